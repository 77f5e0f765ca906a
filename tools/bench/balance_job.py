"""The balance benchmark's job (tools/bench/balance.py): every line of the input copied to
Parquet after Spark work that costs ``$SLUICE_BENCH_WORK_S_PER_ROW`` seconds a row on the
fast readers and ``$SLUICE_BENCH_SLOW_FACTOR`` times that on subtask 0 (a sleep inside
``mapInPandas``, in the Spark server's Python worker, proportional to the rows: the same
work whether a reader runs it split by split or over all it read at once)."""

from __future__ import annotations

import os

from pyspark.sql import DataFrame

from sluice.api import Job, task_context


def work(lines: DataFrame) -> DataFrame:
    per_row = float(os.environ.get("SLUICE_BENCH_WORK_S_PER_ROW", "0.001"))
    if task_context().subtask == 0:
        per_row *= float(os.environ.get("SLUICE_BENCH_SLOW_FACTOR", "5"))

    def slowly(batches):
        import time

        for batch in batches:
            time.sleep(per_row * len(batch))
            yield batch

    return lines.mapInPandas(slowly, lines.schema)


def job(params: dict[str, str]):
    j = Job("balance")
    lines = j.read_text(
        "lines",
        params["input"],
        parallelism=int(params.get("parallelism", 2)),
        split_bytes=int(params["split_bytes"]),
        each_split=params.get("each_split") == "yes",
    )
    lines.map("work", work).write_parquet("out", params["output"])
    return j.graph()
