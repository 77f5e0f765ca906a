"""A source read ``each_split`` (services/taskmanager/worker.py ``_read_each_split``), on the
test run's real Spark: its chained functions run on each split as it arrives, and the work
on a split (its chunk written) is done before the next split is asked for; the result is
every row once, and a reader that got no split still has the chain's columns."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.events import TaskSource
from sluice.services.coordination.source import discover
from sluice.services.taskmanager import worker


class Splits:
    """What a reader's TaskEvents gives: the next split, or None when there are none left;
    ``chunks_done`` records, at each request, how many chunks the reader had written."""

    def __init__(self, splits: list[dict], chunks: Path) -> None:
        self.left, self.chunks = list(splits), chunks
        self.chunks_done: list[int] = []

    def next_split(self) -> dict | None:
        self.chunks_done.append(len(list(self.chunks.glob("*"))) if self.chunks.exists() else 0)
        return self.left.pop(0) if self.left else None


def shout(df: DataFrame) -> DataFrame:
    return df.select(F.upper("value").alias("line"), F.length("value").alias("n"))


def _descriptor(splits: list[dict]) -> Any:
    return cast(
        Any, SimpleNamespace(source=TaskSource("text", {}, "input-splits", splits[0] if splits else None, True))
    )


def test_each_split_is_worked_on_before_the_next_is_asked_for(spark, tmp_path: Path) -> None:
    lines = [f"line {i:05d} " + "x" * (i % 13) for i in range(700)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    splits = discover("text", [str(tmp_path / "in.txt")], 4096, {})
    assert len(splits) >= 3
    temp = tmp_path / "task"
    events = Splits(splits, temp / "chunks")
    df = worker._read_each_split(spark, _descriptor(splits), {}, temp, cast(Any, events), shout)
    got = sorted((r["line"], r["n"]) for r in df.collect())
    assert got == sorted((line.upper(), len(line)) for line in lines)  # every row once, the chain applied
    # Request k+1 came after the chunk of split k was written: the work was done in between.
    assert events.chunks_done == list(range(len(splits) + 1))
    assert not list((temp / "splits").glob("*"))  # each split's copy went once its chunk was written


def test_a_reader_that_gets_no_split_has_the_chains_columns(spark, tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("a\nb\n")
    splits = discover("text", [str(tmp_path / "in.txt")], 4096, {})
    df = worker._read_each_split(
        spark, _descriptor(splits), {}, tmp_path / "task", cast(Any, Splits([], tmp_path)), shout
    )
    assert df.columns == ["line", "n"] and df.count() == 0
