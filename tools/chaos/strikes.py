"""Striking: each kind of fault done to a live cluster, and how long the cluster took to
get back (from the strike, or for a freeze from the moment it was woken, to the next
leader leading / the TaskManager registered / the worker replaced / a leader rebuilt on the
restarted Redis)."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from sluice.store import LeaseHolder

from . import procs
from .checks import refusal
from .cluster import ChaosCluster, Proc, poll
from .kinds import Kind, Strike

__all__ = ["Outcome", "strike", "RECOVERY_TIMEOUT_S"]

RECOVERY_TIMEOUT_S = 90.0


@dataclass
class Outcome:
    kind: Kind
    target: str = ""
    recovered_s: float | None = None
    """None: the cluster did not get back within RECOVERY_TIMEOUT_S."""
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    at: float = 0.0
    """When it struck (time.time())."""
    progress_s: float | None = None
    """From the strike to the next task FINISHED in any job (the job making progress again)."""


def strike(c: ChaosCluster, s: Strike) -> Outcome:
    out = Outcome(s.kind, at=time.time())
    {
        Kind.LEADER_KILL: _leader_kill,
        Kind.LEADER_STOP: _leader_stop,
        Kind.TM_KILL: _tm_kill,
        Kind.WORKER_KILL: _worker_kill,
        Kind.TM_STOP: _tm_stop,
        Kind.REDIS_RESTART: _redis_restart,
    }[s.kind](c, s, out)
    if out.recovered_s is None and not out.failures:
        out.failures.append(
            f"{s.kind.value} of {out.target}: the cluster did not recover within {RECOVERY_TIMEOUT_S:.0f} s"
        )
    return out


def _pick(items: list, pick: float):
    return items[min(int(pick * len(items)), len(items) - 1)]


def _new_leader(c: ChaosCluster, old_epoch: int, old_holder: str) -> bool:
    h = c.leading()
    return h is not None and h.epoch > old_epoch and h.holder != old_holder


def _leader(c: ChaosCluster, out: Outcome, verb: str) -> tuple[LeaseHolder, Proc] | None:
    """The leader to strike (its lease and its process), named in ``out``; None (a failure
    said) when there is none within a minute."""
    holder = poll(c.leading, 60)
    if holder is None:
        out.failures.append(f"no leader to {verb} within 60 s")
        return None
    p = c.procs[holder.holder]
    out.target = f"{p.name} (epoch {holder.epoch})"
    return holder, p


def _leader_kill(c: ChaosCluster, s: Strike, out: Outcome) -> None:
    found = _leader(c, out, "kill")
    if found is None:
        return
    holder, p = found
    t0 = time.monotonic()
    procs.kill(p.pid, signal.SIGKILL)
    c.retired.add(p.name)
    standby = c.spawn("jobmanager")  # there is always a standby
    out.notes.append(f"started standby {standby.name}")
    if poll(lambda: _new_leader(c, holder.epoch, holder.holder), RECOVERY_TIMEOUT_S, tick=c.sample_workers):
        out.recovered_s = time.monotonic() - t0


def _leader_stop(c: ChaosCluster, s: Strike, out: Outcome) -> None:
    found = _leader(c, out, "freeze")
    if found is None:
        return
    holder, p = found
    log_file = c.log_file(p.name)
    offset = log_file.stat().st_size if log_file.exists() else 0
    t0 = time.monotonic()
    procs.kill(p.pid, signal.SIGSTOP)
    try:
        took = poll(lambda: _new_leader(c, holder.epoch, holder.holder), RECOVERY_TIMEOUT_S, tick=c.sample_workers)
        if took:
            out.recovered_s = time.monotonic() - t0
            time.sleep(1.0)  # the new leader commits; the frozen one wakes into a fenced log
    finally:
        procs.kill(p.pid, signal.SIGCONT)
    line = poll(lambda: refusal(log_file, offset), 30)
    if line is None:
        out.failures.append(
            f"{p.name} woke up after losing the lease at epoch {holder.epoch} and its log never "
            "said it was refused or stepped down (deposed / lost the lease / StaleEpoch)"
        )
    else:
        out.notes.append(f"{p.name} after SIGCONT: {line[:200]}")


def _tm_kill(c: ChaosCluster, s: Strike, out: Outcome) -> None:
    tms = c.live("taskmanager")
    p = _pick(tms, s.pick)
    out.target = p.name
    c.sample_workers()
    t0 = time.monotonic()
    procs.kill(p.pid, signal.SIGKILL)
    c.retired.add(p.name)
    new = c.spawn("taskmanager")
    out.notes.append(f"started {new.name}")
    if poll(lambda: new.name in c.registered(), RECOVERY_TIMEOUT_S, tick=c.sample_workers):
        out.recovered_s = time.monotonic() - t0


def _worker_kill(c: ChaosCluster, s: Strike, out: Outcome) -> None:
    found = poll(lambda: [(tm, w) for tm in c.live("taskmanager") for w in procs.workers_of(tm.pid)], 30)
    if not found:
        out.failures.append("no worker process to kill within 30 s")
        return
    tm, pid = _pick(found, s.pick)
    out.target = f"worker {pid} of {tm.name}"
    c.sample_workers()
    t0 = time.monotonic()
    procs.kill(pid, signal.SIGKILL)

    def replaced() -> bool:
        now = procs.workers_of(tm.pid)
        c.sample_workers()
        return pid not in now and len(now) >= c.slots

    if poll(replaced, RECOVERY_TIMEOUT_S):
        out.recovered_s = time.monotonic() - t0


def _tm_stop(c: ChaosCluster, s: Strike, out: Outcome) -> None:
    tms = c.live("taskmanager")
    p = _pick(tms, s.pick)
    out.target = p.name
    before = _lost(c, p.name)
    procs.kill(p.pid, signal.SIGSTOP)
    try:
        time.sleep(c.timing.heartbeat_timeout_ms / 1000 + 1.5)
        lost = poll(lambda: _lost(c, p.name) > before, 10, tick=c.sample_workers)
    finally:
        procs.kill(p.pid, signal.SIGCONT)
    t0 = time.monotonic()
    out.notes.append(f"{p.name} declared lost while frozen" if lost else f"{p.name} not declared lost while frozen")
    if poll(lambda: p.name in c.registered(), RECOVERY_TIMEOUT_S, tick=c.sample_workers):
        out.recovered_s = time.monotonic() - t0


def _lost(c: ChaosCluster, name: str) -> int:
    from sluice.events import TaskManagerLost

    return sum(
        1
        for _, env in c.log.replay(c.log.keys.facts(c.log.keys.cluster))
        if isinstance(env.event, TaskManagerLost) and env.event.resource_id == name
    )


def _redis_restart(c: ChaosCluster, s: Strike, out: Outcome) -> None:
    out.target = f"redis-server :{c.port} ({c.fsync})"
    killed_ms = int(time.time() * 1000)
    t0 = time.monotonic()
    c.kill_redis()
    time.sleep(s.pause_s)
    c.restart_redis()
    out.notes.append(f"down {time.monotonic() - t0:.1f} s")

    def rebuilt() -> bool:
        # A leader that took over (or rebuilt) on the restarted server: its grant is newer than the kill.
        h = c.leading()
        return h is not None and any(g.epoch == h.epoch and int(i.split("-")[0]) >= killed_ms for i, g in c.grants())

    if poll(rebuilt, RECOVERY_TIMEOUT_S, tick=c.sample_workers):
        out.recovered_s = time.monotonic() - t0
