"""Every line of the input, copied to Parquet: each line read exactly once shows as
exactly one row (the lines are unique), so a lost or doubled split is visible. With
``attempts=N`` the job restarts a failed task N times, 100 ms apart (default: the
default restart strategy)."""

from sluice.api import Job
from sluice.events import RestartStrategy


def job(params):
    restart = RestartStrategy("fixed-delay", int(params["attempts"]), 100) if "attempts" in params else None
    j = Job("lines", restart=restart)
    lines = j.read_text(
        "lines",
        params["input"],
        parallelism=int(params.get("parallelism", 2)),
        split_bytes=int(params.get("split_bytes", 2048)),
        protocol=params.get("protocol", "operator-events"),
    )
    lines.write_parquet("out", params["output"])
    return j.graph()
