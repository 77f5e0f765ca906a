"""A cluster over TLS as an ACL user kept to its own keys: a redis-server with only a
``--tls-port`` and a throwaway CA, the user created with the README's line, and a
JobManager, a TaskManager, the projector, ``sluice submit --wait`` and ``sluice ui`` over
``rediss://`` (the password from ``$SLUICE_REDIS_PASSWORD``, never in a URL or a log).
Users without the keys, the channels or a command are refused with what they lack."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from sluice.errors import RedisPermissionDenied, RedisUnavailable
from sluice.store import Keys, connect
from sluice.store.acl import acl_rules, acl_setuser, check_access
from tests.e2e.conftest import MARGIN, TEARDOWN, Processes
from tests.e2e.test_submit import NOOP

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "sluice"
"""The README's line is for the default prefix; the server is this module's own."""


@dataclass
class TlsRedis:
    port: int
    ca: Path
    admin: redis.Redis

    def url(self, user: str) -> str:
        return f"rediss://{user}@127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def throwaway_ca(where: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 it signed: (ca.crt, server.crt, server.key)."""
    where.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "1", "-subj", "/CN=Sluice test CA", cwd=where)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost", cwd=where)  # fmt: skip
    (where / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "1", "-extfile", "san.cnf", cwd=where)  # fmt: skip
    return where / "ca.crt", where / "server.crt", where / "server.key"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    if shutil.which("openssl") is None or shutil.which("redis-server") is None:
        pytest.skip("needs openssl and redis-server (scripts/setup installs redis-server)")
    where = tmp_path_factory.mktemp("tls")
    ca, cert, key = throwaway_ca(where)
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(where)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    admin = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca), socket_connect_timeout=2)
    try:
        for _ in range(100):
            try:
                admin.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None:
                    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                    pytest.skip(f"this redis-server does not serve TLS: {out[-300:]}")
                import time

                time.sleep(0.05)
        yield TlsRedis(port, ca, admin)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def readme_acl_line() -> str:
    """The one ``ACL SETUSER`` line of the README's Security section."""
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("ACL SETUSER ")]
    assert len(lines) == 1, lines
    return lines[0]


def sluice(url: str, password: str, *args: str, cwd: Path, home: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_REDIS_PASSWORD=password, SLUICE_HOME=str(home))
    return subprocess.Popen(
        [sys.executable, "-m", "sluice", "--redis", url, "--prefix", PREFIX, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(60 + 30 + MARGIN + TEARDOWN)  # the job, the dashboard
def test_a_cluster_runs_over_tls_as_the_readmes_acl_user(tls_redis: TlsRedis, tmp_path: Path) -> None:
    line = readme_acl_line()
    assert line == acl_setuser("sluice", Keys(PREFIX)), "the README's line is the one Sluice suggests"
    password = secrets.token_hex(16)
    tls_redis.admin.execute_command(*line.replace(">PASSWORD", ">" + password).split())
    tls_redis.admin.execute_command("ACL", "LOG", "RESET")
    url = tls_redis.url("sluice")
    assert password not in url
    home, env = tmp_path / "home", {"SLUICE_REDIS_PASSWORD": password}
    procs = Processes(url, PREFIX, tmp_path)
    try:
        procs.start("jm", "jobmanager", "--storage-root", (tmp_path / "storage").as_uri(), env=env)
        procs.start("tm", "taskmanager", "--resource-id", "tm-1", "--slots", "1", env=env)
        procs.start("projector", "projector", env=env)
        ui = sluice(url, password, "ui", "--port", "0", cwd=tmp_path, home=home)  # starts meanwhile
        try:
            (tmp_path / "noop.py").write_text(NOOP)
            submit = sluice(url, password, "submit", "noop.py", "-p", "n=2", "--wait", cwd=tmp_path, home=home)
            out, err = submit.communicate(timeout=60)
            assert submit.returncode == 0, err + out
            job_id = out.split()[0]
            assert "FINISHED" in out, out
            assert ui.stdout is not None
            said = ui.stdout.readline()
            assert " on http" in said, said + (ui.stderr.read() if ui.poll() is not None and ui.stderr else "")
            where = said.split(" on ", 1)[1].split(" ", 1)[0]
            rows = httpx.get(f"{where}api/jobs", timeout=30).json()
            assert [(r["job_id"], r["status"]) for r in rows] == [(job_id, "FINISHED")]
        finally:
            ui.send_signal(signal.SIGINT)
            ui.communicate(timeout=15)
    finally:
        procs.stop_all()
    # Nothing was refused along the way (not even a call whose refusal Sluice tolerates), and
    # every key the cluster made, RQ's included, is under its one pattern.
    refused = tls_redis.admin.execute_command("ACL", "LOG")
    assert refused == [], refused
    made = {k.decode() for k in tls_redis.admin.scan_iter(count=1000)}
    assert any(k.startswith("{sluice:rq}:") for k in made) and all(k.startswith("{sluice:") for k in made), made
    for name in procs.procs:
        assert password not in procs.output(name)
    assert password not in out + err


def _user(tls: TlsRedis, name: str, rules: str) -> tuple[str, str]:
    password = secrets.token_hex(8)
    tls.admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">" + password, *rules.split())
    return tls.url(name), password


@pytest.mark.timeout(60)
def test_a_user_without_the_clusters_keys_channels_or_commands_is_refused_with_what_it_lacks(
    tls_redis: TlsRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = Keys(PREFIX)
    commands = acl_rules(keys).split(" ", 2)[2]  # the rules without the key and channel patterns
    # Another cluster's keys: a real command refuses at the start, naming the key and the fix.
    url, password = _user(tls_redis, "other", f"~{{other:* &{{other:* {commands}")
    status = sluice(url, password, "status", cwd=tmp_path, home=tmp_path / "home")
    out, err = status.communicate(timeout=30)
    assert status.returncode == 1, out + err
    assert "Redis user 'other'" in err and "may not read the cluster's keys (EXISTS {sluice:cluster}:" in err, err
    assert "ACL SETUSER other ~{sluice:* &{sluice:* -@all +@read" in " ".join(err.split()), err
    assert password not in out + err

    def refused(user: str, rules: str) -> str:
        url, password = _user(tls_redis, user, rules)
        monkeypatch.setenv("SLUICE_REDIS_PASSWORD", password)
        client = connect(url)
        try:
            with pytest.raises(RedisPermissionDenied) as caught:
                check_access(client, keys, url)
        finally:
            client.close()
        return str(caught.value)

    # A server whose certificate's CA is not given: refused with what to write in the URL.
    with pytest.raises(RedisUnavailable, match=r"certificate was not accepted.*\?ssl_ca_certs=/path/to/ca\.crt"):
        connect(f"rediss://sluice@127.0.0.1:{tls_redis.port}/0", timeout=5)
    with pytest.raises(RedisUnavailable, match=r"needs rediss://"):  # the TLS port, without TLS
        connect(f"redis://sluice@127.0.0.1:{tls_redis.port}/0", timeout=5)

    # The log's keys but not RQ's (a pattern a user might guess from the log's tags).
    assert "may not write RQ's keys (LPUSHX {sluice:rq}:" in refused(
        "logonly", f"~{{sluice:cluster}}* &{{sluice:* {commands}"
    )
    # The keys, but no channels: RQ's worker commands.
    assert "may not publish on RQ's channels (PUBLISH {sluice:rq}:pubsub:" in refused(
        "nochannels", f"~{{sluice:* resetchannels {commands}"
    )
    # The keys and channels, but not the scripts: the commits are Lua.
    message = refused("noscripts", f"~{{sluice:* &{{sluice:* {commands} -@scripting")
    assert "may not run the log's Lua scripts (EVALSHA)" in message and "'evalsha'" in message, message
    # No INFO (the default -@dangerous): the restart check.
    message = refused("noinfo", f"~{{sluice:* &{{sluice:* {commands} -info")
    assert "may not read the server's run id (INFO server)" in message, message
    assert re.search(r"grant them with: ACL SETUSER noinfo ~\{sluice:\* &\{sluice:\* -@all", message), message
