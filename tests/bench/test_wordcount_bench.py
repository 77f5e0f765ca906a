"""The word count bench's warm-cluster measure: the job runs again and again on one cluster,
each run's output is the whole count, and each run's time comes from its own facts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tools.bench.wordcount import warm_cluster


def test_the_job_runs_on_one_cluster_each_time_with_the_whole_count(spark, spark_remote: str, tmp_path: Path) -> None:
    source = tmp_path / "text.txt"
    lines = [" ".join(f"w{(i * 7 + j) % 13}" for j in range(i % 5 + 1)) for i in range(400)]
    source.write_text("\n".join(lines) + "\n")
    outputs = [tmp_path / f"out-{i}" for i in range(2)]
    with warm_cluster(spark_remote, tmp_path / "home", parallelism=2, slots=2, master="local[2]") as cluster:
        times = [cluster.run(source, out) for out in outputs]
        vertices = cluster.vertex_times()
    assert all(t > 0 for t in times)
    want = Counter(w for line in lines for w in line.split())
    for out in outputs:
        assert {r["word"]: r["count"] for r in spark.read.parquet(str(out)).collect()} == want
    assert sorted(vertices) == ["lines -> count words: task time, summed", "sum counts -> out: task time, summed"]
    assert all(s > 0 for s in vertices.values())
