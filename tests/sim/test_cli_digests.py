"""``scripts/simulate --digests FILE``: a line a seed, in seed order, each the digest the
seed gives when run on its own (so a refactoring that changes no behaviour leaves the file
the same, and one that does shows which seeds it changed)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tools.sim.cli import _run, digest, main


def test_digests_are_written_a_line_a_seed_in_seed_order_and_equal_a_lone_run(tmp_path: Path) -> None:
    out = tmp_path / "digests.txt"
    result = CliRunner().invoke(
        main, ["--seeds", "3", "--start", "5", "--workers", "2", "--all-faults", "--quiet", "--digests", str(out)]
    )
    assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["5", "6", "7"]
    alone = _run((6, {"all_faults": True}))
    assert lines[1].split()[:2] == ["6", digest(alone)]
    assert all(line.split()[2] == "ok" for line in lines)
