"""``python -m tools.sim``: see tools/sim/cli.py. Runs with a fixed hash seed, so a
seed replays the same in every process (set iteration order depends on it)."""

import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, "-m", "tools.sim", *sys.argv[1:]])

from .cli import main

main()
