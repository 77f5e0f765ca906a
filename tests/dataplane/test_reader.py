"""Reading splits: every line in exactly one split (Hadoop's rule), CSV headers, Parquet row groups."""

from __future__ import annotations

import random
from functools import reduce
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.services.dataplane import SplitError, materialize_split, plan_splits, read_split


def _materialized(
    path: Path, fmt: str, split_bytes: int, tmp: Path, options: dict[str, str] | None = None
) -> list[bytes]:
    return [materialize_split(s, options or {}, tmp).read_bytes() for s in plan_splits(fmt, [str(path)], split_bytes)]


def _assert_partition(content: bytes, parts: list[bytes]) -> None:
    """The split files, concatenated, are the file; each holds whole lines only."""
    assert b"".join(parts) == content
    unterminated = [i for i, part in enumerate(parts) if part and not part.endswith(b"\n")]
    assert unterminated in ([], [max(i for i, part in enumerate(parts) if part)])  # only the file's last line


lines = st.lists(
    st.tuples(
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=30),
        st.sampled_from(["\n", "\r\n"]),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(lines, st.booleans(), st.integers(1, 80))
def test_every_line_is_read_by_exactly_one_split(tmp_path_factory, body, final_newline, split_bytes) -> None:
    text = "".join(line + end for line, end in body)
    if not final_newline and body:
        text = text[: -len(body[-1][1])]  # last line without its newline
    content = text.encode("utf-8")
    tmp = tmp_path_factory.mktemp("lines")
    path = tmp / "in.txt"
    path.write_bytes(content)
    if not content:
        return
    _assert_partition(content, _materialized(path, "text", split_bytes, tmp / "out"))


def test_long_lines_and_seeded_random_split_sizes(tmp_path: Path) -> None:
    rng = random.Random(7)
    pieces = [b"w" * rng.choice([0, 0, 1, 5, 80, 3000]) + rng.choice([b"\n", b"\r\n"]) for _ in range(200)]
    for at in (0, 50, 120):
        pieces.insert(at, b"L" * 200_000 + b"\n")  # lines longer than a scan chunk and than a split
    content = b"".join(pieces) + b"tail-without-newline"
    path = tmp_path / "in.txt"
    path.write_bytes(content)
    sizes = [997, 4096, 65_537, 1 << 20, len(content), len(content) + 10] + [rng.randint(500, 50_000) for _ in range(3)]
    for split_bytes in sizes:
        _assert_partition(content, _materialized(path, "text", split_bytes, tmp_path / f"out{split_bytes}"))


def test_csv_header_is_written_once_in_every_split(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b"a,b\r\n" + b"".join(b"%d,x%d\r\n" % (i, i) for i in range(50)))
    parts = _materialized(path, "csv", 64, tmp_path / "out", {"header": "true"})
    assert len(parts) > 3
    assert all(p.startswith(b"a,b\r\n") and not p[5:].startswith(b"a,b") for p in parts)
    assert b"".join(p[5:] for p in parts) == path.read_bytes()[5:]


def test_parquet_split_copies_its_row_groups(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": list(range(100))}), path, row_group_size=10)
    split = {"format": "parquet", "path": str(path), "row_groups": [3, 5], "index": 0}
    assert pq.read_table(materialize_split(split, {}, tmp_path / "out"))["id"].to_pylist() == list(range(30, 50))


def test_bad_splits_and_options(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b"a\n1\n2\n")
    split = plan_splits("csv", [str(path)], 2)[1]
    with pytest.raises(SplitError, match="multiLine"):
        materialize_split(split, {"multiline": "true"}, tmp_path)
    whole = plan_splits("csv", [str(path)], 100)[0]
    assert materialize_split(whole, {"multiLine": "true"}, tmp_path).read_bytes() == b"a\n1\n2\n"
    with pytest.raises(SplitError, match="lineSep"):
        materialize_split(split, {"lineSep": ";"}, tmp_path)
    with pytest.raises(SplitError, match="lacks end"):
        materialize_split({"format": "csv", "path": str(path), "start": 0, "index": 0}, {}, tmp_path)
    path.unlink()
    with pytest.raises(SplitError, match="no longer exists"):
        materialize_split(split, {}, tmp_path)


def _union_rows(dfs):
    return reduce(lambda a, b: a.unionByName(b), dfs).collect()


def test_text_splits_through_spark(spark, tmp_path: Path) -> None:
    path = tmp_path / "words.txt"
    rng = random.Random(3)
    lines = [" ".join(rng.choice(["a", "bb", "ccc", ""]) for _ in range(rng.randint(0, 6))) for _ in range(300)]
    lines[-1] = "last line, no newline"  # (an empty last element would just end the file with CRLF)
    path.write_bytes("\r\n".join(lines).encode())
    dfs = [read_split(spark, s, {}, tmp_path / "tmp") for s in plan_splits("text", [str(path)], 700)]
    assert len(dfs) > 2
    assert sorted(r.value for r in _union_rows(dfs)) == sorted(lines)


def test_csv_splits_with_header_read_like_the_whole_file(spark, tmp_path: Path) -> None:
    path = tmp_path / "people.csv"
    path.write_text("name;age\n" + "".join(f"p{i};{i % 90}\n" for i in range(400)))
    options = {"header": "true", "sep": ";", "schema": "name STRING, age INT"}
    dfs = [read_split(spark, s, options, tmp_path / "tmp") for s in plan_splits("csv", [str(path)], 1000)]
    assert len(dfs) > 3
    whole = spark.read.options(header="true", sep=";").schema("name STRING, age INT").csv(str(path)).collect()
    got = _union_rows(dfs)
    assert sorted(got) == sorted(whole) and len(got) == 400


def test_parquet_splits_through_spark(spark, tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": list(range(3000)), "s": [f"v{i}" for i in range(3000)]}), path, row_group_size=500)
    meta = pq.ParquetFile(path).metadata
    total = sum(meta.row_group(i).column(c).total_compressed_size for i in range(6) for c in range(2))
    splits = plan_splits("parquet", [str(path)], total // 2 + 1)
    assert 2 <= len(splits) <= 3
    rows = _union_rows([read_split(spark, s, {}, tmp_path / "tmp") for s in splits])
    assert sorted(r.id for r in rows) == list(range(3000))
