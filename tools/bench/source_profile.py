"""Where a word-count source task's time goes (issue 31's "Where the time goes"), on real
text (the ``stdlib`` corpus), phase by phase, against plain Spark's single plan over the
same input, all on one warm Spark Connect server of ``local[2]``:

* **copy**: ``reader.materialize_split`` of each reader's split (Python, the TaskManager);
* **read + partial count**: Spark reading the copy, tokenising and counting it (forced by
  the ``noop`` sink: no output written), with the task's share of one partition
  (``taskmanager.share``), the two readers' tasks run side by side as on 2 slots;
* **+ keyed write**: the same, written partitioned by key group as the exchange writes it
  (``exchange.write_partition``: its Parquet files and their commit), minus the above;
* **plain**: the whole input tokenised, counted and written as Parquet in one plan (what
  the job as a whole competes with), and the same plan into ``noop`` (its write's cost).

Each phase is timed as the best of ``rounds`` after a warm-up (the machine is shared).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.table import Table

from .console import console
from .corpus import write_corpus

__all__ = ["run"]

ROOT = Path(__file__).resolve().parents[2]


def _best(rounds: int, fn: Any) -> float:
    fn()  # warm
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def run(*, megabytes: int = 60, readers: int = 2, rounds: int = 2) -> dict[str, float]:
    from pyspark.sql import SparkSession

    from sluice.services.coordination.source import discover
    from sluice.services.dataplane import exchange, reader
    from sluice.services.embedded.spark_connect import SparkConnectServer
    from sluice.services.taskmanager import share

    sys.path.insert(0, str(ROOT / "examples"))
    import wordcount  # type: ignore[import-not-found]  # examples/wordcount.py, on sys.path from the line above

    with tempfile.TemporaryDirectory(prefix="sluice-bench-profile-") as tmp_dir:
        tmp = Path(tmp_dir)
        source = tmp / "input.txt"
        with console.status(f"{megabytes} MB of the stdlib corpus"):
            write_corpus("stdlib", source, megabytes)
        splits = discover("text", [str(source)], 0, {}, readers)
        server = SparkConnectServer(master="local[2]", log_file=tmp / "spark.log")
        with console.status("starting Spark"):
            url = server.start()
        try:
            sessions = [SparkSession.builder.remote(url).create() for _ in range(readers)]
            for s in sessions:
                share.configure(s, 1)
            copies: list[Path] = []

            def copy() -> None:
                copies.clear()
                for i, split in enumerate(splits):
                    copies.append(reader.materialize_split(split, {}, tmp / f"copy-{i}"))

            def each(fn: Any) -> None:
                with ThreadPoolExecutor(readers) as pool:
                    list(pool.map(fn, range(readers)))

            def frame(i: int) -> Any:
                df = reader.read_materialized(sessions[i], "text", {}, [copies[i]])
                return wordcount.partial_count(share.coalesced(df, 1))

            def counted(i: int) -> None:
                frame(i).write.format("noop").mode("overwrite").save()

            def keyed(i: int) -> None:
                exchange.write_partition(
                    frame(i), str(tmp / f"out-{i}"), key="word", max_parallelism=128, consumers=2, partitions=1
                )

            plain_session = sessions[0]

            def plain(fmt: str) -> None:
                share.configure(plain_session, None)
                df = wordcount.count(wordcount.tokenize(plain_session.read.text(str(source))))
                w = df.write.mode("overwrite")
                (w.format("noop").save() if fmt == "noop" else w.parquet(str(tmp / "plain")))
                share.configure(plain_session, 1)

            with console.status("timing each phase"):
                t_copy = _best(rounds, copy)
                t_count = _best(rounds, lambda: each(counted))
                t_keyed = _best(rounds, lambda: each(keyed))
                t_plain = _best(rounds, lambda: plain("parquet"))
                t_plain_noop = _best(rounds, lambda: plain("noop"))
        finally:
            server.stop()
    row = {
        "copy": t_copy,
        "count": t_count,
        "write": t_keyed - t_count,
        "source_task": t_copy + t_keyed,
        "plain": t_plain,
        "plain_write": t_plain - t_plain_noop,
    }
    table = Table(title=f"A word-count source task's phases, {readers} readers side by side, stdlib {megabytes} MB")
    table.add_column("phase")
    table.add_column("s", justify="right")
    table.add_row("copy of the splits (Python, both readers' in turn)", f"{t_copy:.2f}")
    table.add_row("read + tokenise + partial count (Spark, readers side by side)", f"{t_count:.2f}")
    table.add_row("write partitioned by key group + Parquet commit", f"{row['write']:.2f}")
    table.add_row("source tasks, all phases", f"{row['source_task']:.2f}")
    table.add_row("plain: the whole word count in one plan, written as Parquet", f"{t_plain:.2f}")
    table.add_row("plain: the same plan into noop (no write)", f"{t_plain_noop:.2f}")
    console.print(table)
    console.print(
        f"{len(splits)} splits (planned from the input's size), cores: {os.cpu_count()}; each phase the best of "
        f"{rounds} after a warm-up; on a shared machine a phase's best may still carry others' load",
        style="dim",
    )
    return row
