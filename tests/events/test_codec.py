"""The envelope codec: round trips for every event, strict decoding, upcasting."""

from __future__ import annotations

import dataclasses
import enum
import typing

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sluice.events as events
from sluice.errors import (
    DecodeError,
    MalformedEnvelope,
    MissingField,
    NotJSON,
    UnexpectedField,
    UnknownEventType,
    UnsupportedSchemaVersion,
    WrongFieldType,
)
from sluice.events import EVENT_TYPES, JSON, Envelope, decode, decode_fields, encode
from sluice.events.schema import Event, event
from sluice.events.upcast import upcaster

PROTOCOL = [
    "RegisterTaskManager",
    "AcknowledgeRegistration",
    "AlreadyRegistered",
    "RefuseRegistration",
    "TaskManagerHeartbeat",
    "JobManagerHeartbeat",
    "SubmitJob",
    "Success",
    "SubmitTask",
    "TaskOperationResult",
    "UpdateTaskExecutionState",
    "RequestNextInputSplit",
    "NextInputSplit",
    "ScheduleOrUpdateConsumers",
    "OperatorEvent",
    "NotifyKvStateRegistered",
    "NotifyKvStateUnregistered",
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.text(max_size=10)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def strategy_for(tp: typing.Any) -> st.SearchStrategy:
    origin = typing.get_origin(tp)
    if tp is JSON:
        return json_values
    if tp is str:
        return st.text(max_size=20)
    if tp is int:
        return st.integers(-(2**53), 2**53)
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if tp is bool:
        return st.booleans()
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if origin in (typing.Union, typing.get_origin(int | None)):
        return st.one_of(*[st.none() if a is type(None) else strategy_for(a) for a in typing.get_args(tp)])
    if origin is list:
        return st.lists(strategy_for(typing.get_args(tp)[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(st.text(max_size=5), strategy_for(typing.get_args(tp)[1]), max_size=3)
    if dataclasses.is_dataclass(tp):
        return builds(tp)
    raise AssertionError(f"no strategy for {tp}")


def builds(cls: type) -> st.SearchStrategy:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)})


any_event = st.sampled_from(sorted(EVENT_TYPES)).flatmap(lambda name: builds(EVENT_TYPES[name]))
envelopes = st.builds(
    Envelope,
    any_event,
    st.text(min_size=1, max_size=12),
    st.integers(0, 2**40),
    st.integers(0, 2**50),
    st.none() | st.text(max_size=8),
    st.none() | st.text(max_size=8),
)


def test_every_protocol_message_is_declared() -> None:
    assert set(PROTOCOL) <= set(EVENT_TYPES)
    assert set(events.__all__) >= {cls.__name__ for cls in EVENT_TYPES.values()}


@settings(max_examples=400)
@given(envelopes)
def test_every_event_round_trips(env: Envelope) -> None:
    assert decode(encode(env)) == env
    assert decode_fields({b"e": encode(env)}) == env


def raw(**changes: object) -> bytes:
    base = orjson.loads(encode(Envelope(events.TaskManagerHeartbeat("tm", "s", 1, 2), "id-1", 3, 4)))
    for k, v in changes.items():
        if k.startswith("p_"):
            base["payload"][k[2:]] = v
        elif v is _DROP:
            del base[k]
        else:
            base[k] = v
    return orjson.dumps(base)


_DROP = object()


@pytest.mark.parametrize(
    "data, error, says",
    [
        (b"\xff\xfe", NotJSON, "not JSON"),
        (b"[1, 2]", MalformedEnvelope, "JSON object, got list"),
        (raw(cause=_DROP), MalformedEnvelope, "missing ['cause']"),
        (raw(extra=1), MalformedEnvelope, "unexpected ['extra']"),
        (raw(type=5), MalformedEnvelope, "'type' must be a string"),
        (raw(epoch="3"), MalformedEnvelope, "integers"),
        (raw(id=""), MalformedEnvelope, "'id' must be a non-empty string"),
        (raw(type="Nope"), UnknownEventType, "'Nope' is not an event type"),
        (raw(v=7), UnsupportedSchemaVersion, "newer Sluice"),
        (raw(v=0), UnsupportedSchemaVersion, "versions start at 1"),
        (raw(payload=[1]), WrongFieldType, "payload of TaskManagerHeartbeat must be an object"),
        (raw(p_slots_free="2"), WrongFieldType, "field 'slots_free' must be an integer, got str"),
        (raw(p_slots_free=True), WrongFieldType, "must be an integer, got bool"),
        (raw(p_surprise=1), UnexpectedField, "does not declare: surprise"),
    ],
)
def test_malformed_entries_raise_a_specific_error_naming_stream_and_entry(data: bytes, error: type, says: str) -> None:
    with pytest.raises(error) as info:
        decode(data, stream="{sluice:cluster}:inbox", entry_id="17-0")
    text = str(info.value)
    assert says in text
    assert "stream {sluice:cluster}:inbox, entry 17-0" in text
    assert isinstance(info.value, DecodeError) and info.value.entry_id == "17-0"


def test_a_missing_payload_field_is_named() -> None:
    data = orjson.loads(raw())
    del data["payload"]["session"]
    with pytest.raises(MissingField, match="TaskManagerHeartbeat needs field 'session' \\(a string\\)"):
        decode(orjson.dumps(data))


def test_nested_records_and_enums_are_checked() -> None:
    ok = Envelope(events.NotifyKvStateRegistered("j", "v", events.KeyGroupRange(0, 3), "n", "s", "a"), "i")
    data = orjson.loads(encode(ok))
    data["payload"]["key_group_range"]["end"] = "3"
    with pytest.raises(WrongFieldType, match="in 'key_group_range'.*'end' must be an integer"):
        decode(orjson.dumps(data))
    state = orjson.loads(encode(Envelope(events.UpdateTaskExecutionState("j", "x", events.TaskState.RUNNING), "i")))
    state["payload"]["state"] = "SLEEPING"
    with pytest.raises(WrongFieldType, match="'state' must be one of"):
        decode(orjson.dumps(state))


def test_an_entry_without_the_envelope_field_says_how_to_write_one() -> None:
    with pytest.raises(MalformedEnvelope, match="no 'e' field.*fields: x"):
        decode_fields({b"x": b"1"}, stream="s", entry_id="1-0")


def test_an_old_version_is_upcast_to_the_current_one() -> None:
    current = Envelope(events.RegisterTaskManager("tm", "s", "h", 2, 1, 4, {}), "id", 4, 5)
    v1 = orjson.loads(encode(current))
    v1["v"] = 1
    del v1["payload"]["labels"]  # what a v1 writer wrote
    del v1["payload"]["attempts"]
    assert events.RegisterTaskManager.VERSION == 3
    assert decode(orjson.dumps(v1)) == current


def test_split_requests_and_operator_events_from_before_at_read_as_not_saying_when() -> None:
    """``at`` (when the leader recorded it) came with RequestNextInputSplit v3 and
    OperatorEvent v4; older facts read with 0, which a coordinator sees as "not known"."""
    for current, version in (
        (events.RequestNextInputSplit("j", "src", 0, "src:0:0", "h", 2, 99), 2),
        (events.OperatorEvent("j", "src", 0, True, {"type": "request-split"}, 0, 3, 99), 3),
    ):
        assert type(current).VERSION == version + 1
        old = orjson.loads(encode(Envelope(current, "id", 4, 5)))
        old["v"] = version
        del old["payload"]["at"]
        assert decode(orjson.dumps(old)).event == dataclasses.replace(current, at=0)


def test_a_v1_heartbeat_reads_as_one_without_a_slot_report() -> None:
    """None, not an empty report: an empty one would say the TaskManager holds nothing, and
    the leader would fail everything an older TaskManager runs."""
    current = Envelope(events.TaskManagerHeartbeat("tm", "s", 4, 2), "id", 4, 5)
    v1 = orjson.loads(encode(current))
    v1["v"] = 1
    del v1["payload"]["attempts"]
    assert decode(orjson.dumps(v1)) == current and current.event.attempts is None
    report = Envelope(
        events.TaskManagerHeartbeat(
            "tm", "s", 4, 2, [events.AttemptReport("j", "v:0:1", events.TaskState.FAILED, "boom")]
        ),
        "id",
        4,
        5,
    )
    assert decode(encode(report)) == report


def test_a_version_without_an_upcaster_is_refused_clearly() -> None:
    @event("TestOnlyThing", version=3)
    class Thing(Event):
        n: int

    @upcaster("TestOnlyThing", 1)
    def _v1(p: dict) -> dict:
        return {"n": p["count"]}

    try:
        base = {"type": "TestOnlyThing", "id": "i", "job": None, "epoch": 0, "ts": 0, "cause": None}
        with pytest.raises(UnsupportedSchemaVersion, match="no upcaster from v2 to v3"):
            decode(orjson.dumps({**base, "v": 1, "payload": {"count": 2}}))
        assert decode(orjson.dumps({**base, "v": 3, "payload": {"n": 2}})).event == Thing(2)
    finally:
        from sluice.events.upcast import _STEPS

        del EVENT_TYPES["TestOnlyThing"]
        _STEPS.pop(("TestOnlyThing", 1))


def test_declaring_a_type_twice_is_an_error() -> None:
    with pytest.raises(TypeError, match="declared twice"):

        @event("RegisterTaskManager")
        class Again(Event):
            x: int
