"""The OperatorCoordinator interface and the context it acts through (FLIP-27, seeds PR
#10483 and #12225).

One coordinator per operator that declares one lives on the JobManager. It talks to the
operator's subtasks with ``OperatorEvent``s, which travel through the job's streams and
are facts in its log.

**Threads.** A coordinator may do blocking work on its own thread (``context.call_async``).
It never touches the JobManager's state: every context call (an event to a subtask, a
failure, a checkpoint request) is queued and applied by the JobManager's one main loop.
The framework calls the coordinator's methods holding ``context.lock``; a coordinator
thread that changes the coordinator's state, or sends events, takes the same lock, so a
checkpoint always sees a state that matches the events sent so far.

**Order of life (#12225).** Coordinators are created when the job is created (on the
leader, and on a new leader while it replays the log), so restored state can reach them
before anything runs: ``reset_to_checkpoint`` comes first, with an *unbound* context (a
call on it raises ``ContextNotBound``). The context is bound when the JobManager leads;
then ``start`` is called, once per leader.

**Delivery.** How events to subtasks survive a JobManager failover depends on
``deterministic``:

* ``False`` (the default; any coordinator, threads allowed): events are *held back* and
  released in the commit of the next checkpoint, which covers them. A new leader
  restores the last checkpoint and replays the inputs recorded after it (events from
  subtasks, subtask failures): what the coordinator sent in answer before the failover
  was never released, so nothing is sent twice, and the inputs are answered again, so
  nothing is lost.
* ``True`` (what it sends depends only on its state and its inputs, all on the main
  loop): events are released in the commit of the input that caused them (lowest
  latency). A new leader restores the last checkpoint and replays the inputs after it
  with sending muted, checking that it would send exactly what the log says it sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sluice.errors import ContextNotBound, CoordinatorError

__all__ = ["OperatorCoordinator", "CoordinatorContext", "ContextNotBound", "CoordinatorError"]


class OperatorCoordinator:
    """Override what you need; every method is called on the main loop with ``context.lock`` held."""

    deterministic: bool = False

    def __init__(self, context: CoordinatorContext) -> None:
        self.context = context

    def start(self) -> None:
        """The job runs (on this leader). Called after ``reset_to_checkpoint`` when restored."""

    def close(self) -> None:
        """The job ended or this JobManager stops leading: stop threads, release resources."""

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        """An ``OperatorEvent`` body from attempt ``attempt`` of ``subtask``."""

    def checkpoint_coordinator(self, checkpoint_id: int) -> Any:
        """The coordinator's state as JSON-able data, reflecting every input handed to it
        so far (including work still queued for its thread)."""
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The checkpoint is committed to the log."""

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        """Go back to the state of a checkpoint (a new leader restoring)."""

    def subtask_failed(self, subtask: int, attempt: int, reason: str | None) -> None:
        """That attempt of ``subtask`` failed (or was cancelled); it will not send again."""

    def subtask_reset(self, subtask: int, attempt: int) -> None:
        """``subtask`` will run again as attempt ``attempt``."""

    def subtask_scheduled(self, subtask: int, attempt: int) -> None:
        """That attempt of ``subtask`` was given a slot (it will run unless it fails first)."""

    def subtask_ready(self, subtask: int, attempt: int) -> None:
        """That attempt of ``subtask`` is running and reading its events."""

    def subtask_finished(self, subtask: int, attempt: int) -> None:
        """That attempt of ``subtask`` finished (its output is committed)."""


class CoordinatorContext:
    """How a coordinator acts on the job: every call becomes a queued action applied by
    the JobManager's main loop. Safe to call from any thread once bound."""

    def __init__(
        self, job_id: str, operator_id: str, parallelism: int, executor: Callable[[str], Any] | None = None
    ) -> None:
        """``executor(name)`` makes the coordinator's worker (an object with ``submit(fn)``
        and ``shutdown(wait=, cancel_futures=)``); by default a one-thread pool. The
        simulation passes one whose work runs as steps of its scheduler."""
        self.job_id, self.operator_id, self.parallelism = job_id, operator_id, parallelism
        self._make_executor = executor
        self.lock = threading.RLock()
        self._queue: list[tuple[str, Any]] = []
        self._queue_lock = threading.Lock()
        self._bound = False
        self._attempts = [0] * parallelism
        self._executor: Any = None
        self._closed = False
        self.now: int | None = None
        """While an event from a subtask is handled: when the leader recorded it (ms, the
        leader's clock; None for facts recorded before Sluice kept the time). A coordinator's
        only clock: it comes from the log, so a coordinator replayed after a failover sees
        the same times and decides the same."""

    # --- for coordinators ---
    def send_event(self, subtask: int, body: Any, attempt: int | None = None) -> None:
        """Send ``body`` to ``subtask`` (by default to its current attempt, or the one that
        will run next if it is not running: the event waits for it in its inbox)."""
        self._check()
        if not 0 <= subtask < self.parallelism:
            raise ValueError(
                f"{self.operator_id} has subtasks 0..{self.parallelism - 1}; there is no subtask {subtask}"
            )
        self._put("send", (subtask, self._attempts[subtask] if attempt is None else attempt, body))

    def fail_job(self, cause: BaseException | str) -> None:
        """Fail the job with ``cause`` as its root cause."""
        self._check()
        self._put("fail", cause)

    def request_checkpoint(self) -> None:
        """Checkpoint this coordinator at the end of the main loop's current pass."""
        self._check()
        self._put("checkpoint", None)

    def call_async(self, fn: Callable[[], Any], then: Callable[[Any], None] | None = None) -> None:
        """Run ``fn`` on the coordinator's own thread; ``then(result)`` runs afterwards on the
        main loop with the lock held. An exception in either fails the job."""
        self._check()
        if self._executor is None:
            if self._make_executor is not None:
                self._executor = self._make_executor(f"coordinator-{self.operator_id}")
            else:
                from concurrent.futures import ThreadPoolExecutor

                self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"coordinator-{self.operator_id}")

        def run() -> None:
            try:
                result = fn()
            except BaseException as exc:
                self._put("fail", exc)
                return
            if then is not None:
                self._put("call", (then, result))

        self._executor.submit(run)

    def current_attempt(self, subtask: int) -> int:
        return self._attempts[subtask]

    @property
    def bound(self) -> bool:
        return self._bound

    # --- for the framework ---
    def _check(self) -> None:
        if self._closed:
            raise ContextNotBound(
                f"the coordinator of {self.operator_id!r} (job {self.job_id}) is closed: its job ended or this "
                "JobManager stopped leading; stop its threads in close()"
            )
        if not self._bound:
            raise ContextNotBound(
                f"the coordinator of {self.operator_id!r} (job {self.job_id}) used its context before the "
                "JobManager leads: the context is bound when leadership is granted, after restore; "
                "do not send events, fail the job or start work in __init__ or reset_to_checkpoint"
            )

    def _put(self, kind: str, item: Any) -> None:
        with self._queue_lock:
            if not self._closed:
                self._queue.append((kind, item))

    def _take(self) -> list[tuple[str, Any]]:
        if not self._queue:  # the common case, without the lock (a list's truth is atomic)
            return []
        with self._queue_lock:
            out, self._queue = self._queue, []
            return out

    def _bind(self) -> None:
        self._bound = True

    def _close(self) -> None:
        with self._queue_lock:
            self._closed = True
            self._bound = False
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
