"""Pieces every shell shares: ids, clocks, logging, process signals."""
