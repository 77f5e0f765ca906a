"""An invalid job: a lambda transform and a vertex with too much parallelism."""

from sluice.api import Job


def job(params):
    j = Job("invalid", max_parallelism=4)
    j.read_text("lines", "/nonexistent", parallelism=8).map("f", lambda df: df).write_parquet("out", "/tmp/x")
    return j.graph()
