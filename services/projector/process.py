"""The projector shell: follow the fact streams, fold, write rows and position atomically."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from sluice.errors import RedisUnavailable, StoreRestarted
from sluice.events import decode_fields
from sluice.services.common.gauges import projector_gauges
from sluice.services.common.metrics import ProjectorMetrics
from sluice.services.common.shell import RedisAway, get_logger
from sluice.services.jobmanager.snapshot_codec import SnapshotUnreadable, decode_job, install_job
from sluice.services.jobs.state import JobsState
from sluice.store import EventLog, ReadModels, Snapshots, entry_order

from .core import EXECUTION_GRAPH, JOB_PROJECTIONS, JOBS, PROJECTIONS, Projection, expand

__all__ = ["Projector"]


@dataclass
class _Running:
    projection: Projection
    tag: str
    stream: str
    position: str | None
    state: Any
    dirty: set[str] = field(default_factory=set)
    last_seen: str | None = None


class Projector:
    """Keeps every projection's table in step with its fact stream.

    Each batch of events is folded with the component's ``evolve``; the changed rows and
    the new position are written in one script that first checks the stored position is
    the one we started from, so every event is projected exactly once even with two
    projectors running or a crash between reading and writing.
    """

    def __init__(self, log: EventLog, projections: tuple[Projection, ...] = PROJECTIONS) -> None:
        self.log = log
        self.tables = ReadModels(log)
        self.server = ""
        self.logger = get_logger("projector")
        self.metrics = ProjectorMetrics()
        self.metrics.collect_with(lambda: projector_gauges(self))
        tag = log.keys.cluster
        self.running = [_Running(p, tag, log.keys.facts(tag), None, p.initial()) for p in projections]

    def load(self) -> None:
        # Pinned before anything is read: if the server restarts (and loses writes) after
        # this, what we project from may be gone, and our writes are refused.
        self.server = self.log.server_id()
        for r in self.running:
            self._load(r)
        self._add_jobs()

    def _load(self, r: _Running) -> None:
        r.position, rows = self.tables.read(r.tag, r.projection.name)
        r.dirty.clear()
        r.last_seen = None
        if r.projection.load is not None:
            r.state = r.projection.load(rows) if rows else r.projection.initial()
            return
        r.state = r.projection.initial()  # rebuilt by replaying up to the stored position
        if r.position is not None:
            after = self._seed(r)
            for entry_id, env in self.log.replay(r.stream, after):
                if entry_order(entry_id) > entry_order(r.position):
                    break
                r.projection.evolve(r.state, env)

    def _seed(self, r: _Running) -> str:
        """A job table's state starts from the leader's snapshot of the job when it covers no
        more than the table does (the same fold, so the same state): only the facts after
        it are replayed, and a restart costs what the job did lately, not its history.
        Returns the entry id after which to fold ('0-0': everything)."""
        job_id = self.log.keys.job_id_of(r.tag)
        if job_id is None or r.projection not in JOB_PROJECTIONS or r.position is None:
            return "0-0"
        stored = Snapshots(self.log).read(r.tag)
        if stored is None or entry_order(stored.position) > entry_order(r.position):
            return "0-0"
        try:
            snap = decode_job(stored.data, job_id)
        except SnapshotUnreadable as exc:
            self.logger.warning("snapshot unreadable; replaying the job's facts in full", job=job_id, why=str(exc))
            return "0-0"
        if r.projection is EXECUTION_GRAPH:
            state = JobsState()
            install_job(state, snap)
            r.state = state
        else:
            r.state = snap.run.kvstate if snap.run is not None else r.projection.initial()
        return stored.position

    def _add_jobs(self) -> None:
        """Every registered job gets its ExecutionGraph and KvStateLocation tables (a purged
        job has none: its keys are gone)."""
        jobs = next((r for r in self.running if r.projection is JOBS), None)
        if jobs is None:
            return
        have = {(r.tag, r.projection.name) for r in self.running}
        for job_id, row in jobs.state.items():
            if "purged_at" not in row:
                self.add_job(job_id, have)

    def add_job(self, job_id: str, have: set[tuple[str, str]] | None = None) -> None:
        """Follow one job's tables (also for a reader that wants only this job brought up to date)."""
        have = have if have is not None else {(r.tag, r.projection.name) for r in self.running}
        tag = self.log.keys.job(job_id)
        for projection in JOB_PROJECTIONS:
            if (tag, projection.name) not in have:
                r = _Running(projection, tag, self.log.keys.facts(tag), None, projection.initial())
                self._load(r)
                self.running.append(r)

    def run(self, stop: threading.Event, *, block_ms: int = 200) -> None:
        """Project until stopped; a Redis outage (also at the start) is waited out, then the
        tables are loaded again (the server may have restarted and lost writes)."""
        away = RedisAway(self.logger)
        loaded = False
        while not stop.is_set():
            try:
                if not loaded:
                    self.load()
                    loaded = True
                self.step(block_ms=block_ms)
                away.back()
            except RedisUnavailable as exc:
                stop.wait(away.away(exc))
                loaded = False

    def catch_up(self) -> int:
        """Project everything in the log now (no blocking); returns the events applied."""
        total = 0
        while True:
            n = self.step(block_ms=None)
            total += n
            if n == 0:
                return total

    def step(self, *, block_ms: int | None = 200) -> int:
        if self.log.server_id() != self.server:
            # Redis restarted: our tables may have lost writes that our memory still holds.
            if self.server:  # (not loaded yet otherwise)
                self.logger.info("the Redis server restarted; reloading the tables")
            self._reload()
        by_stream: dict[str, list[_Running]] = {}
        for r in self.running:
            by_stream.setdefault(r.stream, []).append(r)
        # All projections of one stream move together; read from the least advanced.
        positions = {s: min((r.position or "0-0" for r in rs), key=entry_order) for s, rs in by_stream.items()}
        if block_ms is None:
            entries = []
            for s, pos in positions.items():
                entries += [(s, i, f) for i, f in self.log.replay_raw(s, pos, page=1000)]
                if len(entries) > 5000:
                    break
        else:
            entries = self.log.follow(positions, block_ms=block_ms, count=1000)
        if not entries:
            return 0
        types = []
        for stream, entry_id, fields in entries:
            env = decode_fields(fields, stream=stream, entry_id=entry_id, codec=self.log.decode)
            types.append(env.event.TYPE)
            for r in by_stream[stream]:
                if r.position is not None and entry_order(entry_id) <= entry_order(r.position):
                    continue
                r.projection.evolve(r.state, env)
                r.dirty.update(r.projection.touched(env))
                r.last_seen = entry_id
        for r in self.running:
            new_pos = r.last_seen
            if new_pos is None or new_pos == r.position:
                continue
            dirty = expand(r.state, r.dirty) if r.projection is EXECUTION_GRAPH else r.dirty
            rows = {k: v for k in dirty if (v := r.projection.row(r.state, k)) is not None}
            r.dirty = set(dirty)
            gone = tuple(k for k in r.dirty if k not in rows)
            try:
                written = self.tables.write(
                    r.tag,
                    r.projection.name,
                    expected=r.position,
                    position=new_pos,
                    rows=rows,
                    deleted=gone,
                    server=self.server,
                )
            except StoreRestarted:
                self.logger.info("the Redis server restarted; reloading the tables")
                self._reload()
                break
            if written:
                r.position = new_pos
                r.dirty.clear()
                self.metrics.table_writes.inc()
            else:
                self.logger.debug("table moved under us; reloading", table=r.projection.name)
                self._reload()
                break
        self.metrics.handled(types)
        self._add_jobs()
        return len(entries)

    def _reload(self) -> None:
        for r in self.running:
            r.last_seen = None
        self.load()
