"""Each kind of fault done to a live cluster across hosts, and how long it took to get back:
from the heal (the link up, the loss or latency gone, the host's processes started again) to
the struck TaskManager registered afresh / the cluster at full strength; for a cut leader,
from the cut to the standby leading. A TaskManager or leader that came back must be seen
refused (its log says so); what it still wrote is checked on the log after the run."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from sluice.events import LeadershipGranted, TaskManagerLost, TaskManagerRegistered
from sluice.store import LeaseHolder, current_leader
from tools.hosts import HostsCluster, faults

from ..checks import REFUSALS, refusal
from ..cluster import poll
from .fences import TM_REFUSALS
from .kinds import HostKind, HostStrike

__all__ = ["Outcome", "strike", "leading", "full_strength", "RECOVERY_TIMEOUT_S"]

RECOVERY_TIMEOUT_S = 90.0


@dataclass
class Outcome:
    kind: HostKind
    target: str
    recovered_s: float | None = None
    """None: not recovered within RECOVERY_TIMEOUT_S (or, for SKEW, nothing to recover from)."""
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    at_ms: int = 0
    """When it struck (wall clock, ms)."""


def _facts(c: HostsCluster) -> list:
    return list(c.log.replay(c.log.keys.facts(c.log.keys.cluster)))


def leading(c: HostsCluster) -> LeaseHolder | None:
    """The lease holder, once it has committed its LeadershipGranted (it leads, not replays)."""
    holder = current_leader(c.log)
    if holder is None:
        return None
    granted = any(isinstance(env.event, LeadershipGranted) and env.event.epoch == holder.epoch for _, env in _facts(c))
    return holder if granted else None


def full_strength(c: HostsCluster) -> bool:
    """Both JobManagers alive, one leading, every TaskManager host's TaskManager registered."""
    jms = [c.popen.get(n) for n in ("jm1", "jm2")]
    if any(p is None or p.poll() is not None for p in jms) or leading(c) is None:
        return False
    return {h.name for h in c.taskmanager_hosts()} <= c.registered()


def _registered_since(c: HostsCluster, tm: str, since_ms: int) -> bool:
    return any(
        isinstance(env.event, TaskManagerRegistered)
        and env.event.resource_id == tm
        and int(entry_id.split("-")[0]) >= since_ms
        for entry_id, env in _facts(c)
    )


def _lost_since(c: HostsCluster, tm: str, since_ms: int) -> bool:
    return any(
        isinstance(env.event, TaskManagerLost)
        and env.event.resource_id == tm
        and int(entry_id.split("-")[0]) >= since_ms
        for entry_id, env in _facts(c)
    )


def _offset(c: HostsCluster, host: str, name: str) -> int:
    f = c.log_file(host, name)
    return f.stat().st_size if f.exists() else 0


def strike(c: HostsCluster, s: HostStrike) -> Outcome:
    out = Outcome(s.kind, s.target, at_ms=int(time.time() * 1000))
    try:
        {
            HostKind.TM_CUT: _tm_cut,
            HostKind.JM_CUT: _jm_cut,
            HostKind.DROP: _drop,
            HostKind.LATENCY: _latency,
            HostKind.SKEW: _skew,
            HostKind.HOST_KILL: _host_kill,
        }[s.kind](c, s, out)
    finally:
        faults.heal(c)
    if out.recovered_s is None and not out.failures and s.kind is not HostKind.SKEW:
        out.failures.append(f"{s.describe()}: the cluster did not recover within {RECOVERY_TIMEOUT_S:.0f} s")
    return out


def _tm_cut(c: HostsCluster, s: HostStrike, out: Outcome) -> None:
    offset = _offset(c, s.target, s.target)
    faults.cut(c, s.target)
    t0 = time.monotonic()
    lost = poll(lambda: _lost_since(c, s.target, out.at_ms), s.hold_s + 10)
    if lost:
        out.notes.append(f"declared lost after {time.monotonic() - t0:.1f} s")
    time.sleep(max(0.0, s.hold_s - (time.monotonic() - t0)))
    faults.restore(c, s.target)
    healed, healed_ms = time.monotonic(), int(time.time() * 1000)
    if not lost:
        out.failures.append(f"{s.target} was cut off for {s.hold_s:.1f} s and never declared lost")
        return
    if poll(lambda: _registered_since(c, s.target, healed_ms), RECOVERY_TIMEOUT_S):
        out.recovered_s = time.monotonic() - healed
    log_file = c.log_file(s.target, s.target)
    line = poll(lambda: refusal(log_file, offset, TM_REFUSALS) or refusal(log_file, offset, FRESH), 30)
    if line is None:
        out.failures.append(
            f"{s.target} came back after it was declared lost and its log never said the leader "
            f"had stopped counting it in ({' / '.join(TM_REFUSALS + FRESH)})"
        )
    else:
        out.notes.append(f"{s.target} healed: {line[:160]}")


FRESH = ("AcknowledgeRegistration",)
"""A TaskManager the leader still counted in is answered AlreadyRegistered; one it declared
lost is acknowledged afresh (what its log says when it held no task to drop)."""


def _jm_cut(c: HostsCluster, s: HostStrike, out: Outcome) -> None:
    old = poll(lambda: leading(c), 60)
    if old is None:
        out.failures.append("no leader to cut off within 60 s")
        return
    host = out.target = old.holder
    offset = _offset(c, host, host)
    faults.cut(c, host)
    t0 = time.monotonic()

    def taken_over() -> bool:
        h = leading(c)
        return h is not None and h.epoch > old.epoch and h.holder != old.holder

    # Reconnected only once the standby leads (or the wait gave up): the old leader must come
    # back into a log fenced above its epoch.
    took = poll(taken_over, max(s.hold_s, RECOVERY_TIMEOUT_S))
    if took:
        out.recovered_s = time.monotonic() - t0
    time.sleep(max(0.0, s.hold_s - (time.monotonic() - t0)))
    faults.restore(c, host)
    line = poll(lambda: refusal(c.log_file(host, host), offset, STEPPED_DOWN), 30)
    if line is None:
        out.failures.append(
            f"{host} led at epoch {old.epoch}, was cut off, came back, and its log never said it "
            f"was refused or stepped down ({' / '.join(STEPPED_DOWN)})"
        )
    else:
        out.notes.append(f"{host} reconnected: {line[:160]}")
    said = _stale_commit(c, host, old.epoch)
    if said.startswith("refused"):
        out.notes.append(f"a commit at epoch {old.epoch} from {host}: {said[:160]}")
    else:
        out.failures.append(f"a commit at the deposed epoch {old.epoch} from {host} was not refused: {said[:300]}")


STEPPED_DOWN = (*REFUSALS, "standby")
"""What the deposed leader's log says once it is back: refused (it tried to write), or gone
standby under the new leader (Redis went away under it: it stepped down before writing)."""

_STALE_COMMIT = """import sys
from sluice.errors import StaleEpoch
from sluice.store import EventLog, Keys, connect
log = EventLog(connect(sys.argv[1]), Keys(sys.argv[2]))
try:
    log.commit(log.keys.cluster, int(sys.argv[3]), [])
except StaleEpoch as exc:
    print("refused:", exc)
else:
    print("accepted")
"""


def _stale_commit(c: HostsCluster, host: str, epoch: int) -> str:
    """An empty commit at ``epoch`` from ``host``, through its own link, as its JobManager would
    send one: what the fence said (``refused: ...``, or ``accepted``)."""
    done = c.hosts[host].run(
        sys.executable, "-c", _STALE_COMMIT, c.url_for(c.hosts[host]), c.prefix, str(epoch), check=False
    )
    return (done.stdout.strip() or done.stderr.strip()[-300:]) or f"exit {done.returncode}, no output"


def _resolve(c: HostsCluster, target: str) -> str:
    if target != "leader":
        return target
    holder = poll(lambda: leading(c), 60)
    return holder.holder if holder is not None else "jm1"


def _back(c: HostsCluster, out: Outcome) -> None:
    t0 = time.monotonic()
    if poll(lambda: full_strength(c), RECOVERY_TIMEOUT_S):
        out.recovered_s = time.monotonic() - t0
    lost = sorted(
        {
            env.event.resource_id
            for entry_id, env in _facts(c)
            if isinstance(env.event, TaskManagerLost) and int(entry_id.split("-")[0]) >= out.at_ms
        }
    )
    if lost:
        out.notes.append(f"declared lost meanwhile: {', '.join(lost)}")


def _drop(c: HostsCluster, s: HostStrike, out: Outcome) -> None:
    out.target = _resolve(c, s.target)
    faults.drop(c, out.target, s.loss)
    time.sleep(s.hold_s)
    faults.undrop(c, out.target)
    _back(c, out)


def _latency(c: HostsCluster, s: HostStrike, out: Outcome) -> None:
    faults.latency(c, s.target, *s.latency_ms)
    time.sleep(s.hold_s)
    faults.no_latency(c, s.target)
    _back(c, out)


def _skew(c: HostsCluster, s: HostStrike, out: Outcome) -> None:
    """The clock was set when the host started (``Layout.skew``): nothing to do now."""
    out.notes.append(f"{s.target} runs {s.offset} since it started")


def _host_kill(c: HostsCluster, s: HostStrike, out: Outcome) -> None:
    killed = faults.kill_host(c, s.target)
    out.notes.append(f"killed {len(killed)} processes")
    time.sleep(s.hold_s)
    restarted_ms = int(time.time() * 1000)
    faults.restart_host(c, s.target)
    t0 = time.monotonic()
    if poll(lambda: _registered_since(c, s.target, restarted_ms), RECOVERY_TIMEOUT_S):
        out.recovered_s = time.monotonic() - t0
