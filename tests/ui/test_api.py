"""The dashboard's JSON endpoints (Starlette's TestClient) on the log of a job driven with a
failure and a restart: the content of every endpoint, ``?at=`` showing the earlier state,
the errors (an unknown job, a bad moment), the cancel's token, the OpenAPI document, and
assets that load nothing from elsewhere."""

from __future__ import annotations

import re
from importlib.resources import files

import pytest
from starlette.routing import Route

from sluice.events import CancelJob
from sluice.state import StateClient
from sluice.store import EventLog, server_address
from sluice.ui.app import create_app
from sluice.views.archive import collect, export_lines, load, parse
from tests.services.failover_helpers import events
from tests.services.test_kvstate_core import running
from tests.services.test_state_client import _url, commit, publish
from tests.ui.conftest import TOKEN, TestClient
from tests.ui.driven import TRACEBACK, DrivenJob
from tests.views.test_replay import second_prefix


def test_every_view_is_served_as_json(finished: DrivenJob, client) -> None:
    c = client()
    [row] = c.get("/api/jobs").json()
    assert (row["job_id"], row["status"], row["tasks_done"], row["tasks_total"], row["restarts"]) == (
        "j1",
        "FINISHED",
        2,
        2,
        1,
    )
    assert row["duration_s"] is not None and row["duration_s"] >= 0

    tl = c.get("/api/jobs/j1").json()
    assert [(a["vertex"], a["subtask"], a["attempt"], a["final"]) for a in tl["attempts"]] == [
        ("src", 0, 0, "FAILED"),
        ("src", 0, 1, "FINISHED"),
        ("src", 1, 0, "FINISHED"),
    ]
    assert {(a["taskmanager"], a["slot"]) for a in tl["attempts"]} == {("tm-1", 0), ("tm-1", 1)}
    assert tl["root_cause"]["traceback"] == TRACEBACK and "cannot split line 17" in tl["root_cause"]["text"]
    assert tl["restarts"] == 1
    assert tl["entries"] == [e["entry"] for e in tl["events"]] and len(tl["entries"]) > 10
    last = c.get("/api/jobs/j1", params={"events": "3", "attempts": "2"}).json()
    assert last["events"] == tl["events"][-3:] and last["entries"] == tl["entries"]
    # The two that started last (the restart began after both first attempts), in the usual order.
    assert [(a["subtask"], a["attempt"]) for a in last["attempts"]] == [(0, 1), (1, 0)]
    assert last["attempts_total"] == 3
    none = c.get("/api/jobs/j1", params={"events": "0", "attempts": "0"}).json()
    assert none["events"] == [] and none["attempts"] == [] and none["entries"] == tl["entries"]

    g = c.get("/api/jobs/j1/graph").json()
    assert [(v["id"], v["parallelism"], v["states"], v["status"]) for v in g["vertices"]] == [
        ("src", 2, {"FINISHED": 2}, "FINISHED")
    ]

    [t] = c.get("/api/taskmanagers").json()
    assert (t["resource_id"], t["state"], t["slots_total"], t["slots_in_use"]) == ("tm-1", "REGISTERED", 2, 0)

    assert c.get("/api/jobs/j1/kvstate").status_code == 200
    streams = c.get("/api/stats", params={"window": "600"})
    assert streams.status_code == 200 and "j1" in streams.text  # the job's streams are listed


def _entry_of(tl: dict, state: str) -> str:
    """The entry of the first fact recording a subtask in ``state``."""
    return next(e["entry"] for e in tl["events"] if e["kind"] == "state" and e.get("state") == state)


def test_at_an_earlier_entry_answers_the_state_as_it_was_then(finished: DrivenJob, client) -> None:
    c = client()
    tl = c.get("/api/jobs/j1").json()
    failed = _entry_of(tl, "FAILED")
    then = c.get("/api/jobs/j1", params={"at": failed}).json()
    assert then["entries"] == tl["entries"][: tl["entries"].index(failed) + 1]
    assert then["job"]["status"] == "RUNNING" and then["restarts"] == 0
    assert [(a["subtask"], a["attempt"], a["final"]) for a in then["attempts"]] == [(0, 0, "FAILED"), (1, 0, "RUNNING")]
    [v] = c.get("/api/jobs/j1/graph", params={"at": failed}).json()["vertices"]
    assert v["states"] == {"FAILED": 1, "RUNNING": 1}
    [row] = c.get("/api/jobs", params={"at": failed}).json()
    assert (row["status"], row["tasks_done"]) == ("RUNNING", 0)
    [t] = c.get("/api/taskmanagers", params={"at": failed}).json()
    assert t["slots_in_use"] >= 1  # subtask 1 still holds its slot then; now none is held
    first = c.get("/api/jobs/j1", params={"at": tl["entries"][0]}).json()
    assert first["entries"] == tl["entries"][:1] and first["attempts"] == []


@pytest.mark.parametrize(
    "path",
    ["/api/jobs?at=yesterday", "/api/jobs/j1?at=12-ab", "/api/jobs/j1/graph?at=tuesday", "/api/taskmanagers?at=soon"],
)
def test_a_moment_that_is_none_says_which_forms_are(finished: DrivenJob, client, path: str) -> None:
    r = client().get(path)
    assert r.status_code == 400
    assert re.search("entry id.*milliseconds.*ISO 8601", r.json()["error"])


@pytest.mark.parametrize(
    "path", ["/api/jobs/nope", "/api/jobs/nope/graph", "/api/jobs/nope/kvstate", "/api/jobs/nope/events"]
)
def test_a_job_that_is_not_there_is_404_saying_where_the_jobs_are(finished: DrivenJob, client, path: str) -> None:
    r = client().get(path)
    assert r.status_code == 404
    assert r.json()["error"].startswith("job 'nope' not found under prefix") and "/api/jobs" in r.json()["error"]


def test_bad_query_values_are_400_with_what_to_send(finished: DrivenJob, client) -> None:
    c = client()
    for window in ("a while", "0", "inf", "nan"):
        r = c.get("/api/stats", params={"window": window})
        assert r.status_code == 400 and f"window={window!r}" in r.json()["error"] and "window=60" in r.json()["error"]
    r = c.get("/api/state/j1/counts/abc", params={"type": "long"})
    assert r.status_code == 400 and "integer key" in r.json()["error"]
    r = c.get("/api/state/j1/counts/abc", params={"type": "float"})
    assert r.status_code == 400 and "type=string or type=long" in r.json()["error"]
    r = c.get("/api/jobs/j1", params={"events": "-1"})
    assert r.status_code == 400 and "events=200" in r.json()["error"]
    r = c.get("/api/jobs/j1", params={"attempts": "many"})
    assert r.status_code == 400 and "attempts='many' is not a count of attempts" in r.json()["error"]
    r = c.get("/no/such/page")
    assert r.status_code == 404 and "/api/openapi.json" in r.json()["error"]


def test_the_state_lookup_names_what_is_missing(finished: DrivenJob, client) -> None:
    c = client()
    r = c.get("/api/state/j1/nope/x")
    assert r.status_code == 404 and "no queryable state named 'nope'" in r.json()["error"]
    r = c.get("/api/state/ghost/counts/x")
    assert r.status_code == 404 and "ghost" in r.json()["error"]


def test_cancel_needs_a_configured_token_and_the_request_to_carry_it(driven: DrivenJob, log: EventLog, client) -> None:
    driven.submit()
    driven.run()
    inbox = log.keys.inbox(log.keys.job("j1"))

    r = client().post("/api/jobs/j1/cancel", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 403 and "read-only" in r.json()["error"] and "SLUICE_UI_TOKEN" in r.json()["error"]
    c = client(TOKEN)
    r = c.post("/api/jobs/j1/cancel")
    assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]
    assert r.headers["www-authenticate"].startswith("Bearer")
    r = c.post("/api/jobs/j1/cancel", headers={"Authorization": "Bearer not-the-token"})
    assert r.status_code == 401 and "not the dashboard's" in r.json()["error"]
    assert TOKEN not in r.text
    assert events(log, inbox, CancelJob) == []  # nothing was sent so far

    r = c.post("/api/jobs/nope/cancel", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 404
    r = c.post("/api/jobs/j1/cancel", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 202 and r.json()["status"] == "RUNNING"
    [sent] = events(log, inbox, CancelJob)
    assert sent.job_id == "j1" and "dashboard" in sent.reason
    driven._pump(lambda: driven.job().status.value == "CANCELLING", "the leader taking the cancel")


def test_cancelling_an_ended_job_says_it_has_ended(finished: DrivenJob, client) -> None:
    r = client(TOKEN).post("/api/jobs/j1/cancel", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 409 and "FINISHED already" in r.json()["error"]


def test_the_openapi_document_lists_every_endpoint(client) -> None:
    doc = client().get("/api/openapi.json").json()
    listed = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert listed == {
        ("get", "/api/jobs"),
        ("get", "/api/jobs/{job_id}"),
        ("get", "/api/jobs/{job_id}/graph"),
        ("get", "/api/jobs/{job_id}/kvstate"),
        ("get", "/api/jobs/{job_id}/events"),
        ("get", "/api/events"),
        ("post", "/api/jobs/{job_id}/cancel"),
        ("get", "/api/taskmanagers"),
        ("get", "/api/stats"),
        ("get", "/api/state/{job_id}/{name}/{key}"),
    }
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert op["summary"], path
            assert {p["name"] for p in op["parameters"] if p["in"] == "path"} == set(re.findall(r"{(\w+)}", path))
    assert any(p["name"] == "at" for p in doc["paths"]["/api/jobs/{job_id}/graph"]["get"]["parameters"])


def test_the_assets_ship_in_the_package_and_load_nothing_from_elsewhere(client) -> None:
    static = files("sluice.ui") / "static"
    names = sorted(p.name for p in static.iterdir())
    assert names == ["app.js", "index.html", "style.css"]
    c = client()
    for name in names:
        text = (static / name).read_text()
        assert not re.search(r"(?i)https?:|@import|(?<![\w:])//\w[\w-]*\.\w", text), f"{name} names another origin"
        for ref in re.findall(r"url\(([^)]*)\)", text):
            assert ref.strip("'\"").startswith(("#", "/", "data:")), f"{name} loads {ref}"
        assert c.get(f"/static/{name}").text == text
    shell = c.get("/jobs/j1").text
    for ref in re.findall(r'(?:src|href)="([^"]*)"', shell):
        assert ref.startswith("/") and not ref.startswith("//") or ref.startswith("data:"), ref


def test_an_imported_job_is_served_as_the_original(finished: DrivenJob, log: EventLog, client) -> None:
    """Export the job's log, import it under a fresh prefix: every job endpoint answers the same,
    now and at an earlier entry."""
    c = client()
    with second_prefix(log) as other:
        load(other, parse(export_lines(collect(log, "j1"), exported_at=1), "j1.jsonl"))
        imported = TestClient(create_app(other))
        entries = c.get("/api/jobs/j1").json()["entries"]
        for at in (None, entries[len(entries) // 2]):
            q = {} if at is None else {"at": at}
            for path in ("/api/jobs", "/api/jobs/j1", "/api/jobs/j1/graph", "/api/jobs/j1/kvstate"):
                assert imported.get(path, params=q).json() == c.get(path, params=q).json(), (path, at)
        [tm] = imported.get("/api/taskmanagers").json()
        assert (tm["resource_id"], tm["state"], tm["slots_total"]) == ("tm-1", "REGISTERED", 2)
        imported.close()


@pytest.fixture
def counts(log: EventLog) -> str:
    """Job j1's keyed vertex publishes "counts" (w0..w299 -> {"word", "count": len}) as its tasks
    would; the address of the Redis that holds it."""
    sim, tasks = running()
    address = server_address(_url(log))
    for t in tasks:
        publish(log, sim, t, address)
    commit(log, sim.log)
    return address


def test_the_state_lookup_answers_what_sluice_state_get_does(log: EventLog, counts: str, client) -> None:
    address = counts
    c = client()
    r = c.get("/api/state/j1/counts/w17")
    assert r.status_code == 200
    want = StateClient(log).lookup("j1", "counts", "w17")
    assert r.json() == {
        "job_id": "j1",
        "name": "counts",
        "key": "w17",
        "key_group": want.key_group,
        "vertex": want.vertex,
        "state_id": want.state_id,
        "address": address,
        "value": {"word": "w17", "count": 3},
    }
    assert c.get("/api/state/j1/counts/not-a-word").json()["value"] is None


def test_a_bug_is_answered_as_json_saying_where_the_traceback_is(log: EventLog) -> None:
    app = create_app(log)

    def broken(request):
        raise KeyError("vertex")

    app.router.routes.append(Route("/api/broken", broken))
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/api/broken")
    assert r.status_code == 500
    assert r.json()["error"] == (
        "the dashboard failed answering /api/broken (KeyError: 'vertex'): a bug in Sluice; "
        "the output of `sluice ui` has the traceback"
    )
