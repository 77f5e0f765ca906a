"""The legal moves of a task attempt and of a job, and their groups of states: one table
each, in one place.

Every state change of a task or a job is decided by the jobs core and recorded as a fact;
``evolve`` (services/jobs/state.py) checks each fact against these tables before it
applies it, and refuses an illegal one with :class:`~sluice.errors.IllegalTransition`,
whose message tells that attempt's (or job's) recent story, so a bug report explains
itself (as dask's worker state machine does). The simulation runs every fact through the
same ``evolve``, so it checks the tables on every run.

A task's table has the moves of one attempt and the moves to a new attempt (a restart)
alike, so one check covers every move. The groups of states (terminal, stopping, live,
holding a slot, ...) are defined here, once, and used everywhere else.
"""

from __future__ import annotations

from typing import NamedTuple

from sluice.errors import IllegalTransition
from sluice.events import JobStatus, TaskState

__all__ = [
    "Move",
    "Why",
    "TASK_MOVES",
    "JOB_MOVES",
    "REPORTED",
    "check_task",
    "check_job",
    "story",
    "TERMINAL_TASK",
    "STOPPING_TASK",
    "LIVE_TASK",
    "HOLDS_SLOT",
    "STARTED_TASK",
    "UNDEPLOYED_TASK",
    "ABORTED_TASK",
    "TERMINAL_JOB",
    "STOPPING_JOB",
    "LIVE_JOB",
    "ABORTED_JOB",
]

C, SC, DE, IN, RU, FI, CI, CA, FA = (
    TaskState.CREATED,
    TaskState.SCHEDULED,
    TaskState.DEPLOYING,
    TaskState.INITIALIZING,
    TaskState.RUNNING,
    TaskState.FINISHED,
    TaskState.CANCELING,
    TaskState.CANCELED,
    TaskState.FAILED,
)


class Move(NamedTuple):
    """A move of a task: from ``old`` to ``new``, of the same attempt or (``restart``) to a
    new attempt, numbered higher, that replaces the current one."""

    old: TaskState
    new: TaskState
    restart: bool = False


class Why(NamedTuple):
    """Why such a move happens; ``reported``: a TaskManager or worker may report it for the
    current attempt (the leader decides every other move itself)."""

    text: str
    reported: bool = False


TASK_MOVES: dict[Move, Why] = {
    Move(C, SC): Why("the scheduler took a slot for it"),
    Move(C, CA): Why("its job was cancelled or failed before it was deployed"),
    Move(SC, DE): Why("sent to its TaskManager"),
    Move(SC, CA): Why("its job was cancelled or failed before it was deployed"),
    Move(SC, FA): Why("its TaskManager was lost before it was deployed"),
    Move(DE, IN): Why("its TaskManager started it", reported=True),
    Move(DE, RU): Why("its worker runs it (the INITIALIZING report is still on its way)", reported=True),
    Move(DE, FI): Why("it finished (earlier reports still on their way)", reported=True),
    Move(DE, FA): Why("deploying it failed, its TaskManager was lost, or the log restarted", reported=True),
    Move(DE, CI): Why("its job is being cancelled or failing"),
    Move(DE, CA): Why("the log restarted while its job was ending"),
    Move(IN, RU): Why("its worker runs it", reported=True),
    Move(IN, FI): Why("it finished (the RUNNING report is still on its way)", reported=True),
    Move(IN, FA): Why("it failed, or its TaskManager was lost, or the log restarted", reported=True),
    Move(IN, CI): Why("its job is being cancelled or failing"),
    Move(IN, CA): Why("the log restarted while its job was ending"),
    Move(RU, FI): Why("it finished", reported=True),
    Move(RU, FA): Why("it failed, or its TaskManager was lost, or the log restarted", reported=True),
    Move(RU, CI): Why("its job is being cancelled or failing"),
    Move(RU, CA): Why("the log restarted while its job was ending"),
    Move(CI, CA): Why("its TaskManager stopped it", reported=True),
    Move(CI, FA): Why("it failed while being cancelled", reported=True),
    Move(CI, FI): Why("it finished before the cancel reached it", reported=True),
    # A new attempt (TaskRestartScheduled), numbered higher than the current one:
    Move(FA, C, restart=True): Why("restarted: a new attempt follows the failed one"),
    Move(C, C, restart=True): Why(
        "the log restarted: a new attempt replaces one that never ran (a write the log lost may have deployed it)"
    ),
}
"""Every legal move of a task -> why it happens. Anything else is a bug."""

REPORTED: frozenset[tuple[TaskState, TaskState]] = frozenset(
    (m.old, m.new) for m, why in TASK_MOVES.items() if why.reported and not m.restart
)
"""The moves a TaskManager or worker may report for the current attempt (any other report
is stale or out of order, and is ignored with the reason)."""

JOB_MOVES: dict[tuple[JobStatus, JobStatus], str] = {
    (JobStatus.CREATED, JobStatus.RUNNING): "every source runs",
    (JobStatus.CREATED, JobStatus.FINISHED): "every task finished",
    (JobStatus.RUNNING, JobStatus.FINISHED): "every task finished",
    (JobStatus.CREATED, JobStatus.FAILING): "a task failed beyond its restarts, or a coordinator failed",
    (JobStatus.RUNNING, JobStatus.FAILING): "a task failed beyond its restarts, or a coordinator failed",
    (JobStatus.CREATED, JobStatus.CANCELLING): "cancelled",
    (JobStatus.RUNNING, JobStatus.CANCELLING): "cancelled",
    (JobStatus.FAILING, JobStatus.FAILED): "every task stopped",
    (JobStatus.CANCELLING, JobStatus.CANCELED): "every task stopped",
}
"""Every legal move of a job -> why it happens. (A job's restarts are its tasks' new
attempts: the job itself stays RUNNING meanwhile, as Flink's region failover keeps it.)"""


# --- the groups of states ----------------------------------------------------------------------

TERMINAL_TASK = frozenset(s for s in TaskState if s.terminal)
"""FINISHED, CANCELED, FAILED: the attempt is over (only a new attempt follows)."""
STOPPING_TASK = frozenset({CI})
"""Being cancelled: the leader waits for its TaskManager to stop it."""
LIVE_TASK = frozenset({DE, IN, RU})
"""Deployed and not being stopped: what it says (a partition produced, queryable state
registered) is taken."""
HOLDS_SLOT = frozenset({SC, DE, IN, RU, CI})
"""Placed on a TaskManager's slot, until it ends."""
STARTED_TASK = frozenset({RU, FI})
"""It ran (a source that started counts towards its job's RUNNING)."""
UNDEPLOYED_TASK = frozenset({C, SC})
"""Not yet sent to a TaskManager: cancelled at once, without asking anyone."""
ABORTED_TASK = frozenset({FA, CA})
"""Ended without finishing: what it registered goes with it."""

TERMINAL_JOB = frozenset({JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED})
"""The job is over."""
STOPPING_JOB = frozenset({JobStatus.FAILING, JobStatus.CANCELLING})
"""The job is failing or being cancelled: it waits for its tasks to stop."""
LIVE_JOB = frozenset({JobStatus.CREATED, JobStatus.RUNNING})
"""Neither over nor stopping: the job accepts messages (from its tasks, its coordinators'
input, a cancel), schedules its tasks and restarts them."""
ABORTED_JOB = frozenset({JobStatus.FAILED, JobStatus.CANCELED})
"""Ended without finishing: its queryable state goes with it."""


# --- the checks ---------------------------------------------------------------------------------


def story(history: list[tuple[int, str]] | None) -> str:
    if not history:
        return "(no earlier moves)"
    return "; ".join(f"{ts} {what}" for ts, what in history)


def _legal_from(old: TaskState) -> str:
    moves = [
        f"{m.new.value} ({'a new attempt' if m.restart else 'the same attempt'}: {why.text})"
        for m, why in TASK_MOVES.items()
        if m.old == old
    ]
    return "; ".join(moves) or "none (it is over)"


def check_task(
    what: str,
    old: TaskState,
    new: TaskState,
    history: list[tuple[int, str]] | None,
    *,
    current: int,
    attempt: int,
    restart: bool = False,
) -> Why:
    """The move of a task from ``old`` (its ``current`` attempt) to ``new`` (as ``attempt``:
    the same one, or a higher one for a ``restart``), with why it happens; raises
    IllegalTransition, with the subtask's story, if it is not a legal move."""
    why = TASK_MOVES.get(Move(old, new, restart))
    numbered = attempt > current if restart else attempt == current
    if why is not None and numbered:
        return why
    kind = f"a restart as attempt {attempt}" if restart else f"a move of attempt {attempt}"
    if why is None:
        problem = "is not a legal move of a task"
    elif restart:
        problem = "is not a legal move of a task: a new attempt is numbered higher than the current one"
    else:
        problem = "is not a legal move of a task: a fact about another attempt than the current one"
    raise IllegalTransition(
        f"{what}: {old.value} -> {new.value} ({kind}; the subtask is at attempt {current}) "
        f"{problem}. From {old.value} it may move to: {_legal_from(old)}. "
        f"Its story: {story(history)}"
    )


def check_job(job_id: str, old: JobStatus, new: JobStatus, history: list[tuple[int, str]] | None) -> str:
    """Why the job moves from ``old`` to ``new``; raises IllegalTransition, with the job's
    story, if it is not a legal move."""
    why = JOB_MOVES.get((old, new))
    if why is None:
        raise IllegalTransition(
            f"job {job_id}: {old.value} -> {new.value} is not a legal move of a job. Its story: {story(history)}"
        )
    return why
