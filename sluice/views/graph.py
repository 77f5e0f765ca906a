"""A job's ExecutionGraph at a moment, as vertices and edges (``sluice inspect graph``, the
dashboard's DAG), and as Graphviz text coloured by state.

JSON::

    {"job_id", "status",
     "vertices": [{"id", "name", "kind", "parallelism", "states": {STATE: count}, "status"}],
     "edges": [{"source", "target", "exchange", "key"}]}

``exchange`` is the JobGraph edge's: ``forward`` (subtask i to subtask i) or ``keyed``
(by key group). A vertex's ``status`` is the state most of its story is about: FAILED if
any subtask's current attempt failed, else the least advanced state any subtask is in
(so a vertex is FINISHED only when every subtask is), CREATED before the graph is built.
"""

from __future__ import annotations

from collections import Counter

from sluice.store import EventLog

from .history import Moment, job_at
from .jobs import require_job

__all__ = ["graph", "to_dot", "STATE_COLOURS"]

_ORDER = ("CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING", "CANCELING", "CANCELED", "FINISHED")

STATE_COLOURS = {
    "CREATED": "#d9d9d9",
    "SCHEDULED": "#c6dbef",
    "DEPLOYING": "#9ecae1",
    "INITIALIZING": "#6baed6",
    "RUNNING": "#4292c6",
    "FINISHED": "#74c476",
    "CANCELING": "#fdd0a2",
    "CANCELED": "#fd8d3c",
    "FAILED": "#ef3b2c",
}
"""Fill colour of a vertex by its status (the dashboard uses the same)."""


def _status(states: dict[str, int]) -> str:
    if not states:
        return "CREATED"
    if states.get("FAILED"):
        return "FAILED"
    return next(s for s in _ORDER if states.get(s))


def graph(log: EventLog, job_id: str, at: Moment = Moment(None)) -> dict:
    """Raises JobNotFound for a job the log never had."""
    require_job(log, job_id)
    run = job_at(log, job_id, at).run
    if run is None:
        return {"job_id": job_id, "status": "CREATED", "vertices": [], "edges": []}
    vertices = []
    for spec in run.graph.vertices:
        v = run.vertices.get(spec.name)
        states = dict(Counter(ex.state._value_ for ex in v.subtasks)) if v is not None else {}
        vertices.append(
            {
                "id": spec.name,
                "name": spec.name,
                "kind": spec.kind,
                "parallelism": spec.parallelism,
                "states": states,
                "status": _status(states),
            }
        )
    edges = [{"source": e.source, "target": e.target, "exchange": e.exchange, "key": e.key} for e in run.graph.edges]
    return {"job_id": job_id, "status": run.status._value_, "vertices": vertices, "edges": edges}


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(g: dict) -> str:
    """Graphviz text of ``graph()``'s data: one box per vertex, filled by its status, with
    its per-state counts; edges labelled with their exchange."""
    lines = [
        f"digraph {_q(str(g.get('job_id', 'job')))} {{",
        "  rankdir=LR;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    for v in g["vertices"]:
        counts = ", ".join(f"{s} {n}" for s, n in sorted(v["states"].items()))
        label = f"{v['name']} ({v.get('kind', '')}) x{v['parallelism']}\n{v['status']}"
        if counts:
            label += f"\n{counts}"
        colour = STATE_COLOURS.get(v["status"], "#ffffff")
        lines.append(f"  {_q(v['id'])} [label={_q(label)}, fillcolor={_q(colour)}];")
    for e in g["edges"]:
        label = e["exchange"] + (f" by {e['key']}" if e.get("key") else "")
        style = ", style=dashed" if e["exchange"] == "keyed" else ""
        lines.append(f"  {_q(e['source'])} -> {_q(e['target'])} [label={_q(label)}{style}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
