"""Split planning: byte ranges and row groups, path forms, and errors that say what to fix."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sluice.services.dataplane import SplitError, plan_splits


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_byte_ranges_cover_each_file_and_are_numbered(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.txt", b"x" * 25)
    b = _write(tmp_path / "b.txt", b"y" * 10)
    splits = plan_splits("text", [str(a), str(b)], 10)
    assert [(s["path"], s["start"], s["end"]) for s in splits] == [
        (str(a), 0, 10),
        (str(a), 10, 20),
        (str(a), 20, 25),
        (str(b), 0, 10),
    ]
    assert [s["index"] for s in splits] == [0, 1, 2, 3]
    assert all(s["format"] == "text" for s in splits)


def test_directories_globs_and_file_uris(tmp_path: Path) -> None:
    d = tmp_path / "in"
    for name in ("b.csv", "a.csv", "_SUCCESS", ".a.csv.crc", "sub/c.csv"):
        _write(d / name, b"1,2\n")
    _write(d / "empty.csv", b"")
    expected = [str(d / "a.csv"), str(d / "b.csv")]
    assert [s["path"] for s in plan_splits("csv", [str(d)], 100)] == expected
    assert [s["path"] for s in plan_splits("csv", [f"file://{d}"], 100)] == expected
    assert [s["path"] for s in plan_splits("csv", [str(d / "*.csv")], 100)] == expected
    assert [s["path"] for s in plan_splits("csv", [str(d / "a.csv"), str(d)], 100)] == expected  # no duplicates


def test_compressed_text_is_one_split(tmp_path: Path) -> None:
    gz = _write(tmp_path / "a.txt.gz", b"\x1f\x8b" + b"z" * 100)
    assert [(s["start"], s["end"]) for s in plan_splits("text", [str(gz)], 10)] == [(0, 102)]


def test_parquet_groups_row_groups_up_to_split_bytes(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"id": list(range(1000)), "s": [f"row{i}" * 5 for i in range(1000)]}), path, row_group_size=100
    )
    meta = pq.ParquetFile(path).metadata
    sizes = [sum(meta.row_group(i).column(c).total_compressed_size for c in range(2)) for i in range(10)]
    splits = plan_splits("parquet", [str(path)], sum(sizes) * 4 // 10)
    groups = [s["row_groups"] for s in splits]
    assert groups[0][0] == 0 and groups[-1][1] == 10
    assert all(g[1] == h[0] for g, h in itertools.pairwise(groups))
    assert 2 <= len(groups) <= 4
    assert all(sum(sizes[g[0] : g[1]]) <= sum(sizes) * 4 // 10 for g in groups)
    assert [s["row_groups"] for s in plan_splits("parquet", [str(path)], 1)] == [[i, i + 1] for i in range(10)]


@pytest.mark.parametrize(
    ("fmt", "paths", "split_bytes", "message"),
    [
        ("text", ["{d}/missing.txt"], 10, "does not exist"),
        ("text", ["{d}/nothing-*.txt"], 10, "matches nothing"),
        ("text", ["{d}/emptydir"], 10, "no input files"),
        ("text", ["{d}/a.txt"], -1, "split_bytes must be a positive"),
        ("orc", ["{d}/a.txt"], 10, "unknown input format 'orc'"),
        ("text", ["gs://bucket/a.txt"], 10, "scheme .gs. is not supported"),
        ("text", ["file://otherhost/a.txt"], 10, "must name a local path"),
        ("text", [], 10, "non-empty list"),
        ("parquet", ["{d}/a.txt"], 10, "not a readable Parquet file"),
    ],
)
def test_errors_name_the_problem(tmp_path: Path, fmt: str, paths: list[str], split_bytes: int, message: str) -> None:
    _write(tmp_path / "a.txt", b"hello\n")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(SplitError, match=message):
        plan_splits(fmt, [p.format(d=tmp_path) for p in paths], split_bytes)


def test_empty_files_give_no_split(tmp_path: Path) -> None:
    _write(tmp_path / "e.txt", b"")
    assert plan_splits("text", [str(tmp_path / "e.txt")], 10) == []


def test_auto_split_bytes_is_sparks_max_split_bytes() -> None:
    """min(maxPartitionBytes, max(openCost, (bytes + files * openCost) / readers))."""
    from sluice.services.dataplane.splits import MAX_SPLIT_BYTES, OPEN_COST_BYTES, auto_split_bytes

    mb = 1 << 20
    assert auto_split_bytes([60 * mb], 2) == 32 * mb  # (60 + 4) / 2: one split a reader
    assert auto_split_bytes([100], 4) == OPEN_COST_BYTES  # a small input: one split, not 4 tiny ones
    assert auto_split_bytes([10_000 * mb], 2) == MAX_SPLIT_BYTES  # a large one still balances
    assert auto_split_bytes([31 * mb, 1 * mb], 4) == (32 * mb + 2 * OPEN_COST_BYTES) // 4
    with pytest.raises(SplitError, match="at least 1 reader"):
        auto_split_bytes([1], 0)


def test_split_bytes_0_plans_from_the_input_and_the_readers(tmp_path: Path) -> None:
    from sluice.services.coordination.source import discover

    big = _write(tmp_path / "big.txt", b"word\n" * 3_000_000)  # 15 MB
    assert len(plan_splits("text", [str(big)], 0, readers=2)) == 2
    assert len(plan_splits("text", [str(big)], 0, readers=1)) == 1
    assert len(discover("text", [str(big)], 0, {}, readers=4)) == 4  # (15 MB + 4 MiB) / 4 a split
    assert len(plan_splits("text", [str(big)], 1 << 20)) == 15  # given: an override
    with pytest.raises(SplitError, match="or 0"):
        plan_splits("text", [str(big)], -1)
