"""Queryable state end to end: real processes, real Spark. The word count publishes its
counts as ``word-counts``; 1,000 random keys read through the client (and one through the
CLI) equal what plain PySpark computes; disposing the job releases the state."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from sluice.errors import UnknownStateName
from sluice.events import JobStatus
from sluice.state import StateClient
from sluice.store import EventLog
from tests.e2e.conftest import MARGIN, SPARK_START, TEARDOWN, Processes, registered, start_tm, wait_until
from tests.e2e.test_jobs import ROOT, run_job


def write_words(path: Path, vocabulary: int = 3000, lines: int = 4000, seed: int = 3) -> Path:
    rng = random.Random(seed)
    path.write_text(
        "\n".join(" ".join(f"w{rng.randrange(vocabulary)}" for _ in range(rng.randint(1, 9))) for _ in range(lines))
        + "\n"
    )
    return path


@pytest.mark.timeout(SPARK_START + 90 + 120 + 60 + MARGIN + TEARDOWN)  # registration, the job, the CLI
def test_a_keyed_jobs_state_is_readable_for_any_key_and_equals_plain_pyspark(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    start_tm(procs, cluster, "tm-1")
    wait_until(lambda: registered(log) == {"tm-1"}, "the TaskManager", timeout=90)
    text = write_words(tmp_path / "in.txt")
    job_id, job = run_job(
        log,
        ROOT / "examples" / "wordcount.py",
        {"input": str(text), "output": str(tmp_path / "out"), "parallelism": "2", "reducers": "3"},
    )
    assert job.status == JobStatus.FINISHED, job.reason
    from pyspark.sql import functions as F

    words = (
        spark.read.text(str(text))
        .select(F.explode(F.split(F.lower("value"), r"[^a-z0-9']+")).alias("word"))
        .where("word != ''")
    )
    want = {r["word"]: r["count"] for r in words.groupBy("word").count().collect()}
    client = StateClient(log)
    keys = random.Random(5).sample([f"w{i}" for i in range(3300)], 1000)  # some never occur
    got = {k: client.get(job_id, "word-counts", k) for k in keys}
    assert {k: v["count"] for k, v in got.items() if v is not None} == {k: want[k] for k in keys if k in want}
    assert all(v is None or v["word"] == k for k, v in got.items()) and sum(v is None for v in got.values()) > 0
    # The CLI reads the same.
    k = next(k for k in keys if k in want)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "--redis",
            procs.url,
            "--prefix",
            procs.prefix,
            "state",
            "get",
            job_id,
            "word-counts",
            k,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    found = orjson.loads(out.stdout)
    assert found["value"] == {"word": k, "count": want[k]} and found["vertex"] == "sum counts -> out"
    # Disposed, the state is gone, and the client says so.
    done = client.dispose(job_id)
    assert done.names == ["word-counts"] and len(done.state_ids) == 3
    with pytest.raises(UnknownStateName, match="publishes no queryable state now"):
        client.get(job_id, "word-counts", k)
    assert not list(
        log.client.scan_iter(match=log.keys.job(job_id).replace("{", "[{]").replace("}", "[}]") + ":kvstate:*")
    )
