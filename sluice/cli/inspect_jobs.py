"""``sluice inspect jobs|job|graph|kvstate|taskmanagers``: the views of ``sluice.views``
rendered with rich, or printed as JSON (``--json``: one document, the view's own data), at
any moment of the log (``--at``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sluice.errors import BadMoment, SluiceError
from sluice.views.history import Moment, resolve_at

from .context import Context

__all__ = ["at_option", "clock", "emit", "register_job_views"]

console = Console(highlight=False, emoji=False, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])

STATE_STYLE = {
    "CREATED": "dim",
    "SCHEDULED": "blue",
    "DEPLOYING": "blue",
    "INITIALIZING": "cyan",
    "RUNNING": "bold blue",
    "FINISHED": "green",
    "CANCELING": "yellow",
    "CANCELED": "yellow",
    "FAILED": "bold red",
    "FAILING": "red",
    "CANCELLING": "yellow",
    "REGISTERED": "green",
    "LOST": "red",
    "UNREGISTERED": "dim",
}


def _at(ctx: click.Context, param: click.Parameter, value: str | None) -> Moment:
    try:
        return resolve_at(value)
    except BadMoment as exc:
        raise click.BadParameter(str(exc).replace("--at ", "", 1), ctx, param) from None


def at_option(f: F) -> F:
    return click.option(
        "--at",
        "at",
        default=None,
        callback=_at,
        metavar="ENTRY_ID|TIME",
        help="Show it as it was at this entry of the log, time in ms or ISO 8601 time (default: now).",
    )(f)


def json_option(f: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print the view's JSON (documented in docs/observability.md)."
    )(f)


def emit(data: object) -> None:
    sys.stdout.write(orjson.dumps(data).decode() + "\n")
    sys.stdout.flush()


def clock(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.3f} s" if s < 10 else f"{s:.1f} s"
    return f"{int(s // 60)} min {s % 60:02.0f} s"


def styled(state: str | None) -> str:
    if state is None:
        return "-"
    style = STATE_STYLE.get(state, "")
    return f"[{style}]{escape(state)}[/]" if style else escape(state)


def _moment(at: Moment) -> str:
    return f" at {escape(at.said or at.entry or '')}" if at.entry is not None else ""


# --- jobs -------------------------------------------------------------------------------


def render_jobs(rows: list[dict], at: Moment) -> None:
    table = Table(title=f"jobs{_moment(at)}")
    for col in ("job", "name", "status", "submitted", "duration", "tasks", "restarts", "reason"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            escape(r["job_id"]),
            escape(r["name"]),
            styled(r["status"]),
            clock(r["submitted_at"]),
            seconds(r["duration_s"]),
            f"{r['tasks_done']}/{r['tasks_total']}",
            str(r["restarts"]),
            escape((r["reason"] or "").splitlines()[0][:80] if r["reason"] else ""),
        )
    console.print(table)


# --- one job's timeline -------------------------------------------------------------------


def render_job(t: dict, at: Moment, *, gantt: bool) -> None:
    job = t["job"]
    restarts = f"{t['restarts']} restart{'s' if t['restarts'] != 1 else ''}"
    console.print(
        f"[bold]job {escape(job['job_id'])}[/] ({escape(job['name'])}){_moment(at)}: "
        f"{styled(job['status'])}, {restarts}, {job['tasks_done']}/{job['tasks_total']} tasks done, "
        f"submitted {clock(job['submitted_at'])}"
        + (
            f", ended {clock(job['ended_at'])} after {seconds(job['duration_s'])}"
            if job["ended_at"]
            else f", {seconds(job['duration_s'])} so far"
        )
    )
    cause = t["root_cause"]
    if cause is not None:
        title = "root cause" if cause["job_failed"] else "last failure"
        console.print(f"[red]{title}:[/] {escape(cause['text'])}")
        if cause["traceback"] and cause["traceback"].strip() != cause["text"].strip():
            console.print(cause["traceback"], markup=False, style="dim")
    if gantt:
        render_gantt(t, at)
        return
    start = job["submitted_at"] or (t["events"][0]["at"] if t["events"] else 0)
    events = Table(title="timeline", show_edge=False)
    for col in ("time", "+s", "what", "", "entry"):
        events.add_column(col, no_wrap=col != "")
    for e in t["events"]:
        style = {
            "restart": "magenta",
            "job-status": "bold",
            "checkpoint": "dim",
            "split-request": "dim",
            "speculative": "cyan",
            "won": "green",
        }.get(e["kind"], "red" if e.get("state") == "FAILED" else "")
        events.add_row(
            clock(e["at"]),
            f"{(e['at'] - start) / 1000:.3f}",
            escape(e["kind"]),
            Text(e["text"], style=style),
            f"[dim]{e['entry']}[/]",
        )
    console.print(events)
    attempts = Table(title="attempts", show_edge=False)
    for col in ("subtask", "attempt", "where", "final", "deployed", "duration", "states", "splits"):
        attempts.add_column(col)
    for a in t["attempts"]:
        where = f"{a['taskmanager']} slot {a['slot']}" if a["taskmanager"] is not None else "-"
        path = " → ".join(
            f"{s['state']} {seconds(s['duration_s'])}" if s["duration_s"] is not None else s["state"]
            for s in a["states"][1:]
        )
        splits = ", ".join(f"{s['split']} {s['outcome']}" for s in a["splits"]) or "-"
        attempts.add_row(
            escape(f"{a['vertex']}[{a['subtask']}]"),
            str(a["attempt"]) + _race(a),
            escape(where),
            styled(a["final"]),
            clock(a["started_at"]),
            seconds(a["duration_s"]),
            escape(path),
            escape(splits),
        )
    console.print(attempts)


def _race(a: dict) -> str:
    """What speculative execution made of an attempt: ``(speculative, won)`` and the like."""
    marks = (["speculative"] if "speculative" in a else []) + ([a["race"]] if "race" in a else [])
    return f" ({', '.join(marks)})" if marks else ""


_BAR = {
    "SCHEDULED": ("░", "blue"),
    "DEPLOYING": ("▒", "blue"),
    "INITIALIZING": ("▓", "cyan"),
    "RUNNING": ("█", "blue"),
    "CANCELING": ("▒", "yellow"),
}
_END = {"FINISHED": ("✓", "green"), "FAILED": ("✗", "bold red"), "CANCELED": ("○", "yellow")}


def render_gantt(t: dict, at: Moment) -> None:
    """Each attempt a bar from its deployment to its end, shaded by state, on one time axis."""
    shown = [a for a in t["attempts"] if a["started_at"] is not None]
    if not shown:
        console.print("no attempt deployed yet")
        return
    t0 = min(a["started_at"] for a in shown)
    ends = [a["ended_at"] for a in shown if a["ended_at"] is not None]
    open_until = [a["started_at"] + int((a["duration_s"] or 0) * 1000) for a in shown]
    t1 = max(ends + open_until + [t0 + 1])
    labels = [f"{a['vertex']}[{a['subtask']}] #{a['attempt']} {a['taskmanager'] or ''}/{a['slot']}" for a in shown]
    pad = max(len(s) for s in labels) + 1
    width = max(min(console.width - pad - 4, 100), 20)

    def col(ms: int) -> int:
        return min(int((ms - t0) * width / (t1 - t0)), width - 1)

    for label, a in zip(labels, shown):
        line = Text(label.ljust(pad))
        cells = [(" ", "")] * width
        states = [s for s in a["states"] if s["state"] != "CREATED"]
        for s, nxt in zip(states, states[1:] + [None]):
            bar = _BAR.get(s["state"])
            if bar is None:
                continue
            stop = nxt["at"] if nxt is not None else a["started_at"] + int((a["duration_s"] or 0) * 1000)
            for c in range(col(s["at"]), max(col(stop), col(s["at"]) + 1)):
                cells[c] = bar
        if a["final"] in _END and a["ended_at"] is not None:
            cells[col(a["ended_at"])] = _END[a["final"]]
        for ch, style in cells:
            line.append(ch, style=style)
        line.append(f" {seconds(a['duration_s'])}")
        console.print(line)
    axis = f"0 s{' ' * (width - 3 - len(seconds((t1 - t0) / 1000)))}{seconds((t1 - t0) / 1000)}"
    console.print(" " * pad + axis, style="dim")
    console.print(
        " " * pad + "░ scheduled ▒ deploying ▓ initializing █ running  ✓ finished ✗ failed ○ canceled", style="dim"
    )


# --- the ExecutionGraph -------------------------------------------------------------------


def render_graph(g: dict, at: Moment) -> None:
    table = Table(title=f"ExecutionGraph of job {escape(g['job_id'])}{_moment(at)}: {g['status']}")
    for col in ("vertex", "kind", "parallelism", "status", "subtasks by state"):
        table.add_column(col)
    for v in g["vertices"]:
        counts = ", ".join(f"{styled(s)} {n}" for s, n in sorted(v["states"].items()))
        table.add_row(escape(v["name"]), escape(v["kind"]), str(v["parallelism"]), styled(v["status"]), counts)
    console.print(table)
    for e in g["edges"]:
        key = f" by {escape(e['key'])}" if e.get("key") else ""
        console.print(f"  {escape(e['source'])} ──{escape(e['exchange'])}{key}──▶ {escape(e['target'])}")
    if not g["edges"]:
        console.print("  [dim](no edges: every vertex is its own pipeline)[/]")


def write_png(dot_text: str, out: str) -> None:
    dot = shutil.which("dot")
    if dot is None:
        raise SluiceError(
            "--png needs Graphviz's `dot` program, which is not on PATH: install Graphviz "
            "(apt-get install graphviz), or write the Graphviz text with --dot FILE and render it "
            "elsewhere"
        )
    done = subprocess.run(
        [dot, "-Tpng", "-o", out], input=dot_text, text=True, capture_output=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise SluiceError(f"dot could not render {out}: {done.stderr.strip() or f'exit {done.returncode}'}")


# --- queryable state ------------------------------------------------------------------------


def render_kvstate(job_id: str, rows: list[dict], at: Moment) -> None:
    table = Table(title=f"KvStateLocation table of job {escape(job_id)}{_moment(at)}")
    for col in ("name", "vertex", "key groups", "range", "state id", "server", "registered by"):
        table.add_column(col)
    for r in rows:
        first = True
        for rng in r["ranges"] or [None]:
            head = (
                (escape(r["name"]), escape(r["vertex"]), f"{r['registered_key_groups']}/{r['num_key_groups']}")
                if first
                else ("", "", "")
            )
            first = False
            if rng is None:
                table.add_row(*head, "-", "-", "-", "-")
                continue
            table.add_row(
                *head,
                f"{rng['start']}..{rng['end']}",
                escape(rng["state_id"]),
                escape(rng["address"]),
                escape(rng["execution_id"] or "-"),
            )
    console.print(table)
    if not rows:
        console.print("[dim]no queryable state registered[/]")


def render_taskmanagers(rows: list[dict], at: Moment) -> None:
    table = Table(title=f"TaskManagers{_moment(at)}")
    for col in ("TaskManager", "host", "state", "slots used/total", "held by", "registered", "last heartbeat"):
        table.add_column(col)
    for r in rows:
        held = ", ".join(f"{h['slot']}: {h['job_id']} {h['execution_id']}" for h in r["slots"]) or "-"
        table.add_row(
            escape(r["resource_id"]),
            escape(r["host"]),
            styled(r["state"]),
            f"{r['slots_in_use']}/{r['slots_total']}",
            escape(held),
            clock(r["registered_at"]),
            clock(r["last_heartbeat"]),
        )
    console.print(table)


# --- commands -------------------------------------------------------------------------------


def register_job_views(group: click.Group) -> None:
    @group.command("jobs")
    @at_option
    @json_option
    @click.pass_obj
    def jobs_cmd(obj: Context, at: Moment, as_json: bool) -> None:
        """Every job: status, duration, tasks done, restarts."""
        from sluice.views.jobs import jobs

        rows = jobs(obj.log(), at)
        if as_json:
            emit(rows)
        else:
            render_jobs(rows, at)

    @group.command("job")
    @click.argument("job_id")
    @at_option
    @json_option
    @click.option("--gantt", is_flag=True, help="Draw the attempts as bars on one time axis.")
    @click.pass_obj
    def job_cmd(obj: Context, job_id: str, at: Moment, as_json: bool, gantt: bool) -> None:
        """JOB_ID's timeline: submission, every attempt's deployment and state changes with their
        durations, splits, coordinator events and checkpoints, failures with their root cause,
        restarts, the end."""
        from sluice.views.timeline import timeline

        t = timeline(obj.log(), job_id, at)
        if as_json:
            emit(t)
        else:
            render_job(t, at, gantt=gantt)

    @group.command("graph")
    @click.argument("job_id")
    @at_option
    @json_option
    @click.option(
        "--dot",
        "dot",
        is_flag=False,
        flag_value="-",
        default=None,
        metavar="[FILE]",
        help="Write Graphviz text coloured by state, to FILE or (alone) to stdout.",
    )
    @click.option(
        "--png",
        "png",
        default=None,
        metavar="FILE",
        type=click.Path(dir_okay=False),
        help="Render it to a PNG with Graphviz's dot (apt-get install graphviz).",
    )
    @click.pass_obj
    def graph_cmd(obj: Context, job_id: str, at: Moment, as_json: bool, dot: str | None, png: str | None) -> None:
        """JOB_ID's ExecutionGraph: vertices with their subtasks by state, edges with their exchange."""
        from sluice.views.graph import graph, to_dot

        g = graph(obj.log(), job_id, at)
        if dot is None and png is None:
            if as_json:
                emit(g)
            else:
                render_graph(g, at)
            return
        text = to_dot(g)
        if png is not None:
            write_png(text, png)
            if dot != "-":
                console.print(f"wrote {escape(png)}")
        if dot == "-":
            sys.stdout.write(text)
        elif dot is not None:
            Path(dot).write_text(text)
            console.print(f"wrote {escape(dot)}")

    @group.command("kvstate")
    @click.argument("job_id")
    @at_option
    @json_option
    @click.pass_obj
    def kvstate_cmd(obj: Context, job_id: str, at: Moment, as_json: bool) -> None:
        """JOB_ID's KvStateLocation table: each queryable state's key-group ranges, state ids and servers."""
        from sluice.views.kvstate import kvstate

        rows = kvstate(obj.log(), job_id, at)
        if as_json:
            emit(rows)
        else:
            render_kvstate(job_id, rows, at)

    @group.command("taskmanagers")
    @at_option
    @json_option
    @click.pass_obj
    def taskmanagers_cmd(obj: Context, at: Moment, as_json: bool) -> None:
        """Every TaskManager: state, slots in use and by whom, last heartbeat."""
        from sluice.views.taskmanagers import taskmanagers

        rows = taskmanagers(obj.log(), at)
        if as_json:
            emit(rows)
        else:
            render_taskmanagers(rows, at)
