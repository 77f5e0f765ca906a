"""Content-addressed blobs: a job's code is stored once under its SHA-256."""

from __future__ import annotations

import hashlib

from .log import EventLog

__all__ = ["Blobs"]


class Blobs:
    def __init__(self, log: EventLog) -> None:
        self.log = log

    def put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        self.log.backend.set(self.log.keys.blob(digest), data, nx=True)
        return digest

    def get(self, digest: str) -> bytes | None:
        data = self.log.backend.get(self.log.keys.blob(digest))
        if data is not None and hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(f"blob {digest} is corrupted: its content does not hash to its name")
        return data

    def exists(self, digest: str) -> bool:
        return bool(self.log.backend.exists(self.log.keys.blob(digest)))
