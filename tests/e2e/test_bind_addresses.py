"""Across hosts, each process binds and advertises the address a setting gives: a Spark
Connect server Sluice starts listens on $SLUICE_SPARK_CONNECT_HOST (only there), ``sluice ui``
on $SLUICE_UI_HOST, and a TaskManager registers with the host $SLUICE_ADVERTISE_HOST names.
Bad values are refused with the setting named."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sluice.config import advertised_host, host_setting, spark_connect_host
from sluice.errors import ConfigError
from sluice.services.embedded.spark_connect import SparkConnectServer
from sluice.store import EventLog
from tests.e2e.conftest import MARGIN, TEARDOWN, Processes, membership, wait_until
from tests.ui.test_cli import sluice_ui


def own_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (None: it has none)."""
    done = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=False
    )
    for line in done.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


def accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def test_host_settings_are_checked_and_name_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLUICE_SPARK_CONNECT_HOST", raising=False)
    assert spark_connect_host() == "127.0.0.1"  # the default is unchanged: this machine only
    monkeypatch.setenv("SLUICE_SPARK_CONNECT_HOST", " 0.0.0.0 ")
    assert spark_connect_host() == "0.0.0.0"
    assert SparkConnectServer(port=15999).url == "sc://127.0.0.1:15999"  # every interface: reached on loopback here
    assert SparkConnectServer(port=15999, host="::").url == "sc://127.0.0.1:15999"
    assert SparkConnectServer(port=15999, host="fd00::2").url == "sc://[fd00::2]:15999"
    monkeypatch.setenv("SLUICE_SPARK_CONNECT_HOST", "two words")
    with pytest.raises(ConfigError, match=r"\$SLUICE_SPARK_CONNECT_HOST='two words' is not a host name or address"):
        SparkConnectServer()
    with pytest.raises(ConfigError, match="--host='' is not a host name"):
        host_setting("", "--host")
    with pytest.raises(ConfigError, match="is where a server listens, not an address other hosts can reach"):
        advertised_host("0.0.0.0", "--advertise-host")
    assert advertised_host(None, "--advertise-host") is None
    assert advertised_host("node1.example.com", "--advertise-host") == "node1.example.com"


@pytest.mark.timeout(120 + 30)  # the server's start, its stop
def test_a_spark_connect_server_listens_on_the_address_the_setting_gives_and_only_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    address = own_address()
    if address is None:
        pytest.skip("this machine has no IPv4 address but loopback")
    monkeypatch.setenv("SLUICE_SPARK_CONNECT_HOST", address)
    server = SparkConnectServer(master="local[1]", log_file=tmp_path / "connect.log")
    try:
        url = server.start(timeout=120)
        assert url == f"sc://{address}:{server.port}"
        assert accepts(address, server.port)
        assert not accepts("127.0.0.1", server.port)  # bound to that address, not to every interface
    finally:
        server.stop()


def test_sluice_ui_listens_on_the_address_its_setting_gives(log: EventLog, redis_url: str) -> None:
    address = own_address()
    if address is None:
        pytest.skip("this machine has no IPv4 address but loopback")
    with sluice_ui(redis_url, log.keys.prefix, "--port", "0", env={"SLUICE_UI_HOST": address}) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        assert url.startswith(f"http://{address}:"), line
        assert httpx.get(f"{url}api/jobs", timeout=10).json() == []
    bad = subprocess.run(
        [sys.executable, "-m", "sluice", "--redis", redis_url, "ui"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "SLUICE_UI_HOST": "not an address"},
        check=False,
    )
    assert bad.returncode != 0 and "$SLUICE_UI_HOST='not an address' is not a host name" in bad.stderr


@pytest.mark.timeout(60 + 60 + MARGIN + TEARDOWN)  # the registration, the refused start
def test_a_taskmanager_registers_with_the_host_it_advertises(procs: Processes, log: EventLog, tmp_path: Path) -> None:
    procs.start("jm", "jobmanager", "--storage-root", (tmp_path / "s").as_uri())
    procs.start(
        "tm",
        "taskmanager",
        "--resource-id",
        "tm-1",
        "--no-execute",
        env={"SLUICE_ADVERTISE_HOST": "node7.example.com", "SLUICE_HOST": "not-this-one"},
    )
    wait_until(
        lambda: {r.resource_id: r.host for r in membership(log).active()} == {"tm-1": "node7.example.com"},
        "tm-1 to register as node7.example.com",
        timeout=60,
    )
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "--redis",
            procs.url,
            "--prefix",
            procs.prefix,
            "taskmanager",
            "--advertise-host",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode != 0
    assert "--advertise-host='0.0.0.0' is where a server listens" in bad.stderr
