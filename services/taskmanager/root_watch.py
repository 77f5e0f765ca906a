"""Whether this TaskManager sees the leader's storage root, looked at off its loop and
reported to the leader, which refuses jobs while a TaskManager cannot see it.

The leader names its root and the root's identity when it acknowledges a registration
(``AcknowledgeRegistration`` v2). The look (``root_identity.look``) reads one small file,
but on a shared filesystem whose mount hangs a read may never return: it runs on a thread
of its own, and the loop only asks whether it ended. A look without an answer within
``timeout_ms`` is reported as such (the heartbeats go on meanwhile); when it ends after
all, its answer is reported then. The root is looked at again every ``relook_ms``; a
report goes to the leader when what it says changed, or a new registration asks again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.events import ReportStorageReach
from sluice.services.common import root_identity

__all__ = ["RootWatch", "LOOK_TIMEOUT_MS", "RELOOK_MS"]

LOOK_TIMEOUT_MS = 5_000
"""A look that has not answered by then is reported as no answer (a hung mount)."""
RELOOK_MS = 30_000
"""How often the root is looked at again (a mount may go, or come, while the TaskManager runs)."""

Look = Callable[[str, str], tuple[str, "str | None"]]


@dataclass(frozen=True, slots=True)
class _Target:
    session: str
    storage_root: str
    root_id: str


@dataclass(slots=True)
class _Looking:
    """One look, on its own thread (or done already, inline)."""

    target: _Target
    started: int
    done: threading.Event = field(default_factory=threading.Event)
    answer: tuple[str, str | None] = ("", None)
    overdue_for: _Target | None = None
    """The target last told that this look has not answered in time."""


class RootWatch:
    """The storage root check of the TaskManager ``resource_id`` on ``host``. ``inline``: look
    on the caller's thread (a simulated world, whose steps must stay in the order it picks)."""

    def __init__(
        self,
        resource_id: str,
        logger: Any,
        *,
        inline: bool = False,
        look: Look = root_identity.look,
        timeout_ms: int = LOOK_TIMEOUT_MS,
        relook_ms: int = RELOOK_MS,
    ) -> None:
        self.resource_id, self.logger, self.inline, self.look = resource_id, logger, inline, look
        self.timeout_ms, self.relook_ms = timeout_ms, relook_ms
        self.target: _Target | None = None
        self.looking: _Looking | None = None
        self.next_look = 0
        self.said: tuple[_Target, str, str | None] | None = None
        """The last report the leader got."""
        self.pending: ReportStorageReach | None = None
        """A report made, not yet sent."""

    def expect(self, session: str, storage_root: str, root_id: str, now: int) -> None:
        """A registration was acknowledged: look at the leader's root (now, or as soon as a
        look under way ends) and report what is seen, even if nothing changed."""
        self.target = _Target(session, storage_root, root_id) if root_id else None
        self.next_look = now
        self.said = None
        self.pending = None

    def poll(self, now: int, session: str) -> ReportStorageReach | None:
        """What to report now to the leader (the same report until ``sent``), if anything."""
        target = self.target
        if target is None or target.session != session:
            return None
        answer: tuple[str, str | None] | None = None
        looking = self.looking
        if looking is not None:
            if looking.done.is_set():
                self.looking = None
                if looking.target == target:
                    answer = looking.answer
                    self.next_look = max(self.next_look, now + self.relook_ms)
            elif looking.overdue_for != target and now - looking.started >= self.timeout_ms:
                looking.overdue_for = target  # (a look that hangs holds up the next: this is its answer)
                path = root_identity.root_file(looking.target.storage_root)
                answer = (
                    str(path or looking.target.storage_root),
                    f"no answer within {self.timeout_ms / 1000:g} s (a hung mount?)",
                )
        if self.looking is None and answer is None and now >= self.next_look:
            answer = self._start(target, now)
        if answer is not None:
            self._report(target, answer)
        return self.pending

    def sent(self) -> None:
        """The pending report reached the leader's inbox."""
        if self.pending is not None and self.target is not None:
            self.said = (self.target, self.pending.path, self.pending.problem)
        self.pending = None

    def _start(self, target: _Target, now: int) -> tuple[str, str | None] | None:
        looking = _Looking(target, now)
        self.next_look = now + self.relook_ms

        def run() -> None:
            try:
                looking.answer = self.look(target.storage_root, target.root_id)
            except Exception as exc:  # (look says what it sees; anything else is said as it is)
                looking.answer = (target.storage_root, f"the look failed: {type(exc).__name__}: {exc}")
            looking.done.set()

        if self.inline:
            run()
            return looking.answer
        self.looking = looking
        threading.Thread(target=run, name=f"root-watch-{self.resource_id}", daemon=True).start()
        return None

    def _report(self, target: _Target, answer: tuple[str, str | None]) -> None:
        path, problem = answer
        if self.said == (target, path, problem):
            return
        before = self.said[2] if self.said is not None else None
        if problem is not None and (self.said is None or before != problem):
            self.logger.warning(
                "this TaskManager cannot see the leader's storage root: jobs are refused while it is registered",
                storage_root=target.storage_root,
                path=path,
                problem=problem,
            )
        elif problem is None and self.said is not None and before is not None:
            self.logger.info("this TaskManager sees the leader's storage root again", path=path)
        self.pending = ReportStorageReach(
            self.resource_id, target.session, target.storage_root, target.root_id, path, problem
        )
