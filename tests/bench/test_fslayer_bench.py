"""The file layer's benchmark (tools/bench/fslayer.py) runs every operation on both sides
and prints a ratio for each; no timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.fslayer import main, measure


def test_every_operation_is_measured_on_both_sides(tmp_path: Path) -> None:
    rows = measure(tmp_path, files=20, mb=1, repeat=1)
    assert len(rows) == 7 and all(direct > 0 and layer > 0 for _, direct, layer in rows)


def test_it_prints_a_ratio_per_operation(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--files", "10", "--mb", "1", "--repeat", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8 and all(line.rstrip().endswith("x") for line in lines[1:])
