"""The leader's side of the storage check before submission, with a real Redis, a real
JobManager and TaskManager (their workers run nothing): the root's identity told at
registration and reported back as a membership fact, a submission refused while a
registered TaskManager sees another root, and the markers of running jobs written again
by a new leader (a job an older Sluice accepted has none)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from sluice.events import JobRefused, JobRegistered, TaskManagerStorageReach
from sluice.services.common import root_identity
from sluice.services.common.job_marker import marker_path
from sluice.services.membership.core import TaskManagerRow
from sluice.store import EventLog
from tests.services.failover_helpers import (
    TinySlots,
    events,
    jm,
    lead,
    pump,
    register_tm,
    source_graph,
    started,
    submit,
    tm,
)


def _reported(row: TaskManagerRow | None, root_id: str) -> bool:
    return row is not None and row.root_id == root_id


@pytest.mark.timeout(60)
def test_a_taskmanager_that_sees_another_root_refuses_submissions_naming_its_host_and_the_path(
    log: EventLog, tmp_path: Path
) -> None:
    keys = log.keys
    world, a, t, _ = started(log, tmp_path)
    root = a.storage_root
    root_id = orjson.loads((tmp_path / "storage" / "_SLUICE_ROOT").read_bytes())["root_id"]
    members = a.state.membership
    pump(
        [lambda: t.step(block_ms=None), lambda: a.step(block_ms=None)],
        lambda: _reported(members.taskmanagers.get("tm-1"), root_id),
        what="tm-1's report",
        world=world,
    )
    assert members.taskmanagers["tm-1"].sees_root(root, root_id) is True
    submit(log, world, "j1", source_graph("j1"))
    pump(
        [lambda: a.step(block_ms=None)],
        lambda: bool(events(log, keys.facts(keys.cluster), JobRegistered)),
        what="j1 accepted",
        world=world,
    )

    # tm-2's path holds a root of its own (a directory of its host where the shared one should be mounted)
    (tmp_path / "storage" / "_SLUICE_ROOT").write_bytes(orjson.dumps({"root_id": "a-private-root"}))
    t2 = tm(log, world, tmp_path, TinySlots(), rid="tm-2")
    register_tm(a, t2, world)
    pump(
        [lambda: t2.step(block_ms=None), lambda: a.step(block_ms=None)],
        lambda: _reported(members.taskmanagers.get("tm-2"), root_id),
        what="tm-2's report",
        world=world,
    )
    path = tmp_path / "storage" / "_SLUICE_ROOT"
    facts = events(log, keys.facts(keys.cluster), TaskManagerStorageReach)
    assert [(f.resource_id, f.path, f.problem is None) for f in facts] == [
        ("tm-1", str(path), True),
        ("tm-2", str(path), False),
    ]
    reply_to = keys.inbox(keys.client("c2"))
    submit(log, world, "j2", source_graph("j2"), reply_to=reply_to)
    pump([lambda: a.step(block_ms=None)], lambda: bool(events(log, reply_to)), what="j2 answered", world=world)
    (refused,) = events(log, reply_to)
    assert isinstance(refused, JobRefused)
    assert refused.reason.startswith(
        f"TaskManager tm-2 on host host-a cannot see the storage root {root} ({path}: it holds the id "
        f"a-private-root, not the leader's {root_id}"
    )
    assert "README 'Across hosts'" in refused.reason
    assert [r.job_id for r in events(log, keys.facts(keys.cluster), JobRegistered)] == ["j1"]
    assert marker_path(root, "j2") is not None and not marker_path(root, "j2").is_file()  # type: ignore[union-attr]


@pytest.mark.timeout(60)
def test_a_second_leader_on_the_same_root_tells_the_same_identity(log: EventLog, tmp_path: Path) -> None:
    world, a, t, _ = started(log, tmp_path)
    made = a.cluster.root.known()
    assert made and root_identity.look(a.storage_root, made)[1] is None
    a.step_down()
    a.lease.release()
    b = jm(log, world, "jm-b", tmp_path)
    lead(b, world)
    assert b.cluster.root.known() == made


@pytest.mark.timeout(60)
def test_a_new_leader_writes_the_marker_of_a_running_job_that_has_none(log: EventLog, tmp_path: Path) -> None:
    keys = log.keys
    world, a, t, slots = started(log, tmp_path)
    submit(log, world, "j1", source_graph("j1"))
    pump(
        [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: bool(slots.launched),
        what="j1's first task",
        world=world,
    )
    marker = marker_path(a.storage_root, "j1")
    assert marker is not None and marker.is_file()
    marker.unlink()  # as a leader of an older Sluice left it: no marker
    (tmp_path / "storage" / "j2").mkdir()
    a.step_down()
    a.lease.release()
    b = jm(log, world, "jm-b", tmp_path)
    lead(b, world)
    pump([lambda: b.step(block_ms=None)], lambda: not b.recovering, what="j1 recovered", world=world)
    assert marker.is_file()
    assert orjson.loads(marker.read_bytes())["job_id"] == "j1"
    assert not (tmp_path / "storage" / "j2" / "_SLUICE_JOB").exists()  # no job of that id: nothing written
    assert events(log, keys.facts(keys.cluster), JobRegistered)[0].job_id == "j1"


@pytest.mark.timeout(60)
def test_the_leader_reads_the_roots_identity_again_once_it_is_old(log: EventLog, tmp_path: Path) -> None:
    """A JobManager started before the shared filesystem was mounted made an identity on its
    own disk, which the mount then hid: kept for ever, it would refuse every submission (every
    TaskManager reports the mounted root's id) until the JobManager restarts."""
    from sluice.services.jobmanager.storage_identity import REFRESH_MS

    world, a, _, _ = started(log, tmp_path)
    first = a.cluster.root.known()
    assert first
    (tmp_path / "storage" / "_SLUICE_ROOT").write_bytes(orjson.dumps({"root_id": "the-mounted-root"}))
    world.advance(REFRESH_MS // 2)
    assert a.cluster.root.known() == first  # not read on every submission
    world.advance(REFRESH_MS // 2 + 1)
    assert a.cluster.root.known() == "the-mounted-root"
