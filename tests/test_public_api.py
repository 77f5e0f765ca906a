"""The public API, pinned (as httpx's tests/test_api.py pins ``httpx.__all__``): the names
``sluice.api``, ``sluice.client``, ``sluice.state`` and ``sluice.errors`` export, and the
public methods of the classes a user holds. A change here is a change users see: make it
on purpose, and say it in the notes."""

from __future__ import annotations

import inspect

import pytest

import sluice.api
import sluice.client
import sluice.errors
import sluice.state

API = {"Job", "Stream", "Keyed", "Broadcast", "function_ref", "task_context"}
CLIENT = {"JobFile", "load_job", "Client", "JobNotFound", "JobRefusedError"}
STATE = {"Location", "Lookup", "StateClient"}
ERRORS = {
    "SluiceError",
    "EventError",
    "DecodeError",
    "NotJSON",
    "MalformedEnvelope",
    "UnknownEventType",
    "UnsupportedSchemaVersion",
    "MissingField",
    "WrongFieldType",
    "UnexpectedField",
    "StoreError",
    "RedisUnavailable",
    "RedisPermissionDenied",
    "StaleEpoch",
    "StoreRestarted",
    "ScriptError",
    "ScriptFailed",
    "NoGroup",
    "CommandError",
    "WrongType",
    "PartlyAppended",
    "PartlyRead",
    "IdsOutOfOrder",
    "ConfigError",
    "PrefixInUse",
    "InvalidJobGraph",
    "JobRefusedError",
    "SnapshotUnreadable",
    "BadMoment",
    "UnknownDeadLetter",
    "NotAnExport",
    "ApiError",
    "DataplaneError",
    "SplitError",
    "SchemaError",
    "StorageError",
    "StorageNotFound",
    "MessageRejected",
    "UnexpectedMessage",
    "UnexpectedJobMessage",
    "IllegalTransition",
    "ServiceError",
    "ContextNotBound",
    "CoordinatorError",
    "NoAnswer",
    "TaskStartFailed",
    "StorageUnreachable",
    "BroadcastTooLarge",
    "HandlerFailed",
    "DuplicateCommit",
    "QueryableStateError",
    "JobNotFound",
    "UnknownJob",
    "UnknownStateName",
    "StateNotRegistered",
    "StateServerUnavailable",
}

METHODS = {
    sluice.api.Job: {"graph", "noop", "read_csv", "read_json", "read_parquet", "read_range", "read_text"},
    sluice.api.Stream: {"broadcast", "key_by", "map", "with_coordinator", "write_csv", "write_parquet"},
    sluice.api.Keyed: {"join", "map"},
    sluice.client.Client: {
        "cancel",
        "checkpoint",
        "close",
        "job",
        "job_ids",
        "purge",
        "submit",
        "wait_accepted",
        "wait_ended",
        "wait_running",
    },
    sluice.state.StateClient: {"dispose", "forget", "get", "location", "lookup"},
    sluice.state.Location: {"range_of"},
}


@pytest.mark.parametrize(
    ("module", "names"),
    [(sluice.api, API), (sluice.client, CLIENT), (sluice.state, STATE), (sluice.errors, ERRORS)],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_the_exported_names(module: object, names: set[str]) -> None:
    exported = module.__all__
    assert len(exported) == len(set(exported)), "a name exported twice"
    assert set(exported) == names
    assert [n for n in exported if getattr(module, n, None) is None] == []


def test_the_public_methods_of_what_a_user_holds() -> None:
    assert {cls.__name__: {n for n in dir(cls) if not n.startswith("_")} for cls in METHODS} == {
        cls.__name__: names for cls, names in METHODS.items()
    }


def test_every_error_exported_is_one_of_the_tree() -> None:
    """The client's errors are the error module's classes (not copies), and the two names
    of an unknown job are one class, so code catching either catches both."""
    for module in (sluice.client, sluice.errors):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                assert issubclass(obj, sluice.errors.SluiceError), name
                assert getattr(sluice.errors, name) is obj, name
    assert sluice.errors.UnknownJob is sluice.errors.JobNotFound
    assert issubclass(sluice.errors.JobNotFound, sluice.errors.QueryableStateError)
    assert issubclass(sluice.errors.SnapshotUnreadable, ValueError)  # caught as one where snapshots are read
