"""Benchmarks: Sluice against raw Redis, RQ and PySpark baselines measured in the same run."""
