"""A storage root's identity (``_SLUICE_ROOT``): made once, exclusively, read by every later
JobManager on the same root; a private root gets an id of its own; what a TaskManager sees."""

from __future__ import annotations

import itertools
import multiprocessing
from pathlib import Path

import pytest

from sluice.errors import StorageUnreachable
from sluice.services.common import root_identity


def ids(prefix: str):
    counter = itertools.count()
    return lambda: f"{prefix}-{next(counter)}"


def test_the_first_jobmanager_makes_the_id_and_the_next_ones_read_it(tmp_path: Path) -> None:
    shared = (tmp_path / "shared").as_uri()
    first = root_identity.ensure(shared, ids("a"), "host-a")
    assert first == "a-0" and (tmp_path / "shared" / "_SLUICE_ROOT").is_file()
    assert root_identity.ensure(shared, ids("b"), "host-b") == first  # a second JobManager, same root
    assert root_identity.ensure(str(tmp_path / "shared"), ids("c"), "host-c") == first  # a plain path is local too
    assert root_identity.ensure((tmp_path / "private").as_uri(), ids("d"), "host-d") == "d-0"
    assert [p.name for p in (tmp_path / "shared").iterdir()] == ["_SLUICE_ROOT"]  # nothing partial left


def _ensure(args: tuple[str, str]) -> str:
    root, name = args
    return root_identity.ensure(root, lambda: name, name)


def test_jobmanagers_starting_at_once_agree_on_one_id(tmp_path: Path) -> None:
    root = (tmp_path / "shared").as_uri()
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        seen = pool.map(_ensure, [(root, f"jm-{i}") for i in range(8)])
    assert len(set(seen)) == 1 and seen[0].startswith("jm-")


def test_a_root_of_another_scheme_has_no_identity() -> None:
    assert root_identity.ensure("s3://bucket/storage", ids("a"), "h") == ""
    assert root_identity.look("s3://bucket/storage", "x") == ("", None)


def test_a_root_the_jobmanager_cannot_write_is_said_naming_its_host_and_the_path(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(StorageUnreachable) as info:
        root_identity.ensure((blocked / "storage").as_uri(), ids("a"), "host-jm")
    assert (
        f"the JobManager on host host-jm cannot make or read the storage root's identity "
        f"{blocked / 'storage' / '_SLUICE_ROOT'}" in str(info.value)
    )
    assert info.value.host == "host-jm" and "README 'Across hosts'" in str(info.value)


def test_what_a_taskmanager_sees(tmp_path: Path) -> None:
    root = (tmp_path / "storage").as_uri()
    path = str(tmp_path / "storage" / "_SLUICE_ROOT")
    assert root_identity.look(root, "r-1") == (path, "missing")
    made = root_identity.ensure(root, lambda: "r-1", "h")
    assert root_identity.look(root, made) == (path, None)
    seen, why = root_identity.look(root, "r-2")
    assert seen == path and why is not None and "it holds the id r-1, not the leader's r-2" in why
    (tmp_path / "storage" / "_SLUICE_ROOT").write_text("{not json")
    assert root_identity.look(root, "r-1")[1].startswith("unreadable: ")  # type: ignore[union-attr]
