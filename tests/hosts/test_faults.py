"""The fault primitives the chaos campaign uses, each seen to take effect and to be undone,
on one small cluster (one TaskManager host behind a delay proxy)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.chaos import procs
from tools.chaos.cluster import poll
from tools.hosts import HostsCluster, HostsError, Layout, faults

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(hosts_available: None) -> Iterator[HostsCluster]:
    c = HostsCluster(Layout(taskmanagers=1, slots=1, proxied=("tm1",)))
    try:
        yield c.up()
    finally:
        assert c.down() == [], "the hosts harness left things behind"


def reaches(c: HostsCluster, host: str, target: str, port: int) -> bool:
    done = c.hosts[host].run("timeout", "3", "bash", "-c", f"</dev/tcp/{target}/{port}", check=False)
    return done.returncode == 0


def test_a_cut_link_reaches_nobody_until_restored(cluster: HostsCluster) -> None:
    redis = cluster.hosts["redis"].address
    assert reaches(cluster, "tm1", redis, 6379)
    faults.cut(cluster, "tm1")
    try:
        assert not reaches(cluster, "tm1", redis, 6379)
    finally:
        faults.restore(cluster, "tm1")
    assert poll(lambda: reaches(cluster, "tm1", redis, 6379), 10)


def test_dropped_packets_and_their_removal(cluster: HostsCluster) -> None:
    redis = cluster.hosts["redis"].address
    faults.drop(cluster, "tm1", 1.0)
    try:
        rules = cluster.hosts["tm1"].run("iptables", "-S").stdout
        assert "--probability 1" in rules and "DROP" in rules
        assert not reaches(cluster, "tm1", redis, 6379)
    finally:
        faults.undrop(cluster, "tm1")
    assert "DROP" not in cluster.hosts["tm1"].run("iptables", "-S").stdout
    assert reaches(cluster, "tm1", redis, 6379)


PING = (
    "import socket,sys,time; s=socket.create_connection(('127.0.0.1',16379),5); t=time.monotonic(); "
    "s.sendall(b'PING\\r\\n'); r=s.recv(64); print(r.decode().strip(), round(time.monotonic()-t,3))"
)


def test_latency_through_the_hosts_delay_proxy(cluster: HostsCluster) -> None:
    import sys

    tm1 = cluster.hosts["tm1"]
    reply, _ = tm1.run(sys.executable, "-c", PING).stdout.split()
    assert reply == "+PONG"
    faults.latency(cluster, "tm1", 400, 400)
    time.sleep(0.6)  # the proxy reads its delay file every 0.5 s
    try:
        reply, took = tm1.run(sys.executable, "-c", PING).stdout.split()
    finally:
        faults.no_latency(cluster, "tm1")
    assert reply == "+PONG"
    assert float(took) >= 0.8, f"a round trip through 400 ms each way took {took} s"  # a floor the proxy enforces


def test_a_skewed_host_runs_its_processes_on_a_wall_clock_off_by_the_offset(cluster: HostsCluster) -> None:
    tm1 = cluster.hosts["tm1"]
    faults.skew(cluster, "tm1", "+30s")
    try:
        log = tm1.directory / "date.log"
        proc = tm1.spawn(["sh", "-c", "date +%s"], log=log)
        proc.wait(10)
        ahead = int(log.read_text().split()[-1]) - time.time()
        assert 25 < ahead < 35, f"the host's clock is {ahead:.0f} s off, not +30 s"
        tm = [p for p in tm1.pids() if "taskmanager" in procs.argv(p) and "faketime" not in procs.argv(p)]
        environ = Path(f"/proc/{tm[0]}/environ").read_bytes()  # faketime's child: the TaskManager itself
        assert b"libfaketime" in environ
        slept = tm1.directory / "sleep.log"  # (with FAKETIME_DONT_FAKE_MONOTONIC=1, time.sleep raised EINVAL)
        tm1.spawn(
            [
                sys.executable,
                "-c",
                "import time; t = time.monotonic(); time.sleep(0.2); print('slept', time.monotonic() - t >= 0.2)",
            ],
            log=slept,
        ).wait(30)
        assert slept.read_text().split()[-2:] == ["slept", "True"], slept.read_text()[-500:]
        assert poll(lambda: "tm1" in cluster.registered(), 60), "the skewed TaskManager did not register again"
    finally:
        faults.skew(cluster, "tm1", None)
    assert poll(lambda: "tm1" in cluster.registered(), 60)


def test_a_killed_host_loses_every_process_but_its_storage_and_comes_back(cluster: HostsCluster) -> None:
    tm1 = cluster.hosts["tm1"]
    mount = cluster.popen["weed-mount-tm1"].pid
    killed = faults.kill_host(cluster, "tm1")
    assert cluster.popen["tm1"].pid in killed and cluster.popen["proxy-tm1"].pid in killed
    assert tm1.pids() == [mount]
    tm1.run("sh", "-c", f"echo still > {cluster.shared}/after-kill")
    faults.restart_host(cluster, "tm1")
    assert poll(lambda: "tm1" in cluster.registered() and len(tm1.pids()) > 2, 60)


def test_freeze_and_thaw_one_process(cluster: HostsCluster) -> None:
    pid = cluster.popen["jm1"].pid

    def state() -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    faults.freeze(pid)
    try:
        assert poll(lambda: state() == "T", 5)
    finally:
        faults.thaw(pid)
    assert poll(lambda: state() in "RSD", 5)
    with pytest.raises(HostsError, match="is gone"):
        faults.freeze(2**22 + 12345)
    procs.kill(pid, signal.SIGCONT)


def test_bad_fault_arguments_say_what_to_give() -> None:
    c = HostsCluster(Layout(taskmanagers=1))
    with pytest.raises(HostsError, match=r"not in \(0, 1\]: give e.g. 0.2"):
        faults.drop(c, "tm1", 0.0)
    with pytest.raises(HostsError, match=r"host tm1 has no delay proxy: lay the cluster out with Layout\(proxied"):
        faults.latency(c, "tm1", 50, 200)
    with pytest.raises(HostsError, match="give a signed faketime offset"):
        faults.skew(c, "tm1", "30s")
