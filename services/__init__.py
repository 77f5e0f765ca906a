"""Sluice's components: each a pure core (``decide`` + ``evolve``) and a thin shell."""
