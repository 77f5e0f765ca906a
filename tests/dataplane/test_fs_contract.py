"""What Sluice's own file operations do, the same on a local disk (``file://``) and on S3
(``s3://``, SeaweedFS's S3 gateway): one set of assertions, run against both roots.

Covered: resolve, list, stat, write (whole or not at all), ranged reads, move, delete a
tree; and through them what the data plane builds on them: planning splits and reading
their byte ranges and row groups back exactly, ``_schema.json``, publishing a sink (a
reader sees one attempt whole, never part of one) and sweeping it; and the errors (no such
object, bucket or directory; a scheme that is not supported).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.errors import SplitError, StorageError, StorageNotFound
from sluice.services.dataplane import fs, publish
from sluice.services.dataplane.exchange import SCHEMA_FILE, _publish, _schema_of, sweep_sink
from sluice.services.dataplane.reader import materialize_split
from sluice.services.dataplane.splits import list_input_files, plan_splits
from tests.seaweed import SeaweedS3

BUCKET = "sluice-contract"


@pytest.fixture(scope="module")
def _bucket(seaweed_s3: SeaweedS3) -> str:
    seaweed_s3.admin().create_dir(BUCKET)
    return BUCKET


@pytest.fixture(params=["file", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty directory to work in: ``file:///…`` on the local disk, or ``s3://bucket/<fresh prefix>``
    with the endpoint and credentials in the environment (as a deployment gives them)."""
    if request.param == "file":
        yield (tmp_path / "root").as_uri()
        return
    server: SeaweedS3 = request.getfixturevalue("seaweed_s3")
    bucket = request.getfixturevalue("_bucket")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    prefix = f"s3://{bucket}/{uuid.uuid4().hex[:12]}"
    yield prefix
    fs.delete_tree(prefix)


def names(location: str) -> list[str]:
    return [e.name for e in fs.listdir(location)]


# --- the operations ------------------------------------------------------------------------------------


def test_write_stat_list_read_move_and_delete(root: str) -> None:
    fs.write_bytes(fs.join(root, "d/a.txt"), b"alpha\n")
    fs.write_bytes(fs.join(root, "d/sub/b.txt"), b"bravo!\n")
    fs.write_bytes(fs.join(root, "d/a.txt"), b"alpha, again\n")  # replaces
    a = fs.info(fs.join(root, "d/a.txt"))
    assert a is not None and a.is_file and a.size == 13 and a.name == "a.txt"
    d = fs.info(fs.join(root, "d"))
    assert d is not None and not d.is_file
    assert fs.info(fs.join(root, "d/missing")) is None and not fs.exists(fs.join(root, "d/missing"))
    assert names(fs.join(root, "d")) == ["a.txt", "sub"]  # sorted, one level, no temp file left behind
    assert [(e.name, e.is_file) for e in fs.listdir(fs.join(root, "d"), recursive=True)] == [
        ("a.txt", True),
        ("sub", False),
        ("b.txt", True),
    ]
    assert fs.read_bytes(fs.join(root, "d/a.txt")) == b"alpha, again\n"
    fs.move(fs.join(root, "d/sub/b.txt"), fs.join(root, "d/c.txt"))
    assert fs.read_bytes(fs.join(root, "d/c.txt")) == b"bravo!\n" and not fs.exists(fs.join(root, "d/sub/b.txt"))
    fs.delete_file(fs.join(root, "d/c.txt"))
    fs.delete_file(fs.join(root, "d/c.txt"))  # already gone: fine
    fs.delete_tree(fs.join(root, "d"))
    fs.delete_tree(fs.join(root, "d"))
    assert not fs.exists(fs.join(root, "d/a.txt")) and not fs.exists(fs.join(root, "d"))


def test_listed_locations_are_spelled_as_the_root_was(root: str) -> None:
    fs.write_bytes(fs.join(root, "x.bin"), b"1")
    (entry,) = fs.listdir(root)
    if root.startswith("s3://"):
        assert entry.uri == fs.join(root, "x.bin")
    else:  # a file:// root lists plain absolute paths, as splits always held them
        assert entry.uri == fs.resolve(root)[1] + "/x.bin" and Path(entry.uri).is_file()
    assert fs.read_bytes(entry.uri) == b"1"


def test_ranged_reads_return_exactly_the_bytes_asked_for(root: str) -> None:
    data = bytes(range(256)) * 1000
    fs.write_bytes(fs.join(root, "blob"), data)
    with fs.open_read(fs.join(root, "blob")) as f:
        for start, length in ((0, 10), (255_990, 10), (1234, 100_000), (77, 0)):
            f.seek(start)
            assert f.read(length) == data[start : start + length]


def test_globs_match_within_one_segment(root: str) -> None:
    for name in ("in/a.csv", "in/b.csv", "in/c.txt", "in/deep/d.csv"):
        fs.write_bytes(fs.join(root, name), b"x\n")
    assert fs.glob(fs.join(root, "in/*.csv")) == [fs.join(fs.info(root).uri, n) for n in ("in/a.csv", "in/b.csv")]  # type: ignore[union-attr]
    assert fs.glob(fs.join(root, "in/*/d.csv")) == [fs.join(fs.info(root).uri, "in/deep/d.csv")]  # type: ignore[union-attr]
    assert fs.glob(fs.join(root, "nothing-*")) == []


# --- what the data plane builds on them ---------------------------------------------------------------


def test_input_listing_skips_hidden_files_and_dedupes(root: str) -> None:
    for name in ("in/b.txt", "in/a.txt", "in/_SUCCESS", "in/.a.txt.crc", "in/sub/c.txt"):
        fs.write_bytes(fs.join(root, name), b"x\n")
    base = fs.info(root).uri  # type: ignore[union-attr]
    found = [
        e.uri for e in list_input_files([fs.join(root, "in"), fs.join(root, "in/a.txt"), fs.join(root, "in/*.txt")])
    ]
    assert found == [fs.join(base, "in/a.txt"), fs.join(base, "in/b.txt")]


def test_a_text_file_split_into_byte_ranges_reads_back_exactly(root: str, tmp_path: Path) -> None:
    lines = [f"line {i} {'x' * (i % 37)}\n".encode() for i in range(2000)]
    data = b"".join(lines) + b"last line without newline"
    fs.write_bytes(fs.join(root, "in/words.txt"), data)
    splits = plan_splits("text", [fs.join(root, "in")], 997)
    assert len(splits) == -(-len(data) // 997) and [s["index"] for s in splits] == list(range(len(splits)))
    copies = [materialize_split(s, {}, tmp_path / "splits") for s in splits]
    assert b"".join(c.read_bytes() for c in copies) == data  # every line once, in order, none cut


def test_a_csv_split_keeps_the_header_in_every_copy(root: str, tmp_path: Path) -> None:
    body = b"".join(f"w{i},{i}\n".encode() for i in range(500))
    fs.write_bytes(fs.join(root, "t.csv"), b"word,n\n" + body)
    splits = plan_splits("csv", [fs.join(root, "t.csv")], 1000)
    copies = [materialize_split(s, {"header": "true"}, tmp_path / "s").read_bytes() for s in splits]
    assert all(c.startswith(b"word,n\n") for c in copies)
    assert b"".join(c.removeprefix(b"word,n\n") for c in copies) == body


def test_parquet_row_groups_split_and_read_back_exactly(root: str, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"k": list(range(10_000)), "v": [f"v{i}" for i in range(10_000)]})
    out = pa.BufferOutputStream()
    pq.write_table(table, out, row_group_size=1000)
    fs.write_bytes(fs.join(root, "t.parquet"), out.getvalue().to_pybytes())
    splits = plan_splits("parquet", [fs.join(root, "t.parquet")], 1)
    assert [s["row_groups"] for s in splits] == [[i, i + 1] for i in range(10)]
    back = pa.concat_tables(pq.read_table(materialize_split(s, {}, tmp_path / "p")) for s in splits)
    assert back.equals(table)


def test_the_schema_file_reads_back(root: str) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("w", StringType()), StructField("n", LongType())])
    assert _schema_of(fs.join(root, "out")) is None
    fs.write_bytes(fs.join(root, "out", SCHEMA_FILE), schema.json().encode())
    assert _schema_of(fs.join(root, "out")) == schema


def _stage(root: str, subtask: int, attempt: int, *rows: bytes) -> str:
    staging = publish.staging_name(subtask, attempt)
    for i, row in enumerate(rows):
        fs.write_bytes(fs.join(root, staging, f"part-{i:05d}-{attempt}-c000.csv"), row)
    fs.write_bytes(fs.join(root, staging, "_SUCCESS"), b"")
    return staging


def test_publishing_shows_a_reader_one_whole_attempt_and_the_newest_wins(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = fs.join(root, "sink")
    assert _publish(sink, _stage(sink, 0, 0, b"old-0\n", b"old-1\n"), 0, 0, "csv") is publish.Outcome.PUBLISHED
    old = publish.current(names(sink))
    assert old == ("part-00000-a000000-000.csv", "part-00000-a000000-001.csv")

    seen: list[tuple[str, ...]] = []  # what a reader taking publish.current saw around every file operation
    real_move, real_write = fs.move, fs.write_bytes

    def watched(operation):
        def operate(*args):
            seen.append(publish.current(names(sink)))
            operation(*args)
            seen.append(publish.current(names(sink)))

        return operate

    staging = _stage(sink, 0, 1, b"new-0\n", b"new-1\n", b"new-2\n")
    monkeypatch.setattr(fs, "move", watched(real_move))  # the data files
    monkeypatch.setattr(fs, "write_bytes", watched(real_write))  # the marker
    assert _publish(sink, staging, 0, 1, "csv") is publish.Outcome.PUBLISHED
    new = ("part-00000-a000001-000.csv", "part-00000-a000001-001.csv", "part-00000-a000001-002.csv")
    assert seen == [old] * 7 + [new]  # whole old until the marker is in, then whole new: never a mix
    assert [n for n in names(sink) if not n.startswith("_attempt-")] == ["_part-00000-a000001.published", *new]
    assert [fs.read_bytes(fs.join(sink, n)) for n in new] == [b"new-0\n", b"new-1\n", b"new-2\n"]
    monkeypatch.setattr(fs, "move", real_move)
    monkeypatch.setattr(fs, "write_bytes", real_write)
    late = _publish(sink, _stage(sink, 0, 0, b"stale\n"), 0, 0, "csv")  # a lost attempt finishing late
    assert late is publish.Outcome.SUPERSEDED and publish.current(names(sink)) == new


def test_a_publication_failing_halfway_takes_back_what_it_moved(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = fs.join(root, "sink")
    real_move = fs.move
    moves: list[str] = []

    def second_fails(source: str, target: str) -> None:
        moves.append(target)
        if len(moves) == 2:
            raise StorageError("the store went away")
        real_move(source, target)

    monkeypatch.setattr(fs, "move", second_fails)
    with pytest.raises(StorageError, match="went away"):
        _publish(sink, _stage(sink, 3, 0, b"a\n", b"b\n"), 3, 0, "csv")
    assert publish.current(names(sink)) == () and [n for n in names(sink) if n.startswith("part-")] == []


def test_a_sweep_deletes_only_the_superseded_attempts_files(root: str) -> None:
    sink = fs.join(root, "sink")
    for name in (
        "part-00000-a000001-000.csv",
        "_part-00000-a000002.published",
        "part-00000-a000002-000.csv",
        "part-00001-a000000-000.csv",
        "_part-00001-a000000.published",
        "notes.txt",
    ):
        fs.write_bytes(fs.join(sink, name), b"x")
    assert sweep_sink(sink, 0) == 1
    assert names(sink) == [
        "_part-00000-a000002.published",
        "_part-00001-a000000.published",
        "notes.txt",
        "part-00000-a000002-000.csv",
        "part-00001-a000000-000.csv",
    ]
    assert sweep_sink(fs.join(root, "never-written"), 0) == 0


# --- errors --------------------------------------------------------------------------------------------


def test_a_missing_object_is_named(root: str) -> None:
    missing = fs.join(root, "no/such.txt")
    with pytest.raises(StorageNotFound, match="does not exist") as err:
        fs.read_bytes(missing)
    assert missing in str(err.value) and isinstance(err.value, FileNotFoundError)
    with pytest.raises(StorageNotFound, match="does not exist"):
        fs.listdir(fs.join(root, "no"))
    with pytest.raises(SplitError, match="does not exist"):
        plan_splits("text", [missing], 10)


def test_a_split_whose_input_went_away_says_so(root: str, tmp_path: Path) -> None:
    fs.write_bytes(fs.join(root, "gone.txt"), b"a\nb\n")
    (split,) = plan_splits("text", [fs.join(root, "gone.txt")], 100)
    fs.delete_file(fs.join(root, "gone.txt"))
    with pytest.raises(SplitError, match="no longer exists"):
        materialize_split(split, {}, tmp_path)


def test_a_missing_bucket_is_named(seaweed_s3: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in seaweed_s3.env().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StorageNotFound, match="bucket 'no-such-bucket' of 's3://no-such-bucket/in' does not exist"):
        fs.listdir("s3://no-such-bucket/in")
    with pytest.raises(StorageError, match="no-such-bucket"):
        fs.write_bytes("s3://no-such-bucket/x", b"1")  # never created on the way
    with pytest.raises(SplitError, match="no-such-bucket"):
        plan_splits("text", ["s3://no-such-bucket/in/*.txt"], 10)


def test_wrong_credentials_are_refused_without_showing_the_secret(
    seaweed_s3: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    seaweed_s3.admin().create_dir("sluice-denied")
    for name, value in seaweed_s3.env(AWS_SECRET_ACCESS_KEY="not-" + seaweed_s3.secret_key).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StorageError) as err:
        fs.write_bytes("s3://sluice-denied/x", b"1")
    assert "denied" in str(err.value).lower() and seaweed_s3.secret_key not in str(err.value)


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("gs://bucket/x", "scheme 'gs' is not supported"),
        ("hdfs://nn:8020/x", "scheme 'hdfs' is not supported"),
        ("s3:///x", "names no bucket"),
        ("s3://bucket/x?endpoint_override=evil:80", "takes no options or credentials"),
        ("s3://key:secret@bucket/x", "takes no options or credentials"),
        ("file://otherhost/x", "must name a local path"),
        ("", "non-empty"),
    ],
)
def test_a_location_that_cannot_be_reached_is_refused_with_what_to_use(location: str, message: str) -> None:
    with pytest.raises(StorageError, match=message) as err:
        fs.resolve(location)
    assert "secret" not in str(err.value)


def test_a_malformed_endpoint_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_S3_ENDPOINT", "ftp://127.0.0.1:1")
    with pytest.raises(StorageError, match="SLUICE_S3_ENDPOINT"):
        fs.resolve("s3://bucket/x")
