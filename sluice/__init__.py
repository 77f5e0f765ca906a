"""Sluice: the control plane of Flink's runtime for PySpark pipelines, on Redis streams."""

__version__ = "0.1.0"
