"""What a core decides, in one shape for every core: ``decide(state, stimulus, now) -> Decision``.

A core's door takes its state, one stimulus (a small frozen dataclass, or the message
itself) and the time, and returns a ``Decision``: the facts for the log, in order; the
messages to send, each to an ``Address`` (which inbox); and the other things its shell
carries out, as typed instructions (a note to log, a checkpoint, a vertex or a job to
fail...). A door does no I/O and never raises: a message it refuses to decide on is a
``Rejected`` decision, which the shell parks. The shell commits the facts with the sends
in one script.
Modelled on dask's ``handle_stimulus(*events) -> instructions`` and Temporal's
``activate(activation) -> completion``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple, TypeVar

from sluice.errors import MessageRejected
from sluice.events import Event

__all__ = [
    "Address",
    "Send",
    "Note",
    "Checkpoint",
    "FailVertex",
    "FailJob",
    "Recorded",
    "Deliver",
    "Rejected",
    "Instruction",
    "Decision",
]

Inbox = Literal["cluster", "job", "subtask", "taskmanager", "client"]


@dataclass(frozen=True, slots=True)
class Address:
    """Which inbox a message goes to; the shell turns it into a stream key."""

    kind: Inbox
    name: str = ""
    """taskmanager: its resource id; job and subtask: the job id; client: its reply stream; cluster: ""."""
    vertex: str = ""
    subtask: int = 0

    @classmethod
    def cluster(cls) -> Address:
        return cls("cluster")

    @classmethod
    def taskmanager(cls, resource_id: str) -> Address:
        return cls("taskmanager", resource_id)

    @classmethod
    def client(cls, reply_to: str) -> Address:
        return cls("client", reply_to)

    @classmethod
    def job(cls, job_id: str) -> Address:
        return cls("job", job_id)

    @classmethod
    def of_subtask(cls, job_id: str, vertex: str, subtask: int) -> Address:
        return cls("subtask", job_id, vertex, subtask)


class Send(NamedTuple):
    """Send ``event`` to the inbox at ``to``."""

    to: Address
    event: Event


@dataclass(frozen=True, slots=True)
class Note:
    """Why a stimulus was ignored or refused: for the shell's log."""

    text: str


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Checkpoint the job's coordinators now (``TriggerCheckpoint``)."""


@dataclass(frozen=True, slots=True)
class FailVertex:
    """Fail ``vertex`` without restart (a KvState clash); ``execution_id``: its attempt that caused it, if live."""

    vertex: str
    execution_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class FailJob:
    """Fail the job at once, without restarts (a coordinator failed)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Recorded:
    """Final states the log has: the TaskManager may forget them (task ids)."""

    task_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Deliver:
    """The decision's fact at index ``fact`` is also delivered to the inbox at ``to`` (a subtask's)."""

    fact: int
    to: Address


@dataclass(frozen=True, slots=True)
class Rejected:
    """The message was refused before anything was decided (the shell parks it with ``error``'s
    kind and text); a decision that holds one holds nothing else."""

    error: MessageRejected


Instruction = Note | Checkpoint | FailVertex | FailJob | Recorded | Deliver | Rejected
_I = TypeVar("_I", Note, Checkpoint, FailVertex, FailJob, Recorded, Deliver, Rejected)


@dataclass(slots=True)
class Decision:
    """What one stimulus causes. ``job_id``: the job whose log the facts go to ("": the
    cluster's); ``now``: when they were decided (their envelopes' time); ``jobs``: for a
    stimulus that touches several jobs, one decision per job, each committed on its own."""

    facts: list[Event] = field(default_factory=list)
    sends: list[Send] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)
    job_id: str = ""
    now: int = 0
    jobs: list[Decision] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.facts or self.sends)

    def of(self, kind: type[_I]) -> list[_I]:
        """The instructions of one kind, in order."""
        return [i for i in self.instructions if type(i) is kind]

    @property
    def rejected(self) -> MessageRejected | None:
        """Why the message was refused (None: it was decided)."""
        found = self.of(Rejected)
        return found[0].error if found else None

    @property
    def notes(self) -> list[str]:
        return [i.text for i in self.of(Note)]

    @property
    def note(self) -> str | None:
        """The last note (most stimuli explain themselves once), if any."""
        notes = self.notes
        return notes[-1] if notes else None

    def merge(self, other: Decision | None) -> None:
        """Append ``other``'s facts, sends and instructions (decided at the same time)."""
        if other is not None:
            assert other.now == self.now, "a merged decision was decided at another time"
            self.facts += other.facts
            self.sends += other.sends
            self.instructions += other.instructions
