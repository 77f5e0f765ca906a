"""Reader options and retry classification checked where they can be, without Spark: a bad
option refused at submission naming the vertex, the option and the fix; the DDL check; the
classification of failures; the versions that carry it; and the jobs core failing a job at
once on a failure its TaskManager found deterministic (replayed state equal to live)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice import events
from sluice.api import Job
from sluice.errors import InvalidJobGraph
from sluice.events import (
    Envelope,
    JobStatus,
    RestartStrategy,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
    decode,
    descriptor_from_json,
    descriptor_to_json,
    encode,
)
from sluice.services.dataplane import ddl
from sluice.services.jobs.validate import problems, validate
from sluice.services.taskmanager.classify import classify, names_of
from tests.cores import JobsDriven
from tests.services.test_jobs_core import wordcount


def _csv_problems(**kw) -> list[str]:
    j = Job("t")
    j.read_csv("flights", "/data/f.csv", **kw).write_parquet("out", "/data/out")
    return problems(j.graph())


# --- options at submission ----------------------------------------------------------------------


def test_good_options_of_every_reader_pass() -> None:
    j = Job("t", retry_on=[ValueError, "mymod.Flaky"], no_retry_on=["CAST_INVALID_INPUT"])
    j.read_csv("a", "/a.csv", sep="\t", quote="", null_value="NA", schema="x INT, y STRING", mode="dropmalformed")
    j.read_text("b", "/b.txt", encoding="windows-1252")
    j.read_json("c", "/c.jsonl", schema="u STRING, tags ARRAY<STRING>", mode="FAILFAST", multi_line=True)
    j.read_parquet("d", "/d.parquet", columns=["k", "v"], options={"datetimeRebaseMode": "CORRECTED"})
    j.read_csv("e", "/e.csv", options={"dateFormat": "yyyy-MM-dd", "NANVALUE": "-"})
    graph = j.graph()
    assert [p for p in problems(graph) if "no consumer" not in p] == []
    assert graph.restart.retry_on == ["ValueError", "mymod.Flaky"]
    assert graph.vertices[0].source.options == {  # type: ignore[union-attr]
        "header": "true",
        "inferSchema": "false",
        "sep": "\t",
        "quote": "",
        "nullValue": "NA",
        "schema": "x INT, y STRING",
        "mode": "dropmalformed",
    }


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"sep": ";;"}, "source 'flights -> out': option 'sep' must be a single character, got ';;' (2 characters)"),
        ({"quote": "''"}, "option 'quote' must be a single character"),
        ({"mode": "LENIENT"}, "option 'mode' is 'LENIENT'; use one of PERMISSIVE, DROPMALFORMED, FAILFAST"),
        ({"schema": "a INTEGR"}, "option 'schema' (a schema): 'a INTEGR' is not a Spark DDL schema ('INTEGR' is not a"),
        ({"schema": "a INT, a STRING"}, "names column(s) 'a' more than once"),
        ({"schema": "a INT, t ARRAY<STRING>"}, "makes 't' an array, map or struct, which the CSV reader cannot read"),
        ({"encoding": "UTF-16"}, "option 'encoding' is not ASCII-compatible"),
        ({"encoding": "klingon"}, "option 'encoding' is not a known charset"),
        ({"sep": "|", "quote": "|"}, "options 'sep' and 'quote' are both '|'; they must differ"),
        (
            {"options": {"delimiter": ";"}},
            "option 'delimiter' is not a csv reader option (Sluice spells it 'sep'); known: ",
        ),
        ({"options": {"lineSep": ";"}}, "option 'lineSep' is not a csv reader option (splits are cut at"),
        ({"options": {"header": "yes"}}, None),  # has its own argument: refused by the API at once (below)
        ({"options": {"enforceSchema": "maybe"}}, "option 'enforceSchema' must be 'true' or 'false', got 'maybe'"),
    ],
)
def test_a_bad_csv_option_is_refused_naming_the_vertex_the_option_and_the_fix(kw, expected) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="reader option 'header' has its own argument: pass it as header="):
            _csv_problems(**kw)
        return
    found = _csv_problems(**kw)
    assert any(expected in p for p in found), found
    assert all(p.startswith("source 'flights -> out': ") for p in found if "option" in p)


def test_an_unknown_option_lists_the_known_ones_and_the_job_is_refused_before_it_runs() -> None:
    j = Job("t")
    j.read_json("events", "/e.jsonl", options={"samplingRatioo": "0.5"}).write_parquet("out", "/o")
    j.read_parquet("facts", "/f.parquet", columns=[]).write_parquet("out2", "/o2")
    with pytest.raises(InvalidJobGraph) as caught:
        validate(j.graph())
    text = str(caught.value)
    assert "source 'events -> out': option 'samplingRatioo' is not a json reader option; known: allowBackslash" in text
    assert "multiLine" in text and "schema" in text
    assert "source 'facts -> out2': option 'columns' must be a JSON list of column names" in text


def test_a_hand_built_graph_is_checked_as_the_api_builds_it() -> None:
    """The JobManager validates what it gets, whoever built it: options are text, names known."""
    from dataclasses import replace

    from sluice.events import SourceSpec

    graph = wordcount()
    bad = SourceSpec("text", ["/in"], 100, {"encoding": 8, "wholetext": "true"})  # type: ignore[dict-item]
    graph = replace(graph, vertices=[replace(graph.vertices[0], source=bad), *graph.vertices[1:]])
    found = problems(graph)
    assert any("option 'encoding' must be text, got int 8" in p for p in found), found
    assert any("option 'wholetext' is not a text reader option (read with read_text" in p for p in found), found


def test_retry_on_and_no_retry_on_take_names() -> None:
    j = Job("t", retry_on=["not a name!"], no_retry_on=["X", "Y"])
    j.read_text("l", "/in").write_parquet("o", "/o")
    found = problems(j.graph())
    assert any("retry_on names 'not a name!'" in p for p in found)
    j = Job("t", retry_on=["X"], no_retry_on=["X"])
    j.read_text("l", "/in").write_parquet("o", "/o")
    assert any("'X' is in both retry_on and no_retry_on" in p for p in problems(j.graph()))


def test_the_api_refuses_what_is_not_a_schema_or_a_column_list() -> None:
    with pytest.raises(TypeError, match="DDL string"):
        Job("t").read_csv("a", "/a", schema=42)
    with pytest.raises(TypeError, match="list of column names"):
        Job("t").read_parquet("a", "/a", columns="k")


# --- DDL ------------------------------------------------------------------------------------------


_PRIMITIVES = [
    "INT",
    "bigint",
    "STRING",
    "double",
    "boolean",
    "date",
    "timestamp",
    "DECIMAL(10,2)",
    "binary",
]
_names = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True) | st.from_regex(r"`[a-z ,<>:]{1,6}`", fullmatch=True)
_types = st.recursive(
    st.sampled_from(_PRIMITIVES),
    lambda inner: st.one_of(
        inner.map(lambda t: f"ARRAY<{t}>"),
        st.tuples(inner, inner).map(lambda kv: f"MAP<{kv[0]}, {kv[1]}>"),
        st.lists(st.tuples(_names, inner), min_size=1, max_size=3, unique_by=lambda f: f[0].lower()).map(
            lambda fs: "STRUCT<" + ", ".join(f"{n}: {t}" for n, t in fs) + ">"
        ),
    ),
    max_leaves=6,
)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(_names, _types, st.booleans()), min_size=1, max_size=5, unique_by=lambda c: c[0].strip("`").lower()
    )
)
def test_every_schema_the_grammar_makes_is_accepted_with_its_column_names(columns) -> None:
    text = ", ".join(f"{n} {t}{' NOT NULL' if nn else ''}" for n, t, nn in columns)
    assert ddl.problems(text) is None
    assert ddl.column_names(text) == [n.strip("`") for n, _, _ in columns]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "it is empty"),
        ("a", "it ends too early"),
        ("a INT,", "it ends too early"),
        ("a INT b", "unexpected 'b' after column 'a'"),
        ("a ARRAY<INT", "expected '>' at the end"),
        ("a MAP<INT>", "expected ','"),
        ("a DECIMAL(1,2,3)", "DECIMAL takes 0 to 2 parameter(s), got 3"),
        ("a VARCHAR", "VARCHAR takes 1 parameter(s), got 0"),
        ("a INT; DROP TABLE t", "unexpected character ';'"),
        ("a STRUCT<b: VARCHAR(3)>", "uses VARCHAR, which Spark's file readers refuse in a schema; use STRING"),
    ],
)
def test_a_schema_that_is_not_ddl_says_why(text, why) -> None:
    assert why in (ddl.problems(text) or ""), ddl.problems(text)


# --- classification -------------------------------------------------------------------------------


class BadRow(ValueError):
    pass


def test_deterministic_failures_are_not_retryable_and_the_rest_are() -> None:
    from pyspark.errors import AnalysisException, ParseException

    assert not classify(AnalysisException("[UNRESOLVED_COLUMN.WITH_SUGGESTION] x")).retryable
    assert not classify(ParseException("bad sql")).retryable
    assert not classify(ModuleNotFoundError("No module named 'mylib'")).retryable
    cast = classify(RuntimeError("[CAST_INVALID_INPUT] The value 'NA' of the type STRING cannot be cast to INT"))
    assert not cast.retryable and cast.why and cast.why.startswith("Spark error CAST_INVALID_INPUT is deterministic")
    wrapped = RuntimeError("task failed")
    wrapped.__cause__ = ArithmeticError("[DIVIDE_BY_ZERO] Division by zero.")
    assert not classify(wrapped).retryable  # found through the chain
    read = classify(OSError("[FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH] column n"))
    assert not read.retryable and "FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH" in (read.why or "")
    for transient in (ConnectionError("reset"), ValueError("bad row 42"), OSError("[FAILED_READ_FILE.NO_HINT] io")):
        assert classify(transient).retryable


def test_the_jobs_lists_decide_first_by_class_name_or_condition() -> None:
    exc = BadRow("row 7")
    classes, _ = names_of(exc)
    assert {"BadRow", f"{__name__}.BadRow", "ValueError", "Exception"} <= set(classes)
    assert classify(exc).retryable
    verdict = classify(exc, no_retry_on=["ValueError"])
    assert (
        not verdict.retryable
        and verdict.why == "ValueError is in the job's no_retry_on: the job fails without another attempt"
    )
    assert classify(ImportError("x"), retry_on=["ImportError"]).retryable
    assert not classify(ImportError("x"), retry_on=["ImportError"], no_retry_on=["ImportError"]).retryable
    assert classify(RuntimeError("[CAST_INVALID_INPUT] v"), retry_on=["CAST_INVALID_INPUT"]).retryable


def test_a_self_referencing_chain_ends() -> None:
    a, b = ValueError("a"), KeyError("b")
    a.__context__, b.__context__ = b, a
    assert classify(a).retryable


# --- versions -------------------------------------------------------------------------------------


def test_a_failure_report_is_written_as_v3_unless_it_is_not_retryable() -> None:
    """TaskManagers are upgraded before the leader: only a deterministic failure (new with
    v4) needs an upgraded leader; a v3 report reads as retryable."""
    assert UpdateTaskExecutionState.VERSION == 4
    failed = Envelope(UpdateTaskExecutionState("j", "v:0:0", TaskState.FAILED, "boom", "v", 0, 0, "tm", 1), "id", 4, 5)
    raw = orjson.loads(encode(failed))
    assert raw["v"] == 3 and "retryable" not in raw["payload"] and decode(encode(failed)) == failed
    final = Envelope(
        UpdateTaskExecutionState("j", "v:0:0", TaskState.FAILED, "[CAST_INVALID_INPUT]", retryable=False), "id", 4, 5
    )
    raw = orjson.loads(encode(final))
    assert raw["v"] == 4 and raw["payload"]["retryable"] is False and decode(encode(final)) == final


def test_a_v2_descriptor_reads_with_no_retry_lists() -> None:
    d = events.TaskDeploymentDescriptor(
        "j", "v:0:0", "v", 0, 0, 1, 128, "noop", "0" * 64, "m", [], {}, [], retry_on=["A"], no_retry_on=["B"]
    )
    assert descriptor_from_json(descriptor_to_json(d)) == d
    v2 = descriptor_to_json(d)
    del v2["retry_on"], v2["no_retry_on"]
    v2["version"] = 2
    old = descriptor_from_json(v2)
    assert (old.retry_on, old.no_retry_on, old.version) == ([], [], events.DESCRIPTOR_VERSION)


# --- the jobs core --------------------------------------------------------------------------------


def test_a_failure_that_is_not_retryable_fails_the_job_at_once_and_the_lists_reach_the_task() -> None:
    graph = wordcount(RestartStrategy("fixed-delay", 3, 100, retry_on=["X"], no_retry_on=["Y"]))
    sim = JobsDriven(graph, {"tm-a": 4})
    first, second = sim.schedule()
    assert (first.descriptor.retry_on, first.descriptor.no_retry_on) == (["X"], ["Y"])
    sim.report(first, TaskState.RUNNING)
    why = "Spark error CAST_INVALID_INPUT is deterministic (...)\nTraceback ..."
    d = sim.tell(UpdateTaskExecutionState("j1", first.execution_id, TaskState.FAILED, why, retryable=False))
    assert not [f for f in d.facts if isinstance(f, TaskRestartScheduled)]
    assert sim.job.status == JobStatus.FAILING and sim.job.restarts == 0
    sim.report(second, TaskState.CANCELED)
    assert sim.job.status == JobStatus.FAILED
    assert sim.job.reason == f"task lines -> tokenize[0] failed (no restart): {why}"
    replayed = sim.replayed().jobs["j1"]
    assert (replayed.status, replayed.reason, replayed.restarts) == (sim.job.status, sim.job.reason, 0)


def test_a_retryable_failure_is_restarted_as_before() -> None:
    sim = JobsDriven(wordcount(RestartStrategy("fixed-delay", 3, 100)), {"tm-a": 4})
    first, _ = sim.schedule()
    sim.report(first, TaskState.RUNNING)
    d = sim.report(first, TaskState.FAILED, "ValueError: bad row")
    assert [f.attempt for f in d.facts if isinstance(f, TaskRestartScheduled)] == [1]
