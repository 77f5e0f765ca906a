"""Several hosts on one machine, with real parts: the hosts harness (issue 29).

A host is a network namespace (``slh-<run>-<name>``, an address from a /24 of
198.18.0.0/15 on one bridge that also has an address in the root namespace) with a mount
namespace of its own and a private tmpfs ``/tmp``, held by one long-lived process; every
process of the host is started with ``nsenter`` into both. SeaweedFS runs on the host
``storage`` and is FUSE-mounted at the same path (``cluster.shared``) on every other host;
the storage root (``cluster.storage_root``) and a job's input live under it.

Use it::

    from tools.hosts import HostsCluster, Layout, faults

    cluster = HostsCluster(Layout(taskmanagers=3, slots=2, proxied=("tm2",))).up()
    try:
        cluster.hosts["tm1"].put(local_file, f"{cluster.shared}/input")   # files in
        ...  # submit with sluice.client.Client(cluster.log)
        faults.cut(cluster, "tm1"); faults.restore(cluster, "tm1")       # link down / up
        faults.drop(cluster, "tm2", 0.2); faults.undrop(cluster, "tm2")  # random packet loss
        faults.latency(cluster, "tm2", 50, 200); faults.no_latency(cluster, "tm2")  # delay proxy
        faults.skew(cluster, "tm3", "+30s")                              # faketime, wall clock only
        faults.kill_host(cluster, "tm3"); faults.restart_host(cluster, "tm3")  # kill -9 a host
        faults.freeze(pid); faults.thaw(pid)                             # SIGSTOP / SIGCONT
        faults.heal(cluster)                                             # undo every fault
    finally:
        left = cluster.down()   # [] when everything it made is gone

Hosts: ``storage`` (``weed server``), ``redis`` (redis-server, AOF), ``jm1`` and ``jm2``
(a JobManager each; the projector on ``jm2``), ``tm1``..``tmN`` (a TaskManager with its slot
workers and its own Spark Connect server, ``local[*]``). Processes of a host are found by
their mount namespace (``Host.pids``). ``cluster.log`` is an EventLog on the cluster's Redis
(prefix ``cluster.prefix``), for the client, the views and the checks;
``cluster.s3_endpoint`` is SeaweedFS's S3 gateway; ``cluster.listdir(host, path)`` lists a
directory as one host sees it, and ``placement.hosts_by_vertex`` / ``placement.cross_reads``
say where a job's subtasks ran and which keyed partitions were read across hosts.
``Layout.private_storage`` gives each host a private directory at the shared path instead
(the negative control). ``Layout.spark`` puts the TaskManagers on a Spark standalone cluster
(``spark.py``: a master on host ``spark``, a worker on each TaskManager host; ``standalone``: each
TaskManager's Connect server is an application of it, ``standalone-shared``: one Connect server on
``spark`` for all). ``advertise(host)`` is the one place a TaskManager's advertised
host name is chosen (``--host``, today).

Faults: ``cut``/``restore`` set the host's root-side veth down/up; ``drop``/``undrop`` add
and flush iptables ``statistic`` DROP rules inside the host's namespace; ``latency`` writes
the delay range that the host's delay proxy (``proxy.py``, between its processes and Redis,
only for hosts in ``Layout.proxied``) reads every 0.5 s; ``skew`` restarts a host's
processes under ``faketime`` (the monotonic clock shifted by the same constant: durations true) (also at start:
``Layout(skew={"tm1": "+30s"})``); ``kill_host`` kill -9s all of a host's processes but its
storage mount.

Clean-up: every namespace, link, holder and process is written to a state file
(``/var/tmp/sluice-hosts/<run>.json``) before or as it is made, and ``cluster.down()``
removes it all; ``scripts/hosts clean`` removes what runs whose owner died left behind.
Every wait has a deadline. Traffic goes only over the bridge and loopback: nothing routes
out. ``probe.unavailable()`` says why hosts cannot be made here (None: they can).
"""

from __future__ import annotations

from . import faults
from .cleanup import clean_leftovers
from .cluster import HostsCluster, Layout, advertise
from .host import Host
from .net import HostsError
from .probe import unavailable

__all__ = ["HostsCluster", "Layout", "Host", "HostsError", "faults", "unavailable", "clean_leftovers", "advertise"]
