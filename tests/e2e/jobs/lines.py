"""Every line of the input, copied to Parquet: each line read exactly once shows as
exactly one row (the lines are unique), so a lost or doubled split is visible."""

from sluice.api import Job


def job(params):
    j = Job("lines")
    lines = j.read_text("lines", params["input"], parallelism=int(params.get("parallelism", 2)),
                        split_bytes=int(params.get("split_bytes", 2048)),
                        protocol=params.get("protocol", "operator-events"))
    lines.write_parquet("out", params["output"])
    return j.graph()
