"""Content-addressed blobs: a job's code is stored once under its SHA-256."""

from __future__ import annotations

import hashlib

from .log import EventLog, translate_errors

__all__ = ["Blobs"]


class Blobs:
    def __init__(self, log: EventLog) -> None:
        self.log = log

    def put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        with translate_errors("storing a blob"):
            self.log.client.set(self.log.keys.blob(digest), data, nx=True)
        return digest

    def get(self, digest: str) -> bytes | None:
        with translate_errors(f"reading blob {digest[:12]}"):
            data = self.log.client.get(self.log.keys.blob(digest))
        if data is not None and hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(f"blob {digest} is corrupted: its content does not hash to its name")
        return data

    def exists(self, digest: str) -> bool:
        with translate_errors(f"reading blob {digest[:12]}"):
            return bool(self.log.client.exists(self.log.keys.blob(digest)))
