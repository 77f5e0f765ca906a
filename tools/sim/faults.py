"""Faults the simulation injects, and the seam it injects most of them through.

Swarm testing: each seed switches every kind of fault on or off and picks how often it
strikes, so rare combinations get explored instead of always the same average mix.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.errors import PartlyAppended, RedisUnavailable
from sluice.store.backend import Backend, Delegating

if TYPE_CHECKING:
    from .cluster import Simulation

__all__ = ["KINDS", "SHARD_KINDS", "Crash", "Faults", "FaultyBackend"]

KINDS = (
    "crash",  # a process dies (JobManager, TaskManager, worker, projector) and restarts
    "crash_mid_call",  # ... between two calls to the log, before or after a call took effect
    "conn_loss",  # a call fails with the connection lost, before or after it took effect
    "pause",  # a process stops being scheduled for a while (GC, a frozen VM)
    "interleave",  # other processes run inside one process's call to the log
    "redeliver",  # recovery delivers outboxes again, racing the leader's own delivery; a commit
    # that consumed inbox entries reaches Redis twice (a client retrying a lost reply)
    "heartbeat_loss",  # a TaskManager's heartbeats do not get through
    "clock_jump",  # time jumps ahead: leases expire, timeouts fire
    "redis_restart",  # Redis restarts and loses nothing (appendfsync always)
    "redis_lose",  # Redis restarts and loses up to its last second of writes (everysec)
    "user_error",  # a task's user code raises
    "coordinator_error",  # a user coordinator raises: its job fails
    "slow_reader",  # one TaskManager's tasks work 5x slower
    "hostile",  # malformed and hostile messages in every inbox; inboxes' keys overwritten with strings
    "cancel",  # a client cancels a job
    "deposed_read",  # a leader freezes (renewal thread too) just before it reads its inboxes, for longer than
    # its lease: another takes over, then the deposed one reads one more batch before it notices
    "schema_skew",  # jm0 is a newer Sluice (writes a later schema version the others cannot read); some
    # facts are written at an older version (read back by upcasting): tools/sim/skew.py
    "tm_back_same_session",  # a leader commits a TaskManager lost and dies before failing its attempts; the
    # TaskManager registers again under the same session (tools/sim/comeback.py)
    "clock_skew",  # each host's wall clock is off true time, and steps (NTP); monotonic clocks stay so
)

SHARD_KINDS = (
    "shard_failover",  # the master of one shard dies and its replica is promoted, without the writes it had
    # not yet received (up to the last second): only with --shards (the log on a Redis Cluster), so a seed
    # run without it draws and does what it always did
)


class Crash(BaseException):
    """The process running this code dies now (not an error any code may catch)."""


@dataclass
class Faults:
    """Which kinds are on for this seed, and each one's rate (chance per opportunity)."""

    rates: dict[str, float] = field(default_factory=dict)

    @classmethod
    def swarm(cls, rng: random.Random, kinds: tuple[str, ...] = KINDS, *, all_on: bool = False) -> Faults:
        rates = {}
        for kind in kinds:
            if all_on or rng.random() < 0.5:
                rates[kind] = rng.choice((0.2, 0.5, 1.0, 2.0))
        return cls(rates)

    @classmethod
    def none(cls) -> Faults:
        return cls({})

    def on(self, kind: str) -> bool:
        return kind in self.rates

    def hit(self, rng: random.Random, kind: str, base: float) -> bool:
        rate = self.rates.get(kind)
        return rate is not None and rng.random() < base * rate


class FaultyBackend(Delegating):
    """One process's connection to the log, through which the simulation strikes: a call
    may fail before or after it took effect (connection lost, or the process dying in
    between), or other processes may run while it waits."""

    def __init__(self, inner: Backend, sim: Simulation, actor: str, owner: Any = None) -> None:
        super().__init__(inner)
        self.sim, self.actor, self.owner = sim, actor, owner

    def around(self, name: str, call: Any) -> Any:
        sim = self.sim
        # What this call runs, taken now: another step of this process (its lease renewal)
        # may run while it waits.
        scripting = self.scripting if name == "script:commit" else None
        if not sim.faulting:
            if scripting is not None:
                sim.watch.fence_check(self.actor, scripting[1][0], int(scripting[2][0]), call)
            result = call()
            if name == "xreadgroup" and self.actor.startswith("jm"):
                sim.watch.read_by_jobmanager(self.actor, result)
            return result
        rng, faults = sim.rng, sim.faults
        sim.calls += 1
        rates = faults.rates  # (``faults.hit`` inlined: it runs four times a call)
        rate = rates.get("interleave")
        if rate is not None and rng.random() < 0.01 * rate and sim.depth == 0:
            sim.interleave(self.actor, self.owner)
        if (
            name == "xreadgroup"
            and self.actor.startswith("jm")
            and sim.depth == 0
            and faults.hit(rng, "deposed_read", 0.005)
        ):
            sim.freeze_inside(self.actor, self.owner)
        rate = rates.get("conn_loss")
        if rate is not None and rng.random() < 0.002 * rate:
            if rng.random() < 0.5:
                sim.note(f"{self.actor}: connection lost before {name}")
                raise RedisUnavailable(f"(simulated) connection lost before {name}")
            call()
            sim.note(f"{self.actor}: connection lost after {name} took effect")
            raise RedisUnavailable(f"(simulated) connection lost after {name}")
        rate = rates.get("crash_mid_call")
        if rate is not None and rng.random() < 0.0005 * rate and sim.can_crash(self.actor):
            if rng.random() < 0.5:
                sim.note(f"{self.actor}: dies before {name}")
                raise Crash(self.actor)
            call()
            sim.note(f"{self.actor}: dies after {name} took effect")
            raise Crash(self.actor)
        if name == "xadd" and self.actor.startswith("tm") and faults.hit(rng, "heartbeat_loss", 0.02):
            sim.note(f"{self.actor}: a message does not get through")
            raise RedisUnavailable("(simulated) network trouble")
        if scripting is not None:
            sim.watch.fence_check(self.actor, scripting[1][0], int(scripting[2][0]), call)
        result = call()
        if name == "xreadgroup" and self.actor.startswith("jm"):
            sim.watch.read_by_jobmanager(self.actor, result)
        if name == "xadd" and self.actor.startswith("tm"):
            sim.watch.sent_by_taskmanager(self.actor.split(".")[0], self.appending)
        return result

    def group_setid(self, stream: str, group: str, start: str) -> None:
        sim = self.sim
        if sim.faulting and self.actor.startswith("tm") and sim.faults.hit(sim.rng, "hostile", 0.2):
            # A TaskManager starting: its inbox goes between its group's creation and the move
            # to its end (finding 4 of issue 28: the NOGROUP that escaped its start)
            sim.note(f"client: deletes {stream} while {self.actor} starts")
            sim.watch.destroyed(stream)
            self.inner.delete(stream)
        super().group_setid(stream, group, start)

    def xadd_many(self, items: Any) -> list[str]:
        try:
            result = super().xadd_many(items)
        except PartlyAppended as exc:  # the ones that went were sent all the same
            self._sent_together([item for item, entry in zip(items, exc.ids) if entry is not None])
            raise
        self._sent_together(items)
        return result

    def _sent_together(self, items: Any) -> None:
        if self.actor.startswith("tm"):  # a TaskManager's reports sent together (see ``around``)
            for _, fields in items:
                self.sim.watch.sent_by_taskmanager(self.actor.split(".")[0], fields)

    def script(self, name: str, keys: Any, args: Any) -> Any:
        sent = args
        if name in ("commit", "snapshot") and self.sim.faults.on("schema_skew"):  # tools/sim/skew.py
            from .skew import skewed_commit, skewed_snapshot

            newer = self.actor.startswith("jm0.")
            if name == "snapshot":
                sent = [*args[:2], skewed_snapshot(args[2])] if newer else args
            else:
                sent = skewed_commit(
                    args, newer=newer, older=self.sim.faulting and self.sim.faults.hit(self.sim.rng, "schema_skew", 0.3)
                )
        result = super().script(name, keys, sent)
        if name == "commit" and result and result[0] in (b"OK", "OK"):
            self.sim.watch.committed(self.actor, int(args[0]), keys[0])
            self.sim.watch.check_order(keys, args)
            self.sim.watch.check_losses(self.actor, keys, args)
            self.sim.watch.check_reconciled(self.actor, keys, args)
            sim = self.sim
            if sim.faulting and int(args[3]) > 0 and sim.faults.hit(sim.rng, "redeliver", 0.05):
                # The same commit arrives again (a retry after a lost reply): it consumed its
                # inbox entries already, so it must change nothing.
                sim.note(f"{self.actor}: a commit of {keys[1]} reaches Redis twice")
                again = self.inner.script(name, keys, sent)
                if again and again[0] not in (b"DUP", "DUP"):
                    sim.watch.committed(self.actor, int(args[0]), keys[0])
        return result
