"""``sluice inspect job|graph|kvstate|jobs|taskmanagers|stats|dead-letters|splits`` as a user
runs them, on the log of a job that failed once and ran again (a real JobManager and
TaskManager driven through their step functions on the session's redis-server): ``--json``
parsed and checked against the views, the rich output checked for what a person looks for,
``--at`` in the middle of the job, and every bad input's message."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result

from sluice.cli.main import _register, cli
from sluice.events import FIELD
from sluice.store import EventLog
from sluice.views.graph import graph
from sluice.views.timeline import timeline
from tests.views.test_job_views import TRACEBACK, Run, run_failing_job

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ran(log: EventLog, tmp_path: Path) -> Run:
    return run_failing_job(log, tmp_path)


def inspect(url: str, log: EventLog, *args: str) -> Result:
    _register()
    result = CliRunner().invoke(
        cli,
        ["--redis", url, "--prefix", log.keys.prefix, "inspect", *args],
        catch_exceptions=False,
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    return result


def scripts_inspect(url: str, log: EventLog, *args: str) -> subprocess.CompletedProcess:
    """``scripts/inspect`` (``sluice inspect`` from a checkout) as a process: what a user sees."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_REDIS_URL=url, SLUICE_PREFIX=log.keys.prefix)
    return subprocess.run(
        [str(ROOT / "scripts" / "inspect"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(120)
def test_job_graph_and_the_lists_in_json_and_in_rich_now_and_in_the_middle(
    log: EventLog, redis_url: str, ran: Run, tmp_path: Path
) -> None:
    t = orjson.loads(inspect(redis_url, log, "job", "j1", "--json").output)
    assert t["job"]["status"] == "FINISHED" and t["restarts"] == 1
    assert t["root_cause"]["traceback"] == TRACEBACK
    assert [a["final"] for a in t["attempts"]] == ["FAILED", "FINISHED", "FINISHED"]
    assert t["entries"] == timeline(log, "j1")["entries"]
    rich = inspect(redis_url, log, "job", "j1").output
    for seen in (
        "job j1 (j1)",
        "FINISHED, 1 restart, 2/2 tasks done",
        "last failure: src[0] attempt 0 failed: ValueError: boom",
        "restarts as attempt 1",
        "job FINISHED",
        "attempts",
        "returned",
    ):
        assert seen in rich, seen
    gantt = inspect(redis_url, log, "job", "j1", "--gantt").output
    assert "src[0] #0 tm-1/" in gantt and "✗" in gantt and "✓" in gantt and "█" in gantt

    then = orjson.loads(inspect(redis_url, log, "job", "j1", "--at", ran.mid, "--json").output)
    assert then["job"]["status"] == "RUNNING" and then["entries"][-1] == ran.mid
    assert "RUNNING, 1 restart, 0/2 tasks done" in inspect(redis_url, log, "job", "j1", "--at", ran.mid).output

    g = orjson.loads(inspect(redis_url, log, "graph", "j2", "--json").output)
    assert g == graph(log, "j2") and g["edges"][0]["exchange"] == "keyed"
    rich = inspect(redis_url, log, "graph", "j2").output
    assert "src ──keyed by id──▶ agg" in rich and "CREATED 1" in rich
    dot = inspect(redis_url, log, "graph", "j1", "--dot").output
    assert dot.startswith('digraph "j1"') and 'fillcolor="#74c476"' in dot  # FINISHED's green
    inspect(redis_url, log, "graph", "j1", "--dot", str(tmp_path / "g.dot"))
    assert (tmp_path / "g.dot").read_text() == dot
    mid = inspect(redis_url, log, "graph", "j1", "--dot", "--at", ran.mid).output
    assert "RUNNING" in mid and "#74c476" not in mid

    rows = orjson.loads(inspect(redis_url, log, "jobs", "--json").output)
    assert [(r["job_id"], r["status"], r["restarts"]) for r in rows] == [("j1", "FINISHED", 1), ("j2", "CREATED", 0)]
    assert "2/2" in inspect(redis_url, log, "jobs").output
    (tm,) = orjson.loads(inspect(redis_url, log, "taskmanagers", "--json").output)
    assert tm["resource_id"] == "tm-1" and tm["last_heartbeat"] is not None
    assert "tm-1" in inspect(redis_url, log, "taskmanagers").output
    assert orjson.loads(inspect(redis_url, log, "kvstate", "j1", "--json").output) == []
    assert "no queryable state registered" in inspect(redis_url, log, "kvstate", "j1").output

    every = [orjson.loads(line) for line in inspect(redis_url, log, "tail", "--json").output.splitlines()]
    last = [orjson.loads(line) for line in inspect(redis_url, log, "tail", "-n", "3", "--json").output.splitlines()]
    assert last == every[-3:] and len(every) > 50
    upto = [
        orjson.loads(line)["entry"]
        for line in inspect(redis_url, log, "tail", "job:j1:facts", "--json", "--at", ran.mid).output.splitlines()
    ]
    assert upto == t["entries"][: t["entries"].index(ran.mid) + 1]
    assert [
        orjson.loads(line)["entry"]
        for line in inspect(
            redis_url, log, "tail", "job:j1:facts", "-n", "2", "--at", ran.mid, "--json"
        ).output.splitlines()
    ] == upto[-2:]

    lengths = {
        ln.split()[0]: int(ln.split()[1])
        for ln in inspect(redis_url, log, "streams", "--at", ran.mid).output.splitlines()
    }
    assert lengths["job:j1:facts"] == len(upto) and not any(name.startswith("job:j2") for name in lengths)

    splits = [orjson.loads(line) for line in inspect(redis_url, log, "splits", "j1", "--json").output.splitlines()]
    assert {s["outcome"] for s in splits} == {"returned", "finished"}
    early = inspect(redis_url, log, "splits", "j1", "--json", "--at", ran.mid).output.splitlines()
    assert [orjson.loads(line)["outcome"] for line in early] == ["returned"]


@pytest.mark.timeout(60)
def test_stats_and_dead_letters_with_a_redrive(log: EventLog, redis_url: str, ran: Run) -> None:
    inbox = log.keys.inbox(log.keys.job("j1"))
    log.append_raw(inbox, {FIELD: b"not json"})
    from sluice.store.consumer import dead_letter

    dead_letter(log, inbox, "", "7-0", {FIELD: b'{"not": "an envelope"}'}, "malformed", "no type")
    s = orjson.loads(inspect(redis_url, log, "stats", "--window", "1h", "--json").output)
    assert s["window_s"] == 3600 and s["dead_letters"]["total"] == 1
    assert any(e["type"] == "UpdateTaskExecutionState" and e["by_kind"]["facts"] >= 10 for e in s["events"])
    assert any(g["group"] == "jobmanager" for g in s["groups"])
    rich = inspect(redis_url, log, "stats").output
    for seen in ("streams", "job:j1:facts", "consumer groups", "jobmanager", "dead letters: 1", "no type"):
        assert seen in rich, seen

    (d,) = orjson.loads(inspect(redis_url, log, "dead-letters", "--json").output)
    assert (d["stream"], d["entry"], d["reason"]) == (inbox, "7-0", "no type")
    assert "no type" in inspect(redis_url, log, "dead-letters").output
    out = orjson.loads(
        inspect(redis_url, log, "dead-letters", "--redrive", d["id"], "--stream", "job:j1:dead", "--json").output
    )
    assert out["redriven_as"] == log.last_id(inbox)
    assert orjson.loads(inspect(redis_url, log, "dead-letters", "--json").output) == []
    assert "no dead letters" in inspect(redis_url, log, "dead-letters").output


@pytest.mark.timeout(60)
def test_every_bad_input_says_what_was_wrong_and_what_to_do(log: EventLog, redis_url: str, tmp_path: Path) -> None:
    run_failing_job(log, tmp_path)
    cases = [
        (("inspect", "job", "nope"), "job 'nope' not found under prefix"),
        (("inspect", "graph", "nope", "--dot"), "`sluice list` shows the jobs"),
        (("inspect", "kvstate", "nope"), "job 'nope' not found"),
        (("inspect", "job", "j1", "--at", "yesterday"), "neither an entry id"),
        (("inspect", "splits", "j1", "--at", "12-ab"), "ISO 8601"),
        (("inspect", "stats", "--window", "soon"), "'soon' is not a time window: give seconds above 0, like 60s"),
        (("inspect", "dead-letters", "--redrive", "1-1"), "no dead letter 1-1 under prefix"),
        (("inspect", "dead-letters", "--redrive", "x"), "'x' is not a dead letter's id"),
        (("inspect", "dead-letters", "--redrive", "1-1", "--stream", "nope"), "no stream 'nope' under prefix"),
        (("inspect", "tail", "--follow", "--at", "1-1"), "--follow prints what comes next"),
        (("inspect", "graph", "j1", "--png", str(tmp_path / "g.png")), "apt-get install graphviz"),
    ]
    _register()
    for args, said in cases:
        result = CliRunner().invoke(
            cli, ["--redis", redis_url, "--prefix", log.keys.prefix, *args], env={"PATH": str(tmp_path)}
        )  # no Graphviz there
        told = result.output + str(result.exception or "")
        assert result.exit_code != 0 and said in told, (args, told)
    done = scripts_inspect(redis_url, log, "job", "nope")  # as a user sees it
    assert done.returncode == 1 and done.stderr.startswith("error: job 'nope' not found under prefix"), done.stderr


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)")
@pytest.mark.timeout(60)
def test_png_renders_the_graph_with_graphviz(log: EventLog, redis_url: str, ran: Run, tmp_path: Path) -> None:
    out = tmp_path / "j2.png"
    inspect(redis_url, log, "graph", "j2", "--png", str(out))
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.timeout(60)
def test_after_export_and_import_the_commands_show_the_same_job(log: EventLog, redis_url: str, ran: Run) -> None:
    from sluice.views.archive import collect, export_lines, load, parse
    from tests.views.test_replay import second_prefix

    with second_prefix(log) as there:
        load(there, parse(list(export_lines(collect(log, "j1"), exported_at=1)), "test export"))
        for args in (
            ("job", "j1", "--json"),
            ("job", "j1", "--json", "--at", ran.mid),
            ("graph", "j1", "--json"),
            ("kvstate", "j1", "--json"),
            ("splits", "j1", "--json"),
        ):
            assert inspect(redis_url, there, *args).output == inspect(redis_url, log, *args).output, args
        (row,) = orjson.loads(inspect(redis_url, there, "jobs", "--json").output)
        assert (row["job_id"], row["status"], row["restarts"]) == ("j1", "FINISHED", 1)
        assert (
            "last failure: src[0] attempt 0 failed: ValueError: boom" in inspect(redis_url, there, "job", "j1").output
        )


@pytest.mark.timeout(60)
def test_inspect_splits_names_a_reader_held_back_by_the_end_game(log: EventLog, redis_url: str) -> None:
    """The facts of a source read each split whose slow reader was told "no more" with two
    splits left (made by the real coordination core, tests/views/test_split_outcomes.py),
    in the log on the session's redis-server."""
    from sluice.events import TaskState
    from tests.views.test_split_outcomes import JOB, main_loop, request, state

    loop = main_loop(splits=8, each_split=True)
    loop.batch(state(0, 0, TaskState.RUNNING), state(1, 0, TaskState.RUNNING))
    loop.batch(request(0, 0, 1, at=1000), request(1, 0, 1, at=1000))
    for seq, at in enumerate((2000, 3000, 4000, 5000), start=2):
        loop.batch(request(0, 0, seq, at=at))
    loop.batch(request(1, 0, 2, at=6000))
    for seq, at in enumerate((6000, 7000, 8000), start=6):
        loop.batch(request(0, 0, seq, at=at))
    for env in loop.envelopes():
        log.append(log.keys.facts(log.keys.job(JOB)), env)
    out = inspect(redis_url, log, "splits", JOB).output
    assert "finished splits per subtask" not in out  # nothing finished yet: all are being read
    assert "told no more while splits were left: src[1] attempt 0 (2 handed out after)" in out
