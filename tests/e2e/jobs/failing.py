"""A job whose transform raises (tests: restarts, then the job fails with this error)."""

from sluice.api import Job
from sluice.events import RestartStrategy


def explode(df):
    raise ValueError("bad input row 42")


def job(params):
    j = Job("failing", restart=RestartStrategy("fixed-delay", int(params.get("attempts", 2)), 100))
    j.read_text("lines", params["input"], parallelism=1).map("explode", explode).write_parquet("out", params["output"])
    return j.graph()
