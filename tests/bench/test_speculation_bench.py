"""The speculation bench (tools/bench/speculation.py) refuses bad options before it starts."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tools.bench.cli import bench


@pytest.mark.parametrize(("option", "value"), [("--slow", "0.5"), ("--work", "0"), ("--reducers", "2")])
def test_a_bad_option_is_named(option: str, value: str) -> None:
    result = CliRunner().invoke(bench, ["speculation", option, value])
    assert result.exit_code == 2 and option in result.output
