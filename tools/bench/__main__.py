"""``python -m tools.bench`` (what ``scripts/bench`` runs): see tools/bench/cli.py."""

from tools.bench.cli import main

main()
