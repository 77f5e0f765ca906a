"""Which subtask took which split, when, and what became of it: read from a job's facts.

Pure: give it the job's envelopes in log order. A split can appear several times (a
failed attempt's splits go back and are handed out again); exactly one of its rows ends
``finished`` when the job succeeded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sluice.events import Envelope, NextInputSplit, OperatorEvent, TaskState, UpdateTaskExecutionState
from sluice.services.jobs.state import parse_execution_id

__all__ = ["Assignment", "split_timeline", "describe_split"]


@dataclass
class Assignment:
    split: int
    what: str
    vertex: str
    subtask: int
    attempt: int
    at: int
    epoch: int
    outcome: str = "reading"
    """reading (held by a running attempt), finished, or returned (its attempt failed)."""


def describe_split(split: dict) -> str:
    if split.get("format") == "range":
        return f"numbers {split['start']}..{split['end'] - 1}"
    if "row_groups" in split:
        a, b = split["row_groups"]
        return f"{split['path']} row groups {a}..{b - 1}"
    return f"{split.get('path')} bytes {split.get('start')}..{split.get('end')}"


def split_timeline(envs: Iterable[Envelope]) -> list[Assignment]:
    rows: list[Assignment] = []
    held: dict[tuple[str, int, int], list[Assignment]] = {}
    for env in envs:
        ev = env.event
        split = None
        if isinstance(ev, OperatorEvent) and not ev.to_coordinator and isinstance(ev.body, dict) \
                and ev.body.get("type") == "split":
            split, vertex, subtask, attempt = ev.body.get("split"), ev.operator_id, ev.subtask, ev.attempt
        elif isinstance(ev, NextInputSplit) and ev.split is not None:
            vertex, subtask, attempt = parse_execution_id(ev.execution_id)
            split = ev.split
        elif isinstance(ev, UpdateTaskExecutionState) and ev.state.terminal:
            outcome = "finished" if ev.state == TaskState.FINISHED else "returned"
            for row in held.pop((ev.vertex_id, ev.subtask, ev.attempt), []):
                row.outcome = outcome
        if isinstance(split, dict):
            row = Assignment(int(split.get("index", -1)), describe_split(split), vertex, subtask, attempt, env.ts,
                             env.epoch)
            rows.append(row)
            held.setdefault((vertex, subtask, attempt), []).append(row)
    return rows
