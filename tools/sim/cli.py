"""``scripts/simulate``: run many seeds of the simulated cluster, report the rate, show a
failing seed's trace, and replay one seed.

    scripts/simulate --seeds 1000            # seeds 0..999, swarm faults, every core
    scripts/simulate --seed 4242             # one seed, with its trace if it fails
    scripts/simulate --seeds 100000 --start 0 --workers 2 --all-faults
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
import time
from dataclasses import asdict
from typing import Any

import click

__all__ = ["main"]


def _run(args: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    from .cluster import run_seed
    from .faults import Faults
    from .notes import quiet_logging

    seed, opts = args
    quiet_logging()
    kwargs: dict[str, Any] = {}
    if opts.get("all_faults"):
        import random

        kwargs["faults"] = Faults.swarm(random.Random(seed), all_on=True)
    if opts.get("no_faults"):
        kwargs["faults"] = Faults.none()
    if opts.get("steps"):
        kwargs["fault_steps"] = opts["steps"]
    if opts.get("kinds"):
        import random

        kwargs["faults"] = Faults.swarm(random.Random(seed), tuple(opts["kinds"]), all_on=bool(opts.get("all_faults")))
    for knob in ("max_stall_s", "replay_page", "jobs", "shards", "speculation"):
        if opts.get(knob):
            kwargs[knob] = opts[knob]
    outcome = run_seed(seed, **kwargs)
    out = asdict(outcome)
    out["pid"], out["rss"] = os.getpid(), rss_bytes()
    return out


def rss_bytes() -> int:
    """This process's resident memory (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def digest(outcome: dict[str, Any]) -> str:
    """What must be the same when a seed is run again."""
    keep = {k: outcome[k] for k in ("seed", "ok", "violation", "steps", "sim_ms", "facts", "faults", "jobs")}
    return hashlib.sha256(repr(sorted(keep.items())).encode()).hexdigest()[:16]


def _init_worker(plant_name: str | None) -> None:
    """A worker of the pool: the bug ``plant_name`` planted in it first (tools/sim/plants.py)."""
    if plant_name:
        from .plants import plant

        plant(plant_name)


def _campaign(n: int, start: int, workers: int, opts: dict[str, Any], names: list[str]) -> None:
    """Each plant on its own pool, its seeds run until the first that catches it."""
    from .plants import PLANTS

    rows = []
    for name in names:
        began = time.monotonic()
        caught: int | None = None
        ran = 0
        with multiprocessing.get_context("fork").Pool(workers, _init_worker, (name,)) as pool:
            for out in pool.imap(_run, [(s, opts) for s in range(start, start + n)], chunksize=2):
                ran += 1
                if not out["ok"]:
                    caught = out["seed"]
                    click.echo(f"{name}: caught by seed {caught}: {out['violation'].splitlines()[0][:200]}")
                    pool.terminate()
                    break
        took = time.monotonic() - began
        if caught is None:
            click.echo(f"{name}: NOT caught in {ran} seeds")
        rows.append((name, PLANTS[name].issue, caught, ran, took))
    click.echo(f"\n{'plant':22} {'issue':6} {'caught by seed':>15} {'seeds run':>10} {'seconds':>8}")
    for name, issue, caught, ran, took in rows:
        click.echo(
            f"{name:22} {issue:6} {str(caught) if caught is not None else 'NOT CAUGHT':>15} {ran:>10} {took:>8.1f}"
        )
    if any(caught is None for _, _, caught, _, _ in rows):
        sys.exit(1)


@click.command()
@click.option("--seeds", type=int, default=None, help="How many seeds to run (from --start).")
@click.option("--seed", type=int, default=None, help="Run this one seed and show its trace if it fails.")
@click.option("--start", type=int, default=0, show_default=True, help="The first seed.")
@click.option("--workers", type=int, default=None, help="Processes (default: one per core).")
@click.option(
    "--all-faults",
    is_flag=True,
    help="Every kind of fault on in every seed (default: each seed switches each kind on or off: swarm testing).",
)
@click.option("--no-faults", is_flag=True, help="A healthy cluster (the happy path).")
@click.option("--steps", type=int, default=None, help="Steps with faults before they stop (default 1200).")
@click.option("--stop-after", type=int, default=5, show_default=True, help="Stop after this many failing seeds.")
@click.option(
    "--faults", "kinds", default="", help="Only these kinds of fault, comma-separated (see tools/sim/faults.py)."
)
@click.option("--max-stall-s", type=float, default=None, help="The JobManagers' stall limit (default 5 s).")
@click.option("--replay-page", type=int, default=None, help="Facts a new leader replays per step.")
@click.option("--jobs", type=int, default=None, help="Jobs per world (default 1 or 2).")
@click.option(
    "--shards",
    type=click.IntRange(1, 16),
    default=None,
    help="The log on a Redis Cluster of this many masters (tags spread over them by slot), each of which "
    "fails over alone and loses its own last second (the shard_failover fault; not in --all-faults: the "
    "seeds without it run as they always did).",
)
@click.option(
    "--speculation",
    is_flag=True,
    help="Speculative execution on, with one TaskManager 5x slower: slow subtasks race a speculative attempt.",
)
@click.option("--quiet", is_flag=True, help="Only the summary and failures.")
@click.option(
    "--rss-every",
    type=int,
    default=None,
    help="Every this many seeds, print each worker's resident "
    "memory (a seed must leave nothing behind: it stays flat).",
)
@click.option(
    "--plant",
    "plant_name",
    default=None,
    help="Put this known bug into the code first (see "
    "tools/sim/plants.py): the run says how many seeds it takes to catch it.",
)
@click.option(
    "--campaign",
    is_flag=True,
    help="Every plant (or --plant's), each until the first seed that catches "
    "it, within --seeds seeds (default 1000); a table at the end.",
)
@click.option(
    "--digests",
    "digests_to",
    type=click.File("w"),
    default=None,
    help="Write each seed's digest (what must be the same when it runs again: steps, facts, outcome, jobs) to "
    "this file, a line a seed in seed order: a refactoring that changes no behaviour leaves the file the same.",
)
def main(
    seeds: int | None,
    seed: int | None,
    start: int,
    workers: int | None,
    all_faults: bool,
    no_faults: bool,
    steps: int | None,
    stop_after: int,
    quiet: bool,
    kinds: str,
    max_stall_s: float | None,
    replay_page: int | None,
    jobs: int | None,
    shards: int | None,
    speculation: bool,
    rss_every: int | None,
    plant_name: str | None,
    campaign: bool,
    digests_to: Any = None,
) -> None:
    """Simulate Sluice clusters under faults; every invariant is checked after every step."""
    from .faults import KINDS

    chosen = [k for k in kinds.split(",") if k]
    unknown = sorted(set(chosen) - set(KINDS))
    if unknown:
        raise click.UsageError(f"unknown fault kinds {unknown}; the kinds are {', '.join(KINDS)}")
    from .plants import PLANTS

    if plant_name is not None and plant_name not in PLANTS:
        raise click.UsageError(f"no plant {plant_name!r}; the plants are {', '.join(PLANTS)}")
    opts = {
        "all_faults": all_faults,
        "no_faults": no_faults,
        "steps": steps,
        "kinds": chosen,
        "max_stall_s": max_stall_s,
        "replay_page": replay_page,
        "jobs": jobs,
        "shards": shards,
        "speculation": speculation,
    }
    if campaign:
        _campaign(
            seeds or 1000, start, workers or os.cpu_count() or 1, opts, [plant_name] if plant_name else list(PLANTS)
        )
        return
    if seed is not None:
        _init_worker(plant_name)
        first = _run((seed, opts))
        again = _run((seed, opts))
        same = digest(first) == digest(again)
        click.echo(
            f"seed {seed}: {'ok' if first['ok'] else 'FAILED'} — {first['steps']} steps, "
            f"{first['sim_ms'] / 1000:.1f} s simulated, {first['facts']} facts, jobs {first['jobs']}"
        )
        click.echo(f"faults on: {', '.join(first['faults']) or 'none'}")
        click.echo(f"replayed: {'identical' if same else 'DIFFERENT'} ({digest(first)} / {digest(again)})")
        if not first["ok"]:
            click.echo("\n" + first["trace"])
        sys.exit(0 if first["ok"] and same else 1)
    n = seeds if seeds is not None else 100
    workers = workers or os.cpu_count() or 1
    began = time.monotonic()
    failed: list[dict[str, Any]] = []
    digests: dict[int, str] = {}
    done = steps_total = facts_total = 0
    last_report = began
    rss: dict[int, int] = {}  # each worker's, as its last seed left it
    speculated = raced = 0
    todo = [(s, opts) for s in range(start, start + n)]
    with multiprocessing.get_context("fork").Pool(workers, _init_worker, (plant_name,)) as pool:
        for out in pool.imap_unordered(_run, todo, chunksize=8):
            done += 1
            steps_total += out["steps"]
            facts_total += out["facts"]
            speculated += out["speculated"]
            raced += out["raced"]
            rss[out["pid"]] = out["rss"]
            digests[out["seed"]] = f"{out['seed']} {digest(out)} {'ok' if out['ok'] else 'FAILED'} {out['steps']}"
            if rss_every and done % rss_every == 0:
                click.echo(
                    f"  rss after {done} seeds ({time.monotonic() - began:.0f} s): "
                    + ", ".join(f"{r / 2**20:.0f} MB" for _, r in sorted(rss.items()))
                )
            if not out["ok"]:
                failed.append(out)
                click.echo(f"seed {out['seed']} FAILED: {out['violation'].splitlines()[0][:240]}")
                if len(failed) >= stop_after:
                    pool.terminate()
                    break
            now = time.monotonic()
            if not quiet and now - last_report > 10:
                last_report = now
                click.echo(
                    f"  {done}/{n} seeds, {done / (now - began):.1f} seeds/s, "
                    f"{facts_total / (now - began):.0f} facts/s, {len(failed)} failed",
                    err=True,
                )
    if digests_to is not None:
        digests_to.write("".join(digests[k] + "\n" for k in sorted(digests)))
    took = time.monotonic() - began
    click.echo(
        f"{done} seeds in {took:.1f} s: {done / took:.1f} seeds/s, {steps_total / took:.0f} steps/s, "
        f"{facts_total / took:.0f} facts/s (events decided and committed), {workers} workers; "
        f"{len(failed)} failed"
    )
    if opts.get("speculation"):
        click.echo(f"speculation: {speculated} speculative attempts, {raced} races decided")
    if failed:
        worst = min(failed, key=lambda o: o["seed"])
        click.echo(
            f"\nthe first failing seed, {worst['seed']} (run it again: scripts/simulate --seed {worst['seed']}"
            f"{' --all-faults' if all_faults else ''}{f' --shards {shards}' if shards else ''}):\n"
        )
        click.echo(worst["trace"])
        sys.exit(1)


if __name__ == "__main__":
    main()
