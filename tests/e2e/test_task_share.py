"""A task's share of its Spark server (services/taskmanager/share.py), end to end on real
processes and the test run's Spark server: a TaskManager told one partition a task gives
its tasks a session whose shuffles make one partition and an input read as one partition,
which several Spark partitions would otherwise hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.events import JobStatus
from tests.e2e.conftest import MARGIN, SPARK_START, TEARDOWN, Processes, registered, start_tm, wait_until
from tests.e2e.test_jobs import JOBS, run_job


@pytest.mark.timeout(SPARK_START + 90 + 120 + MARGIN + TEARDOWN)
def test_a_task_of_one_partition_reads_its_splits_as_one_and_shuffles_into_one(
    procs: Processes, log, cluster: dict, spark, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    text = tmp_path / "in.txt"
    line = "x" * 99
    with text.open("w") as f:
        for i in range(120_000):  # 12 MB: three splits of 4 MB
            f.write(f"{i:08d} {line}\n")
    # Left to Spark, these bytes are several partitions (the power of the check below).
    assert spark.read.text(str(text)).select(F.spark_partition_id()).distinct().count() > 1

    start_tm(procs, cluster, "tm-1", slots=2, env={"SLUICE_TASK_PARTITIONS": "1"})
    wait_until(lambda: registered(log) == {"tm-1"}, "the TaskManager", timeout=90)
    out = tmp_path / "out"
    _, job = run_job(log, JOBS / "partitions.py", {"input": str(text), "output": str(out), "split_bytes": str(4 << 20)})
    assert job.status == JobStatus.FINISHED, job.reason
    rows = spark.read.parquet(str(out))
    assert rows.count() == 120_000
    assert {(r["pid"], r["shuffles"]) for r in rows.select("pid", "shuffles").distinct().collect()} == {(0, "1")}
