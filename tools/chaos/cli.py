"""``scripts/chaos`` (``python -m tools.chaos``): the seeded chaos suite on real processes."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .campaign import campaign

__all__ = ["main"]


@click.command()
@click.option("--runs", default=1, show_default=True, type=click.IntRange(1), help="Runs, with seeds S, S+1, ...")
@click.option("--seed", default=1, show_default=True, type=int, help="Seed of the first run (S).")
@click.option(
    "--kills",
    default=4,
    show_default=True,
    type=click.IntRange(0),
    help="Strikes per run (0: the job alone, for a baseline).",
)
@click.option(
    "--dir",
    "root",
    default=".tools/chaos",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where each run's cluster home (logs, Redis AOF, input, output) is kept.",
)
@click.option(
    "--hosts",
    is_flag=True,
    help="The campaign across hosts (tools/chaos/hosts, as root): one fault "
    "per run (cut links, packet loss, latency, clock skew, kill -9 of a host), kinds by seed; --kills unused.",
)
@click.option(
    "--summary",
    "summary_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="With --hosts: write the summary to this file too (rewritten after every run).",
)
@click.option(
    "--failover",
    type=click.Choice(["job", "cluster", "other", "both", "all"]),
    default=None,
    help="The campaign on a loopback Redis Cluster (tools/chaos/failover.py): each run kills -9 the master "
    "holding a running job's tag (job), the cluster's tag (cluster), or neither (other: the job must re-run "
    "nothing); both: job and cluster, all: the three. The replica is promoted and the job must finish with "
    "exact output. Reports the time to recover.",
)
def main(
    runs: int, seed: int, kills: int, root: str, hosts: bool, summary_file: str | None, failover: str | None
) -> None:
    """Run real clusters (redis-server, two JobManagers, TaskManagers, RQ workers, the projector,
    Spark Connect) through a keyed three-stage job while seeded strikes kill -9 or freeze the
    leader, TaskManagers, workers and Redis. Exit 1 when a run failed (its replay command is printed)."""
    if failover is not None:
        from .failover import failover_campaign

        sys.exit(0 if all(r.ok for r in failover_campaign(failover, runs, seed, Path(root))) else 1)
    if hosts:
        from .hosts import campaign as hosts_campaign

        summary = Path(summary_file) if summary_file is not None else None
        sys.exit(0 if all(r.ok for r in hosts_campaign(runs, seed, Path(root), summary_file=summary)) else 1)
    results = campaign(runs, seed, kills, Path(root))
    sys.exit(0 if all(r.ok for r in results) else 1)
