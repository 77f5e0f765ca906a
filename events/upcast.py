"""Upcasters: explicit steps that turn an old schema version of a payload into the next one.

Register one function per step, ``(type, from_version) -> payload of from_version + 1``::

    @upcaster("RegisterTaskManager", 1)
    def _v1_to_v2(payload): return {**payload, "labels": {}}

Decoding an entry written at version ``k`` applies the steps ``k -> k+1 -> ... -> current``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.errors import UnsupportedSchemaVersion

__all__ = ["upcaster", "upcast"]

Payload = dict[str, Any]
_STEPS: dict[tuple[str, int], Callable[[Payload], Payload]] = {}


def upcaster(
    type_name: str, from_version: int
) -> Callable[[Callable[[Payload], Payload]], Callable[[Payload], Payload]]:
    def register(fn: Callable[[Payload], Payload]) -> Callable[[Payload], Payload]:
        key = (type_name, from_version)
        if key in _STEPS:
            raise TypeError(f"upcaster {type_name} v{from_version} is registered twice")
        _STEPS[key] = fn
        return fn

    return register


def upcast(type_name: str, version: int, current: int, payload: Any) -> Any:
    if version > current:
        raise UnsupportedSchemaVersion(
            f"{type_name} v{version} was written by a newer Sluice (this one reads up to v{current}); upgrade Sluice",
            type_name=type_name,
            version=version,
            current=current,
        )
    if version < 1:
        raise UnsupportedSchemaVersion(f"{type_name} has schema version {version}; versions start at 1")
    while version < current:
        step = _STEPS.get((type_name, version))
        if step is None:
            raise UnsupportedSchemaVersion(
                f"{type_name} v{version} cannot be read: no upcaster from v{version} to v{version + 1}"
            )
        payload = step(payload)
        version += 1
    return payload


# --- the steps ---------------------------------------------------------------------------


@upcaster("RegisterTaskManager", 1)
def _register_task_manager_v1_v2(payload: Payload) -> Payload:
    """v2 added ``labels`` (free-form placement hints); v1 TaskManagers had none."""
    if isinstance(payload, dict):
        return {**payload, "labels": {}}
    return payload


@upcaster("RegisterTaskManager", 2)
def _register_task_manager_v2_v3(payload: Payload) -> Payload:
    """v3 added the slot report ``attempts``; older TaskManagers send none (None: not an
    empty report, which would say they hold nothing)."""
    if isinstance(payload, dict):
        return {**payload, "attempts": None}
    return payload


@upcaster("TaskManagerHeartbeat", 1)
def _task_manager_heartbeat_v1_v2(payload: Payload) -> Payload:
    """v2 added the slot report ``attempts``; older heartbeats carry none (None, as above)."""
    if isinstance(payload, dict):
        return {**payload, "attempts": None}
    return payload


@upcaster("AcknowledgeRegistration", 1)
def _acknowledge_registration_v1_v2(payload: Payload) -> Payload:
    """v2 added the leader's ``storage_root`` and ``root_id``; a v1 leader names none (nothing to check)."""
    if isinstance(payload, dict):
        return {**payload, "storage_root": "", "root_id": ""}
    return payload


@upcaster("AlreadyRegistered", 1)
def _already_registered_v1_v2(payload: Payload) -> Payload:
    """v2 added ``storage_root`` and ``root_id``, as AcknowledgeRegistration v2 did."""
    if isinstance(payload, dict):
        return {**payload, "storage_root": "", "root_id": ""}
    return payload


@upcaster("UpdateTaskExecutionState", 1)
def _update_task_execution_state_v1_v2(payload: Payload) -> Payload:
    """v1 named the execution only; v2 records vertex, subtask, attempt and location too."""
    if isinstance(payload, dict):
        return {"vertex_id": "", "subtask": -1, "attempt": -1, "taskmanager": None, "slot": None, **payload}
    return payload


@upcaster("OperatorEvent", 1)
def _operator_event_v1_v2(payload: Payload) -> Payload:
    """v2 added ``attempt`` (which execution attempt sent it, or is meant to get it)."""
    if isinstance(payload, dict):
        return {"attempt": 0, **payload}
    return payload


@upcaster("LeadershipGranted", 1)
def _leadership_granted_v1_v2(payload: Payload) -> Payload:
    """v2 added ``server`` (the Redis run id the leader rebuilt from); v1 leaders did not say."""
    if isinstance(payload, dict):
        return {**payload, "server": ""}
    return payload


@upcaster("LogRestarted", 1)
def _log_restarted_v1_v2(payload: Payload) -> Payload:
    """v2 added ``slots`` (the slot ranges that failed over on a cluster); a v1 restart was
    of the whole log (None)."""
    if isinstance(payload, dict):
        return {**payload, "slots": None}
    return payload


@upcaster("OperatorEvent", 2)
def _operator_event_v2_v3(payload: Payload) -> Payload:
    """v3 added ``seq`` (what one attempt sends, numbered); older events are unnumbered."""
    if isinstance(payload, dict):
        return {**payload, "seq": 0}
    return payload


@upcaster("OperatorEvent", 3)
def _operator_event_v3_v4(payload: Payload) -> Payload:
    """v4 added ``at`` (when the leader recorded it); older events say nothing (0)."""
    if isinstance(payload, dict):
        return {**payload, "at": 0}
    return payload


@upcaster("RequestNextInputSplit", 1)
def _request_next_input_split_v1_v2(payload: Payload) -> Payload:
    """v2 added ``seq`` (what one attempt sends, numbered); older requests are unnumbered."""
    if isinstance(payload, dict):
        return {**payload, "seq": 0}
    return payload


@upcaster("RequestNextInputSplit", 2)
def _request_next_input_split_v2_v3(payload: Payload) -> Payload:
    """v3 added ``at`` (when the leader recorded it); older requests say nothing (0)."""
    if isinstance(payload, dict):
        return {**payload, "at": 0}
    return payload


@upcaster("UpdateTaskExecutionState", 2)
def _update_task_execution_state_v2_v3(payload: Payload) -> Payload:
    """v3 added ``session`` (the TaskManager registration an attempt was placed on)."""
    if isinstance(payload, dict):
        return {**payload, "session": None}
    return payload


@upcaster("UpdateTaskExecutionState", 3)
def _update_task_execution_state_v3_v4(payload: Payload) -> Payload:
    """v4 added ``retryable``; every failure a v3 TaskManager reported could be retried."""
    if isinstance(payload, dict):
        return {**payload, "retryable": True}
    return payload


@upcaster("ExecutionGraphBuilt", 1)
def _execution_graph_built_v1_v2(payload: Payload) -> Payload:
    """v2 added ``first_attempt``; before, every subtask started at attempt 0."""
    if isinstance(payload, dict):
        return {**payload, "first_attempt": 0}
    return payload


@upcaster("JobWaitingForSlots", 1)
def _job_waiting_for_slots_v1_v2(payload: Payload) -> Payload:
    """v2 waits last until ``JobSlotsFound``; a v1 wait lasted until the job's next slot taken."""
    if isinstance(payload, dict):
        return {**payload, "until_placed": False}
    return payload


@upcaster("SubmitTask", 1)
def _submit_task_v1_v2(payload: Payload) -> Payload:
    """v2 types the descriptor; a v1 descriptor has the same fields (and is version 1)."""
    return payload


@upcaster("TaskOperationResult", 1)
def _task_operation_result_v1_v2(payload: Payload) -> Payload:
    """v2 added ``retryable``; every failure a v1 TaskManager reported could be retried."""
    if isinstance(payload, dict):
        return {**payload, "retryable": True}
    return payload
