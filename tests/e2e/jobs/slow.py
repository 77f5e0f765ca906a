"""A job whose first attempt hangs in Python (tests: kill -9 of a worker, cancellation)."""

import os
import time
from pathlib import Path

from sluice.api import Job
from sluice.events import RestartStrategy


def stall(df):
    marker = Path(os.environ.get("SLUICE_TEST_MARKER", "/tmp/sluice-slow-marker"))
    if not marker.exists():
        marker.write_text(str(os.getpid()))  # the worker's pid, for the test to kill it
        time.sleep(60)
    return df


def job(params):
    j = Job("slow", restart=RestartStrategy("fixed-delay", 2, 100))
    j.read_text("lines", params["input"], parallelism=1).map("stall", stall).write_parquet("out", params["output"])
    return j.graph()
