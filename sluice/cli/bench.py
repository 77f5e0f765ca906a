"""``sluice bench``: the benchmarks (also ``scripts/bench``)."""

from __future__ import annotations

import click


@click.command()
@click.option("--events", default=1_000_000, show_default=True, help="Events to replay.")
@click.option("--appends", default=20_000, show_default=True, help="Single appends to time.")
@click.option("--batch", default=100, show_default=True, help="Events per batched append.")
@click.option("--redis", "redis_url", default=None, help="Benchmark against this Redis (default: a private redis-server).")
def bench(events: int, appends: int, batch: int, redis_url: str | None) -> None:
    """Sluice's log vs raw redis-py: append (single, batched) and replay into state."""
    from sluice.bench.log import run

    run(events=events, appends=appends, batch=batch, redis_url=redis_url)


def register(cli: click.Group) -> None:
    cli.add_command(bench)
