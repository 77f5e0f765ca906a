"""The leadership lease: one holder at a time, an epoch that increases at every takeover."""

from __future__ import annotations

from dataclasses import dataclass

from .backend import ScriptFailed
from .log import EventLog, _s, script_error

__all__ = ["LeaderLease", "LeaseHolder", "current_leader"]


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    holder: str
    epoch: int
    ttl_ms: int


class LeaderLease:
    """A Redis lease with TTL. Taking it over from nobody increases the epoch and raises
    the cluster tag's fence in the same script, so the deposed leader's commits fail."""

    def __init__(self, log: EventLog, holder: str, ttl_ms: int) -> None:
        self.log, self.holder, self.ttl_ms = log, holder, ttl_ms
        keys = log.keys
        self._keys = [keys.leader, keys.epoch, keys.fence(keys.cluster)]
        self.epoch: int | None = None
        self.server = ""
        """The server run id the holder expects (renewal fails once the server restarted)."""

    def try_acquire(self) -> int | None:
        """The epoch if this holder now leads (newly or still), else None."""
        epoch, state = self.log.backend.script("lease_acquire", self._keys, [self.holder, self.ttl_ms])
        if int(state) >= 0:
            self.epoch = int(epoch)
            return self.epoch
        return None

    def renew(self) -> bool:
        """Extend the lease; False (and no epoch) when it is lost, or the server restarted
        since the holder began (``server``)."""
        if self.epoch is None:
            return False
        try:
            ok = self.log.backend.script(
                "lease_renew", self._keys[:1], [self.holder, self.epoch, self.ttl_ms, self.server]
            )
        except ScriptFailed as exc:
            if "SLUICE_RESTARTED" not in exc.text:
                raise script_error(exc, self.log.keys.cluster) from exc
            ok = 0
        if not ok:
            self.epoch = None
        return bool(ok)

    def release(self) -> None:
        if self.epoch is None:
            return
        self.log.backend.script("lease_release", self._keys[:1], [self.holder, self.epoch])
        self.epoch = None

    def current(self) -> LeaseHolder | None:
        return current_leader(self.log)


def current_leader(log: EventLog) -> LeaseHolder | None:
    """Who leads now, at which epoch (None when nobody holds the lease)."""
    fields, ttl = log.backend.hgetall_with_ttl(log.keys.leader)
    if not fields:
        return None
    return LeaseHolder(_s(fields[b"holder"]), int(fields[b"epoch"]), int(ttl))
