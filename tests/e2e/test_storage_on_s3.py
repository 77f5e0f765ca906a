"""S3 with real processes: a storage root or sink Spark cannot reach is refused at submission,
before any task runs, naming the URI and what to do; an input on s3:// (a real SeaweedFS S3
gateway) needs no Spark connector, since Sluice copies its splits itself, and the job's
counts are exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.client import Client, JobRefusedError, load_job
from sluice.events import JobStatus
from sluice.store import EventLog
from tests.e2e.conftest import MARGIN, SPARK_START, TEARDOWN, Processes, registered, start_tm, wait_until
from tests.e2e.test_jobs import run_job, write_lines
from tests.seaweed import SeaweedS3

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = ROOT / "examples" / "wordcount.py"


@pytest.mark.timeout(2 * 30 + MARGIN + TEARDOWN)  # two refusals
@pytest.mark.parametrize(
    ("where", "says"),
    [
        (
            "root",
            "the storage root 's3://bucket/sluice' cannot be used: Spark writes and reads the job's exchange "
            "partitions there",
        ),
        (
            "sink",
            "sink 'sum counts -> out' writes to 's3://bucket/counts', which cannot be used: Spark writes the "
            "sink's files there",
        ),
    ],
)
def test_a_location_spark_cannot_reach_is_refused_at_submission(
    procs: Processes, log: EventLog, tmp_path: Path, where: str, says: str
) -> None:
    root = "s3://bucket/sluice" if where == "root" else (tmp_path / "storage").as_uri()
    output = "s3://bucket/counts" if where == "sink" else str(tmp_path / "out")
    procs.start("jm", "jobmanager", "--storage-root", root)
    text = write_lines(tmp_path / "in.txt", 10)
    client = Client(log)
    job_id = client.submit(load_job(WORDCOUNT, {"input": str(text), "output": output}))
    with pytest.raises(JobRefusedError) as info:
        client.wait_accepted(job_id, timeout=30)
    message = str(info.value)
    assert says in message and "hadoop-aws" in message and "file://" in message and "README" in message
    assert job_id not in client.job_ids()


@pytest.mark.timeout(SPARK_START + 90 + 120 + MARGIN + TEARDOWN)  # registration, the job
def test_an_input_on_s3_is_read_without_a_spark_connector(
    procs: Processes, log: EventLog, seaweed_s3: SeaweedS3, spark, spark_remote: str, tmp_path: Path
) -> None:
    admin = seaweed_s3.admin()
    admin.create_dir("sluice-inputs")
    text = write_lines(tmp_path / "in.txt", 3000)
    with admin.open_output_stream("sluice-inputs/words/in.txt") as out:
        out.write(text.read_bytes())
    home = tmp_path / "home"
    s3 = seaweed_s3.env()  # the JobManager plans the splits, the TaskManager copies them
    procs.start(
        "jm",
        "jobmanager",
        "--storage-root",
        (tmp_path / "storage").as_uri(),
        "--slot-timeout",
        "120",
        env={"SLUICE_HOME": str(home), **s3},
    )
    start_tm(procs, {"home": home, "spark": spark_remote}, "tm-1", env=s3)
    wait_until(lambda: registered(log) == {"tm-1"}, "the TaskManager", timeout=90)
    out = tmp_path / "out"
    job_id, job = run_job(
        log,
        WORDCOUNT,
        {
            "input": "s3://sluice-inputs/words/",
            "output": str(out),
            "parallelism": "2",
            "split_bytes": "8192",
            "queryable": "no",
        },
    )
    assert job.status == JobStatus.FINISHED, job.reason
    from pyspark.sql import functions as F

    got = {r["word"]: r["count"] for r in spark.read.parquet(str(out)).collect()}
    lines = spark.read.text(str(text))
    words = lines.select(F.explode(F.split(F.lower("value"), r"[^a-z0-9']+")).alias("word")).where("word != ''")
    assert got == {r["word"]: r["count"] for r in words.groupBy("word").count().collect()} and sum(got.values()) > 3000
