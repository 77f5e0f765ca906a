"""A failing seed's story: what the simulation did last, and the log as ``inspect tail`` shows it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from sluice.store import EventLog, entry_order
from sluice.views.entries import line, record

if TYPE_CHECKING:
    from .cluster import Simulation

__all__ = ["render"]


def render(sim: Simulation, violation: str, *, entries: int = 60) -> str:
    out = [
        f"seed {sim.cfg.seed} failed at step {sim.steps} (t={sim.world.elapsed_ms / 1000:.3f} s simulated)",
        f"faults on: {', '.join(sorted(sim.faults.rates)) or 'none'}",
        "",
        "VIOLATION: " + violation,
        "",
        "what the simulation did last:",
    ]
    out += ["  " + n for n in list(sim.notes)[-40:]]
    out += ["", f"the last {entries} entries of the log (sluice inspect tail):"]
    log = EventLog.__new__(EventLog)
    log.keys = sim.keys
    rows = []
    for stream in sim.store.streams():
        for entry_id, fields in sim.store.entries(stream)[-entries:]:
            rows.append((entry_order(entry_id), stream, entry_id, fields))
    rows.sort(key=lambda r: r[0])
    for _, stream, entry_id, fields in rows[-entries:]:
        out.append("  " + Text.from_markup(line(record(log, stream, entry_id, fields))).plain)
    return "\n".join(out)
