"""Planning input splits: which bytes (text, CSV) or row groups (Parquet) each split reads.

The JobManager's split enumerator hands these out one at a time (``NextInputSplit``), so a
split is a small JSON-able dict that travels in an event:

* text / csv: ``{"format", "path", "start", "end", "index"}``, a byte range ``[start, end)``
  of ``split_bytes`` (the last one of a file shorter). Which *lines* a range reads is
  decided when it is read (``reader.materialize_split``, Hadoop's rule), so planning only
  needs file sizes.
* parquet: ``{"format", "path", "row_groups": [first, last_exclusive], "index"}``,
  consecutive row groups until about ``split_bytes`` of compressed data.

``index`` numbers the splits of one plan from 0. Planning is pure (file system only) and
for now only local paths (plain or ``file://``) can be split.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from sluice.services.dataplane.errors import SplitError

__all__ = ["COMPRESSED_SUFFIXES", "FORMATS", "Split", "list_input_files", "local_path", "plan_splits"]

Split = dict[str, object]
"""One input split; see the module docstring for its keys per format."""

FORMATS = ("text", "csv", "parquet")

COMPRESSED_SUFFIXES = (".gz", ".bz2", ".zst", ".zstd", ".xz", ".lz4", ".snappy", ".deflate", ".br")
"""Text/CSV files with these suffixes cannot be cut into byte ranges: one split reads the whole file."""

_GLOB_CHARS = frozenset("*?[")


def local_path(path: str) -> Path:
    """``path`` (a plain path or a ``file://`` URI) as an absolute local path.

    Absolute because the Spark Connect server resolves relative paths against its own
    working directory, not the client's.
    """
    if not isinstance(path, str) or not path:
        raise SplitError(f"an input path must be a non-empty string, got {path!r}")
    parsed = urlparse(path)
    if len(parsed.scheme) > 1:  # one letter is a Windows drive, not a scheme
        if parsed.scheme != "file":
            raise SplitError(
                f"cannot split {path!r}: only local paths and file:// URIs can be split by this planner for now "
                f"(scheme {parsed.scheme!r}); copy the input to a local or mounted file system first"
            )
        if parsed.netloc not in ("", "localhost"):
            raise SplitError(f"cannot split {path!r}: a file:// URI must name a local path (file:///abs/path)")
        path = unquote(parsed.path)
    return Path(os.path.abspath(os.path.expanduser(path)))


def _visible(name: str) -> bool:
    """Spark and Hadoop skip names starting with '.' or '_' (``_SUCCESS``, ``.crc`` files)."""
    return not name.startswith((".", "_"))


def _files_of(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if _visible(p.name) and p.is_file())
    if path.is_file():
        return [path]
    return []


def list_input_files(paths: list[str]) -> list[Path]:
    """Every input file ``paths`` name, in order, without duplicates.

    A path is a file, a directory (its regular files, sorted, not recursing into
    subdirectories, skipping names that start with '.' or '_'), or a glob (its matches,
    sorted, each a file or a directory as above).
    """
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)) or not paths:
        raise SplitError(f"paths must be a non-empty list of paths, got {paths!r}")
    files: list[Path] = []
    for raw in paths:
        path = local_path(raw)
        if not path.exists() and _GLOB_CHARS & set(str(path)):
            matches = sorted(glob.glob(str(path)))
            if not matches:
                raise SplitError(f"input glob {raw!r} matches nothing: check the pattern and the directory")
            found = [f for m in matches for f in _files_of(Path(m))]
        elif not path.exists():
            raise SplitError(f"input path {raw!r} does not exist ({path})")
        else:
            found = _files_of(path)
        files.extend(found)
    unique = list(dict.fromkeys(files))
    if not unique:
        raise SplitError(
            f"no input files found in {paths!r}: directories are not searched recursively, "
            "and names starting with '.' or '_' are skipped"
        )
    return unique


def _byte_splits(fmt: str, path: Path, split_bytes: int) -> list[Split]:
    size = path.stat().st_size
    if size == 0:
        return []
    if path.name.lower().endswith(COMPRESSED_SUFFIXES):
        return [{"format": fmt, "path": str(path), "start": 0, "end": size}]
    return [
        {"format": fmt, "path": str(path), "start": start, "end": min(start + split_bytes, size)}
        for start in range(0, size, split_bytes)
    ]


def _parquet_splits(path: Path, split_bytes: int) -> list[Split]:
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for non-Parquet files
        raise SplitError(f"{path} is not a readable Parquet file: {exc}") from exc
    splits: list[Split] = []
    first, size = 0, 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        rg_bytes = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)) or rg.total_byte_size
        if i > first and size + rg_bytes > split_bytes:
            splits.append({"format": "parquet", "path": str(path), "row_groups": [first, i]})
            first, size = i, 0
        size += rg_bytes
    if meta.num_row_groups > first:
        splits.append({"format": "parquet", "path": str(path), "row_groups": [first, meta.num_row_groups]})
    return splits


def plan_splits(format: str, paths: list[str], split_bytes: int) -> list[Split]:
    """The splits of ``paths`` read as ``format`` ("text", "csv" or "parquet"), numbered by ``index``.

    Empty files (and Parquet files without row groups) give no split. Compressed text/CSV
    files (``COMPRESSED_SUFFIXES``) give one split each, since a byte range of a compressed
    stream cannot be read on its own.
    """
    if format not in FORMATS:
        raise SplitError(f"unknown input format {format!r}: use one of {', '.join(FORMATS)}")
    if isinstance(split_bytes, bool) or not isinstance(split_bytes, int) or split_bytes < 1:
        raise SplitError(f"split_bytes must be a positive int (bytes per split, e.g. 64 MiB), got {split_bytes!r}")
    splits: list[Split] = []
    for path in list_input_files(paths):
        splits.extend(
            _parquet_splits(path, split_bytes) if format == "parquet" else _byte_splits(format, path, split_bytes)
        )
    for index, split in enumerate(splits):
        split["index"] = index
    return splits
