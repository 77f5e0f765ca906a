"""Reading one input split into a Spark DataFrame.

Spark cannot read a byte range of a text file or a few row groups of a Parquet file, so
a split is first *materialized*: its records are copied into a temp file that Spark reads
whole. The split's input is read through ``fs`` (a local file, or an object on S3, its
byte range fetched with ranged reads), so Spark itself never reads an input: only the
copy, on the TaskManager's own disk. For text and CSV, Hadoop's line rule decides which lines a byte range holds, so
that every line of a file is read by exactly one split:

    a line belongs to the split that contains its first byte.

A split ``[start, end)`` therefore skips the partial line it starts in (unless start is
0: it seeks to ``start - 1`` and skips to just past the first newline there or later),
then reads whole lines while a line's first byte is before ``end``; the last line may run
past ``end``. Lines end with ``\\n`` (``\\r\\n`` keeps its ``\\r`` with the line, which
Spark strips); a last line without newline is read as a line. The copy streams the byte
range in large chunks: no per-line Python.

JSON lines are split as text is. With ``encoding`` (text, CSV, JSON: an ASCII-compatible
charset, checked at submission) the copy is decoded from it and written as UTF-8, which
Spark reads; Parquet's ``columns`` are the only columns copied (the others' bytes are
never fetched) and the only ones Spark reads.

The temp file must exist until Spark has read it, and Spark reads lazily: whoever calls
``read_split`` deletes ``temp_dir`` after the task's action has completed. The Spark
Connect server reads the temp file, so ``temp_dir`` must be on its machine (a
TaskManager's server is local to it).
"""

from __future__ import annotations

import codecs
import contextlib
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from sluice.errors import StorageError, StorageNotFound
from sluice.services.dataplane import fs
from sluice.services.dataplane.errors import SplitError
from sluice.services.dataplane.options import is_true as _is_true
from sluice.services.dataplane.options import lookup as _option
from sluice.services.dataplane.options import parquet_columns, transcoded
from sluice.services.dataplane.splits import COMPRESSED_SUFFIXES, FORMATS, Split

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["materialize_split", "read_split", "read_materialized"]

_COPY_CHUNK = 8 << 20
"""Bytes per read when copying a split's range."""

_SCAN_CHUNK = 1 << 16
"""Bytes per read when looking for the end of a line (lines are usually short; long ones loop)."""


def _check_split(split: Split) -> str:
    """The split's format, after checking it has the keys its format needs."""
    if not isinstance(split, dict):
        raise SplitError(f"a split must be a dict made by plan_splits, got {type(split).__name__}")
    fmt = split.get("format")
    if fmt not in FORMATS:
        raise SplitError(f"split has unknown format {fmt!r}: use one of {', '.join(FORMATS)} (split: {split!r})")
    need = ("path", "index", "row_groups") if fmt == "parquet" else ("path", "index", "start", "end")
    missing = [k for k in need if k not in split]
    if missing:
        raise SplitError(f"{fmt} split lacks {', '.join(missing)}: make splits with plan_splits (split: {split!r})")
    if fmt == "parquet":
        rgs = split["row_groups"]
        if not (isinstance(rgs, (list, tuple)) and len(rgs) == 2 and 0 <= rgs[0] < rgs[1]):
            raise SplitError(f"split row_groups must be [first, last_exclusive] with first < last, got {rgs!r}")
    elif not (isinstance(split["start"], int) and isinstance(split["end"], int) and 0 <= split["start"] < split["end"]):
        raise SplitError(
            f"split byte range must be ints with 0 <= start < end, got {split['start']!r}..{split['end']!r}"
        )
    return str(fmt)


def _source_size(split: Split) -> int:
    try:
        found = fs.info(str(split["path"]))
    except StorageError as exc:
        raise SplitError(f"cannot read split input {split['path']}: {exc}") from exc
    if found is None or not found.is_file:
        raise SplitError(f"split input {split['path']} no longer exists: was it moved after planning?")
    return found.size or 0


@contextlib.contextmanager
def _opened(split: Split) -> Iterator[IO[bytes]]:
    """The split's input file, open for reading at any offset."""
    try:
        f = fs.open_read(str(split["path"]))
    except StorageNotFound as exc:
        raise SplitError(f"split input {split['path']} no longer exists: was it moved after planning?") from exc
    except StorageError as exc:
        raise SplitError(f"cannot read split input {split['path']}: {exc}") from exc
    with f:
        yield cast("IO[bytes]", f)


def _check_options(fmt: str, options: Mapping[str, object], split: Split) -> None:
    """Reject reader options under which byte ranges cut records apart (fine when a split is a whole file)."""
    if not isinstance(options, Mapping):
        raise SplitError(f"options must be a dict of reader options, got {type(options).__name__}")
    if fmt == "parquet":
        return
    multiline = _is_true(options, "multiLine") or _is_true(options, "wholetext")
    # (a Split's values are objects, which int() is not typed for: _check_split checked them)
    if multiline and not (split["start"] == 0 and _source_size(split) <= int(split["end"])):  # type: ignore[call-overload]
        raise SplitError(
            f"{fmt} option multiLine/wholetext cannot be read split by split (a record may span splits): "
            "drop the option, or plan with a split_bytes larger than the files (one split per file)"
        )
    sep = _option(options, "lineSep")
    if sep is not None and sep != "\n":  # Spark's default (\n, \r\n or \r) ends records at least where we cut
        raise SplitError(f"{fmt} option lineSep={sep!r} is not supported: splits cut lines at '\\n'")


def _next_line_start(f: IO[bytes], pos: int, size: int) -> int:
    """The offset just past the first ``\\n`` at or after ``pos`` (``size`` when there is none)."""
    f.seek(pos)
    while pos < size:
        chunk = f.read(_SCAN_CHUNK)
        if not chunk:
            break
        i = chunk.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(chunk)
    return size


def _copy_range(src: IO[bytes], dst: IO[bytes], begin: int, stop: int, encoding: str | None = None) -> None:
    """Copy ``[begin, stop)``; with ``encoding``, decoded from it and written as UTF-8."""
    decoder = codecs.getincrementaldecoder(encoding)() if encoding else None
    src.seek(begin)
    remaining = stop - begin
    while remaining > 0:
        chunk = src.read(min(_COPY_CHUNK, remaining))
        if not chunk:
            break
        remaining -= len(chunk)
        dst.write(chunk if decoder is None else decoder.decode(chunk, final=remaining <= 0).encode("utf-8"))


def _line_range(f: IO[bytes], start: int, end: int, size: int) -> tuple[int, int]:
    """``[begin, stop)``: the bytes of the lines whose first byte lies in ``[start, end)``."""
    begin = 0 if start == 0 else _next_line_start(f, start - 1, size)
    if begin >= min(end, size):
        return begin, begin
    return begin, _next_line_start(f, end - 1, size)


def _materialize_lines(split: Split, fmt: str, options: Mapping[str, object], out: Path) -> None:
    # (a Split's values are objects, which int() is not typed for: _check_split checked them)
    start, end = int(split["start"]), int(split["end"])  # type: ignore[call-overload]
    header = fmt == "csv" and _is_true(options, "header")
    encoding = _encoding(options)
    size = _source_size(split)  # and a clear error when the file is gone
    with _opened(split) as src, open(out, "wb") as dst:
        begin, stop = _line_range(src, start, end, size)
        if header and start > 0:  # the file's first line is the header; split 0 copies it already
            header_end = _next_line_start(src, 0, size)
            src.seek(0)
            line = src.read(header_end)
            if encoding:
                line = line.decode(encoding).encode("utf-8")
            dst.write(line if line.endswith(b"\n") else line + b"\n")
        try:
            _copy_range(src, dst, begin, stop, encoding)
        except UnicodeDecodeError as exc:
            raise SplitError(
                f"{split['path']} is not {encoding} at byte {begin + exc.start} or after ({exc.reason}): "
                "give the files' real encoding"
            ) from exc


def _encoding(options: Mapping[str, object]) -> str | None:
    """The charset to decode a split from (None: UTF-8, copied as it is)."""
    return str(_option(options, "encoding")) if transcoded(options) else None


def _materialize_parquet(split: Split, out: Path, columns: list[str] | None) -> None:
    import pyarrow.parquet as pq

    first, last = cast("list[int]", split["row_groups"])
    with _opened(split) as src:
        _copy_row_groups(pq.ParquetFile(src), split, first, last, out, columns)


def _copy_row_groups(pf: Any, split: Split, first: int, last: int, out: Path, columns: list[str] | None) -> None:
    import pyarrow.parquet as pq

    if last > pf.metadata.num_row_groups:
        raise SplitError(
            f"split wants row groups [{first}, {last}) of {split['path']}, which has {pf.metadata.num_row_groups}: "
            "the file changed after planning; plan the splits again"
        )
    schema = pf.schema_arrow
    if columns is not None:
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise SplitError(
                f"{split['path']} has no column(s) {', '.join(map(repr, missing))} (columns=...); "
                f"its columns: {', '.join(schema.names)}"
            )
        schema = pa_schema(schema, columns)
    # Microsecond timestamps: Spark cannot read Parquet's nanosecond timestamps.
    with pq.ParquetWriter(str(out), schema, coerce_timestamps="us", allow_truncated_timestamps=True) as w:
        for i in range(first, last):  # only the columns asked for: the others' pages are never read
            w.write_table(pf.read_row_group(i, columns=columns).select(schema.names))


def pa_schema(schema: Any, columns: list[str]) -> Any:
    """``schema`` with only ``columns``, in their order."""
    import pyarrow as pa

    return pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)


def materialize_split(split: Split, options: Mapping[str, str], temp_dir: Path) -> Path:
    """Write the records of ``split`` into a new file under ``temp_dir`` that Spark can read whole.

    CSV with ``options["header"] == "true"``: the file's first line is the header; it is
    written first in every split's file (once in the split that starts at byte 0).
    Returns the file's absolute path.
    """
    fmt = _check_split(split)
    _check_options(fmt, options, split)
    temp_dir = Path(temp_dir).resolve()
    temp_dir.mkdir(parents=True, exist_ok=True)
    suffix = {"text": ".txt", "csv": ".csv", "json": ".json", "parquet": ".parquet"}[fmt]
    src_name = str(split["path"]).lower()
    if fmt != "parquet" and src_name.endswith(COMPRESSED_SUFFIXES):
        suffix += Path(src_name).suffix  # keep .gz & co so Spark decompresses the whole-file copy
    # (a Split's values are objects, which int() is not typed for: plan_splits numbers them)
    out = temp_dir / f"split-{int(split['index']):05d}-{uuid.uuid4().hex[:8]}{suffix}"  # type: ignore[call-overload]
    if fmt == "parquet":
        _materialize_parquet(split, out, parquet_columns(options))
    else:
        _materialize_lines(split, fmt, options, out)
    return out


def read_split(spark: SparkSession, split: Split, options: Mapping[str, str], temp_dir: Path) -> DataFrame:
    """The records of ``split`` as a DataFrame (text: one column ``value``; csv, json and
    parquet: their columns).

    ``options`` go to Spark's reader (csv: ``header``, ``inferSchema``, ``sep``, ...;
    ``services/dataplane/options.py`` lists them). A ``schema`` option (a DDL string such
    as ``"word STRING, n BIGINT"``) sets the schema, which CSV and JSON need for every split
    to agree on types (``inferSchema`` infers them split by split). The caller deletes ``temp_dir`` after the action that uses the
    DataFrame has completed: Spark reads the temp file lazily.
    """
    path = materialize_split(split, options, temp_dir)
    return read_materialized(spark, str(split["format"]), options, [path])


def read_materialized(spark: SparkSession, fmt: str, options: Mapping[str, str], paths: list[Path]) -> DataFrame:
    """Materialized splits (files made by ``materialize_split``) as one DataFrame, read in one scan."""
    path = [str(p) for p in paths]
    opts = {k: str(v) for k, v in options.items() if k.lower() not in _SLUICE_OPTIONS}
    reader = spark.read.options(**opts)
    schema = _option(options, "schema")
    if schema:
        reader = reader.schema(str(schema))
    if fmt == "text":
        return reader.text(path)
    if fmt == "csv":
        return reader.csv(path)
    if fmt == "json":
        return reader.json(path)
    columns = parquet_columns(options)
    df = reader.parquet(*path)
    return df if columns is None else df.select(*[f"`{c.replace('`', '``')}`" for c in columns])


_SLUICE_OPTIONS = frozenset({"schema", "columns", "encoding"})
"""Options Sluice applies itself, not passed to Spark's reader as options (the schema is
given as a schema; the encoding was decoded when the split was copied)."""
