"""``scripts/bench hosts``'s pure parts: where a job's time went from its task state changes,
the ratios, the table, the plain-Python count and the output check; its options refused
with what to give instead. The bench itself (hosts, as root) is ``-m "hosts and slow"``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from tools.bench.console import console
from tools.bench.hosts import Phase, Row, check_counts, phase_lines, phases, python_counts, ratios, read_counts, table


def test_phases_fold_task_changes_into_windows_running_and_waiting_per_vertex() -> None:
    changes = [
        (1_000, "src", "a", "SCHEDULED"),
        (1_000, "src", "b", "SCHEDULED"),
        (1_500, "src", "a", "DEPLOYING"),
        (2_000, "src", "a", "RUNNING"),
        (3_000, "src", "b", "RUNNING"),
        (6_000, "src", "a", "FINISHED"),
        (7_000, "src", "b", "FINISHED"),
        (6_500, "sum", "c", "SCHEDULED"),
        (7_500, "sum", "c", "RUNNING"),
        (9_000, "sum", "c", "FINISHED"),
        (9_000, "never", "d", "SCHEDULED"),
    ]
    got = phases(0, changes)
    assert got == {
        "src": Phase(start=2.0, end=7.0, running=8.0, waiting=3.0),
        "sum": Phase(start=7.5, end=9.0, running=1.5, waiting=1.0),
    }


def test_a_failed_attempt_counts_as_waiting_but_not_running() -> None:
    changes = [
        (0, "src", "a", "SCHEDULED"),
        (1_000, "src", "a", "RUNNING"),
        (2_000, "src", "a", "FAILED"),
        (2_000, "src", "a2", "SCHEDULED"),
        (2_500, "src", "a2", "RUNNING"),
        (4_000, "src", "a2", "FINISHED"),
    ]
    assert phases(0, changes) == {"src": Phase(start=1.0, end=4.0, running=1.5, waiting=1.5)}


ROWS = [
    Row("plain PySpark, 1 host", [10.0, 8.0], 30.0),
    Row("Sluice, 1 host", [12.0, 16.0], 40.0),
    Row("Sluice, 2 hosts, local", [9.0, 9.6], 41.0, {"src": Phase(0.1, 6.0, 10.0, 0.2)}, "tm1 2, tm2 2"),
    Row("Sluice, 2 hosts, standalone", [18.0], 80.0),
]


def test_ratios_are_best_against_plain_and_two_hosts_against_one() -> None:
    got = ratios(ROWS)
    assert got["plain PySpark, 1 host"] == {"plain": 1.0}
    assert got["Sluice, 1 host"] == {"plain": 1.5}
    assert got["Sluice, 2 hosts, local"] == {"plain": 9.0 / 8.0, "one host": 0.75}
    assert got["Sluice, 2 hosts, standalone"] == {"plain": 2.25, "one host": 1.5}


def test_without_a_plain_row_there_is_no_plain_ratio() -> None:
    assert ratios(ROWS[1:3]) == {"Sluice, 1 host": {}, "Sluice, 2 hosts, local": {"one host": 0.75}}


def test_the_table_shows_each_row_with_its_ratios_and_the_phases_their_lines() -> None:
    with console.capture() as out:
        console.print(table(ROWS, "t"))
    text = out.get()
    assert "│ Sluice, 2 hosts, local" in text and "1.12" in text and "0.75" in text and "tm1 2, tm2 2" in text
    assert "2.25" in text and "1.50" in text and "9.0, 9.6" in text
    assert phase_lines(ROWS) == [
        "Sluice, 2 hosts, local, src: ran 0.1-6.0 s after SubmitJob; tasks RUNNING 10.0 s "
        "summed, waiting to run (SCHEDULED -> RUNNING) 0.2 s summed"
    ]


def test_the_plain_python_count_is_the_jobs_tokenizer(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes("Don't stop: the THE the_x 42 caf\u00e9\n\n\xa0x\n".encode() + b"bad \xff byte\n")
    assert python_counts(source) == Counter(
        {"don't": 1, "stop": 1, "the": 3, "x": 2, "42": 1, "caf": 1, "bad": 1, "byte": 1}
    )


def test_the_output_check_reads_parquet_and_names_what_differs(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    out.mkdir()
    pq.write_table(pa.table({"word": ["a", "b"], "count": [2, 1]}), out / "part-0.parquet")
    pq.write_table(pa.table({"word": ["c"], "count": [5]}), out / "part-1.parquet")
    (out / "_SUCCESS").write_text("")
    got = read_counts(out)
    check_counts("x", got, Counter({"a": 2, "b": 1, "c": 5}))
    with pytest.raises(RuntimeError, match=r"x is not the plain-Python count: 3 words \(want 3\).*counts for \['c'\]"):
        check_counts("x", got, Counter({"a": 2, "b": 1, "c": 4}))
    with pytest.raises(RuntimeError, match=r"missing \['d'\]"):
        check_counts("x", got, Counter({"a": 2, "b": 1, "c": 5, "d": 1}))


@pytest.mark.parametrize("spark", ["standalone", "local,yarn"])
def test_bad_spark_modes_are_refused_naming_the_choices(spark: str) -> None:
    from tools.bench.cli import bench

    result = CliRunner().invoke(bench, ["hosts", "--spark", spark])
    assert result.exit_code == 2, result.output
    assert "--spark" in result.output and "local, standalone, standalone-shared" in result.output
