"""A storage root's identity: ``<storage_root>/_SLUICE_ROOT``, holding an id made once.

The leader makes sure the file exists (``ensure``): it creates it exclusively with a new
id, or reads the id already there. Two JobManagers on one shared root therefore read
the same id, and a JobManager whose root is a directory of its own gets an id of its
own. A TaskManager told the leader's root and id looks for that file (``look``): a
host where the shared filesystem is not mounted finds no file, or another root's id,
and says so before any job is submitted.

Only local roots (``file://`` URIs and plain paths) have an identity for now, as only
they have a job marker (``job_marker.py``); a root of another scheme (``s3://``) has none
and nothing is checked here.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import orjson

from sluice.errors import StorageUnreachable

from .job_marker import ADVICE, _local

__all__ = ["ROOT_FILE", "root_file", "ensure", "look"]

ROOT_FILE = "_SLUICE_ROOT"
"""The identity's name: ``_`` first, so Spark and Hadoop readers skip it like ``_SUCCESS``."""


def root_file(storage_root: str) -> Path | None:
    """Where the identity of ``storage_root`` is (None: the root is not a local one)."""
    root = _local(storage_root)
    return None if root is None else root / ROOT_FILE


def _read(path: Path) -> str:
    """The id in ``path``; ValueError when the file holds no id."""
    data = orjson.loads(path.read_bytes())
    root_id = data.get("root_id") if isinstance(data, dict) else None
    if not isinstance(root_id, str) or not root_id:
        raise ValueError(f"{path} holds no root id ({data!r:.80})")
    return root_id


def ensure(storage_root: str, new_id: Callable[[], str], host: str) -> str:
    """The id of ``storage_root``: the one in its ``_SLUICE_ROOT``, or a new one (``new_id()``)
    written there first, exclusively (written aside, then hard-linked into place: a link
    fails when the file exists, and a reader never sees half of it). "" for a root that has
    no identity. StorageUnreachable naming ``host`` and the path when it can do neither."""
    path = root_file(storage_root)
    if path is None:
        return ""
    partial = path.with_name(f"{ROOT_FILE}.{os.getpid()}.partial")
    try:
        if path.is_file():
            return _read(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(orjson.dumps({"root_id": new_id(), "storage_root": storage_root, "made_by": host}))
        try:
            os.link(partial, path)
        except FileExistsError:
            pass  # another JobManager made it first: its id is the root's
        except OSError as exc:  # a filesystem without hard links: create it exclusively instead
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            try:
                with open(path, "xb") as out:
                    out.write(partial.read_bytes())
            except FileExistsError:
                pass
        return _read(path)
    except (OSError, ValueError, orjson.JSONDecodeError) as exc:
        raise StorageUnreachable(
            f"the JobManager on host {host} cannot make or read the storage root's identity {path} "
            f"({type(exc).__name__}: {exc}): give the JobManager a storage root it can write (--storage-root "
            f"or $SLUICE_STORAGE_ROOT); {ADVICE}",
            host=host,
            path=str(path),
        ) from exc
    finally:
        try:
            partial.unlink(missing_ok=True)
        except OSError:
            pass


def look(storage_root: str, root_id: str) -> tuple[str, str | None]:
    """What this host sees of the leader's root: the identity's path, and None when it holds
    ``root_id``, else why not (in words a person can act on)."""
    path = root_file(storage_root)
    if path is None:
        return "", None
    try:
        seen = _read(path)
    except FileNotFoundError:
        return str(path), "missing"
    except (OSError, ValueError, orjson.JSONDecodeError) as exc:
        return str(path), f"unreadable: {type(exc).__name__}: {exc}"
    if seen != root_id:
        return str(path), (
            f"it holds the id {seen}, not the leader's {root_id}: a directory of this host's own, not the shared one"
        )
    return str(path), None
