"""Sinks through Spark: the newest attempt of a subtask wins, whatever order attempts finish in.

The regression these guard: attempts staged per subtask and published by "replace every
part of my subtask", so an attempt still running on a TaskManager declared lost, finishing
after its replacement, replaced the replacement's output.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sluice.services.dataplane import write_sink
from sluice.services.dataplane.publish import Outcome

CSV = {"header": "true"}
SCHEMA = "w string, n bigint"


def rows(spark, *values: tuple[str, int]):
    return spark.createDataFrame(list(values), SCHEMA)


def read_csv(spark, sink: str) -> list[tuple[str, str]]:
    return sorted((r.w, r.n) for r in spark.read.options(**CSV).csv(sink).collect())


def visible(sink: Path) -> list[str]:
    """What a reader of the directory takes: its files that do not start with ``_`` or ``.``."""
    return sorted(p.name for p in sink.iterdir() if not p.name.startswith(("_", ".")))


def test_a_late_stale_attempt_cannot_replace_the_newer_attempts_output(spark, tmp_path: Path) -> None:
    sink = str(tmp_path / "sink")
    write_sink(rows(spark, ("other", 9)), sink, 1, 0, "csv", CSV)
    write_sink(rows(spark, ("new", 1)), sink, 0, 1, "csv", CSV)  # the replacement finishes first …
    late = write_sink(rows(spark, ("stale", 0), ("stale", 2)), sink, 0, 0, "csv", CSV)  # … the lost one after it
    assert late is Outcome.SUPERSEDED
    assert read_csv(spark, sink) == [("new", "1"), ("other", "9")]
    assert all(n.startswith(("part-00000-a000001-", "part-00001-a000000-")) for n in visible(tmp_path / "sink"))
    assert not [p for p in (tmp_path / "sink").iterdir() if p.name.startswith("_attempt-")]  # staging is gone


def test_a_newer_attempt_replaces_the_older_and_leaves_other_subtasks(spark, tmp_path: Path) -> None:
    sink = str(tmp_path / "sink")
    write_sink(rows(spark, ("a", 1)), sink, 0, 0, "csv", CSV)
    write_sink(rows(spark, ("b", 2)), sink, 1, 0, "csv", CSV)
    write_sink(rows(spark, ("c", 3)), sink, 0, 1, "csv", CSV)
    assert read_csv(spark, sink) == [("b", "2"), ("c", "3")]  # the directory is one flat dataset
    names = visible(tmp_path / "sink")
    assert {n[:19] for n in names} == {"part-00000-a000001-", "part-00001-a000000-"}
    assert all(n.endswith(".csv") for n in names) and names == sorted(names)


def test_an_empty_newer_attempt_still_wins(spark, tmp_path: Path) -> None:
    """An attempt that wrote no rows (maybe no data file at all) supersedes the older one:
    its marker file says it published."""
    sink = str(tmp_path / "sink")
    write_sink(rows(spark, ("old", 1)), sink, 0, 0, "parquet")
    write_sink(rows(spark).limit(0), sink, 0, 1, "parquet")
    write_sink(rows(spark, ("stale", 2)), sink, 0, 0, "parquet")
    assert spark.read.schema(SCHEMA).parquet(sink).collect() == []


def test_old_style_names_are_replaced(spark, tmp_path: Path) -> None:
    """Files of the naming before attempts (``part-00000-000.csv``) count as older than any attempt."""
    sink = tmp_path / "sink"
    sink.mkdir()
    (sink / "part-00000-000.csv").write_text("w,n\nlegacy,7\n")
    (sink / "part-00001-000.csv").write_text("w,n\nlegacy-other,8\n")
    write_sink(rows(spark, ("new", 1)), str(sink), 0, 0, "csv", CSV)
    assert read_csv(spark, str(sink)) == [("legacy-other", "8"), ("new", "1")]
    assert "part-00000-000.csv" not in visible(sink)


def test_two_attempts_publishing_at_the_same_time(spark, tmp_path: Path) -> None:
    """Both attempts write and publish concurrently (two hosts, one file system): the newer wins."""
    sink = str(tmp_path / "sink")
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(
            pool.map(lambda n: write_sink(rows(spark, (f"attempt-{n}", n)), sink, 0, n, "csv", CSV), (0, 1))
        )
    assert outcomes[1] is Outcome.PUBLISHED and outcomes[0] in set(Outcome)
    assert read_csv(spark, sink) == [("attempt-1", "1")]


@pytest.mark.parametrize("attempt", [-1, True, "1"])
def test_attempt_must_be_a_non_negative_int(spark, tmp_path: Path, attempt) -> None:
    from sluice.services.dataplane import DataplaneError

    with pytest.raises(DataplaneError, match="attempt must be an int >= 0"):
        write_sink(rows(spark, ("a", 1)), str(tmp_path / "sink"), 0, attempt, "csv", CSV)


# --- the shell without Spark: a staging directory as Spark leaves it ------------------------------------


def staged(root: Path, subtask: int, attempt: int, *files: str) -> str:
    from sluice.services.dataplane.publish import staging_name

    staging = root / staging_name(subtask, attempt)
    staging.mkdir(parents=True)
    for name in ("_SUCCESS", *files, *(f".{f}.crc" for f in files)):
        (staging / name).write_text(name)
    return staging.name


def test_the_shell_keeps_compression_extensions_and_skips_spark_bookkeeping(tmp_path: Path) -> None:
    from sluice.services.dataplane.exchange import _publish

    staging = staged(tmp_path, 2, 1, "part-00001-9f8e-c000.csv.gz", "part-00000-9f8e-c000.csv.gz")
    assert _publish(str(tmp_path), staging, 2, 1, "csv") is Outcome.PUBLISHED
    assert (tmp_path / "part-00002-a000001-000.csv.gz").read_text() == "part-00000-9f8e-c000.csv.gz"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != staging) == [
        "_part-00002-a000001.published",
        "part-00002-a000001-000.csv.gz",
        "part-00002-a000001-001.csv.gz",
    ]


def test_the_shell_takes_back_what_it_moved_when_publishing_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sluice.services.dataplane import fs
    from sluice.services.dataplane.exchange import _publish

    moves = []
    real_move = fs.move

    def failing_second_move(src: str, dst: str) -> None:  # a disk that fills up halfway
        moves.append(dst)
        if len(moves) == 2:
            raise OSError("disk full")
        real_move(src, dst)

    monkeypatch.setattr(fs, "move", failing_second_move)
    (tmp_path / "part-00000-000.csv").write_text("legacy")
    staging = staged(tmp_path, 0, 1, "part-00000-1-c000.csv", "part-00001-1-c000.csv")
    with pytest.raises(OSError, match="disk full"):
        _publish(str(tmp_path), staging, 0, 1, "csv")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != staging) == ["part-00000-000.csv"]


def test_taking_back_goes_on_past_a_delete_the_file_layer_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file layer raises StorageError (not OSError) for a delete that fails for another
    reason than a missing file: the take-back must still try every other name it moved in,
    and the error reported stays the first one (the failed move)."""
    from sluice.errors import StorageError
    from sluice.services.dataplane import fs
    from sluice.services.dataplane.exchange import _publish

    moves: list[str] = []
    real_move, real_delete = fs.move, fs.delete_file

    def failing_third_move(src: str, dst: str) -> None:
        moves.append(dst)
        if len(moves) == 3:
            raise OSError("disk full")
        real_move(src, dst)

    refused: list[str] = []

    def refusing_first_delete(location: str) -> None:
        if not refused:
            refused.append(location)
            raise StorageError(f"cannot delete {location}: device busy")
        real_delete(location)

    monkeypatch.setattr(fs, "move", failing_third_move)
    monkeypatch.setattr(fs, "delete_file", refusing_first_delete)
    staging = staged(tmp_path, 0, 1, "part-00000-1-c000.csv", "part-00001-1-c000.csv", "part-00002-1-c000.csv")
    with pytest.raises(OSError, match="disk full"):
        _publish(str(tmp_path), staging, 0, 1, "csv")
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != staging)
    assert len(refused) == 1  # the first delete of the take-back was refused, and the take-back went on:
    assert set(left) <= {refused[0].rsplit("/", 1)[-1]} and not [n for n in left if n.startswith("part-")]


def test_a_sweep_deletes_what_a_stale_attempt_left_halfway_and_nothing_else(tmp_path: Path) -> None:
    """Attempt 1 of subtask 0 moved a data file in after attempt 2 published, and died
    before its own re-check withdrew it: a plain reader would count its rows twice. The
    TaskManager that killed it sweeps the sink: the superseded files go; the newest
    attempt's, other subtasks' and foreign files stay."""
    from sluice.services.dataplane.exchange import sweep_sink
    from sluice.services.dataplane.publish import marker_name, part_name

    keep = [
        part_name(0, 2, 0, "csv"),
        marker_name(0, 2),
        part_name(1, 0, 0, "csv"),
        marker_name(1, 0),
        "_SUCCESS",
        "notes.txt",
    ]
    stale = [part_name(0, 1, 0, "csv"), part_name(0, 1, 1, "csv")]
    for name in keep + stale:
        (tmp_path / name).write_text("x\n")
    assert sweep_sink(str(tmp_path), 0) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)
    assert sweep_sink(str(tmp_path), 0) == 0 and sweep_sink(str(tmp_path / "missing"), 0) == 0
