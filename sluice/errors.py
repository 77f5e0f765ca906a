"""Every error Sluice raises, in one tree.

    SluiceError
     ├── EventError                  (events/: data and codecs)
     │    └── DecodeError            an entry that cannot become an event
     │         ├── NotJSON
     │         ├── MalformedEnvelope
     │         ├── UnknownEventType
     │         ├── UnsupportedSchemaVersion
     │         ├── MissingField
     │         ├── WrongFieldType
     │         └── UnexpectedField
     ├── StoreError                  (store/: everything Redis)
     │    ├── RedisUnavailable       the server cannot be reached
     │    ├── StaleEpoch             a fenced writer: its epoch is older than the tag's fence
     │    ├── StoreRestarted         the server restarted since the writer last looked
     │    ├── ScriptError            a Lua script answered with an error we did not expect
     │    ├── ScriptFailed           a script's error reply, as the backend saw it
     │    ├── NoGroup                a consumer group (or its stream) is gone
     │    ├── CommandError           a command's error reply (an invalid id, READONLY, ...)
     │    │    └── WrongType         WRONGTYPE: the key holds another kind of value
     │    ├── PartlyRead             (a cluster) some slot's streams refused a read, others' taken
     │    ├── PartlyAppended         some appends of a batch refused, the others taken
     │    └── IdsOutOfOrder          an entry copied with its id is not above its stream's last
     ├── ConfigError                 a setting is missing or wrong
     │    └── PrefixInUse            an import or rebuild into a prefix that holds keys
     ├── InvalidJobGraph             a JobGraph that cannot run (every problem listed)
     ├── JobRefusedError             the JobManager refused a submitted job
     ├── SnapshotUnreadable          (also a ValueError) a stored snapshot not usable: full replay
     ├── BadMoment                   an --at / --until that is neither an entry id nor a time
     ├── UnknownDeadLetter           no dead letter with that id (or it cannot be re-driven)
     ├── NotAnExport                 a file `sluice job import` cannot read (names file and line)
     ├── ApiError                    an answer other than 200 the dashboard decides (its status)
     ├── DataplaneError              (also a ValueError) a bad argument or input of the data plane
     │    ├── SplitError             input splits cannot be planned or read
     │    ├── SchemaError            a DataFrame lacks a column or schema
     │    └── StorageError           a file operation failed (bad URI, denied, unreachable)
     │         └── StorageNotFound   (also a FileNotFoundError) no such file, directory or bucket
     ├── MessageRejected             a well-formed message a core refuses (parked with the reason)
     │    ├── UnexpectedMessage      a message the cluster inbox does not take
     │    └── UnexpectedJobMessage   a message a job inbox does not take
     ├── IllegalTransition           a fact that is not a legal move of a task or job (a bug)
     ├── ServiceError                a component cannot go on (names the component)
     │    ├── ContextNotBound        a coordinator used its context before leadership
     │    ├── CoordinatorError       a coordinator failed (the job's root cause)
     │    ├── NoAnswer               a task's coordinator did not answer in time
     │    ├── TaskStartFailed        a step of starting a task failed (names the step)
     │    ├── StorageUnreachable     a TaskManager cannot see a job's storage root or inputs (no retry)
     │    ├── HandlerFailed          a core raised deciding a message (a bug: parked, state rebuilt)
     │    └── DuplicateCommit        a leader's commit found its messages decided already
     └── QueryableStateError         reading queryable state (sluice.state)
          ├── JobNotFound            no such job in this cluster (a lookup, a view, the client;
          │                          also named UnknownJob, as sluice.state's lookups raised it)
          ├── UnknownStateName       the job has no state under that name
          ├── StateNotRegistered     the key's key group has no state right now (retry)
          └── StateServerUnavailable the server the state lives on does not answer

Errors carry their context (which stream, which entry, which job) as attributes and
in their message, so a log line or a bug report explains itself.

Each class is declared here; a module whose callers expect it there also names it
(``sluice.views.archive.NotAnExport``, ``sluice.services.jobmanager.snapshot.SnapshotUnreadable``...).

Outside the tree on purpose: the simulation's ``Crash`` (a process dies) and ``Violation``
(an invariant broke), in tools/sim, are BaseExceptions, so no component's error handling can
swallow them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "SluiceError",
    "EventError",
    "DecodeError",
    "NotJSON",
    "MalformedEnvelope",
    "UnknownEventType",
    "UnsupportedSchemaVersion",
    "MissingField",
    "WrongFieldType",
    "UnexpectedField",
    "StoreError",
    "RedisUnavailable",
    "StaleEpoch",
    "StoreRestarted",
    "ScriptError",
    "ContextNotBound",
    "CoordinatorError",
    "ConfigError",
    "MessageRejected",
    "UnexpectedMessage",
    "UnexpectedJobMessage",
    "ServiceError",
    "ScriptFailed",
    "NoGroup",
    "CommandError",
    "WrongType",
    "InvalidJobGraph",
    "JobNotFound",
    "JobRefusedError",
    "DataplaneError",
    "SplitError",
    "StorageError",
    "StorageNotFound",
    "SchemaError",
    "NoAnswer",
    "TaskStartFailed",
    "StorageUnreachable",
    "HandlerFailed",
    "DuplicateCommit",
    "IllegalTransition",
    "QueryableStateError",
    "UnknownJob",
    "UnknownStateName",
    "StateNotRegistered",
    "StateServerUnavailable",
    "PartlyAppended",
    "PartlyRead",
    "IdsOutOfOrder",
    "PrefixInUse",
    "SnapshotUnreadable",
    "BadMoment",
    "UnknownDeadLetter",
    "NotAnExport",
    "ApiError",
]


class SluiceError(Exception):
    """Root of every error Sluice raises on purpose."""


class EventError(SluiceError):
    """Something is wrong with an event or its encoding."""


class DecodeError(EventError):
    """An entry could not be decoded into an event.

    ``stream`` and ``entry_id`` say where the entry is (``None`` when decoding bytes that
    did not come from a stream); ``reason`` says what is wrong with it.
    """

    kind = "undecodable"

    def __init__(self, reason: str, *, stream: str | None = None, entry_id: str | None = None) -> None:
        self.reason = reason
        self.stream = stream
        self.entry_id = entry_id
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.stream is not None or self.entry_id is not None:
            where = f" (stream {self.stream or '?'}, entry {self.entry_id or '?'})"
        return f"{self.kind}{where}: {self.reason}"

    def at(self, stream: str | None, entry_id: str | None) -> DecodeError:
        """The same error, now naming the stream and entry it came from."""
        self.stream, self.entry_id = stream, entry_id
        self.args = (self._render(),)
        return self


class NotJSON(DecodeError):
    kind = "not JSON"


class MalformedEnvelope(DecodeError):
    kind = "malformed envelope"


class UnknownEventType(DecodeError):
    kind = "unknown event type"


class UnsupportedSchemaVersion(DecodeError):
    """``version`` of ``type_name`` cannot be read by this Sluice, which reads up to
    ``current``: newer (``newer``: written by a later Sluice), below 1, or with an upcaster
    missing. The three are None when not known."""

    kind = "unsupported schema version"

    def __init__(
        self,
        reason: str,
        *,
        stream: str | None = None,
        entry_id: str | None = None,
        type_name: str | None = None,
        version: int | None = None,
        current: int | None = None,
    ) -> None:
        self.type_name, self.version, self.current = type_name, version, current
        super().__init__(reason, stream=stream, entry_id=entry_id)

    @property
    def newer(self) -> bool:
        return self.version is not None and self.current is not None and self.version > self.current


class MissingField(DecodeError):
    kind = "missing field"


class WrongFieldType(DecodeError):
    kind = "wrong field type"


class UnexpectedField(DecodeError):
    kind = "unexpected field"


class StoreError(SluiceError):
    """Redis refused, failed, or answered something we cannot use."""


class RedisUnavailable(StoreError):
    """The Redis server cannot be reached; ``url`` names it without its password."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        self.url = url
        super().__init__(message)


class StaleEpoch(StoreError):
    """A commit carried an epoch older than the fence of the tag it writes to.

    The writer has been deposed (another JobManager took over with ``current``);
    it must stop writing and step down.
    """

    def __init__(self, *, tag: str, epoch: int, current: int) -> None:
        self.tag, self.epoch, self.current = tag, epoch, current
        super().__init__(
            f"commit to {tag} refused: writer epoch {epoch} is older than the fence at epoch "
            f"{current}; a newer JobManager leads, this one must step down"
        )


class StoreRestarted(StoreError):
    """The server restarted (its run id is now ``run_id``) since the writer last looked.

    With ``appendfsync everysec`` a restart can lose the last second of acknowledged
    writes, so what the writer holds in memory may be ahead of the log: it must rebuild
    from the log before it writes again.
    """

    def __init__(self, *, tag: str, run_id: str) -> None:
        self.tag, self.run_id = tag, run_id
        super().__init__(
            f"write to {tag} refused: the Redis server restarted (run id now {run_id}) since this writer "
            "last read the log; it must rebuild its state from the log before writing again"
        )


class ScriptError(StoreError):
    """A Lua script failed in a way that is a bug or a corrupted key, not bad input."""


class ConfigError(SluiceError):
    """A setting is missing or has a value we cannot use."""


class MessageRejected(SluiceError):
    """A well-formed message that a core refuses to decide on (an id that cannot be used, a
    reply address that is not an inbox, a message the inbox does not take). Cores raise
    it before they change anything; the shell parks the entry in dead letters with this
    text as the reason, and goes on. Never a reason to rebuild."""

    kind = "rejected"


class UnexpectedMessage(MessageRejected):
    """A well-formed message the cluster inbox does not take."""


class UnexpectedJobMessage(MessageRejected):
    """A well-formed message a job inbox does not take."""


class IllegalTransition(SluiceError):
    """A fact that is not a legal move of a task attempt or a job (services/jobs/machine.py).
    Only a bug writes one; the message tells the attempt's or job's recent story."""


class ServiceError(SluiceError):
    """A component cannot go on; the message names the component and what to do."""


class ContextNotBound(ServiceError):
    """A coordinator used its context before the JobManager leads (during restore)."""


class CoordinatorError(ServiceError):
    """A coordinator failed; its job fails with this as the root cause."""


class QueryableStateError(SluiceError):
    """A lookup of queryable state failed; ``job_id`` and ``name`` say which state."""

    def __init__(self, message: str, *, job_id: str | None = None, name: str | None = None) -> None:
        self.job_id, self.name = job_id, name
        super().__init__(message)


class JobNotFound(QueryableStateError):
    """No job with that id in this cluster: a queryable-state lookup, a view of the log or a
    client call named one the cluster never had (or purged). ``job_id`` says which, when known."""


UnknownJob = JobNotFound
"""The name ``sluice.state``'s lookups raised it under (one class: code catching either works)."""


class UnknownStateName(QueryableStateError):
    """The job publishes no queryable state under that name (``known`` lists the names it has)."""


class StateNotRegistered(QueryableStateError):
    """The key's key group has no registered state right now (its task is restarting,
    failed, or the job was disposed): retrying later may succeed."""


class StateServerUnavailable(QueryableStateError):
    """The server a registration names (``address``) does not answer."""


class ScriptFailed(StoreError):
    """A script answered with an error; ``text`` is the error as the script wrote it (the
    log turns the ones it expects into StaleEpoch, StoreRestarted, ...)."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(text)


class NoGroup(StoreError):
    """A consumer group (or its stream) does not exist (it was deleted under a reader)."""


class CommandError(StoreError):
    """The server answered a command with an error (an invalid stream id, READONLY, ...):
    both backends raise it, the Redis one ``from`` redis-py's ``ResponseError``; ``text`` is
    the error as redis-py shows it (a leading ``ERR `` dropped). A missing group is NoGroup
    instead, and WRONGTYPE this class's WrongType."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(text)


class WrongType(CommandError):
    """A key read or written as a stream holds another kind of value (Redis's WRONGTYPE):
    something other than Sluice wrote it. Raised by both backends; ``text`` is Redis's error."""


class PartlyRead(StoreError):
    """A read of streams in several slots of a Redis Cluster (one command per slot) that
    some slot refused (``refused``: WrongType, NoGroup) while others gave ``entries``: those
    are taken (pending for the reader), so they come with the error; on one Redis the whole
    read fails and takes nothing."""

    def __init__(self, refused: StoreError, entries: list[tuple[str, str, Any]]) -> None:
        self.refused, self.entries = refused, entries
        super().__init__(f"{refused} (and {len(entries)} entries of other slots were read)")


class PartlyAppended(StoreError):
    """Redis refused some appends of a batch (e.g. WRONGTYPE: the key is not a stream) and
    took the others: ``ids`` holds each append's entry id in order, None where it was
    refused, and ``errors`` the refusals by position."""

    def __init__(self, ids: list[str | None], errors: dict[int, str]) -> None:
        self.ids, self.errors = ids, errors
        super().__init__(f"{len(errors)} of {len(ids)} appends refused: " + "; ".join(sorted(set(errors.values()))))


class InvalidJobGraph(SluiceError):
    """A JobGraph that cannot run; ``problems`` lists every one found."""

    def __init__(self, name: str, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"job {name!r} is not valid:\n{lines}")


class JobRefusedError(SluiceError):
    """The JobManager refused a submitted job (the message says why)."""


class DataplaneError(SluiceError, ValueError):
    """An argument or input of the data plane is wrong; the message says how to fix it. Also
    a ValueError, so plain Python callers can treat it as the bad value it is."""


class SplitError(DataplaneError):
    """Input splits cannot be planned or read (missing paths, unsupported formats or schemes)."""


class SchemaError(DataplaneError):
    """A DataFrame or an exchange directory lacks a column or schema the operation needs."""


class StorageError(DataplaneError):
    """A file operation of Sluice's own (services/dataplane/fs.py) failed: an unsupported or
    malformed location, access denied, storage unreachable. The message names the location."""


class StorageNotFound(StorageError, FileNotFoundError):
    """No such file, directory or bucket (also a FileNotFoundError, as pyarrow's and os's are)."""


class NoAnswer(ServiceError):
    """A task's coordinator did not answer in time (no JobManager leads?)."""


class TaskStartFailed(ServiceError):
    """Starting a task failed at ``step`` because of ``cause`` (the steps before were undone)."""

    def __init__(self, step: str, cause: BaseException) -> None:
        self.step, self.cause = step, cause
        super().__init__(f"starting the task failed at step '{step}': {type(cause).__name__}: {cause}")


class StorageUnreachable(ServiceError):
    """A TaskManager cannot see a job's storage root or one of its input files: every
    attempt there would fail the same way, so the job fails at once (no restart)."""

    def __init__(self, message: str, *, host: str, path: str) -> None:
        self.host, self.path = host, path
        super().__init__(message)


class HandlerFailed(ServiceError):
    """A core raised while deciding ``entry``: a bug. The entry is parked (so it can never
    loop the leader) and the state is rebuilt from the log (it may be ahead of it)."""

    def __init__(self, entry: Any, cause: BaseException) -> None:
        self.entry, self.cause = entry, cause
        super().__init__(
            f"deciding {entry.envelope.type} ({entry.stream} {entry.id}) failed: {type(cause).__name__}: {cause}"
        )


class DuplicateCommit(ServiceError):
    """A commit found its inbox entries already acknowledged: another leader decided them,
    so this leader's state is behind or ahead of the log. Rebuild."""


class IdsOutOfOrder(StoreError):
    """An entry whose id is not above the last one of its stream (a stream's ids only grow)."""


class PrefixInUse(ConfigError):
    """A prefix that already holds keys: imports and rebuilds only go into a fresh one."""


class SnapshotUnreadable(SluiceError, ValueError):
    """A stored snapshot that cannot be used: the log is replayed in full instead. Also a
    ValueError, as it was first declared (callers catch it with what decoding raises)."""


class BadMoment(SluiceError):
    """An ``--at`` / ``--until`` that is neither an entry id nor a time."""


class UnknownDeadLetter(SluiceError):
    """No dead letter with that id (or it cannot be re-driven)."""


class NotAnExport(SluiceError):
    """A file ``sluice job import`` cannot read: not an export, a version it does not know,
    or a line that is not what an export holds (the message names the file and the line)."""


class ApiError(SluiceError):
    """An answer other than 200 that the dashboard itself decides (not found, forbidden...);
    ``status`` is the HTTP status, ``headers`` any headers the answer carries."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers or {}
