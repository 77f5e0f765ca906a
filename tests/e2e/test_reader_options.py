"""Reader options end to end (issue 32): the issue's NA data fails on an ANSI cast after ONE
attempt, its root cause naming the error condition; read with ``null_value="NA"`` and a
schema, the same data gives what plain PySpark gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.events import JobStatus, TaskRestartScheduled, TaskState, UpdateTaskExecutionState
from tests.e2e.conftest import MARGIN, SPARK_START, TEARDOWN, Processes, start_tm
from tests.e2e.test_jobs import JOBS, job_facts, run_job


def flights(tmp_path: Path) -> Path:
    data = tmp_path / "flights.csv"
    data.write_text(
        "carrier,dep_delay\n" + "".join(f"C{i % 3},{'NA' if i % 10 == 0 else i % 40}\n" for i in range(400))
    )
    return data


@pytest.mark.slow  # (~18 s: a cluster's start; the core's decision and the real errors' classes are tested by default)
@pytest.mark.timeout(SPARK_START + 120 + MARGIN + TEARDOWN)  # the job
def test_a_deterministic_cast_error_fails_the_job_after_one_attempt_naming_the_error(
    procs: Processes, log, cluster: dict, tmp_path: Path
) -> None:
    start_tm(procs, cluster, "tm-1")
    job_id, job = run_job(log, JOBS / "na_csv.py", {"input": str(flights(tmp_path)), "output": str(tmp_path / "o")})
    assert job.status == JobStatus.FAILED and job.restarts == 0
    assert job.reason.startswith("task flights -> cast delay[")
    assert "failed (no restart): Spark error CAST_INVALID_INPUT is deterministic" in job.reason
    assert 'The value \'NA\' of the type "STRING" cannot be cast to "INT"' in job.reason
    facts = job_facts(log, job_id)
    assert not [f for f in facts if isinstance(f, TaskRestartScheduled)]
    failed = [f for f in facts if isinstance(f, UpdateTaskExecutionState) and f.state == TaskState.FAILED]
    assert failed and {f.attempt for f in failed} == {0}  # one attempt, no retries


@pytest.mark.slow  # (the same reading is compared with plain Spark in tests/dataplane/test_reader_options.py)
@pytest.mark.timeout(SPARK_START + 120 + MARGIN + TEARDOWN)  # the job
def test_null_value_and_a_schema_read_the_na_data_as_plain_spark_does(
    procs: Processes, log, cluster: dict, spark, tmp_path: Path
) -> None:
    start_tm(procs, cluster, "tm-1")
    data, out = flights(tmp_path), tmp_path / "out"
    _, job = run_job(log, JOBS / "na_csv.py", {"input": str(data), "output": str(out), "fixed": "true"})
    assert job.status == JobStatus.FINISHED, job.reason
    from pyspark.sql import functions as F

    plain = spark.read.options(header="true", nullValue="NA").schema("carrier STRING, dep_delay INT").csv(str(data))
    want = plain.groupBy("carrier").agg(F.avg("dep_delay").alias("mean_delay"), F.count("*").alias("flights"))
    assert sorted(spark.read.parquet(str(out)).collect()) == sorted(want.collect())
