"""The layout DESIGN.md fixes, guarded: packages, who may talk to Redis, the public APIs."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import sluice.events
import sluice.store

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"sluice": "sluice", "sluice.events": "events", "sluice.store": "store", "sluice.services": "services"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_package_directory_is_packaged() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == MAPPED
    found = set()
    for package, folder in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found == set(config["packages"])


def test_only_store_talks_to_redis() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("events", "services", "sluice")
        for p in (ROOT / folder).rglob("*.py")
        if "redis" in imports(p) and p.parent.name != "bench"  # the benchmark's baseline is raw redis-py
    ]
    assert offenders == []


def test_events_are_data_and_codecs_only() -> None:
    for p in (ROOT / "events").rglob("*.py"):
        assert not imports(p) & {"redis", "socket", "time", "threading", "random", "os", "subprocess"}, p


def test_keys_are_built_in_one_module() -> None:
    """No module but store/keys.py spells a key suffix."""
    suffixes = ('":inbox"', '":facts"', '":outbox"', '":dead"', '":fence"', '":leader"', '":epoch"')
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("events", "store", "services", "sluice")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "keys.py" and any(s in p.read_text() for s in suffixes)
    ]
    assert offenders == []


def test_public_apis() -> None:
    assert {"Envelope", "encode", "decode", "decode_fields", "EVENT_TYPES", "TaskState", "KeyGroupRange",
            "RegisterTaskManager", "NotifyKvStateRegistered"} <= set(sluice.events.__all__)
    assert set(sluice.store.__all__) == {
        "Blobs", "connect", "redact", "Entry", "GroupConsumer", "Keys", "tag_of", "LeaderLease", "LeaseHolder",
        "current_leader", "CommitResult", "Consumed", "EventLog", "Out", "entry_order", "Deliverer", "ReadModels",
        "KvStates", "server_address",
    }
    for name in sluice.events.__all__ + sluice.store.__all__:
        assert getattr(sluice.events, name, None) is not None or getattr(sluice.store, name, None) is not None, name
