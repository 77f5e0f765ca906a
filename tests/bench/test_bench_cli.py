"""Every bench option that takes a list of counts names itself and says what it wants when
given a bad one (before anything starts)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sluice.cli.bench import bench


@pytest.mark.parametrize(("command", "option"), [("tasks", "--tasks"), ("control", "--sizes"),
                                                 ("alltoall", "--sizes"), ("wordcount", "--megabytes"),
                                                 ("recovery", "--sizes")])
@pytest.mark.parametrize(("value", "says"), [("60,x", "give whole numbers separated by commas"),
                                             ("", "give whole numbers separated by commas"),
                                             ("0", "every number must be 1 or more"),
                                             ("60,-5", "every number must be 1 or more")])
def test_a_bad_list_of_counts_is_named(command: str, option: str, value: str, says: str) -> None:
    result = CliRunner().invoke(bench, [command, option, value])
    assert result.exit_code == 2
    assert option in result.output and says in result.output
