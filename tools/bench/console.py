"""The console every bench prints its tables to: the terminal's width, or 160 columns when
the output is a pipe or a file (rich's 80 would fold the wide tables and cut their cells)."""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["console"]

console = Console(width=None if sys.stdout.isatty() else 160)
