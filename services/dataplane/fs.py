"""Sluice's own file operations, on a local disk and on S3 alike (pyarrow's file systems).

Everything Sluice does to files itself, outside Spark, goes through here: planning splits
(list, stat, Parquet footers), copying a split's byte range, the exchange's ``_schema.json``,
publishing and sweeping a sink, the chunks of a source read split by split. What Spark
reads and writes itself (exchange partitions, a sink's staging, materialized splits) does
not: see ``spark_reach``.

A location is a plain absolute path, a ``file://`` URI (``file:///abs/path``) or an
``s3://bucket/key`` URI. Any other scheme is refused with what to use instead. S3's
endpoint and credentials come from the environment only, never from a URI:

* ``SLUICE_S3_ENDPOINT`` or ``AWS_ENDPOINT_URL`` (``http://host:port`` for an S3 gateway
  such as SeaweedFS's or MinIO's; unset: AWS itself);
* ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``); unset:
  the AWS SDK's own chain (profile, instance role);
* ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (with an endpoint and no region: ``us-east-1``).

Listings name entries the way the location was given: plain paths for local ones (a
``file://`` URI becomes its path), ``s3://bucket/key`` for S3. A bucket is never created:
a missing one is an error that names it.

On a local disk the calls where pyarrow costs more than the os module (stat, open, write,
rename) are the os module's; listing and deleting trees are pyarrow's on both.

Publishing needs an atomic move of one file: a rename on a local disk; on S3 a
server-side copy (the new object appears whole, or not at all) then a delete of the
source. :func:`write_bytes` is atomic too: a local file is written under a hidden name
then renamed; an S3 object appears only when its upload completes.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, cast
from urllib.parse import unquote, urlparse

from sluice.errors import StorageError, StorageNotFound

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

__all__ = [
    "SCHEMES",
    "Entry",
    "delete_file",
    "delete_tree",
    "exists",
    "glob",
    "info",
    "is_local",
    "join",
    "listdir",
    "make_dirs",
    "move",
    "open_read",
    "read_bytes",
    "resolve",
    "scheme_of",
    "write_bytes",
]

SCHEMES = ("file", "s3")
"""URI schemes this layer reaches (besides plain local paths)."""

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class Entry:
    """One file or directory: ``uri`` spelled as its location was (see the module's docstring)."""

    uri: str
    name: str
    is_file: bool
    size: int | None


def scheme_of(location: str) -> str:
    """``""`` for a plain path (a one-letter scheme is a Windows drive), else the URI's scheme."""
    if location.startswith("/"):
        return ""
    scheme = urlparse(location).scheme
    return scheme.lower() if len(scheme) > 1 else ""


def is_local(location: str) -> bool:
    return scheme_of(location) in ("", "file")


def join(location: str, *names: str) -> str:
    """``location`` with ``names`` appended, one ``/`` between each."""
    return "/".join([location.rstrip("/"), *(n.strip("/") for n in names)])


def resolve(location: str) -> tuple[FileSystem, str]:
    """The file system ``location`` lives on and its path there (local: absolute; S3: ``bucket/key``)."""
    if not isinstance(location, str) or not location:
        raise StorageError(f"a location must be a non-empty path or URI string, got {location!r}")
    if location.startswith("/"):  # the common case, without parsing
        return _local(), os.path.abspath(location)
    parsed = urlparse(location)
    scheme = scheme_of(location)
    if scheme == "":
        return _local(), os.path.abspath(os.path.expanduser(location))
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(
                f"{location!r}: a file:// URI must name a local path (file:///abs/path), "
                f"not a host ({parsed.netloc!r}); mount the remote file system and use its local path"
            )
        return _local(), os.path.abspath(unquote(parsed.path) or "/")
    if scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"{location!r} names no bucket: write s3://BUCKET/PREFIX")
        if parsed.query or parsed.params or "@" in parsed.netloc:
            shown = "an s3:// URI with credentials (not repeated here)" if "@" in parsed.netloc else repr(location)
            raise StorageError(
                f"{shown}: an s3:// location takes no options or credentials in the URI; "
                "set SLUICE_S3_ENDPOINT (or AWS_ENDPOINT_URL), AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY in the environment"
            )
        key = unquote(parsed.path).strip("/")
        return _s3(*_s3_settings()), f"{parsed.netloc}/{key}" if key else parsed.netloc
    raise StorageError(
        f"{location!r}: scheme {scheme!r} is not supported by Sluice's file operations; use a "
        "plain absolute path, file:///abs/path (a local disk or a shared mount) or s3://bucket/prefix"
    )


@functools.cache
def _local() -> FileSystem:
    from pyarrow import fs as pafs

    return pafs.LocalFileSystem()


def _s3_settings() -> tuple[str | None, str | None, str | None, str | None, str | None]:
    env = os.environ
    endpoint = env.get("SLUICE_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    return (
        endpoint or None,
        region or None,
        env.get("AWS_ACCESS_KEY_ID") or None,
        env.get("AWS_SECRET_ACCESS_KEY") or None,
        env.get("AWS_SESSION_TOKEN") or None,
    )


@functools.lru_cache(maxsize=8)
def _s3(endpoint: str | None, region: str | None, key: str | None, secret: str | None, token: str | None) -> FileSystem:
    """One S3 file system per setting (building one costs a few ms; it keeps its connections)."""
    from pyarrow import fs as pafs

    kwargs: dict[str, object] = {"allow_bucket_creation": False, "allow_bucket_deletion": False}
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path.strip("/"):
            raise StorageError(
                f"S3 endpoint {endpoint!r} (SLUICE_S3_ENDPOINT or AWS_ENDPOINT_URL) must be "
                "http://host:port or https://host:port"
            )
        kwargs.update(endpoint_override=parsed.netloc, scheme=parsed.scheme, region=region or "us-east-1")
    elif region:
        kwargs["region"] = region
    if key or secret:
        if not (key and secret):
            raise StorageError("set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (one of them is empty)")
        kwargs.update(access_key=key, secret_key=secret, **({"session_token": token} if token else {}))
    return pafs.S3FileSystem(**kwargs)


def _uri(location: str, path: str) -> str:
    """``path`` on ``location``'s file system, spelled as ``location`` was (see the module's docstring)."""
    return f"s3://{path}" if scheme_of(location) == "s3" else path


@contextlib.contextmanager
def _translated(location: str, what: str) -> Iterator[None]:
    """pyarrow's errors as Sluice's, naming the location and what to do."""
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError as exc:
        raise StorageNotFound(f"{what}: {location!r} does not exist") from exc
    except OSError as exc:
        text = str(exc)
        if "NO_SUCH_BUCKET" in text or "bucket does not exist" in text.lower():
            bucket = urlparse(location).netloc
            raise StorageNotFound(
                f"{what}: the bucket {bucket!r} of {location!r} does not exist; create it "
                "(Sluice never creates buckets) or fix the URI"
            ) from exc
        if scheme_of(location) == "s3" and (
            "ACCESS_DENIED" in text
            or "AccessDenied" in text
            or "InvalidAccessKeyId" in text
            or "SignatureDoesNotMatch" in text
        ):
            raise StorageError(
                f"{what}: access to {location!r} was denied; check AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY and the bucket's policy"
            ) from exc
        raise StorageError(f"{what}: {location!r}: {text}") from exc


def info(location: str) -> Entry | None:
    """What is at ``location`` (None: nothing). On S3 a prefix with objects under it is a directory,
    and so is a bucket."""
    from pyarrow import fs as pafs

    fs, path = resolve(location)
    if fs is _local():  # os.stat: a third of pyarrow's cost on a local disk (tools/bench/fslayer.py)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        is_file = stat.S_ISREG(st.st_mode)
        return Entry(path, os.path.basename(path), is_file, st.st_size if is_file else None)
    with _translated(location, "cannot look at"):
        found = fs.get_file_info(path)
    if found.type == pafs.FileType.NotFound:
        return None
    is_file = found.type == pafs.FileType.File
    return Entry(_uri(location, found.path), found.base_name, is_file, found.size if is_file else None)


def exists(location: str) -> bool:
    return info(location) is not None


def listdir(location: str, *, recursive: bool = False) -> list[Entry]:
    """The entries in the directory ``location``, sorted by path (``StorageNotFound``: no such
    directory or bucket)."""
    from pyarrow import fs as pafs

    fs, path = resolve(location)
    with _translated(location, "cannot list"):
        found = fs.get_file_info(pafs.FileSelector(path, recursive=recursive))
    return sorted(
        (
            Entry(
                _uri(location, i.path),
                i.base_name,
                i.type == pafs.FileType.File,
                i.size if i.type == pafs.FileType.File else None,
            )
            for i in found
        ),
        key=lambda e: e.uri,
    )


def glob(pattern: str) -> list[str]:
    """The locations matching ``pattern`` (``*``, ``?``, ``[...]`` within one path segment), sorted."""
    if is_local(pattern):
        import glob as pyglob

        return sorted(pyglob.glob(resolve(pattern)[1]))
    fs, path = resolve(pattern)
    segments = path.split("/")
    fixed = next(i for i, s in enumerate(segments) if _GLOB_CHARS & set(s))
    base = "s3://" + "/".join(segments[:fixed])
    try:
        candidates = listdir(base, recursive=len(segments) - fixed > 1)
    except StorageNotFound:
        if info("s3://" + segments[0]) is None:  # no bucket: say so, rather than "matches nothing"
            raise
        return []
    return [
        e.uri
        for e in candidates
        if len(e.uri[len("s3://") :].split("/")) == len(segments)
        and all(fnmatch.fnmatchcase(a, b) for a, b in zip(e.uri[len("s3://") :].split("/"), segments))
    ]


def open_read(location: str) -> BinaryIO:
    """The file at ``location``, open for reading at any offset (``seek``; on S3 each read is a
    ranged GET). A local file is Python's own (pyarrow's costs 1.7 times as much to copy
    a file through: tools/bench/fslayer.py)."""
    fs, path = resolve(location)
    with _translated(location, "cannot open"):
        if is_local(location):
            return open(path, "rb")  # noqa: SIM115 (the caller closes it)
        return cast("BinaryIO", fs.open_input_file(path))


def read_bytes(location: str) -> bytes:
    with open_read(location) as f:
        data: bytes = f.read()
        return data


def write_bytes(location: str, data: bytes) -> None:
    """Write ``data`` as the file ``location`` (replacing it) so that no reader ever sees it half-written."""
    fs, path = resolve(location)
    with _translated(location, "cannot write"):
        if scheme_of(location) == "s3":
            with fs.open_output_stream(path) as out:
                out.write(data)
            return
        parent, name = os.path.split(path)
        os.makedirs(parent, exist_ok=True)
        temp = os.path.join(parent, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(temp, "wb") as out:
                out.write(data)
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise


def move(source: str, target: str) -> None:
    """Move one file; ``target`` appears whole or not at all (see the module's docstring)."""
    fs, src = resolve(source)
    target_fs, dst = resolve(target)
    if scheme_of(source) != scheme_of(target) and not (is_local(source) and is_local(target)):
        raise StorageError(f"cannot move {source!r} to {target!r}: they are on different file systems")
    del target_fs
    with _translated(source, f"cannot move to {target!r}"):
        if is_local(source):
            os.replace(src, dst)  # a rename, as pyarrow's, without its overhead
        else:
            fs.move(src, dst)


def make_dirs(location: str) -> None:
    """Create the directory ``location`` and its parents (on S3 nothing: prefixes need no making)."""
    if scheme_of(location) == "s3":
        resolve(location)
        return
    fs, path = resolve(location)
    with _translated(location, "cannot create the directory"):
        fs.create_dir(path, recursive=True)


def delete_file(location: str) -> None:
    """Delete one file; one already gone is fine."""
    fs, path = resolve(location)
    with contextlib.suppress(StorageNotFound), _translated(location, "cannot delete"):
        fs.delete_file(path)


def delete_tree(location: str) -> None:
    """Delete a directory and everything under it; one already gone is fine."""
    fs, path = resolve(location)
    with contextlib.suppress(StorageNotFound), _translated(location, "cannot delete"):
        fs.delete_dir(path)
