"""The metrics, pure: the gauges computed from a leader's and a TaskManager's in-memory
state, the counters a leader's commits move (task states, restarts, split round trips),
and the HTTP endpoint with its errors for a port that is not one or is taken."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.errors import ConfigError
from sluice.events import (
    NextInputSplit,
    OperatorEvent,
    RequestNextInputSplit,
    TaskManagerRegistered,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.gauges import cluster_families, dead_letter_family, inbox_families, taskmanager_families
from sluice.services.common.metrics import JobManagerMetrics, StateCollector, TaskManagerMetrics, serve
from sluice.services.membership.core import Membership, evolve
from sluice.store.metrics_reads import InboxReading
from tests.cores import JobsDriven
from tests.helpers import env
from tests.services.test_jobs_core import wordcount


def samples(families) -> dict[tuple[str, tuple], float]:
    """(sample name, its labels sorted) -> value, for every sample of ``families``."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def value(registry_or_families, name: str, **labels: str) -> float | None:
    families = registry_or_families.collect() if hasattr(registry_or_families, "collect") else registry_or_families
    return samples(families).get((name, tuple(sorted(labels.items()))))


def test_the_leaders_gauges_count_slots_tasks_and_jobs_from_its_state() -> None:
    members = Membership()
    for rid, slots in (("tm-1", 2), ("tm-2", 3)):
        evolve(members, env(TaskManagerRegistered(rid, "s1", "host-a", slots)))
    sim = JobsDriven(wordcount(sources=2, reducers=2), {"tm-1": 2, "tm-2": 3})
    deployed = sim.schedule()
    assert len(deployed) == 2  # the two sources; the reducers wait for their input
    sim.report(deployed[0], TaskState.INITIALIZING)
    sim.report(deployed[1], TaskState.INITIALIZING)
    sim.report(deployed[1], TaskState.RUNNING)
    families = cluster_families(True, 3, members, sim.state)
    assert value(families, "sluice_cluster_slots", state="in_use") == 2
    assert value(families, "sluice_cluster_slots", state="free") == 3
    assert value(families, "sluice_cluster_taskmanagers") == 2
    assert value(families, "sluice_tasks", state="RUNNING") == 1
    assert value(families, "sluice_tasks", state="INITIALIZING") == 1
    assert value(families, "sluice_tasks", state="CREATED") == 2
    assert value(families, "sluice_jobs", status=sim.job.status.value) == 1
    assert sum(v for (n, _), v in samples(families).items() if n == "sluice_jobs") == 1
    assert value(families, "sluice_jobmanager_leading") == 1 and value(families, "sluice_jobmanager_epoch") == 3
    standby = cluster_families(False, None, Membership(), type(sim.state)())
    assert (
        value(standby, "sluice_jobmanager_leading") == 0 and value(standby, "sluice_cluster_slots", state="free") == 0
    )


def test_inbox_and_dead_letter_gauges_sum_per_kind_of_inbox() -> None:
    readings = [
        InboxReading("{p:cluster}:inbox", 4, 1),
        InboxReading("{p:job:a}:inbox", 2, 0),
        InboxReading("{p:job:b}:inbox", 3, 5),
    ]
    kind = lambda s: "cluster" if "cluster" in s else "jobs"
    families = [*inbox_families(readings, kind), dead_letter_family({"{p:cluster}": 2, "{p:job:a}": 1}, kind)]
    assert value(families, "sluice_inbox_lag_entries", inbox="cluster") == 4
    assert value(families, "sluice_inbox_lag_entries", inbox="jobs") == 5
    assert value(families, "sluice_inbox_pending_entries", inbox="jobs") == 5
    assert value(families, "sluice_dead_letter_entries", scope="cluster") == 2
    assert value(families, "sluice_dead_letter_entries", scope="jobs") == 1


def test_a_taskmanagers_gauges_count_its_slots_and_the_tasks_it_holds() -> None:
    families = taskmanager_families(True, 4, ["RUNNING", "DEPLOYING", "RUNNING"])
    assert value(families, "sluice_taskmanager_slots", state="in_use") == 3
    assert value(families, "sluice_taskmanager_slots", state="free") == 1
    assert value(families, "sluice_taskmanager_tasks", state="RUNNING") == 2
    assert value(families, "sluice_taskmanager_registered") == 1


def test_a_collector_reads_again_when_the_loop_changes_a_dict_under_it() -> None:
    calls = []

    def read():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("dictionary changed size during iteration")
        return taskmanager_families(False, 1, [])

    assert value(StateCollector(read).collect(), "sluice_taskmanager_slots", state="free") == 1
    assert len(calls) == 3


def test_commits_count_task_states_restarts_and_split_round_trips() -> None:
    m = JobManagerMetrics()
    sent_at = 1_000_000
    m.handled_entries(
        [
            env(RequestNextInputSplit("j", "src", 0, "src:0:1", "h", 1), ts=sent_at),
            env(OperatorEvent("j", "src", 1, True, {"type": "request-split", "host": "h"}, 0, 1), ts=sent_at),
            env(OperatorEvent("j", "agg", 0, True, {"hello": 1}, 0, 1), ts=sent_at),
        ]
    )
    assert value(m.registry, "sluice_events_handled_total", type="RequestNextInputSplit") == 1
    assert value(m.registry, "sluice_events_handled_total", type="OperatorEvent") == 2
    m.committed(
        [
            env(NextInputSplit("j", "src:0:1", {"index": 0})),
            env(OperatorEvent("j", "src", 1, False, {"type": "no-more-splits"}, 0)),
            env(OperatorEvent("j", "agg", 0, False, {"hi": 1}, 0)),  # not an answer to a split request
            env(UpdateTaskExecutionState("j", "src:0:1", TaskState.FINISHED)),
            env(UpdateTaskExecutionState("j", "src:1:0", TaskState.FAILED, "boom")),
            env(TaskRestartScheduled("j", "src", 1, 1, 0, 1)),
        ],
        [UpdateTaskExecutionState("j", "src:0:1", TaskState.FINISHED)],
        now_ms=sent_at + 250,
    )
    assert value(m.registry, "sluice_split_round_trip_seconds_count") == 2
    assert value(m.registry, "sluice_split_round_trip_seconds_sum") == pytest.approx(0.5)
    assert value(m.registry, "sluice_split_round_trip_seconds_bucket", le="0.25") == 2
    assert value(m.registry, "sluice_task_transitions_total", state="FINISHED") == 1
    assert value(m.registry, "sluice_task_transitions_total", state="FAILED") == 1
    assert value(m.registry, "sluice_task_restarts_total") == 1
    assert value(m.registry, "sluice_events_appended_total", type="UpdateTaskExecutionState", stream="facts") == 2
    assert value(m.registry, "sluice_events_appended_total", type="UpdateTaskExecutionState", stream="outbox") == 1
    # An answer seen again (a redelivery) or with no request seen is not a round trip.
    m.committed([env(NextInputSplit("j", "src:0:1", None))], [], now_ms=sent_at + 900)
    assert value(m.registry, "sluice_split_round_trip_seconds_count") == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_endpoint_serves_one_processs_registry_in_prometheus_text() -> None:
    a, b = TaskManagerMetrics(), TaskManagerMetrics()  # two processes' metrics in one Python process
    a.tasks_ended.labels("FINISHED").inc(3)
    a.collect_with(lambda: taskmanager_families(True, 2, ["RUNNING"]))
    endpoint = serve(a, free_port(), "127.0.0.1")
    try:
        with urllib.request.urlopen(endpoint.url, timeout=10) as r:
            text = r.read().decode()
    finally:
        endpoint.stop()
    families = list(text_string_to_metric_families(text))
    assert value(families, "sluice_taskmanager_tasks_ended_total", state="FINISHED") == 3
    assert value(families, "sluice_taskmanager_slots", state="free") == 1
    assert value(b.registry, "sluice_taskmanager_tasks_ended_total", state="FINISHED") is None


def test_a_port_in_use_or_not_a_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            ConfigError,
            match=f"metrics port {port} on 127.0.0.1 is already in use by another "
            "process: give --metrics-port a free port, or 0",
        ):
            serve(TaskManagerMetrics(), port, "127.0.0.1")
    for bad in (-1, 65536):
        with pytest.raises(
            ConfigError, match=f"metrics port {bad} is not a TCP port: give --metrics-port a port from 1 to 65535, or 0"
        ):
            serve(TaskManagerMetrics(), bad)
    with pytest.raises(ConfigError, match="cannot serve metrics on no-such-host.invalid:"):
        serve(TaskManagerMetrics(), free_port(), "no-such-host.invalid")
