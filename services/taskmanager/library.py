"""The library cache (Flink's LibraryCacheManager): a job's code fetched once per
TaskManager by content hash, kept while tasks use it."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

from sluice.errors import ServiceError
from sluice.store import Blobs

__all__ = ["LibraryCache", "load_module"]


class LibraryCache:
    def __init__(self, blobs: Blobs, root: Path) -> None:
        self.blobs, self.root = blobs, Path(root)
        self.refs: dict[str, int] = {}
        self._lock = threading.Lock()

    def path(self, digest: str, module: str) -> Path:
        return self.root / digest / f"{module}.py"

    def register(self, digest: str, module: str) -> Path:
        """Make the code available locally and count one more user of it."""
        with self._lock:
            path = self.path(digest, module)
            if not path.exists():
                data = self.blobs.get(digest)
                if data is None:
                    raise ServiceError(f"the job's code (blob {digest[:12]}) is not in Redis")
                path.parent.mkdir(parents=True, exist_ok=True)
                # Unique per writer: TaskManagers sharing a home may fetch the same code at once.
                tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_bytes(data)
                tmp.replace(path)
            self.refs[digest] = self.refs.get(digest, 0) + 1
            return path

    def release(self, digest: str) -> None:
        with self._lock:
            n = self.refs.get(digest, 0) - 1
            if n <= 0:
                self.refs.pop(digest, None)
            else:
                self.refs[digest] = n


def load_module(path: Path, name: str) -> ModuleType:
    """Import a job's code from the library cache (once per process and code version)."""
    cached = sys.modules.get(name)
    if cached is not None and getattr(cached, "__file__", None) == str(path):
        return cached
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ServiceError(f"cannot load the job's code from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
