"""The leadership lease: one holder at a time, an epoch that increases at every takeover."""

from __future__ import annotations

from dataclasses import dataclass

from .log import EventLog, _s, translate_errors
from . import scripts

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
        client = log.client
        self._acquire = client.register_script(scripts.LEASE_ACQUIRE)
        self._renew = client.register_script(scripts.LEASE_RENEW)
        self._release = client.register_script(scripts.LEASE_RELEASE)
        self.epoch: int | None = None

    def try_acquire(self) -> int | None:
        """The epoch if this holder now leads (newly or still), else None."""
        with translate_errors("taking the leadership lease"):
            epoch, state = self._acquire(keys=self._keys, args=[self.holder, self.ttl_ms])
        if int(state) >= 0:
            self.epoch = int(epoch)
            return self.epoch
        return None

    def renew(self) -> bool:
        if self.epoch is None:
            return False
        with translate_errors("renewing the leadership lease"):
            ok = self._renew(keys=self._keys[:1], args=[self.holder, self.epoch, self.ttl_ms])
        if not ok:
            self.epoch = None
        return bool(ok)

    def release(self) -> None:
        if self.epoch is None:
            return
        with translate_errors("releasing the leadership lease"):
            self._release(keys=self._keys[:1], args=[self.holder, self.epoch])
        self.epoch = None

    def current(self) -> LeaseHolder | None:
        return current_leader(self.log)


def current_leader(log: EventLog) -> LeaseHolder | None:
    """Who leads now, at which epoch (None when nobody holds the lease)."""
    key = log.keys.leader
    with translate_errors("reading the leadership lease"):
        pipe = log.client.pipeline(transaction=False)
        pipe.hgetall(key)
        pipe.pttl(key)
        fields, ttl = pipe.execute()
    if not fields:
        return None
    return LeaseHolder(_s(fields[b"holder"]), int(fields[b"epoch"]), int(ttl))
