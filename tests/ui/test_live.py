"""The job page's event stream, served by uvicorn: it follows the job's fact stream and says
"changed, at entry X" once per batch of new facts; it resumes after Last-Event-ID."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson

from sluice.events import Envelope, JobRegistered
from sluice.services.embedded import RedisServer
from sluice.store import EventLog, Keys, connect
from sluice.ui.app import create_app
from sluice.ui.serve import UiServer, bind
from tests.ui.driven import DrivenJob


def changes(lines: Iterator[str]) -> Iterator[tuple[str, dict]]:
    """(id, data) of each "changed" event of a server-sent event stream."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if fields.get("event") == "changed":
                yield fields["id"], orjson.loads(fields["data"])
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


def test_the_stream_says_where_the_log_is_then_follows_it(driven: DrivenJob, log: EventLog, served: str) -> None:
    driven.submit()
    facts = log.keys.facts(log.keys.job("j1"))
    with httpx.Client(base_url=served, timeout=30) as http:
        with http.stream("GET", "/api/jobs/j1/events") as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            seen = changes(r.iter_lines())
            first_id, first = next(seen)
            assert first == {"entry": log.last_id(facts), "new": 0} and first_id == first["entry"]
            driven.run()  # the leader records both subtasks RUNNING
            got: list[dict] = []
            while not got or got[-1]["entry"] != log.last_id(facts):
                got.append(next(seen)[1])
            after = [e for e, _ in log.replay(facts, first["entry"])]
            assert sum(g["new"] for g in got) == len(after) > 0  # every new fact counted, none twice

        # A browser that reconnects says where it was; the stream goes on from there.
        with http.stream("GET", "/api/jobs/j1/events", headers={"Last-Event-ID": first["entry"]}) as r:
            _, resumed = next(changes(r.iter_lines()))
            assert resumed == {"entry": log.last_id(facts), "new": len(after)}


def test_a_stream_for_a_job_that_is_not_there_is_404(driven: DrivenJob, served: str) -> None:
    r = httpx.get(f"{served}/api/jobs/nope/events", timeout=10)
    assert r.status_code == 404 and "job 'nope' not found" in r.json()["error"]


def test_a_stream_says_when_redis_goes_away(tmp_path) -> None:
    """On a Redis of its own, stopped while the stream is open: one "unavailable" event naming
    what failed, then the stream ends (the browser reconnects by itself)."""
    server = RedisServer(tmp_path / "redis")
    log = EventLog(connect(server.start()), Keys("gone"))
    log.append(log.keys.facts(log.keys.job("j1")), Envelope(JobRegistered("j1", "j1"), "id-1", 0, 1, "j1"))
    ui = UiServer(create_app(log), bind("127.0.0.1", 0))
    url = ui.start()
    try:
        with httpx.stream("GET", f"{url}/api/jobs/j1/events", timeout=30) as r:
            lines = r.iter_lines()
            assert next(ln for ln in lines if ln.startswith("event:")) == "event: changed"
            server.stop()
            rest = list(lines)  # ends
        assert "event: unavailable" in rest
        data = orjson.loads(rest[rest.index("event: unavailable") + 1].removeprefix("data: "))
        assert data["error"].startswith("Redis went away while following {gone:job:j1}:facts")
    finally:
        ui.stop()
        server.stop()


def test_the_cluster_stream_follows_the_cluster_and_every_job(driven: DrivenJob, log: EventLog, served: str) -> None:
    """The jobs and TaskManagers pages' stream: a job submitted after it opened joins it, and each of
    that job's facts is told."""
    cluster = log.keys.facts(log.keys.cluster)
    facts = log.keys.facts(log.keys.job("j1"))
    with httpx.stream("GET", f"{served}/api/events", timeout=30) as r:
        seen = changes(r.iter_lines())
        _, first = next(seen)
        assert first == {"entry": log.last_id(cluster), "new": 0}
        driven.submit()
        driven.run()
        got: list[dict] = []
        while not got or got[-1]["entry"] != log.last_id(facts):
            got.append(next(seen)[1])
    new = [e for e, _ in log.replay(cluster, first["entry"])] + [e for e, _ in log.replay(facts)]
    assert sum(g["new"] for g in got) == len(new)  # the cluster's new facts and all of the job's
