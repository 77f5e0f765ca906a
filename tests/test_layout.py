"""The layout DESIGN.md fixes, guarded: packages, who may talk to Redis, the public APIs."""

from __future__ import annotations

import ast
import re
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


LAB = ("bench", "chaos", "sim", "hosts")


def test_the_wheel_holds_the_product_alone() -> None:
    """The benchmarks, the chaos campaign, the simulator and the hosts harness live in tools/,
    beside the packages and outside the wheel; no packaged module imports them."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert not [p for p in packages if p.startswith("tools") or set(p.split(".")) & set(LAB)]
    assert {d.name for d in (ROOT / "tools").iterdir() if (d / "__init__.py").exists()} >= set(LAB)
    offenders = [
        str(p.relative_to(ROOT))
        for folder in MAPPED.values()
        for p in sorted((ROOT / folder).rglob("*.py"))
        if "tools" in imports(p)
    ]
    assert offenders == []


REDIS_LIBRARIES = {"redis", "rq", "hiredis"}
REDIS_COMMANDS = {
    "xadd",
    "xrange",
    "xrevrange",
    "xread",
    "xreadgroup",
    "xautoclaim",
    "xclaim",
    "xack",
    "xpending",
    "xtrim",
    "xgroup_create",
    "xgroup_setid",
    "xgroup_destroy",
    "xinfo_groups",
    "xinfo_stream",
    "xlen",
    "hset",
    "hget",
    "hgetall",
    "hkeys",
    "hdel",
    "pttl",
    "pexpire",
    "expire",
    "incr",
    "scan_iter",
    "register_script",
    "evalsha",
    "execute_command",
    "pipeline",
    "flushdb",
    "flushall",
    "lpush",
    "rpush",
    "blpop",
}


def redis_calls(path: Path) -> list[str]:
    """Where a module imports a Redis library, reaches for a log's raw client, or calls a
    method named like a Redis command."""
    found = []
    tree = ast.parse(path.read_text())
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}  # keys.client(id) builds a key
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and {a.name.split(".")[0] for a in node.names} & REDIS_LIBRARIES:
            found.append(f"{path.name}:{node.lineno} imports a Redis library")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.split(".")[0] in REDIS_LIBRARIES
        ):
            found.append(f"{path.name}:{node.lineno} imports from {node.module}")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "client"
            and isinstance(node.ctx, ast.Load)
            and id(node) not in called
        ):
            found.append(f"{path.name}:{node.lineno} uses .client")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REDIS_COMMANDS:
            found.append(f"{path.name}:{node.lineno} calls .{node.func.attr}()")
    return found


def test_only_store_talks_to_redis() -> None:
    """Redis is reached through store/ only: no Redis library, raw client or Redis command
    anywhere else (the benchmarks' baselines excepted: they measure raw redis-py on purpose)."""
    offenders = [
        hit
        for folder in ("events", "services", "sluice", "tools")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p.parent.name != "bench"
        for hit in redis_calls(p)
    ]
    assert offenders == []


def test_the_layout_guard_catches_a_redis_call_outside_store(tmp_path: Path) -> None:
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        "def beat(log, key, hb):\n    pipe = log.client.pipeline()\n    pipe.xadd(key, hb)\n"
        "def skip(log, inbox):\n    log.backend.inner.client.xgroup_setid(inbox, 'g', '$')\n"
        "from rq import Queue\n"
    )
    hits = redis_calls(sneaky)
    assert any(".client" in h for h in hits) and any(".xadd()" in h for h in hits)
    assert any(".xgroup_setid()" in h for h in hits) and any("rq" in h for h in hits)


def test_events_are_data_and_codecs_only() -> None:
    for p in (ROOT / "events").rglob("*.py"):
        assert not imports(p) & {"redis", "socket", "time", "threading", "random", "os", "subprocess"}, p


def test_keys_are_built_in_one_module() -> None:
    """No module but store/keys.py spells a key suffix."""
    suffixes = ('":inbox"', '":facts"', '":outbox"', '":dead"', '":fence"', '":leader"', '":epoch"')
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("events", "store", "services", "sluice", "tools")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "keys.py" and any(s in p.read_text() for s in suffixes)
    ]
    assert offenders == []


def test_public_apis() -> None:
    assert {
        "Envelope",
        "encode",
        "decode",
        "decode_fields",
        "EVENT_TYPES",
        "TaskState",
        "KeyGroupRange",
        "RegisterTaskManager",
        "NotifyKvStateRegistered",
    } <= set(sluice.events.__all__)
    assert set(sluice.store.__all__) == {
        "Backend",
        "RedisBackend",
        "ClusterBackend",
        "open_backend",
        "Blobs",
        "connect",
        "redact",
        "Entry",
        "GroupConsumer",
        "Keys",
        "tag_of",
        "LeaderLease",
        "LeaseHolder",
        "current_leader",
        "CommitResult",
        "Consumed",
        "EventLog",
        "Out",
        "entry_order",
        "Deliverer",
        "ReadModels",
        "KvStates",
        "server_address",
        "Snapshots",
        "StoredSnapshot",
    }
    for name in sluice.events.__all__ + sluice.store.__all__:
        assert getattr(sluice.events, name, None) is not None or getattr(sluice.store, name, None) is not None, name


def test_every_error_is_declared_in_the_tree() -> None:
    """Every exception class of the packages is declared in sluice/errors.py, under SluiceError,
    and drawn in that module's docstring (a module may name one again by importing it)."""
    import inspect

    import sluice.errors

    declared = [
        f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"
        for folder in MAPPED.values()
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p != ROOT / "sluice" / "errors.py"
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(
            isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception")) or b.id in sluice.errors.__all__)
            for b in node.bases
        )
    ]
    assert declared == []
    classes = {n: c for n, c in vars(sluice.errors).items() if inspect.isclass(c) and issubclass(c, BaseException)}
    assert all(issubclass(c, sluice.errors.SluiceError) for c in classes.values())
    assert set(classes) == set(sluice.errors.__all__)
    drawn = sluice.errors.__doc__ or ""
    assert [n for n, c in classes.items() if c.__name__ == n and not re.search(rf"(── |^ +){n}\b", drawn, re.M)] == []
