"""Sluice's lab, beside the product and outside its wheel: what a source checkout runs.

================  ================================================  =========================
package           what it holds                                     run with
================  ================================================  =========================
tools.bench       benchmarks against baselines measured in the run  ``scripts/bench``
tools.chaos       the seeded chaos campaign on real processes       ``scripts/chaos``
tools.sim         the deterministic simulation of a cluster         ``scripts/simulate``
tools.hosts       Sluice across hosts in network namespaces         ``scripts/hosts``
tools.containers  compose.yaml for real, with faults                ``scripts/compose-check``
================  ================================================  =========================

They import ``sluice`` (installed, editable or not) and are imported from the top of the
checkout: the scripts put it on ``PYTHONPATH``, pytest on ``sys.path`` (tests/ is a package).
A Python they start finds them through :func:`with_tools`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ROOT", "with_tools"]

ROOT = Path(__file__).resolve().parents[1]
"""The top of the source checkout (the folder that holds tools/, sluice/, scripts/)."""


def with_tools(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the checkout first on ``PYTHONPATH``,
    for a child Python that imports ``tools`` (``python -m tools.hosts.proxy``, an RQ worker of
    ``tools.bench.tasks``) whatever its working directory."""
    full = dict(os.environ if env is None else env)
    rest = [p for p in full.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), *rest])
    return full
