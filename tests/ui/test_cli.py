"""``sluice ui`` as a user runs it: it serves the dashboard over the given Redis and prefix,
says whether cancelling is allowed without ever printing the token, and refuses a port in
use with what to do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from sluice.errors import ConfigError
from sluice.store import EventLog
from sluice.ui.serve import bind
from tests.ui.driven import DrivenJob

SLUICE = [sys.executable, "-m", "sluice"]


@contextmanager
def sluice_ui(redis_url: str, prefix: str, *args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(
        [*SLUICE, "--redis", redis_url, "--prefix", prefix, "ui", *args],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_sluice_ui_serves_the_dashboard_and_never_shows_the_token(
    finished: DrivenJob, log: EventLog, redis_url: str
) -> None:
    secret = "s3cret-token-never-printed"
    with sluice_ui(
        redis_url, log.keys.prefix, "--port", "0", "--token-env", "MY_UI_TOKEN", env={"MY_UI_TOKEN": secret}
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "cancelling allowed with the token in $MY_UI_TOKEN" in line, line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        [row] = httpx.get(f"{url}api/jobs", timeout=10).json()
        assert row["job_id"] == "j1" and row["status"] == "FINISHED"
        assert httpx.get(url, timeout=10).text.startswith("<!doctype html>")
        r = httpx.post(f"{url}api/jobs/j1/cancel", headers={"Authorization": f"Bearer {secret}"}, timeout=10)
        assert r.status_code == 409  # allowed, but the job has ended
        # A page left open: Ctrl-C still stops the server at once and cleanly, ending its stream.
        with httpx.stream("GET", f"{url}api/jobs/j1/events", timeout=30) as events:
            lines = events.iter_lines()
            assert next(ln for ln in lines if ln.startswith("event:")) == "event: changed"
            proc.send_signal(signal.SIGINT)
            list(lines)  # returns: the stream ends when the server stops
    out, err = proc.communicate()
    assert secret not in line + out + err
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert out.strip() == "dashboard stopped"


def test_a_port_in_use_is_refused_with_what_to_do(log: EventLog, redis_url: str) -> None:
    taken = bind("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is in use.*--port"):
            bind("127.0.0.1", port)
        with sluice_ui(redis_url, log.keys.prefix, "--port", str(port)) as proc:
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1
        assert f"error: port {port} on 127.0.0.1 is in use" in err and "--port 0" in err
    finally:
        taken.close()


def test_a_host_that_is_not_ours_is_refused(log: EventLog) -> None:
    with pytest.raises(ConfigError, match="--host 'no-such-host.invalid' is not an address"):
        bind("no-such-host.invalid", 0)
