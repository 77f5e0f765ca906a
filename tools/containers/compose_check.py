"""``scripts/compose-check``: compose.yaml run for real, from images built here, with faults.

Phases, each timed:

1. **engine**: scripts/docker-engine (installs and starts one, or reuses the running one);
2. **base images**: scripts/docker-images (the Debian base, ``python:3.11-slim`` and
   ``redis:7`` stand-ins; kept in the engine's data-root, so free the second time);
3. **project image**: ``docker build -t sluice:dev .`` (the Dockerfile);
4. **up**: ``compose up -d --scale taskmanager=N`` under the project ``sluice-check``, until
   every container is healthy, a JobManager leads and the N TaskManagers are registered;
5. **job**: word count (examples/wordcount.py, a keyed job) on a generated text in the shared
   volume, submitted with ``compose run cli submit … --wait``; while it runs, the leading
   JobManager's container is killed (the standby takes over), then one TaskManager's container
   is disconnected from the network until the leader declares it LOST, and connected again
   until it is registered again;
6. **verify**: where every attempt ran (from ``sluice inspect job --json``: the subtasks on
   different containers, the keyed exchange crossing them), and the output against a count in
   plain Python of the same text;
7. **down**: ``compose down -v``.

Exit 0 when all of it held, 1 (with what did not) otherwise. Uses the Sluice CLI inside the
containers (``docker exec``) to read the cluster: nothing here talks to Redis itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tools import ROOT

from .engine import build_images, compose_command, docker_env, start_engine

__all__ = ["main", "independent_count", "generate_text", "placements"]

T = TypeVar("T")
PROJECT = "sluice-check"
INPUT = "/shared/inputs/words.txt"
OUTPUT = "/shared/outputs/wordcount"
SOURCES, REDUCERS = "lines -> count words", "sum counts -> out"
WORDS = (
    "The sluice gate water flow river lock canal basin Spark Flink stream Redis task slot split key "
    "group state log event leader epoch fence don't it's o'clock 2026 v4"
).split()


class CheckFailed(Exception):
    """A step of the check did not hold; the message says which and what was seen."""


def generate_text(path: Path, lines: int, seed: int = 33) -> int:
    """A text of ``lines`` lines of words (mixed case, apostrophes, digits and punctuation
    between them); returns its size in bytes."""
    rng = random.Random(seed)
    seps = [" ", "  ", ", ", ". ", "; ", " - ", "\t"]
    with path.open("w") as f:
        for _ in range(lines):
            n = rng.randint(1, 14)
            f.write("".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(n)).rstrip() + "\n")
    return path.stat().st_size


def independent_count(path: Path) -> dict[str, int]:
    """Word count in plain Python, as the job defines a word: lower-cased, split on anything
    but ``[a-z0-9']``, empty strings dropped."""
    counts: Counter[str] = Counter()
    split = re.compile(r"[^a-z0-9']+").split
    with path.open() as f:
        for line in f:
            counts.update(w for w in split(line.rstrip("\n").lower()) if w)
    return dict(counts)


_DEPLOYED = re.compile(r"\bon (\S+) slot \d+")


def placements(timeline: dict[str, Any]) -> list[tuple[str, int, int, str]]:
    """(vertex, subtask, attempt, TaskManager) of every attempt deployed, from the JSON of
    ``sluice inspect job`` (its DEPLOYING events say "… on TM slot N")."""
    found = []
    for ev in timeline.get("events", []):
        if ev.get("kind") == "state" and ev.get("state") == "DEPLOYING":
            m = _DEPLOYED.search(ev.get("text", ""))
            if m:
                found.append((ev["vertex"], ev["subtask"], ev["attempt"], m.group(1)))
    return found


@dataclass
class Timings:
    phases: list[tuple[str, float]] = field(default_factory=list)
    events: list[tuple[str, float]] = field(default_factory=list)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        say(f"== {name}")
        began = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - began
            self.phases.append((name, took))
            say(f"   {name}: {took:.1f} s")

    def report(self) -> str:
        width = max(len(n) for n, _ in [*self.phases, *self.events])
        lines = [f"  {n:<{width}}  {s:7.1f} s" for n, s in self.phases]
        lines.append(f"  {'total':<{width}}  {sum(s for _, s in self.phases):7.1f} s")
        if self.events:
            lines.append("  during the job:")
            lines += [f"  {n:<{width}}  {s:7.1f} s" for n, s in self.events]
        return "\n".join(lines)


def say(line: str) -> None:
    print(f"compose-check: {line}", flush=True)


def wait_for(check: Callable[[], T | None], what: str, timeout: float, every: float = 1.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Cluster:
    """The compose project under test, and the Sluice CLI inside one of its containers."""

    def __init__(self, compose: Sequence[str], env: dict[str, str], workdir: Path) -> None:
        self.compose = [*compose, "-p", PROJECT, "-f", str(ROOT / "compose.yaml")]
        self.env, self.workdir = env, workdir
        self.network = f"{PROJECT}_default"

    def run(self, *args: str, check: bool = True, timeout: float = 600, stdin: Any = None) -> str:
        done = subprocess.run(
            args, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, stdin=stdin
        )
        if check and done.returncode != 0:
            raise CheckFailed(f"`{' '.join(args)}` exited {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
        return done.stdout

    def compose_run(self, *args: str, **kw: Any) -> str:
        return self.run(*self.compose, *args, **kw)

    def containers(self, service: str, *, running: bool = True) -> list[str]:
        out = self.run(
            "docker",
            "ps",
            *([] if running else ["-a"]),
            "--filter",
            f"label=com.docker.compose.project={PROJECT}",
            "--filter",
            f"label=com.docker.compose.service={service}",
            "--format",
            "{{.Names}}",
        )
        return sorted(out.split())

    def inspect(self, container: str, template: str) -> str:
        return self.run("docker", "inspect", "--format", template, container).strip()

    def hostnames(self) -> dict[str, str]:
        """Container host name (what Sluice's ids carry) -> container name, of every container."""
        names = self.run("docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}",
                         "--format", "{{.Names}}").split()  # fmt: skip
        return {self.inspect(n, "{{.Config.Hostname}}"): n for n in names}

    def sluice(self, *args: str, timeout: float = 60) -> str:
        """A ``sluice`` command in the dashboard's container (it has the cluster's settings)."""
        ui = self.containers("ui")
        if not ui:
            raise CheckFailed("the ui container is not running")
        return self.run("docker", "exec", ui[0], "sluice", *args, timeout=timeout)

    def sluice_json(self, *args: str) -> Any:
        return json.loads(self.sluice(*args, "--json"))

    def down(self) -> None:
        self.compose_run("down", "-v", "--remove-orphans", "-t", "20", check=False, timeout=300)


def _healthy(cluster: Cluster, services: Sequence[str], taskmanagers: int) -> bool:
    names = [n for s in services for n in cluster.containers(s)]
    if len([n for n in names if "taskmanager" in n]) < taskmanagers:
        return False
    states = {n: cluster.inspect(n, "{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}") for n in names}
    return all(s in ("healthy", "none") for s in states.values())


def _status(cluster: Cluster) -> dict[str, Any]:
    status: dict[str, Any] = cluster.sluice_json("status")
    return status


def _tm_status(cluster: Cluster, resource_id: str) -> dict[str, Any]:
    for tm in _status(cluster).get("taskmanagers", []):
        if tm["resource_id"] == resource_id:
            return dict(tm)
    return {}


def _job(cluster: Cluster, job_id: str) -> dict[str, Any]:
    try:
        job: dict[str, Any] = cluster.sluice_json("status", job_id)
        return job
    except CheckFailed:
        return {}


def _running_on(job: dict[str, Any]) -> list[str]:
    """TaskManagers holding a subtask that is deploying or running."""
    return [
        s["taskmanager"]
        for v in job.get("vertices", [])
        for s in v.get("subtasks", [])
        if s.get("state") in ("DEPLOYING", "INITIALIZING", "RUNNING") and s.get("taskmanager")
    ]


def check(args: argparse.Namespace, timings: Timings, work: Path) -> None:
    with timings.phase("engine"):
        host, why = start_engine()
        if host is None:
            raise CheckFailed(why)
        env = docker_env(host)
        env["SLUICE_UI_PORT"] = str(free_port())
        say(f"engine at {host}")
    with timings.phase("base images"):
        build_images(["python", "redis"], host)
    with timings.phase("project image"):
        log = work / "docker-build.log"
        with log.open("w") as out:
            done = subprocess.run(["docker", "build", "-t", "sluice:dev", str(ROOT)], env=env, stdout=out,
                                  stderr=subprocess.STDOUT)  # fmt: skip
        if done.returncode != 0:
            raise CheckFailed(f"docker build failed:\n{log.read_text()[-2500:]}")
        size = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", "sluice:dev"], env=env,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        say(f"sluice:dev: {int(size or 0) / 1e9:.2f} GB")
    compose = compose_command(args.compose)
    cluster = Cluster(compose, env, work)
    say(f"compose: {' '.join(compose)} ({cluster.run(*compose, 'version', check=False).splitlines()[0]})")
    cluster.down()  # what an earlier run that was stopped left
    try:
        _cluster_phases(cluster, args, timings, work)
    finally:
        if args.keep:
            say(f"left the cluster up (--keep): {' '.join(cluster.compose)} down -v")
        else:
            with timings.phase("down"):
                cluster.down()
                left = cluster.containers("taskmanager", running=False) + cluster.containers("redis", running=False)
                if left:
                    raise CheckFailed(f"containers left after down -v: {left}")


def _cluster_phases(cluster: Cluster, args: argparse.Namespace, timings: Timings, work: Path) -> None:
    n = args.taskmanagers
    services = ("redis", "jobmanager", "jobmanager-standby", "taskmanager", "projector", "ui")
    with timings.phase("up"):
        cluster.compose_run("up", "-d", "--no-build", "--scale", f"taskmanager={n}")
        wait_for(lambda: _healthy(cluster, services, n), "every container healthy", timeout=300, every=2)
        status = wait_for(
            lambda: (
                (s := _status(cluster))["leader"]
                and len([t for t in s["taskmanagers"] if t["status"] == "REGISTERED"]) >= n
                and s
            ),
            f"a leader and {n} TaskManagers registered",
            timeout=120,
        )
        say(
            f"leader {status['leader']['leader_id']}; TaskManagers: {[t['resource_id'] for t in status['taskmanagers']]}"
        )

    text = work / "words.txt"
    size = generate_text(text, args.lines)
    with text.open("rb") as f:
        cluster.run("docker", "exec", "-i", cluster.containers("ui")[0], "sh", "-c",
                    f"mkdir -p {os.path.dirname(INPUT)} && cat > {INPUT}", stdin=f)  # fmt: skip
    say(f"input: {args.lines} lines, {size / 1e6:.1f} MB at {INPUT}")

    with timings.phase("job (with the faults)"):
        job_id, submit_log = _job_with_faults(cluster, args, timings, work)
    with timings.phase("verify"):
        _verify(cluster, job_id, text, submit_log)


HOLDERS = 6
"""At most this many placeholder containers are started to take a disconnected TaskManager's
address (the engine gives each the network's lowest free one)."""


def _hold_address(cluster: Cluster, address: str) -> list[str]:
    """Placeholder containers on the cluster's network until one holds ``address``: a
    TaskManager connected again then gets another address, as it does when the killed
    leader freed a lower one (the case that found the lost dequeue and the Spark driver on
    its old address). Only one run in three hit it by chance. Returns their names (removed
    by the caller once the TaskManager is connected); none if none got it."""
    names: list[str] = []
    for i in range(HOLDERS):
        name = f"{PROJECT}-holder-{i}"
        cluster.run("docker", "rm", "-f", name, check=False)
        cluster.run(
            "docker", "run", "-d", "--rm", "--name", name, "--network", cluster.network,
            "--entrypoint", "sleep", "redis:7", "600",
        )  # fmt: skip
        names.append(name)
        got = cluster.inspect(name, f'{{{{(index .NetworkSettings.Networks "{cluster.network}").IPAddress}}}}')
        if got == address:
            say(f"{name} holds {address}")
            return names
    say(f"no placeholder got {address}: the TaskManager may come back at it")
    cluster.run("docker", "rm", "-f", *names, check=False)
    return []


def _job_with_faults(cluster: Cluster, args: argparse.Namespace, timings: Timings, work: Path) -> tuple[str, Path]:
    submit_log = work / "submit.log"
    params = ["-p", f"input={INPUT}", "-p", f"output={OUTPUT}", "-p", "parallelism=2", "-p", "reducers=2"]
    cmd = [*cluster.compose, "run", "--rm", "cli", "submit", "examples/wordcount.py", *params, "--wait"]
    began = time.monotonic()
    with submit_log.open("w") as out:
        submit = subprocess.Popen(cmd, env=cluster.env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:

        def submitted() -> str | None:
            if submit.poll() not in (None, 0):
                raise CheckFailed(f"submit exited {submit.returncode}: {submit_log.read_text()[-1500:]}")
            m = re.search(r"^([0-9a-f]{16})$", submit_log.read_text(), re.M)
            return m.group(1) if m else None

        job_id = wait_for(submitted, "the job to be accepted", timeout=180)
        say(f"job {job_id} accepted after {time.monotonic() - began:.1f} s")
        job = wait_for(lambda: (j := _job(cluster, job_id)) and _running_on(j) and j, "a task to run", timeout=180)

        # The leader's container, killed.
        hosts = cluster.hostnames()
        leader = _status(cluster)["leader"]
        leader_host = leader["leader_id"].removeprefix("jm-").rsplit("-", 1)[0]  # jm-HOST-SUFFIX
        victim = hosts[leader_host]
        say(f"killing the leader's container {victim} ({leader['leader_id']}, epoch {leader['epoch']})")
        t0 = time.monotonic()
        cluster.run("docker", "kill", victim)
        new = wait_for(
            lambda: (s := _status(cluster)["leader"]) and s["epoch"] > leader["epoch"] and s,
            "a new leader",
            timeout=120,
            every=0.5,
        )
        timings.events.append(("kill leader -> new leader", time.monotonic() - t0))
        say(f"new leader {new['leader_id']} at epoch {new['epoch']}")

        # A TaskManager's network, cut then restored.
        job = _job(cluster, job_id)
        if job.get("status") in ("FINISHED", "FAILED", "CANCELED"):
            raise CheckFailed(f"the job ended ({job['status']}) before a TaskManager could be cut: give --lines more")
        busy = _running_on(job)
        tms = {t["resource_id"]: t for t in _status(cluster)["taskmanagers"] if t["status"] == "REGISTERED"}
        target = next((r for r in busy if r in tms), next(iter(tms)))
        container = hosts[tms[target]["host"]]
        say(f"disconnecting {container} ({target}; job {job.get('status')}, tasks running on {sorted(set(busy))})")
        address = cluster.inspect(container, f'{{{{(index .NetworkSettings.Networks "{cluster.network}").IPAddress}}}}')
        t0 = time.monotonic()
        cluster.run("docker", "network", "disconnect", cluster.network, container)
        wait_for(lambda: _tm_status(cluster, target).get("status") == "LOST", f"{target} LOST", timeout=120, every=0.5)
        timings.events.append(("disconnect -> TaskManager LOST", time.monotonic() - t0))
        say(f"{target} LOST after {time.monotonic() - t0:.1f} s; connecting {container} again")
        t0 = time.monotonic()
        holders = _hold_address(cluster, address)  # so that it comes back at another address, every run
        try:
            cluster.run("docker", "network", "connect", cluster.network, container)
        finally:
            if holders:
                cluster.run("docker", "rm", "-f", *holders, check=False)
        again = cluster.inspect(container, f'{{{{(index .NetworkSettings.Networks "{cluster.network}").IPAddress}}}}')
        say(f"{container} was {address}, is {again} now" + (" (a new address)" if again != address else ""))
        wait_for(
            lambda: _tm_status(cluster, target).get("status") == "REGISTERED",
            f"{target} registered again",
            timeout=120,
            every=0.5,
        )
        timings.events.append(("reconnect -> registered again", time.monotonic() - t0))
        say(f"{target} registered again after {time.monotonic() - t0:.1f} s; waiting for the job to end")
        try:
            rc = submit.wait(timeout=args.job_timeout)
        except subprocess.TimeoutExpired:
            raise CheckFailed(
                f"the job did not end within {args.job_timeout:.0f} s:\n{_diagnosis(cluster, job_id)}"
            ) from None
    finally:
        if submit.poll() is None:
            submit.kill()
    timings.events.append(("job, submit to end", time.monotonic() - began))
    if rc != 0:
        raise CheckFailed(f"the job did not finish (submit --wait exited {rc}):\n{submit_log.read_text()[-2000:]}")
    return job_id, submit_log


def _diagnosis(cluster: Cluster, job_id: str) -> str:
    """What the cluster says of a job that does not end: its subtasks, and the TaskManagers' slots."""
    out = []
    for args in (("status", job_id), ("inspect", "taskmanagers")):
        try:
            out.append(cluster.sluice(*args))
        except CheckFailed as exc:
            out.append(str(exc))
    return "\n".join(out)


def _verify(cluster: Cluster, job_id: str, text: Path, submit_log: Path) -> None:
    say("the job, as `submit --wait` reported it:\n" + submit_log.read_text().strip()[-800:])
    hosts = cluster.hostnames()
    tms = {t["resource_id"]: t["host"] for t in _status(cluster)["taskmanagers"]}
    where = placements(cluster.sluice_json("inspect", "job", job_id))
    say("where every attempt ran (sluice inspect job):")
    for vertex, subtask, attempt, tm in where:
        say(f"  {vertex}[{subtask}] attempt {attempt}: {tm} in container {hosts.get(tms.get(tm, ''), '?')}")
    containers = {hosts.get(tms.get(tm, ""), tm) for *_, tm in where}
    if len(containers) < 2:
        raise CheckFailed(f"every attempt ran in one container: {containers}")
    job = _job(cluster, job_id)
    final = {(v["name"], s["subtask"]): s["taskmanager"] for v in job["vertices"] for s in v["subtasks"]}
    producers = {hosts.get(tms.get(tm, ""), tm) for (v, _), tm in final.items() if v == SOURCES}
    consumers = {hosts.get(tms.get(tm, ""), tm) for (v, _), tm in final.items() if v == REDUCERS}
    crossing = sorted((p, c) for p in producers for c in consumers if p != c)
    if not crossing:
        raise CheckFailed(f"the keyed exchange never crossed containers: sources {producers}, reducers {consumers}")
    say(f"keyed exchange across containers: {', '.join(f'{p} -> {c}' for p, c in crossing)}")
    say(f"restarts: {job.get('restarts')}")

    read = (
        f"import json, pyarrow.parquet as pq; t = pq.read_table({OUTPUT!r}, columns=['word', 'count']); "
        "print(json.dumps(list(zip(t['word'].to_pylist(), t['count'].to_pylist()))))"
    )
    rows = json.loads(cluster.run("docker", "exec", cluster.containers("ui")[0], "python", "-c", read))
    got: dict[str, int] = {}
    for word, count in rows:
        if word in got:
            raise CheckFailed(f"the output has {word!r} twice")
        got[word] = int(count)
    want = independent_count(text)
    if got != want:
        diff = sorted((w, got.get(w), want.get(w)) for w in set(got) | set(want) if got.get(w) != want.get(w))
        raise CheckFailed(f"the output differs from the plain count in {len(diff)} words, e.g. {diff[:8]}")
    say(f"output matches the plain Python count: {len(want)} words, {sum(want.values())} in all")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/compose-check", description=__doc__.split("\n\n")[0])
    p.add_argument("--taskmanagers", type=int, default=2, help="TaskManager containers (--scale).")
    p.add_argument("--lines", type=int, default=150_000, help="Lines of the generated text.")
    p.add_argument("--compose", choices=("v1", "v2"), default=None, help="Force Compose v1 or v2.")
    p.add_argument("--job-timeout", type=float, default=300, help="Seconds the job may take after the faults.")
    p.add_argument("--keep", action="store_true", help="Leave the cluster up at the end.")
    args = p.parse_args(argv)
    if args.taskmanagers < 2:
        p.error("--taskmanagers must be at least 2 (a subtask on each, a TaskManager cut)")
    timings = Timings()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-compose-check-") as work:
        try:
            check(args, timings, Path(work))
        except CheckFailed as exc:
            say(f"FAILED after {time.monotonic() - began:.0f} s: {exc}")
            if timings.phases:
                say("timings so far:\n" + timings.report())
            return 1
    say("PASSED; timings:\n" + timings.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
