"""Which subtask took which split, when, and what became of it: read from a job's facts.

Pure: give it the job's envelopes in log order. A split can appear several times (a
failed attempt's splits go back and are handed out again); exactly one of its rows ends
``finished`` when the job succeeded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sluice.events import (
    Envelope,
    NextInputSplit,
    OperatorEvent,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.jobs.state import parse_execution_id

from .source import NO_MORE, SPLIT

__all__ = ["Assignment", "split_timeline", "describe_split", "held_back", "told_no_more"]


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
    """reading (held by a running attempt), finished, or returned (its attempt failed, or
    had ended when the answer was recorded)."""


def describe_split(split: dict[str, Any]) -> str:
    if split.get("format") == "range":
        return f"numbers {split['start']}..{split['end'] - 1}"
    if "row_groups" in split:
        a, b = split["row_groups"]
        return f"{split['path']} row groups {a}..{b - 1}"
    return f"{split.get('path')} bytes {split.get('start')}..{split.get('end')}"


def _answer(ev: object) -> tuple[str, str, int, int, object] | None:
    """A coordinator's answer to a split request, by either protocol: (SPLIT or NO_MORE,
    vertex, subtask, attempt, the split); None for any other fact."""
    if (
        isinstance(ev, OperatorEvent)
        and not ev.to_coordinator
        and isinstance(ev.body, dict)
        and ev.body.get("type") in (SPLIT, NO_MORE)
    ):
        return ev.body["type"], ev.operator_id, ev.subtask, ev.attempt, ev.body.get("split")
    if isinstance(ev, NextInputSplit):
        vertex, subtask, attempt = parse_execution_id(ev.execution_id)
        return (NO_MORE if ev.split is None else SPLIT), vertex, subtask, attempt, ev.split
    return None


def split_timeline(envs: Iterable[Envelope]) -> list[Assignment]:
    """The assignments in log order. An answer recorded after its attempt ended (the
    request, the attempt's FAILED and its restart were one batch, and the coordinators'
    answers are committed after the batch's facts) went to an attempt that never read it:
    the coordinator took the split back, so its row is ``returned`` at once."""
    rows: list[Assignment] = []
    held: dict[tuple[str, int, int], list[Assignment]] = {}
    ended: set[tuple[str, int, int]] = set()
    current: dict[tuple[str, int], int] = {}
    for env in envs:
        ev = env.event
        split = None
        answer = _answer(ev)
        if answer is not None and answer[0] == SPLIT:
            _, vertex, subtask, attempt, split = answer
        elif isinstance(ev, UpdateTaskExecutionState) and ev.state.terminal:
            outcome = "finished" if ev.state == TaskState.FINISHED else "returned"
            ended.add((ev.vertex_id, ev.subtask, ev.attempt))
            for row in held.pop((ev.vertex_id, ev.subtask, ev.attempt), []):
                row.outcome = outcome
        elif isinstance(ev, TaskRestartScheduled):
            current[(ev.vertex_id, ev.subtask)] = ev.attempt
        if isinstance(split, dict):
            row = Assignment(
                int(split.get("index", -1)), describe_split(split), vertex, subtask, attempt, env.ts, env.epoch
            )
            rows.append(row)
            if (vertex, subtask, attempt) in ended or attempt < current.get((vertex, subtask), attempt):
                row.outcome = "returned"
            else:
                held.setdefault((vertex, subtask, attempt), []).append(row)
    return rows


def told_no_more(envs: Iterable[Envelope]) -> dict[tuple[str, int, int], int]:
    """When each (vertex, subtask, attempt) was first told there are no more splits (the
    fact's time, ms)."""
    out: dict[tuple[str, int, int], int] = {}
    for env in envs:
        answer = _answer(env.event)
        if answer is not None and answer[0] == NO_MORE:
            out.setdefault(answer[1:4], env.ts)
    return out


def held_back(envs: Iterable[Envelope]) -> dict[tuple[str, int, int], int]:
    """The readers told "no more splits" while splits were still to be handed out (the
    assigner's end game, or a share kept for a reader that had not asked yet): per
    (vertex, subtask, attempt), how many of the splits left then were handed out after.
    A split is left when no running attempt holds it and none finished it: one given back
    after the "no more" (its attempt failed) was not left then, and does not count."""
    out: dict[str, set[int]] = {}  # per vertex: splits held by a running attempt, or done
    held: dict[tuple[str, int, int], list[int]] = {}
    ended: set[tuple[str, int, int]] = set()
    current: dict[tuple[str, int], int] = {}
    told: dict[tuple[str, int, int], set[int]] = {}  # who -> its vertex's splits out when it was told
    after: dict[tuple[str, int, int], int] = {}

    def give_back(key: tuple[str, int, int]) -> None:
        for i in held.pop(key, []):
            out[key[0]].discard(i)

    for env in envs:
        ev = env.event
        if isinstance(ev, UpdateTaskExecutionState) and ev.state.terminal:
            key = (ev.vertex_id, ev.subtask, ev.attempt)
            ended.add(key)
            if ev.state == TaskState.FINISHED:
                held.pop(key, None)  # done: out for good
            else:
                give_back(key)
            continue
        if isinstance(ev, TaskRestartScheduled):
            current[(ev.vertex_id, ev.subtask)] = ev.attempt
            for key in [k for k in held if k[:2] == (ev.vertex_id, ev.subtask) and k[2] < ev.attempt]:
                give_back(key)
            continue
        answer = _answer(ev)
        if answer is None:
            continue
        kind, vertex, subtask, attempt, split = answer
        who = (vertex, subtask, attempt)
        if kind == NO_MORE:
            told[who] = set(out.get(vertex, ()))
            after.setdefault(who, 0)
        elif isinstance(split, dict):
            index = int(split.get("index", -1))
            for other, was_out in told.items():
                if other[0] == vertex and index not in was_out:
                    after[other] += 1
            if who not in ended and attempt >= current.get((vertex, subtask), attempt):
                out.setdefault(vertex, set()).add(index)  # (an answer to an ended attempt went back at once)
                held.setdefault(who, []).append(index)
    return {who: n for who, n in after.items() if n}
