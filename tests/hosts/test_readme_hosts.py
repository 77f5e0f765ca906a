"""The 'Across hosts' section (docs/hosts.md, linked from the README), followed step by step
on hosts of their own.

Bare hosts (``Layout(bare=True)``: namespaces, private ``/tmp``, nothing running) play the
machines: ``storage`` runs the storage block, ``redis`` the Redis block, ``jm1`` and ``jm2``
the JobManager block (``jm2`` the projector's too), ``tm1`` and ``tm2`` the TaskManager
block, each Sluice machine the block every one of them runs first; then ``redis`` plays the
machine a user submits from (that block and the client block). Each machine's blocks run, as
the page writes them, in one ``bash -euo pipefail`` from the checkout, with the checkout's
``.venv/bin`` on ``PATH`` and ``SLUICE_REDIS_PASSWORD`` in the environment (the section's
prerequisites), after ``tests/hosts/readme.py`` filled in the placeholders with the hosts'
addresses and paths. The test itself only waits for what a user would see come up and checks
the result: the job FINISHED with exactly the counts plain Python computes, its subtasks ran
on both TaskManager hosts (by the addresses they advertised), Redis refuses a client without
the ACL user, and each metrics endpoint and the dashboard answer on the address they were
told to bind.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from sluice.client import Client
from sluice.errors import RedisUnavailable
from sluice.events import JobStatus
from sluice.store import EventLog, Keys, connect, current_leader
from sluice.views.taskmanagers import taskmanagers
from tools.chaos.cluster import poll
from tools.hosts import Host, HostsCluster, Layout
from tools.hosts.placement import hosts_by_vertex

from .readme import PAGE, README, blocks, fill

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]

CHECKOUT = README.parent
MACHINES = {
    "storage": ("storage",),
    "redis": ("redis",),
    "jm1": ("every", "jobmanager"),
    "jm2": ("every", "jobmanager", "projector"),
    "tm1": ("every", "taskmanager"),
    "tm2": ("every", "taskmanager"),
}
"""Host -> the page's blocks it runs, in order, to bring the cluster up."""
CLIENT = ("redis", ("every", "client"))
"""The machine a user submits from, and what it runs."""
METRICS = {"jm1": (9250,), "jm2": (9250, 9252), "tm1": (9251,), "tm2": (9251,)}
"""The metrics ports the page's blocks give each host (checked to answer on its address)."""
WORDS = "The sluice gate's water flows; a river, a lock. Canal basin: SPARK, flink & stream!".split()


def corpus(path: Path, lines: int, seed: int = 29) -> Counter[str]:
    """A text of ``lines`` lines (mixed case, punctuation), and its word counts as the
    example's tokenizer defines words (lower case, runs of ``[a-z0-9']``), in plain Python."""
    rng = random.Random(seed)
    text = [
        " ".join(rng.choice(WORDS) + str(rng.randint(0, 400)) * (rng.random() < 0.3) for _ in range(rng.randint(1, 14)))
        for _ in range(lines)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n")
    return Counter(w for line in text for w in re.split(r"[^a-z0-9']+", line.lower()) if w)


def script(host: Host, names: tuple[str, ...], section: dict[str, str], values: dict[str, str]) -> str:
    """What ``host`` runs: ``cd`` to the checkout, then its blocks as written, filled in."""
    mine = {**values, "THIS_HOST": host.address, "/var/lib/sluice": str(host.directory / "var-lib-sluice")}
    return "\n".join([f"cd {CHECKOUT}", *(fill(n, section[n], mine) for n in names)]) + "\n"


def run_blocks(host: Host, text: str, env: dict[str, str], what: str) -> subprocess.Popen[bytes]:
    log = host.directory / f"readme-{what}.log"
    return host.spawn(["bash", "-euo", "pipefail", "-c", text], log=log, env=env)


def finished(proc: subprocess.Popen[bytes], host: Host, what: str, timeout: float) -> str:
    """Wait for a machine's blocks to run through; their output. Fails naming the machine
    when a command failed (``-e``) or they did not end in time."""
    log = host.directory / f"readme-{what}.log"
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the page's blocks on {host.name} ({what}) did not end within {timeout:.0f} s:\n{log.read_text()[-3000:]}"
        )
    out = log.read_text()
    assert code == 0, f"a command of the page on {host.name} ({what}) failed (exit {code}):\n{out[-3000:]}"
    return out


def fetch(url: str) -> str:
    """The body at ``url`` ('' while nothing answers there)."""
    try:
        got = httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return ""
    return got.text if got.status_code == 200 else ""


def answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def test_readme_across_hosts_section_runs_as_written(hosts_cluster, tmp_path: Path) -> None:
    section = blocks(PAGE.read_text())
    cluster: HostsCluster = hosts_cluster(Layout(taskmanagers=2, bare=True))
    hosts = cluster.hosts
    password = secrets.token_urlsafe(18)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env |= {
        "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
        "SLUICE_REDIS_PASSWORD": password,
        "COLUMNS": "200",
    }  # a wide terminal: tables show whole addresses
    want = corpus(cluster.directory / "corpus" / "books.txt", lines=24_000)
    values = {
        "REDIS_HOST": hosts["redis"].address,
        "STORAGE_HOST": hosts["storage"].address,
        "YOUR_TEXT_FILES": str(cluster.directory / "corpus" / "books.txt"),
        "/mnt/sluice": cluster.shared,
    }

    # The storage and Redis machines first, as a user would: they start in the background.
    for name in ("storage", "redis"):
        finished(
            run_blocks(hosts[name], script(hosts[name], MACHINES[name], section, values), env, name),
            hosts[name],
            name,
            60,
        )
    assert poll(lambda: answers(hosts["storage"].address, 8888), 60, every=0.2), (
        f"SeaweedFS's filer did not answer on {hosts['storage'].address}:8888; see {hosts['storage'].directory}"
    )
    url = f"redis://{hosts['redis'].address}:6379/0"
    client = poll(lambda: connect(url.replace("redis://", f"redis://sluice:{password}@")), 30, every=0.2)
    assert client is not None, f"Redis did not answer as user sluice on {url}; see {hosts['redis'].directory}"
    try:
        with pytest.raises(RedisUnavailable, match="refused our credentials"):
            connect(url)  # the default user is off: no password, no way in
        log = EventLog(client, Keys("sluice"))

        # The JobManagers, the projector and the TaskManagers, each on its machine.
        started = {
            n: run_blocks(hosts[n], script(hosts[n], MACHINES[n], section, values), env, n)
            for n in ("jm1", "jm2", "tm1", "tm2")
        }
        for n, proc in started.items():
            finished(proc, hosts[n], n, 90)
        tm_hosts = {hosts["tm1"].address, hosts["tm2"].address}

        def registered() -> set[str]:
            return {r["host"] for r in taskmanagers(log) if r["state"] == "REGISTERED"}

        if not poll(lambda: current_leader(log) is not None and registered() == tm_hosts, 180, every=0.5):
            pytest.fail(
                f"leader {current_leader(log)}; TaskManagers registered on {sorted(registered())}, not on "
                f"the TaskManager hosts' addresses {sorted(tm_hosts)}; logs in {cluster.directory}"
            )
        for n, ports in METRICS.items():  # a standby and the projector may still be starting
            for port in ports:
                metrics = f"http://{hosts[n].address}:{port}/metrics"
                assert poll(lambda url=metrics: "sluice_" in fetch(url), 60, every=0.5), (
                    f"no metrics of {n} at {metrics}"
                )

        # Submit and watch from another machine.
        machine, names = CLIENT
        t0 = time.monotonic()
        out = finished(
            run_blocks(hosts[machine], script(hosts[machine], names, section, values), env, "client"),
            hosts[machine],
            "client",
            480,
        )
        print(f"the page's client block took {time.monotonic() - t0:.1f} s (submit --wait, list, inspect)")
        done = re.search(r"job (\S+) \(wordcount\): FINISHED", out)
        assert done, f"`sluice submit --wait` did not report the job FINISHED:\n{out[-3000:]}"
        job_id = done.group(1)
        assert re.search(rf"{re.escape(job_id)}\s+FINISHED\s+wordcount", out), f"`sluice list`:\n{out[-2000:]}"
        assert all(a in out for a in tm_hosts), f"`sluice inspect taskmanagers` names not both hosts:\n{out[-2000:]}"

        job = Client(log).job(job_id)
        assert job.status == JobStatus.FINISHED and job.restarts == 0, (job.status, job.restarts, job.reason)
        where = hosts_by_vertex(log, job_id)
        assert {h for hs in where.values() for h in hs} == tm_hosts, f"subtasks ran on {where}, not on both hosts"
        copy = hosts[machine].get(f"{cluster.shared}/out/wordcount", tmp_path)
        rows = pq.read_table(copy).to_pylist()
        got = {r["word"]: r["count"] for r in rows}
        assert len(rows) == len(got) and got == dict(want), (
            f"{len(rows)} rows, {len(set(got) ^ set(want))} words differ from plain Python's count"
        )

        dashboard = f"http://{hosts[machine].address}:8087/api/jobs"
        assert poll(lambda: job_id in fetch(dashboard), 60, every=0.5), (
            f"the dashboard did not list {job_id} at {dashboard}"
        )
    finally:
        client.close()
