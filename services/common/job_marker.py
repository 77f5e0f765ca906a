"""A job's marker file: how a TaskManager proves it sees the storage root and inputs the leader saw.

When the leader accepts a job it writes ``<storage_root>/<job_id>/_SLUICE_JOB`` (``write``):
the job id, the input files its sources read (every split's path), and the host that wrote
it. Before the first task of a job runs on a TaskManager, the TaskManager reads the marker
and looks for every input file (``unreachable``); a TaskManager whose storage root is a
directory of its own (a local disk where a shared filesystem should be mounted) finds no
marker, and one whose inputs are not mounted finds a file missing. Either way no attempt
there could work, and the job fails at once with the host and the path named.

Only local roots (``file://`` URIs and plain paths) have a marker for now: a root of
another scheme is neither written nor checked here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import orjson

from sluice.errors import StorageUnreachable

__all__ = ["MARKER", "ADVICE", "marker_path", "input_paths", "write", "unreachable"]

MARKER = "_SLUICE_JOB"
"""The marker's name: ``_`` first, so Spark and Hadoop readers skip it like ``_SUCCESS``."""

ADVICE = (
    "every TaskManager must reach the same storage root and inputs (a shared filesystem mounted at the "
    "same path on every host, see README 'Across hosts')"
)


def _local(uri: str) -> Path | None:
    """``uri`` as a local path, or None for a root of another scheme (not checked here)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri:
        return Path(uri)
    return None


def marker_path(storage_root: str, job_id: str) -> Path | None:
    """Where the marker of ``job_id`` is (None: the root is not a local one)."""
    root = _local(storage_root)
    return None if root is None else root / job_id / MARKER


def input_paths(splits: dict[str, list[Any]]) -> list[str]:
    """The input files of a job's split plan (every split's ``path``), each once, in order."""
    return list(
        dict.fromkeys(str(s["path"]) for plan in splits.values() for s in plan if isinstance(s, dict) and "path" in s)
    )


def write(storage_root: str, job_id: str, inputs: list[str], host: str) -> Path | None:
    """Write (or write again: the same content) the marker of ``job_id``; the path, or None
    for a root that has no marker. Written aside and renamed into place, so a reader never
    sees half of it. Raises StorageUnreachable naming ``host`` and the path when it cannot."""
    path = marker_path(storage_root, job_id)
    if path is None:
        return None
    body = orjson.dumps({"job_id": job_id, "inputs": inputs, "written_by": host})
    partial = path.with_name(f"{MARKER}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(body)
        partial.replace(path)
    except OSError as exc:
        try:
            partial.unlink(missing_ok=True)
        except OSError:
            pass
        raise StorageUnreachable(
            f"the JobManager on host {host} cannot write the job's marker {path} under the storage root "
            f"{storage_root} ({type(exc).__name__}: {exc.strerror or exc}): give the JobManager a storage root "
            f"it can write (--storage-root or $SLUICE_STORAGE_ROOT); {ADVICE}",
            host=host,
            path=str(path),
        ) from exc
    return path


def unreachable(storage_root: str, job_id: str, resource_id: str, host: str) -> StorageUnreachable | None:
    """Why the TaskManager ``resource_id`` on ``host`` cannot run tasks of ``job_id``: its
    marker is missing, unreadable or names another job, or an input file is not there
    (None: it sees them all, or the root is not a local one)."""
    path = marker_path(storage_root, job_id)
    if path is None:
        return None
    who = f"TaskManager {resource_id} on host {host}"
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return StorageUnreachable(
            f"{who} cannot see the storage root {storage_root} (marker {path} missing): {ADVICE}",
            host=host,
            path=str(path),
        )
    except OSError as exc:
        if not _conclusive(exc):
            return None  # an I/O error, not an absence: the attempt runs and fails (and restarts) as any would
        return StorageUnreachable(
            f"{who} cannot read the job's marker {path} under the storage root {storage_root} "
            f"({type(exc).__name__}: {exc}): {ADVICE}",
            host=host,
            path=str(path),
        )
    except orjson.JSONDecodeError as exc:
        return StorageUnreachable(
            f"{who} cannot read the job's marker {path} under the storage root {storage_root} "
            f"({type(exc).__name__}: {exc}): {ADVICE}",
            host=host,
            path=str(path),
        )
    if not isinstance(data, dict) or data.get("job_id") != job_id:
        named = data.get("job_id") if isinstance(data, dict) else data
        return StorageUnreachable(
            f"{who} sees another job's marker at {path} (it names {named!r}, not {job_id!r}): "
            f"the storage root {storage_root} is not the one the JobManager wrote to; "
            f"{ADVICE}",
            host=host,
            path=str(path),
        )
    inputs = data.get("inputs")
    for raw in inputs if isinstance(inputs, list) else []:
        if _is_file(str(raw)) is False:
            return StorageUnreachable(
                f"{who} cannot see the input file {raw} (the JobManager on host "
                f"{data.get('written_by', '?')} planned the job's splits from it): {ADVICE}",
                host=host,
                path=str(raw),
            )
    return None


def _conclusive(exc: OSError) -> bool:
    """Whether ``exc`` says the path is not there for this host (missing, not a directory,
    not allowed: the same on every attempt), not that reaching it failed this time (EIO,
    ESTALE, a timeout of a network filesystem): only the former fails a job without restarts."""
    return isinstance(exc, (FileNotFoundError, NotADirectoryError, PermissionError))


def _is_file(location: str) -> bool | None:
    """Whether the input file ``location`` is there, as this process sees it: a local path
    with the os module, an ``s3://`` object through the data plane's file layer. None when
    looking failed for another reason than its absence (an I/O error, a store that did not
    answer): not proof that this host cannot see it."""
    import stat as stat_

    from sluice.services.dataplane import fs

    if fs.is_local(location):
        try:
            st = os.stat(location if fs.scheme_of(location) == "" else fs.resolve(location)[1])
        except OSError as exc:
            return False if _conclusive(exc) else None
        return stat_.S_ISREG(st.st_mode)
    try:
        entry = fs.info(location)
    except FileNotFoundError:  # (StorageNotFound: no such bucket)
        return False
    except Exception:  # noqa: BLE001 (a store that did not answer this time: inconclusive)
        return None
    return entry is not None and entry.is_file
