"""What one harness run made, written to a state file as it is made, so that a run that died
(a killed test session, a crashed script) is cleaned up later by ``scripts/hosts clean``.

The file is ``<STATE_DIR>/<run>.json``; ``owner`` is the pid (and start time) of the process
that made the run: a run whose owner is gone is a leftover.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.chaos import procs

__all__ = ["STATE_DIR", "RunState", "runs"]

STATE_DIR = Path(os.environ.get("SLUICE_HOSTS_STATE_DIR", "/var/tmp/sluice-hosts"))
"""Where state files and run directories live: not under /tmp, which every host hides behind
its private tmpfs, so every host sees the run directory at the same path."""


@dataclass
class RunState:
    run: str
    owner: tuple[int, int]
    directory: str
    bridge: str = ""
    subnet: str = ""
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    """Root-side links (veths, the bridge): deleted by name."""
    holders: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Host name -> (pid, start time) of the process holding its mount namespace."""
    pids: list[tuple[int, int]] = field(default_factory=list)
    """Every process started (pid, start time), on any host."""

    @property
    def path(self) -> Path:
        return STATE_DIR / f"{self.run}.json"

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.path)

    def owner_alive(self) -> bool:
        """The owner still runs; a run with no owner (pid 0, left up by ``scripts/hosts up``) counts as owned."""
        pid, start = self.owner
        return pid == 0 or procs.same((pid, start))

    @classmethod
    def load(cls, path: Path) -> RunState:
        data = json.loads(path.read_text())
        data["owner"] = tuple(data["owner"])
        data["holders"] = {k: tuple(v) for k, v in data.get("holders", {}).items()}
        data["pids"] = [tuple(p) for p in data.get("pids", [])]
        return cls(**data)


def runs() -> list[RunState]:
    """Every run with a state file, oldest first (a file that does not parse is skipped)."""
    out = []
    if STATE_DIR.is_dir():
        for path in sorted(STATE_DIR.glob("*.json"), key=lambda p: p.stat().st_mtime):
            try:
                out.append(RunState.load(path))
            except (OSError, ValueError, TypeError, KeyError):
                continue
    return out
