"""Planning input splits: which bytes (text, CSV) or row groups (Parquet) each split reads.

The JobManager's split enumerator hands these out one at a time (``NextInputSplit``), so a
split is a small JSON-able dict that travels in an event:

* text / csv / json (JSON lines): ``{"format", "path", "start", "end", "index"}``, a byte
  range ``[start, end)`` of ``split_bytes`` (the last one of a file shorter). Which *lines* a
  range reads is decided when it is read (``reader.materialize_split``, Hadoop's rule), so
  planning only needs file sizes. A source whose records may span lines (CSV or JSON with
  ``multiLine``: a quoted field holding a newline) is planned ``whole_files``, one split a
  file, as Spark reads such files whole; without ``multiLine`` a newline ends a record
  even inside quotes, in Spark and in Sluice alike.
* parquet: ``{"format", "path", "row_groups": [first, last_exclusive], "index"}``,
  consecutive row groups until about ``split_bytes`` of compressed data.

``index`` numbers the splits of one plan from 0. Planning is pure (file system only,
through ``fs``): inputs are plain local paths, ``file://`` or ``s3://`` URIs. A split's
``path`` is an absolute local path for a local input (a ``file://`` URI becomes its path)
and the ``s3://`` URI for one on S3; the reader copies the split's records through ``fs``
too, so Spark never reads an input itself (``spark_reach``).
"""

from __future__ import annotations

from sluice.errors import StorageError
from sluice.services.dataplane import fs
from sluice.services.dataplane.errors import SplitError

__all__ = [
    "AUTO",
    "COMPRESSED_SUFFIXES",
    "FORMATS",
    "MAX_SPLIT_BYTES",
    "OPEN_COST_BYTES",
    "Split",
    "auto_split_bytes",
    "list_input_files",
    "plan_splits",
]

Split = dict[str, object]
"""One input split; see the module docstring for its keys per format."""

FORMATS = ("text", "csv", "json", "parquet")

COMPRESSED_SUFFIXES = (".gz", ".bz2", ".zst", ".zstd", ".xz", ".lz4", ".snappy", ".deflate", ".br")
"""Text/CSV files with these suffixes cannot be cut into byte ranges: one split reads the whole file."""

_GLOB_CHARS = frozenset("*?[")

AUTO = 0
"""``split_bytes`` of a source that lets the plan choose (``auto_split_bytes``)."""

MAX_SPLIT_BYTES = 128 << 20
"""The largest split the plan chooses (Spark's ``spark.sql.files.maxPartitionBytes``)."""

OPEN_COST_BYTES = 4 << 20
"""What opening a split costs, in bytes one could have read instead (Spark's
``spark.sql.files.openCostInBytes``): the smallest split the plan chooses. Here a split
costs a request to the coordinator, a copy and a Spark scan (read ``each_split``: a Spark
job, about a second), so a split is never planned smaller than this on its own."""


def auto_split_bytes(
    sizes: list[int], readers: int, *, open_cost: int = OPEN_COST_BYTES, max_bytes: int = MAX_SPLIT_BYTES
) -> int:
    """The split size for files of ``sizes`` read by ``readers``, as Spark's
    ``FilePartition.maxSplitBytes``: ``min(max_bytes, max(open_cost, bytes_per_reader))``
    where ``bytes_per_reader = (sum(sizes) + len(sizes) * open_cost) / readers``: about
    one split a reader for an input that is small against ``readers * max_bytes`` (every
    reader busy, none waiting on a split's fixed cost), never smaller than a split's cost
    to open, nor larger than ``max_bytes`` (a large input still balances)."""
    if readers < 1:
        raise SplitError(f"a source needs at least 1 reader to plan its splits, got {readers}")
    per_reader = -(-(sum(sizes) + len(sizes) * open_cost) // readers)
    return max(1, min(max_bytes, max(open_cost, per_reader)))


def _visible(name: str) -> bool:
    """Spark and Hadoop skip names starting with '.' or '_' (``_SUCCESS``, ``.crc`` files)."""
    return not name.startswith((".", "_"))


def _files_of(found: fs.Entry) -> list[fs.Entry]:
    if found.is_file:
        return [found]
    return [e for e in fs.listdir(found.uri) if e.is_file and _visible(e.name)]


def _input(raw: object) -> str:
    """One input location, checked (``fs`` says what is wrong with a scheme or a URI)."""
    if not isinstance(raw, str) or not raw:
        raise SplitError(f"an input path must be a non-empty string, got {raw!r}")
    try:
        fs.resolve(raw)
    except StorageError as exc:
        raise SplitError(f"cannot read input {raw!r}: {exc}") from exc
    return raw


def list_input_files(paths: list[str]) -> list[fs.Entry]:
    """Every input file ``paths`` name, in order, without duplicates.

    A path (a plain path, ``file://`` or ``s3://`` URI) is a file, a directory (its files,
    sorted, not recursing into subdirectories, skipping names that start with '.' or '_'),
    or a glob (its matches, sorted, each a file or a directory as above).
    """
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)) or not paths:
        raise SplitError(f"paths must be a non-empty list of paths, got {paths!r}")
    files: list[fs.Entry] = []
    for raw in map(_input, paths):
        try:
            found = fs.info(raw)
            if found is None and _GLOB_CHARS & set(raw):
                matches = [m for m in map(fs.info, fs.glob(raw)) if m is not None]
                if not matches:
                    raise SplitError(f"input glob {raw!r} matches nothing: check the pattern and the directory")
                files.extend(f for m in matches for f in _files_of(m))
            elif found is None:
                where = f" ({fs.resolve(raw)[1]})" if fs.is_local(raw) else ""
                raise SplitError(f"input path {raw!r} does not exist{where}")
            else:
                files.extend(_files_of(found))
        except StorageError as exc:
            raise SplitError(f"cannot read input {raw!r}: {exc}") from exc
    unique = list({f.uri: f for f in files}.values())
    if not unique:
        raise SplitError(
            f"no input files found in {paths!r}: directories are not searched recursively, "
            "and names starting with '.' or '_' are skipped"
        )
    return unique


def _byte_splits(fmt: str, file: fs.Entry, split_bytes: int, whole: bool) -> list[Split]:
    size = file.size or 0
    if size == 0:
        return []
    if whole or file.name.lower().endswith(COMPRESSED_SUFFIXES):
        return [{"format": fmt, "path": file.uri, "start": 0, "end": size}]
    return [
        {"format": fmt, "path": file.uri, "start": start, "end": min(start + split_bytes, size)}
        for start in range(0, size, split_bytes)
    ]


def _parquet_splits(file: fs.Entry, split_bytes: int, columns: list[str] | None) -> list[Split]:
    import pyarrow.parquet as pq

    try:
        with fs.open_read(file.uri) as f:
            pf = pq.ParquetFile(f)
            meta, names = pf.metadata, pf.schema_arrow.names
    except StorageError as exc:
        raise SplitError(f"cannot read input {file.uri}: {exc}") from exc
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for non-Parquet files
        raise SplitError(f"{file.uri} is not a readable Parquet file: {exc}") from exc
    missing = [c for c in columns or () if c not in names]
    if missing:
        raise SplitError(
            f"{file.uri} has no column(s) {', '.join(map(repr, missing))} (columns=...); its columns: {', '.join(names)}"
        )
    splits: list[Split] = []
    first, size = 0, 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        rg_bytes = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)) or rg.total_byte_size
        if i > first and size + rg_bytes > split_bytes:
            splits.append({"format": "parquet", "path": file.uri, "row_groups": [first, i]})
            first, size = i, 0
        size += rg_bytes
    if meta.num_row_groups > first:
        splits.append({"format": "parquet", "path": file.uri, "row_groups": [first, meta.num_row_groups]})
    return splits


def plan_splits(
    format: str,
    paths: list[str],
    split_bytes: int,
    *,
    whole_files: bool = False,
    columns: list[str] | None = None,
    readers: int = 1,
) -> list[Split]:
    """The splits of ``paths`` read as ``format`` ("text", "csv", "json" or "parquet"), numbered by ``index``.

    Empty files (and Parquet files without row groups) give no split. Compressed text/CSV/JSON
    files (``COMPRESSED_SUFFIXES``) give one split each, since a byte range of a compressed
    stream cannot be read on its own; so does every file with ``whole_files`` (records that
    may span lines). ``columns`` (Parquet): the columns to be read, each of which every
    file must have. ``split_bytes`` ``AUTO`` (0): chosen from the files' sizes and the
    ``readers`` (``auto_split_bytes``).
    """
    if format not in FORMATS:
        raise SplitError(f"unknown input format {format!r}: use one of {', '.join(FORMATS)}")
    if isinstance(split_bytes, bool) or not isinstance(split_bytes, int) or split_bytes < 0:
        raise SplitError(
            f"split_bytes must be a positive int (bytes per split, e.g. 64 MiB) or 0 (chosen from the input), "
            f"got {split_bytes!r}"
        )
    files = list_input_files(paths)
    if split_bytes == AUTO:
        split_bytes = auto_split_bytes([f.size or 0 for f in files], readers)
    splits: list[Split] = []
    for path in files:
        splits.extend(
            _parquet_splits(path, split_bytes, columns)
            if format == "parquet"
            else _byte_splits(format, path, split_bytes, whole_files)
        )
    for index, split in enumerate(splits):
        split["index"] = index
    return splits
