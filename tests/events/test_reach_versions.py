"""The versions that carry the storage check: TaskOperationResult v2 (``retryable``) and the
task deployment descriptor v2 (``storage_root``); older ones read as they meant."""

from __future__ import annotations

import orjson

from sluice import events
from sluice.events import Envelope, TaskDeploymentDescriptor, decode, descriptor_from_json, descriptor_to_json, encode


def test_a_v1_task_operation_result_reads_as_retryable() -> None:
    current = Envelope(events.TaskOperationResult("j", "v:0:0", False, "no temp dir", retryable=True), "id", 4, 5)
    assert events.TaskOperationResult.VERSION == 2
    v1 = orjson.loads(encode(current))
    v1["payload"].pop("retryable", None)  # what a v1 TaskManager wrote
    v1["v"] = 1
    assert decode(orjson.dumps(v1)) == current
    refused = Envelope(events.TaskOperationResult("j", "v:0:0", False, "cannot see", retryable=False), "id", 4, 5)
    assert decode(encode(refused)).event.retryable is False


def test_a_retryable_result_is_written_as_v1_for_a_leader_not_yet_upgraded() -> None:
    """TaskManagers are upgraded before the leader (README, rolling upgrades): an answer that
    holds nothing v1 lacks is written as v1, which the older leader reads; only a start that
    is not retryable (new with v2, and rare) needs an upgraded leader."""
    ok = Envelope(events.TaskOperationResult("j", "v:0:0", True, None), "id", 4, 5)
    failed = Envelope(events.TaskOperationResult("j", "v:0:0", False, "no temp dir"), "id", 4, 5)
    for env in (ok, failed):
        raw = orjson.loads(encode(env))
        assert raw["v"] == 1 and set(raw["payload"]) == {"job_id", "execution_id", "success", "message"}
        assert decode(encode(env)) == env
    refused = orjson.loads(encode(Envelope(events.TaskOperationResult("j", "x", False, "cannot see", False), "i")))
    assert refused["v"] == 2 and refused["payload"]["retryable"] is False


def test_a_v1_descriptor_reads_with_no_storage_root_to_check() -> None:
    d = TaskDeploymentDescriptor(
        "j", "v:0:0", "v", 0, 0, 1, 128, "noop", "0" * 64, "m", [], {}, [], storage_root="file:///shared/storage"
    )
    assert d.version == 3 and descriptor_from_json(descriptor_to_json(d)) == d
    v1 = descriptor_to_json(d)
    del v1["storage_root"]
    v1["version"] = 1
    assert descriptor_from_json(v1) == TaskDeploymentDescriptor(
        *[
            getattr(d, f)
            for f in (
                "job_id",
                "execution_id",
                "vertex",
                "subtask",
                "attempt",
                "parallelism",
                "max_parallelism",
                "kind",
                "code_blob",
                "module",
                "functions",
                "params",
                "inputs",
            )
        ],
        storage_root="",
    )
