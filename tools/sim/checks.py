"""The checks of the whole cluster the scheduler runs every few steps (``check``: the
leader's state against a replay of the log, the tasks' key-value state, the JobManagers'
swallowed errors) and once the world has settled (``final_checks``: outboxes delivered,
retention, the jobs' results, the projector's tables against a replay)."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING

from sluice.services.jobs.state import TERMINAL_JOB, JobsState, SlotPool

from . import jobs as simjobs
from .invariants import (
    Violation,
    check_job_result,
    check_kvstate,
    check_outboxes,
    check_retention,
    normal_jobs,
    normal_membership,
)

if TYPE_CHECKING:
    from .actors import JMProcess
    from .cluster import Simulation

__all__ = ["check", "check_errors", "check_tables", "final_checks"]


def check_errors(proc: JMProcess) -> None:
    """A JobManager survived an error it did not expect (it logs it and goes on): a bug."""
    if proc.jm.errors:
        exc = proc.jm.errors[0]
        text = "".join(traceback.format_exception(exc)).strip().splitlines()
        raise Violation(f"{proc.name} survived an unexpected error (a bug): {text[-1]}\n" + "\n".join(text[-12:]))


def check(sim: Simulation) -> None:
    """The checks run every ``check_every`` steps."""
    sim.observer.catch_up()
    for job_id, run in sim.observer.jobs.jobs.items():
        check_kvstate(job_id, run)
    if simjobs.VIOLATIONS:
        raise Violation(simjobs.VIOLATIONS[0])
    for proc in sim.jms:
        check_errors(proc)
    if sim.skew is not None:
        sim.skew.check(sim)
    sim.comebacks.check(sim)
    fields, _ = sim.observer.reader.hgetall_with_ttl(sim.keys.leader)
    holder, epoch = fields.get(b"holder", b"").decode(), int(fields.get(b"epoch", b"0"))
    leader = next((p.jm for p in sim.jms if p.jm.leading and p.jm.id == holder and p.jm.epoch == epoch), None)
    # A leader that has not yet seen a restart of Redis may be ahead of what the log kept:
    # it finds out at its next write, and rebuilds.
    if leader is not None and leader.committer.server == sim.store.identity():
        # Jobs that ended leave the leader's memory (archived in its snapshots), jobs it is
        # still rebuilding are not in it yet (nor the slots they hold): the rest must match.
        recovering = set(leader.recovering)
        pool = SlotPool()
        for tm, slot, job_id, eid in sim.observer.jobs.pool.holders():
            if job_id not in recovering:
                pool.take(tm, slot, job_id, eid)
        logged_jobs = JobsState(
            {j: run for j, run in sim.observer.jobs.jobs.items() if j in leader.state.jobs.jobs}, pool
        )
        for job_id, run in sim.observer.jobs.jobs.items():
            if job_id not in leader.state.jobs.jobs and run.status not in TERMINAL_JOB and job_id not in recovering:
                raise Violation(f"job {job_id} is {run.status.value} in the log, but not in the leader's state")
            if job_id in leader.state.jobs.jobs and job_id in recovering:
                raise Violation(f"job {job_id} is in the leader's state while it is still being rebuilt")
        live, logged = normal_jobs(leader.state.jobs), normal_jobs(logged_jobs)
        if live != logged:
            raise Violation("the leader's state differs from the replay of the log:\n" + _diff(live, logged))
        if normal_membership(leader.state.membership) != normal_membership(sim.observer.membership):
            raise Violation(
                "the leader's membership differs from the replay of the log:\n"
                + _diff(normal_membership(leader.state.membership), normal_membership(sim.observer.membership))
            )


def final_checks(sim: Simulation) -> None:
    """The checks run once every job has ended after the faults stopped."""
    check(sim)
    check_outboxes(sim)
    leader = next(
        (
            p.jm
            for p in sim.jms
            if p.jm.leading and p.jm.replay is None and p.jm.committer.server == sim.store.identity()
        ),
        None,
    )
    if leader is not None:  # (a leader that has not yet seen a restart of Redis may be behind)
        check_retention(sim, leader)
    for job in sim.sim_jobs:
        run = sim.observer.jobs.jobs.get(job.job_id)
        if run is not None:
            check_job_result(sim, job, run)
    try:
        check_tables(sim)
    except Violation:
        raise
    except Exception as exc:
        raise Violation(f"projecting the log failed: {type(exc).__name__}: {exc}") from None


def check_tables(sim: Simulation) -> None:
    """The projector's tables equal the tables of a replay of the log."""
    from sluice.services.projector.core import JOB_PROJECTIONS, PROJECTIONS
    from sluice.store import ReadModels

    proj = sim.projector.projector
    log = sim.connect("checker")
    proj.log = log
    proj.tables = ReadModels(log)
    if not sim.projector.loaded:  # a call failed (maybe after it took effect): it reloads first, as its loop does
        proj.load()
    proj.catch_up()
    tables = ReadModels(log)
    keys = sim.keys
    for projection in PROJECTIONS:
        state = projection.initial()
        for _, env in log.replay(keys.facts(keys.cluster)):
            projection.evolve(state, env)
        _, rows = tables.read(keys.cluster, projection.name)
        want = {k: projection.row(state, k) for k in rows}
        if rows != want:
            raise Violation(f"table {projection.name} differs from the replay of the log:\n" + _diff(rows, want))
    for job_id in sim.observer.registered:
        tag = keys.job(job_id)
        for projection in JOB_PROJECTIONS:
            state = projection.initial()
            for _, env in log.replay(keys.facts(tag)):
                projection.evolve(state, env)
            _, rows = tables.read(tag, projection.name)
            want = {k: projection.row(state, k) for k in rows}
            if rows != want:
                raise Violation(
                    f"table {projection.name} of {job_id} differs from the replay of the log:\n" + _diff(rows, want)
                )


def _diff(a: dict, b: dict) -> str:
    lines = []
    for k in sorted(set(a) | set(b), key=str):
        if a.get(k) != b.get(k):
            lines.append(f"  {k}:\n    live:   {str(a.get(k))[:400]}\n    replay: {str(b.get(k))[:400]}")
    return "\n".join(lines[:6])
