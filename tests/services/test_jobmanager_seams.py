"""The JobManager's collaborators are built from what they use (services/jobmanager/,
issue 30): none takes the JobManager, none reaches back into it, every attribute of the
shell is set when it is built, and its phase is an enum. Some collaborators, built alone
from their few parts, as the shell builds them."""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path

from sluice.errors import StoreRestarted
from sluice.events import LeadershipGranted
from sluice.services.jobmanager import JobManager, Phase
from sluice.services.jobmanager.cluster import TimeoutGate
from sluice.services.jobmanager.restarts import ServerWatch, announce
from sluice.services.jobmanager.state import LeaderState
from sluice.services.jobmanager.unreadable import UnreadableWatch
from sluice.store import EventLog, Keys
from sluice.store.memory import MemoryBackend, MemoryStore

SERVICES = Path(__file__).resolve().parents[2] / "services"


class _Log:
    """A logger that keeps what it was told."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []

    def __getattr__(self, level: str):  # type: ignore[no-untyped-def]
        return lambda what, **kw: self.said.append((level, what))


def _log() -> EventLog:
    return EventLog(MemoryBackend(MemoryStore(clock=lambda: time.time_ns() // 1_000_000), "test"), Keys("seams"))


def test_no_module_of_services_takes_a_jobmanager_or_reaches_back_into_it() -> None:
    found = []
    for path in sorted(SERVICES.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in [*node.args.args, *node.args.kwonlyargs]:
                    if arg.annotation is not None and re.search(r"\bJobManager\b", ast.unparse(arg.annotation)):
                        found.append(f"{path.relative_to(SERVICES)}:{node.lineno} {node.name}({arg.arg})")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "jm":
                found.append(f"{path.relative_to(SERVICES)}:{node.lineno} jm.{node.attr}")
    assert found == []


def test_every_attribute_of_the_shell_is_set_when_it_is_built() -> None:
    jm = JobManager(_log(), jm_id="jm-seams", freeze_gc=False)
    assert jm.phase is Phase.STANDBY and jm.snapshots is None and jm.replay is None
    assert isinstance(jm.current(), LeaderState) and jm.epoch is None and not jm.leading
    before = set(vars(jm))
    jm.step_down()
    assert set(vars(jm)) == before  # stepping down sets nothing new


def test_the_phase_is_a_string_enum_that_reads_as_its_value() -> None:
    assert Phase("replaying") is Phase.REPLAYING and Phase.LEADING == "leading" and f"{Phase.STANDBY}" == "standby"


def test_heartbeat_timeouts_wait_for_a_fresh_read_but_never_longer_than_the_timeout() -> None:
    said = _Log()
    gate = TimeoutGate(1000, 500, said)
    assert gate.ready(100, caught_up=True, read_at=100) and not gate.while_behind
    assert not gate.ready(200, caught_up=False, read_at=200)  # behind since 200
    assert not gate.ready(1200, caught_up=False, read_at=1200)  # behind for the timeout, not longer
    assert gate.ready(1201, caught_up=False, read_at=1201) and gate.while_behind
    assert said.said == [("warning", "the cluster inbox stays behind; deciding heartbeat timeouts anyway")]
    assert gate.ready(1300, caught_up=True, read_at=1300) and not gate.while_behind


def test_a_restart_of_redis_is_noticed_and_announced_with_the_next_epoch() -> None:
    watch = ServerWatch("{x:cluster}")
    watch.seen("run-a")
    watch.seen("run-b")  # a standby saw the server change
    assert watch.saw_restart == ("run-a", "run-b")
    try:
        watch.check("run-c", leading_on="run-b")
    except StoreRestarted:
        pass
    else:
        raise AssertionError("a leader's server that restarted is not noticed")
    assert watch.saw_restart == ("run-b", "run-c")

    class Backend:
        def __init__(self, durable: bool) -> None:
            self._durable = durable

        def durable(self) -> bool:
            return self._durable

        def time_ms(self) -> int:
            return 5000

    granted = LeadershipGranted(2, "jm-b", "host", "run-c")
    last = LeadershipGranted(1, "jm-a", "host", "run-b")
    from sluice.services.membership.core import Membership

    said = _Log()
    grant, facts, consequences = announce(granted, last, None, Backend(durable=False), Membership(), said, Keys("t"))
    assert grant is granted and facts[-1] is granted and not consequences and facts[0].TYPE == "LogRestarted"
    assert announce(granted, last, None, Backend(durable=True), Membership(), said, Keys("t")) == (
        granted,
        [granted],
        True,
    )
    assert announce(granted, granted, None, Backend(durable=True), Membership(), said, Keys("t")) == (granted, [], True)


def test_an_unreadable_fact_is_said_once_and_waited_on_longer_each_time() -> None:
    from sluice.errors import UnknownEventType

    now = [0.0]
    said = _Log()
    watch = UnreadableWatch(_log(), said, lambda: now[0])
    exc = UnknownEventType("Later", stream="s", entry_id="1-0")
    watch.met(exc, 1.0, epoch=3, served=True)
    watch.met(exc, 1.0, epoch=None, served=False)
    assert [level for level, _ in said.said] == ["error", "debug"]
    assert watch.current is not None and watch.current.backoff_s == 2.0
    assert not watch.may_lead()  # not before its wait is over
    now[0] = 10.0
    assert watch.may_lead() and watch.current is None  # the entry is not in the log: gone
