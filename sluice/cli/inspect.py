"""``sluice inspect``: the streams, decoded, as they are, and the views of ``sluice.views``
(jobs, a job's timeline, its graph, queryable state, TaskManagers, stats, dead letters)
at any moment of the log (also ``scripts/inspect``)."""

from __future__ import annotations

import sys
import time

import click
import orjson
from rich.console import Console
from rich.markup import escape

from sluice.store import entry_order
from sluice.store.inspection import newest
from sluice.views.entries import line, record, resolve, short
from sluice.views.history import Moment

from .context import Context
from .inspect_jobs import at_option, register_job_views
from .inspect_log import register_log_views

console = Console(highlight=False, emoji=False, soft_wrap=True)


@click.group()
def inspect() -> None:
    """Look at the log: streams, events, jobs, graphs, dead letters, now or at any past moment."""


@inspect.command()
@click.argument("streams", nargs=-1)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events as they come.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--count", "-n", default=None, type=int, help="Only the last N events.")
@at_option
@click.pass_obj
def tail(obj: Context, streams: tuple[str, ...], follow: bool, as_json: bool, count: int | None, at: Moment) -> None:
    """Print the events of all streams (or the named ones), decoded, in order.

    Streams are named in full ({sluice:cluster}:facts) or short (cluster:facts, facts, tm:ID:inbox).
    """
    if follow and at.entry is not None:
        raise click.UsageError("--follow prints what comes next: it cannot be used with --at (a past moment)")
    log = obj.log()
    names = resolve(log, streams)
    entries: list[tuple[str, str, dict]] = []
    positions: dict[str, str] = {}
    if count is not None:  # the newest N across the streams, read backwards: cheap on a long log
        entries, newest_ids = newest(log, names, at.entry, count)
        positions = {s: i or "0-0" for s, i in newest_ids.items()}
        names = []
    for s in names:
        last = "0-0"
        for entry_id, fields in log.replay_raw(s):
            if not at.includes(entry_id):
                break
            entries.append((s, entry_id, fields))
            last = entry_id
        positions[s] = last
    entries.sort(key=lambda e: entry_order(e[1]))
    if count is not None:
        entries = entries[-count:] if count > 0 else []

    def show(batch: list[tuple[str, str, dict]]) -> None:
        for s, i, f in batch:
            rec = record(log, s, i, f)
            if as_json:
                sys.stdout.write(orjson.dumps(rec).decode() + "\n")
            else:
                console.print(line(rec))
        sys.stdout.flush()

    show(entries)
    while follow:
        if not streams:  # pick up streams created since
            for s in log.streams():
                positions.setdefault(s, "0-0")
        batch = log.follow(positions, block_ms=500)
        for s, i, _ in batch:
            positions[s] = i
        show(batch)


@inspect.command("streams")
@at_option
@click.pass_obj
def list_streams(obj: Context, at: Moment) -> None:
    """Every stream with its length (at a moment: how many of the entries it holds now it had then;
    inboxes are trimmed once read)."""
    from sluice.store.inspection import count_after

    log = obj.log()
    for s in log.streams():
        length = log.length(s)
        if at.entry is not None:
            length -= count_after(log, s, at.entry)
            if length <= 0:
                continue  # not there yet
        console.print(f"{escape(short(log, s)):<40} {length:>8}  [dim]{escape(s)}[/]")


@inspect.command("splits")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per assignment.")
@at_option
@click.pass_obj
def splits(obj: Context, job_id: str, as_json: bool, at: Moment) -> None:
    """Which subtask took which split of JOB_ID, when, under which leader epoch, and what
    became of it (finished, returned by a failed attempt, or still being read); and the
    readers told "no more" while splits were left (held back: the others would finish
    them sooner, or they were kept for a reader that had not asked yet)."""
    from dataclasses import asdict

    from rich.table import Table

    from sluice.services.coordination.timeline import held_back, split_timeline
    from sluice.views.history import facts_until
    from sluice.views.jobs import require_job

    log = obj.log()
    require_job(log, job_id)  # "job not found" for an unknown job
    envs = [env for _, env in facts_until(log, log.keys.facts(log.keys.job(job_id)), at)]
    rows = split_timeline(envs)
    if as_json:
        for r in rows:
            sys.stdout.write(orjson.dumps(asdict(r)).decode() + "\n")
        return
    table = Table(title=f"splits of job {job_id}")
    for col in ("split", "reads", "subtask", "attempt", "at", "epoch", "outcome"):
        table.add_column(col)
    for r in rows:
        when = time.strftime("%H:%M:%S", time.localtime(r.at / 1000)) + f".{r.at % 1000:03d}"
        table.add_row(
            str(r.split),
            escape(r.what),
            f"{escape(r.vertex)}[{r.subtask}]",
            str(r.attempt),
            when,
            str(r.epoch),
            r.outcome,
        )
    console.print(table)
    per: dict[tuple[str, int], int] = {}
    for r in rows:
        if r.outcome == "finished":
            per[(r.vertex, r.subtask)] = per.get((r.vertex, r.subtask), 0) + 1
    if per:
        console.print(
            "finished splits per subtask: " + ", ".join(f"{escape(v)}[{s}]={n}" for (v, s), n in sorted(per.items()))
        )
    held = held_back(envs)
    if held:
        console.print(
            "told no more while splits were left: "
            + ", ".join(f"{escape(v)}[{s}] attempt {a} ({n} handed out after)" for (v, s, a), n in sorted(held.items()))
        )


register_job_views(inspect)
register_log_views(inspect)


def register(cli: click.Group) -> None:
    cli.add_command(inspect)
