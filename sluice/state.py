"""Reading queryable state: ``StateClient(log).get(job, name, key)``.

A key goes to its key group (Spark's Murmur3 ``pmod(hash(key), max_parallelism)``, the same
assignment the keyed exchange uses), the key group to the KvStateLocation of ``name`` (the
projector's ``kvstate`` table of the job: for each key-group range, the state id and the
server it lives on), and the state id to one HGET on that server.

Locations are cached per (job, name). The cache follows re-registrations: when a task
fails or moves, the leader unregisters its state and deletes it, so a cached location
that points to it finds it gone (or a key group unregistered) and reads the table again;
if the table still says the same, the job's table is brought up to date from the log (the
client needs no projector process) and read once more. Only then does it report an error.

State of a finished job stays queryable until the job is disposed
(``sluice job dispose JOB``, :meth:`StateClient.dispose`); a job that failed or was
cancelled unregisters its state when it ends.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass

import orjson

from sluice.errors import (
    JobNotFound,
    RedisUnavailable,
    SluiceError,
    StateNotRegistered,
    StateServerUnavailable,
    UnknownStateName,
)
from sluice.events import DisposeJob, Envelope, JobDisposed, JobRefused
from sluice.services.common.shell import new_id, now_ms
from sluice.services.dataplane.errors import DataplaneError
from sluice.services.dataplane.keygroups import key_group_of
from sluice.services.kvstate.codec import key_field
from sluice.store import EventLog, KvStates

__all__ = ["Location", "Lookup", "StateClient"]


@dataclass(frozen=True, slots=True)
class _Range:
    start: int
    end: int
    state_id: str
    address: str
    state_key: str
    server: KvStates


@dataclass(frozen=True)
class Location:
    """A KvStateLocation as the client holds it: ranges sorted by their first key group."""

    job_id: str
    name: str
    vertex: str
    num_key_groups: int
    starts: list[int]
    ranges: list[_Range]

    def range_of(self, key_group: int) -> _Range | None:
        i = bisect_right(self.starts, key_group) - 1
        if i >= 0 and self.ranges[i].end >= key_group:
            return self.ranges[i]
        return None


@dataclass(frozen=True)
class Lookup:
    """Where one key's value was found (``sluice state get --json`` prints it)."""

    job_id: str
    name: str
    key: object
    key_group: int
    vertex: str
    state_id: str
    address: str
    value: object


class StateClient:
    """Finds and reads any key's queryable state. Not thread-safe (one per thread)."""

    def __init__(self, log: EventLog, *, catch_up: bool = True) -> None:
        self.log = log
        self.home = KvStates(log.backend, log.keys)
        self.catch_up = catch_up
        self._locations: dict[tuple[str, str], Location] = {}
        self._servers: dict[str, KvStates] = {}

    # --- reading ---

    def get(self, job_id: str, name: str, key: object) -> object | None:
        """The value (the row, as JSON data) of ``key`` under ``name`` in job ``job_id``;
        None when the key has no value. Raises a QueryableStateError saying what is wrong."""
        loc = self._locations.get((job_id, name)) or self.location(job_id, name)
        kg = self._key_group(key, loc)
        field = key_field(key)
        r = loc.range_of(kg)
        if r is not None:
            raw = self._hget(r, field)
            if raw is not None:
                return orjson.loads(raw)
        return self.lookup(job_id, name, key).value

    def lookup(self, job_id: str, name: str, key: object) -> Lookup:
        """Like ``get``, with where the value was found; follows a re-registration."""
        field = key_field(key)
        loc = self._locations.get((job_id, name)) or self.location(job_id, name)
        for attempt in range(3):  # cached, then the table, then the table brought up to date
            kg = self._key_group(key, loc)
            r = loc.range_of(kg)
            if r is not None:
                raw = self._hget(r, field)
                if raw is not None:
                    return Lookup(job_id, name, key, kg, loc.vertex, r.state_id, r.address, orjson.loads(raw))
                if self._exists(r):
                    return Lookup(job_id, name, key, kg, loc.vertex, r.state_id, r.address, None)
            if attempt == 2:
                break
            loc = self.location(job_id, name, catch_up=True if attempt == 1 else None)
        raise StateNotRegistered(
            f"key group {kg} of {name!r} in job {job_id} (key {key!r}) has no registered state right now: the task "
            f"that owns it is restarting, has failed, or the job was disposed; retry in a moment "
            f"(`sluice status {job_id}` shows the tasks)",
            job_id=job_id,
            name=name,
        )

    def location(self, job_id: str, name: str, *, catch_up: bool | None = None) -> Location:
        """The KvStateLocation of ``name`` read from the table (and cached)."""
        row = self.home.location(job_id, name)
        if (row is None or catch_up) and (self.catch_up if catch_up is None else catch_up):
            self._catch_up(job_id)
            row = self.home.location(job_id, name)
        if row is None:
            self._locations.pop((job_id, name), None)
            if not self.home.job_exists(job_id):
                raise JobNotFound(
                    f"job not found: {job_id} (no such job in this cluster; `sluice list` shows the jobs)",
                    job_id=job_id,
                    name=name,
                )
            known = self.home.names(job_id)
            have = f"it publishes {', '.join(map(repr, known))}" if known else "it publishes no queryable state now"
            raise UnknownStateName(
                f"job {job_id} has no queryable state named {name!r} ({have}; a vertex publishes "
                "state with key_by(...).map(..., queryable='name'), and a failed, cancelled or "
                "disposed job publishes none)",
                job_id=job_id,
                name=name,
            )
        try:
            ranges = self._ranges(job_id, row)
        except StateServerUnavailable:
            if not self.catch_up or catch_up:
                raise
            return self.location(job_id, name, catch_up=True)  # the table may be behind the log
        loc = Location(job_id, name, row["vertex"], row["num_key_groups"], [r.start for r in ranges], ranges)
        self._locations[(job_id, name)] = loc
        return loc

    def _ranges(self, job_id: str, row: dict) -> list[_Range]:
        ranges = []
        for r in sorted(row["ranges"], key=lambda r: r["start"]):
            key = self.home.key(job_id, r["state_id"])
            ranges.append(
                _Range(r["start"], r["end"], r["state_id"], r["address"], key, self._server(r["address"], key))
            )
        return ranges

    def forget(self) -> None:
        """Drop every cached location (the next lookups read the table)."""
        self._locations.clear()

    # --- disposing ---

    def dispose(self, job_id: str, timeout: float = 30.0) -> JobDisposed:
        """Ask the leading JobManager to release an ended job's queryable state; returns its
        ``JobDisposed`` (the names released). Raises if the job is running or unknown."""
        keys = self.log.keys
        inbox = keys.inbox(keys.client(new_id()[:12]))
        self.log.append(keys.inbox(keys.cluster), Envelope(DisposeJob(job_id, inbox), new_id(), 0, now_ms(), job_id))
        deadline = time.monotonic() + timeout
        pos = "0-0"
        while time.monotonic() < deadline:
            for entry_id, env in self.log.replay(inbox, pos):
                pos = entry_id
                if isinstance(env.event, JobRefused):
                    raise (
                        JobNotFound(env.event.reason, job_id=job_id)
                        if "not found" in env.event.reason
                        else SluiceError(f"dispose refused: {env.event.reason}")
                    )
                if isinstance(env.event, JobDisposed):
                    self._locations = {k: v for k, v in self._locations.items() if k[0] != job_id}
                    if self.catch_up:
                        self._catch_up(job_id)  # the table shows it at once, projector or not
                    return env.event
            time.sleep(0.05)
        raise SluiceError(
            f"no JobManager answered within {timeout:.0f} s: is the cluster running? "
            "(`sluice cluster start`, or `sluice status` to see it)"
        )

    # --- helpers ---

    def _key_group(self, key: object, loc: Location) -> int:
        try:
            return key_group_of(key, loc.num_key_groups)  # type: ignore[arg-type]
        except DataplaneError as exc:
            raise SluiceError(f"key {key!r} cannot be looked up: {exc}") from exc

    def _hget(self, r: _Range, field: str) -> bytes | None:
        try:
            return r.server.get(r.state_key, field)
        except RedisUnavailable as exc:
            raise StateServerUnavailable(
                f"the state server at {r.address} (state {r.state_id}) does not answer: {exc}; is that Redis up?",
                job_id=None,
            ) from exc

    def _exists(self, r: _Range) -> bool:
        try:
            return r.server.exists(r.state_key)
        except RedisUnavailable as exc:
            raise StateServerUnavailable(f"the state server at {r.address} does not answer: {exc}") from exc

    def _server(self, address: str, state_key: str) -> KvStates:
        server = self._servers.get(address)
        if server is None:
            if self.home.serves(address):
                server = self.home
            else:
                try:
                    server = KvStates.at(address, self.log.keys)
                except RedisUnavailable as exc:
                    # An embedded cluster's Redis comes back on a new port with the same data:
                    # the state is then where the log is.
                    if not self.home.exists(state_key):
                        raise StateServerUnavailable(f"the state server at {address} does not answer: {exc}") from exc
                    server = self.home
            self._servers[address] = server
        return server

    def _catch_up(self, job_id: str) -> None:
        from sluice.services.projector import Projector

        projector = Projector(self.log, ())
        projector.add_job(job_id)
        projector.catch_up()
