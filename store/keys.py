"""Every Redis key Sluice uses, built here and nowhere else.

All keys start with one configurable prefix and carry a Redis Cluster hash tag, so
every key one atomic commit touches lives in one slot:

    {<p>:cluster}:inbox        messages to the JobManager about the cluster
    {<p>:cluster}:facts        the cluster's facts (membership, leadership)
    {<p>:cluster}:outbox       replies waiting to be delivered to other tags' inboxes
    {<p>:cluster}:dead         entries of this tag's streams that failed to decode
    {<p>:cluster}:fence        highest leader epoch that wrote to this tag
    {<p>:cluster}:delivered    per origin outbox, the last entry delivered into this tag
    {<p>:cluster}:cursor:outbox  the last entry of this tag's outbox delivered (all before too)
    {<p>:cluster}:leader       the leadership lease (holder, epoch) with a TTL
    {<p>:cluster}:epoch        the epoch counter, increased at every takeover
    {<p>:cluster}:table:<name> a read model (e.g. taskmanagers), with
    {<p>:cluster}:position:<name>  the fact stream position it reflects
    {<p>:cluster}:snapshot     the leader's state folded from this tag's facts, with the
                               fact entry id it covers (a hash: pos, data)
    {<p>:cluster}:purged       one tombstone row per purged job (a hash: job id -> JSON of
                               when it was purged and how it had ended)
    {<p>:…}:inbox:not-a-stream:<ms>-<hex>  what was found in place of an inbox (another kind of
                               value), set aside when its reader made the inbox again
    {<p>:job:<id>}:…           the same shapes, per job, and
    {<p>:job:<id>}:task:<v>:<i>:inbox  events to subtask i of vertex v (splits, operator events)
    {<p>:job:<id>}:kvstate:<state id>  one task attempt's queryable state (a hash)
    {<p>:tm:<id>}:…            the same shapes, per TaskManager (its inbox)
    {<p>:client:<id>}:inbox    replies to one client (Success, JobRefused)
    {<p>:blob}:<sha256>        a job's code, content-addressed

and RQ's keys, all in one hash tag of their own, ``{<p>:rq}`` (``Keys.rq_prefix``: RQ
builds every key and channel from that one prefix, ``store/rq_keys.py``), so that one ACL
key pattern, ``~{<p>:*``, covers everything a cluster uses:

    {<p>:rq}:queue:<p>:<resource id>:slot-<n>   the RQ queue of one TaskManager slot
                               (``Keys.slot_queue`` names it; ``…:intermediate`` beside it),
                               served by the RQ worker named
                               ``<resource id>/slot-<n>@<host>.<pid>`` (``Keys.slot_worker``)
    {<p>:rq}:queues, :workers, :workers:<queue>, :worker:<name>   RQ's lists of them
    {<p>:rq}:job:<id>, :results:<id>, :execution:…, :executions:<id>   a task and its run
    {<p>:rq}:wip|finished|failed|deferred|ready|scheduled|canceled:<queue>   RQ's
                               registries (and ``:clean_registries:<queue>``, their lock)
    {<p>:rq}:suspended         set by ``rq suspend``
    {<p>:rq}:pubsub:<worker>   the channel of RQ's worker commands (ACL: ``&{<p>:*``)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from sluice.errors import ConfigError
from sluice.events.ids import id_problem, inbox_problem

__all__ = ["Keys", "tag_of"]

_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def tag_of(key: str) -> str:
    """The hash tag part (``{…}``) of a key built here (ConfigError for any other key)."""
    end = key.find("}")
    if not key.startswith("{") or end < 0:
        shown = key if len(key) <= 60 else key[:57] + "..."
        raise ConfigError(f"{shown!r} is not a Sluice key: it has no {{hash tag}}")
    return key[: end + 1]


@dataclass(frozen=True)
class Keys:
    prefix: str = "sluice"

    def __post_init__(self) -> None:
        if not _PREFIX_RE.match(self.prefix):
            raise ConfigError(f"key prefix {self.prefix!r} is not usable: use 1-64 letters, digits, '_', '.' or '-'")

    # --- tags ---
    @property
    def cluster(self) -> str:
        return "{" + self.prefix + ":cluster}"

    def job(self, job_id: str) -> str:
        return "{" + self.prefix + ":job:" + _check_id(job_id, "job id") + "}"

    def client(self, client_id: str) -> str:
        return "{" + self.prefix + ":client:" + _check_id(client_id, "client id") + "}"

    def blob(self, digest: str) -> str:
        """A job's code, stored once under its SHA-256."""
        return "{" + self.prefix + ":blob}:" + _check_id(digest, "blob digest")

    def job_id_of(self, tag: str) -> str | None:
        """The job id of a job's tag (None for any other tag)."""
        head = "{" + self.prefix + ":job:"
        return tag[len(head) : -1] if tag.startswith(head) else None

    def taskmanager(self, resource_id: str) -> str:
        return "{" + self.prefix + ":tm:" + _check_id(resource_id, "TaskManager resource id") + "}"

    def inbox_problem(self, key: str, kinds: tuple[str, ...] = ("client", "tm", "job")) -> str | None:
        """Why ``key`` is not the inbox of a client, TaskManager or job of this cluster
        (None when it is): where outbox entries may be delivered."""
        return inbox_problem(self.prefix, key, kinds)

    # --- per-tag keys ---
    @staticmethod
    def inbox(tag: str) -> str:
        return tag + ":inbox"

    @staticmethod
    def facts(tag: str) -> str:
        return tag + ":facts"

    @staticmethod
    def outbox(tag: str) -> str:
        return tag + ":outbox"

    @staticmethod
    def dead(tag: str) -> str:
        return tag + ":dead"

    @staticmethod
    def fence(tag: str) -> str:
        return tag + ":fence"

    @staticmethod
    def delivered(tag: str) -> str:
        return tag + ":delivered"

    @staticmethod
    def outbox_cursor(tag: str) -> str:
        """The last entry of the tag's outbox that has been delivered (everything before too)."""
        return tag + ":cursor:outbox"

    @staticmethod
    def table(tag: str, name: str) -> str:
        return tag + ":table:" + name

    @staticmethod
    def position(tag: str, name: str) -> str:
        return tag + ":position:" + name

    @staticmethod
    def snapshot(tag: str) -> str:
        """A hash: ``pos`` (the last fact entry id folded in) and ``data`` (the encoded state)."""
        return tag + ":snapshot"

    @property
    def purged(self) -> str:
        """The tombstones of purged jobs (``sluice job purge``): a hash, job id -> JSON."""
        return self.cluster + ":purged"

    @staticmethod
    def tag_pattern(tag: str) -> str:
        """A SCAN pattern matching every key of one hash tag (``{…}`` and what follows)."""
        return _glob_escape(tag) + "*"

    def transport(self, tag: str, task_inboxes: Iterable[str] = ()) -> list[str]:
        """The keys of a tag that carry messages rather than record them: its inbox, its
        outbox with its delivery cursor, the marks of what was delivered into it, and the
        subtask inboxes given (its facts, snapshot, tables, fence and dead letters are not)."""
        return [self.inbox(tag), self.outbox(tag), self.outbox_cursor(tag), self.delivered(tag), *task_inboxes]

    @staticmethod
    def set_aside(key: str, stamp: str) -> str:
        """Where a value found in place of the stream ``key`` (something else wrote it) is
        kept for a person to look at (``stamp``: when it was found, ms, and a few random
        characters, so that two findings in one millisecond keep both)."""
        return f"{key}:not-a-stream:{stamp}"

    @staticmethod
    def task_inbox(tag: str, vertex: str, subtask: int) -> str:
        """The inbox of one subtask (all its attempts; each event names its attempt), in the
        job's tag so the leader writes it in the commit that decides the event."""
        digest = hashlib.sha1(vertex.encode()).hexdigest()[:12]
        return f"{tag}:task:{digest}:{int(subtask)}:inbox"

    @staticmethod
    def kvstate(tag: str, state_id: str) -> str:
        """A hash holding one task attempt's queryable state (key -> value)."""
        return tag + ":kvstate:" + _check_id(state_id, "state id")

    @property
    def rq_prefix(self) -> str:
        """The prefix of every key and channel RQ makes for this cluster, ``{<p>:rq}``: one
        hash tag for all of RQ, so its multi-key commands stay in one slot, under the
        cluster's ACL pattern (``RQ_KEY_PREFIX`` of its processes: ``store/rq_keys.py``)."""
        return "{" + self.prefix + ":rq}"

    def slot_queue(self, resource_id: str, slot: int) -> str:
        """The RQ queue of one TaskManager slot, ``<p>:<resource id>:slot-<n>``, as ``rq info``
        lists it (its key: ``{<p>:rq}:queue:<p>:<resource id>:slot-<n>``)."""
        return f"{self.prefix}:{_check_id(resource_id, 'TaskManager resource id')}:slot-{int(slot)}"

    @staticmethod
    def slot_worker(resource_id: str, slot: int, host: str, pid: int, incarnation: int = 1) -> str:
        """The RQ worker name of one slot's worker, ``<resource id>/slot-<n>@<host>.<pid>``
        (``.<k>`` appended for the k-th worker of one process: RQ refuses a name whose
        registration has not expired, and a killed worker's lingers for minutes)."""
        name = f"{_check_id(resource_id, 'TaskManager resource id')}/slot-{int(slot)}@{host}.{int(pid)}"
        return name if incarnation <= 1 else f"{name}.{int(incarnation)}"

    def access_probes(self) -> tuple[str, str, str]:
        """Keys and a channel that are never written, which ``store/acl.py`` probes at the
        start to learn whether the Redis user may use the cluster's keys: the log's
        (``{<p>:cluster}:acl-probe``), RQ's (``{<p>:rq}:acl-probe``) and RQ's channels
        (``{<p>:rq}:pubsub:acl-probe``)."""
        return self.cluster + ":acl-probe", self.rq_prefix + ":acl-probe", self.rq_prefix + ":pubsub:acl-probe"

    # --- cluster-wide ---
    @property
    def leader(self) -> str:
        return self.cluster + ":leader"

    @property
    def epoch(self) -> str:
        return self.cluster + ":epoch"

    # --- discovery ---
    @property
    def pattern(self) -> str:
        """A SCAN pattern matching every key under this prefix."""
        return "{" + _glob_escape(self.prefix) + ":*"

    @staticmethod
    def is_dead_letter(key: str) -> bool:
        return key.endswith(":dead")

    @staticmethod
    def is_inbox(key: str) -> bool:
        return key.endswith(":inbox")

    @staticmethod
    def is_outbox(key: str) -> bool:
        return key.endswith(":outbox")

    def is_stream_name(self, key: str) -> bool:
        return key.startswith("{" + self.prefix + ":") and key.rsplit(":", 1)[-1] in (
            "inbox",
            "facts",
            "outbox",
            "dead",
        )


def _check_id(value: str, what: str) -> str:
    problem = id_problem(value, what)
    if problem is not None:
        raise ConfigError(problem)
    return value


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
