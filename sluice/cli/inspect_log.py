"""``sluice inspect stats`` and ``sluice inspect dead-letters``: the log now (no ``--at``:
they are about the streams as they are), rendered with rich or printed as JSON."""

from __future__ import annotations

import re

import click
from rich.markup import escape
from rich.table import Table

from sluice.store import EventLog
from sluice.views.entries import resolve, short

from .context import Context
from .inspect_jobs import clock, console, emit

__all__ = ["register_log_views", "parse_window"]

_WINDOW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, None: 1.0}


def parse_window(ctx: click.Context | None, param: click.Parameter | None, value: str) -> float:
    """``60s``, ``5m``, ``1h``, ``500ms`` or plain seconds, above 0."""
    m = _WINDOW.match(value)
    seconds = float(m.group(1)) * _UNIT[m.group(2)] if m else 0.0
    if not seconds > 0:
        raise click.BadParameter(
            f"{value!r} is not a time window: give seconds above 0, like 60s, 5m, 1h or 500ms", ctx, param
        )
    return seconds


def size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def render_stats(log: EventLog, s: dict) -> None:
    streams = Table(title="streams")
    for col in ("stream", "kind", "length", "memory", "last entry"):
        streams.add_column(col, justify="right" if col in ("length", "memory") else "left")
    for r in s["streams"]:
        streams.add_row(
            escape(short(log, r["stream"])),
            r["kind"],
            str(r["length"]),
            size(r["memory_bytes"]),
            f"[dim]{r['last_entry'] or '-'}[/]",
        )
    console.print(streams)
    events = Table(title=f"events of the last {s['window_s']:g} s")
    for col in ("type", "count", "per second", "inbox", "facts", "outbox"):
        events.add_column(col, justify="left" if col == "type" else "right")
    for e in s["events"]:
        k = e["by_kind"]
        events.add_row(
            escape(e["type"]),
            str(e["count"]),
            f"{e['rate_per_s']:.3f}",
            str(k.get("inbox", "")),
            str(k.get("facts", "")),
            str(k.get("outbox", "")),
        )
    console.print(events if s["events"] else f"no events in the last {s['window_s']:g} s")
    groups = Table(title="consumer groups")
    for col in ("stream", "group", "consumers", "lag", "pending", "oldest pending", "its age"):
        groups.add_column(col)
    for g in s["groups"]:
        age = "-" if g["oldest_pending_age_s"] is None else f"{g['oldest_pending_age_s']:.1f} s"
        lag = "?" if g["lag"] is None else str(g["lag"])
        groups.add_row(
            escape(short(log, g["stream"])),
            escape(g["group"]),
            str(g["consumers"]),
            lag,
            str(g["pending"]),
            g["oldest_pending"] or "-",
            age,
        )
    console.print(groups)
    dead = s["dead_letters"]
    if not dead["total"]:
        console.print("no dead letters")
        return
    reasons = Table(title=f"dead letters: {dead['total']}")
    for col in ("count", "kind", "reason"):
        reasons.add_column(col)
    for r in dead["by_reason"]:
        reasons.add_row(str(r["count"]), escape(r["kind"]), escape(r["reason"]))
    console.print(reasons)


def render_dead_letters(log: EventLog, letters: list[dict]) -> None:
    if not letters:
        console.print("no dead letters")
        return
    table = Table(title=f"dead letters ({len(letters)})")
    for col in ("id", "parked", "from", "entry", "type", "kind", "reason", "re-drive"):
        table.add_column(col)
    for d in letters:
        what = d["type"] or "-"
        if d["job_id"]:
            what += f" ({d['job_id']})"
        table.add_row(
            d["id"],
            clock(d["at"]),
            escape(short(log, d["stream"])),
            d["entry"] or "-",
            escape(what),
            escape(d["kind"] or "-"),
            escape(d["reason"] or "-"),
            "yes" if d["redrivable"] else "no",
        )
    console.print(table)


def register_log_views(group: click.Group) -> None:
    @group.command("stats")
    @click.option(
        "--window",
        default="60s",
        show_default=True,
        callback=parse_window,
        metavar="TIME",
        help="How far back event counts and rates go (60s, 5m, 1h).",
    )
    @click.option(
        "--json", "as_json", is_flag=True, help="Print the view's JSON (documented in docs/observability.md)."
    )
    @click.pass_obj
    def stats_cmd(obj: Context, window: float, as_json: bool) -> None:
        """The streams now: lengths and memory, events by type over a window, consumer groups
        with lag and pending entries, dead letters by reason."""
        from sluice.views.stats import stats

        log = obj.log()
        s = stats(log, window)
        if as_json:
            emit(s)
        else:
            render_stats(log, s)

    @group.command("dead-letters")
    @click.option(
        "--redrive",
        "redrive_id",
        default=None,
        metavar="ID",
        help="Put dead letter ID back on the inbox it came from (once its cause is fixed).",
    )
    @click.option(
        "--stream",
        "dead_stream",
        default=None,
        metavar="STREAM",
        help="The dead-letter stream ID is in, when several hold that id (e.g. cluster:dead).",
    )
    @click.option(
        "--json", "as_json", is_flag=True, help="Print the view's JSON (documented in docs/observability.md)."
    )
    @click.pass_obj
    def dead_letters_cmd(obj: Context, redrive_id: str | None, dead_stream: str | None, as_json: bool) -> None:
        """The entries parked because they could not be decoded or handled, with why."""
        from sluice.views.deadletters import dead_letters, redrive

        log = obj.log()
        if redrive_id is None:
            letters = dead_letters(log)
            if as_json:
                emit(letters)
            else:
                render_dead_letters(log, letters)
            return
        stream = None
        if dead_stream is not None:
            (stream,) = resolve(log, (dead_stream,))[:1]
        out = redrive(log, redrive_id, stream)
        if as_json:
            emit(out)
        else:
            console.print(
                f"re-drove dead letter {out['id']} ({escape(out['type'] or 'undecodable entry')}) onto "
                f"{escape(short(log, out['stream']))} as {out['redriven_as']}"
            )
