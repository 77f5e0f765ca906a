"""Every bench option that takes a list of counts names itself and says what it wants when
given a bad one (before anything starts)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tools.bench.cli import bench


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("tasks", "--tasks"),
        ("control", "--sizes"),
        ("alltoall", "--sizes"),
        ("wordcount", "--megabytes"),
        ("recovery", "--sizes"),
    ],
)
@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("60,x", "give whole numbers separated by commas"),
        ("", "give whole numbers separated by commas"),
        ("0", "every number must be 1 or more"),
        ("60,-5", "every number must be 1 or more"),
    ],
)
def test_a_bad_list_of_counts_is_named(command: str, option: str, value: str, says: str) -> None:
    result = CliRunner().invoke(bench, [command, option, value])
    assert result.exit_code == 2
    assert option in result.output and says in result.output


def test_sluice_bench_says_where_the_benchmarks_went() -> None:
    """The installed ``sluice`` has no benchmarks: ``sluice bench ...`` says to run them from a
    source checkout with scripts/bench, whatever follows it."""
    from sluice.cli.main import _register, cli

    _register()
    for args in (["bench"], ["bench", "tasks", "--tasks", "60"], ["bench", "--help"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, result.output
        assert "source checkout" in result.output and "scripts/bench" in result.output
