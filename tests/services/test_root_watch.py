"""A TaskManager's look at the leader's storage root: off its loop (a look that hangs is
reported as no answer in time, and the loop never waits for it), reported until sent,
again when what it sees changes, and only for the session the leader acknowledged."""

from __future__ import annotations

import threading
from pathlib import Path

from sluice.events import ReportStorageReach
from sluice.services.common import root_identity
from sluice.services.common.shell import get_logger
from sluice.services.taskmanager.root_watch import RootWatch

LOGGER = get_logger("test")


def test_it_reports_what_it_sees_once_sent_and_again_when_that_changes(tmp_path: Path) -> None:
    root = (tmp_path / "storage").as_uri()
    made = root_identity.ensure(root, lambda: "r-1", "h")
    path = str(tmp_path / "storage" / "_SLUICE_ROOT")
    w = RootWatch("tm-1", LOGGER, inline=True, relook_ms=1000)
    assert w.poll(0, "s1") is None  # no leader told a root yet
    w.expect("s1", root, made, now=0)
    assert w.poll(0, "s2") is None  # another session's: not this one's to report
    seen = ReportStorageReach("tm-1", "s1", root, "r-1", path, None)
    assert w.poll(0, "s1") == seen and w.poll(1, "s1") == seen  # until it is sent
    w.sent()
    assert w.poll(2, "s1") is None and w.poll(1001, "s1") is None  # looked again: nothing changed
    (tmp_path / "storage" / "_SLUICE_ROOT").unlink()  # the mount went away
    assert w.poll(1500, "s1") is None  # not looked at before its time
    assert w.poll(2001, "s1") == ReportStorageReach("tm-1", "s1", root, "r-1", path, "missing")
    w.sent()
    w.expect("s1", root, made, now=2100)  # a new leader acknowledged it: it says it again
    assert w.poll(2100, "s1") == ReportStorageReach("tm-1", "s1", root, "r-1", path, "missing")


def test_a_look_that_hangs_is_reported_as_no_answer_and_its_late_answer_after(tmp_path: Path) -> None:
    release = threading.Event()
    entered = threading.Event()

    def hung(storage_root: str, root_id: str) -> tuple[str, str | None]:
        entered.set()
        release.wait(30)
        return "/mnt/storage/_SLUICE_ROOT", None

    w = RootWatch("tm-1", LOGGER, look=hung, timeout_ms=5000)
    w.expect("s1", "file:///mnt/storage", "r-1", now=0)
    assert w.poll(0, "s1") is None  # the look runs on its own thread: poll returns at once
    assert entered.wait(30)
    assert w.poll(4999, "s1") is None
    overdue = w.poll(5000, "s1")
    assert overdue == ReportStorageReach(
        "tm-1", "s1", "file:///mnt/storage", "r-1", "/mnt/storage/_SLUICE_ROOT", "no answer within 5 s (a hung mount?)"
    )
    w.sent()
    assert w.poll(9000, "s1") is None  # no second look while the first still hangs
    release.set()
    assert w.looking is not None and w.looking.done.wait(30)
    assert w.poll(9001, "s1") == ReportStorageReach(
        "tm-1", "s1", "file:///mnt/storage", "r-1", "/mnt/storage/_SLUICE_ROOT", None
    )


def test_a_leader_with_no_root_identity_asks_nothing() -> None:
    w = RootWatch("tm-1", LOGGER, inline=True)
    w.expect("s1", "s3://bucket/storage", "", now=0)
    assert w.poll(0, "s1") is None
