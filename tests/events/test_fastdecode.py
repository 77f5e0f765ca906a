"""The replay path's msgspec decoder against the reference (orjson) one: for any input, the
same envelope, or the same error (kind and words)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import DecodeError
from sluice.events import EVENT_TYPES, Envelope, decode_bytes, encode
from sluice.events.fastdecode import decode_bytes_msgspec

from .test_codec import envelopes, json_values


def outcome(decoder: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", decoder(raw)
    except DecodeError as exc:
        return type(exc).__name__, str(exc)


def same(raw: bytes) -> tuple[str, Any]:
    ref = outcome(decode_bytes, raw)
    fast = outcome(decode_bytes_msgspec, raw)
    assert fast == ref, raw
    return ref


@settings(max_examples=150)
@given(envelopes)
def test_any_event_decodes_to_the_same_envelope(env: Envelope) -> None:
    assert same(encode(env)) == ("ok", env)


_ENVELOPE_KEYS = ["type", "v", "id", "job", "epoch", "ts", "cause", "payload"]
_odd_values = st.one_of(
    json_values,
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 1.0, True, "", [], {}]),
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """An encoded envelope with one or more things wrong (or not), at the JSON or byte level."""
    env = draw(envelopes)
    d = orjson.loads(encode(env))
    payload = d["payload"]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(
                [
                    "drop key",
                    "extra key",
                    "key value",
                    "version",
                    "type",
                    "drop field",
                    "extra field",
                    "field value",
                    "payload value",
                ]
            )
        )
        if kind == "drop key":
            d.pop(draw(st.sampled_from(_ENVELOPE_KEYS)), None)
        elif kind == "extra key":
            d[draw(st.text(max_size=6))] = draw(_odd_values)
        elif kind == "key value":
            d[draw(st.sampled_from(_ENVELOPE_KEYS))] = draw(_odd_values)
        elif kind == "version":
            cls = EVENT_TYPES.get(d.get("type")) if isinstance(d.get("type"), str) else None
            d["v"] = draw(st.integers(-1, (cls.VERSION if cls else 3) + 1))
        elif kind == "type":
            d["type"] = draw(st.sampled_from(sorted(EVENT_TYPES)) | st.text(max_size=8))
        elif isinstance(payload, dict) and kind == "drop field" and payload:
            payload.pop(draw(st.sampled_from(sorted(payload))))
        elif isinstance(payload, dict) and kind == "extra field":
            payload[draw(st.text(max_size=8))] = draw(_odd_values)
        elif isinstance(payload, dict) and kind == "field value" and payload:
            payload[draw(st.sampled_from(sorted(payload)))] = draw(_odd_values)
        elif kind == "payload value":
            d["payload"] = draw(_odd_values)
    raw = json.dumps(d, separators=(",", ":")).encode()  # (orjson cannot write an integer above 64 bits)
    byte_level = draw(st.sampled_from(["none", "truncate", "garbage", "duplicate"]))
    if byte_level == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif byte_level == "garbage":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:]
    elif byte_level == "duplicate":  # a key twice: the last one counts, for both
        key = draw(st.sampled_from(_ENVELOPE_KEYS))
        raw = raw[:-1] + b',"' + key.encode() + b'":' + json.dumps(draw(_odd_values)).encode() + b"}"
    return raw


@settings(max_examples=200)
@given(mutated())
def test_any_input_is_accepted_or_refused_alike(raw: bytes) -> None:
    same(raw)


@pytest.mark.slow
@settings(max_examples=5000)
@given(mutated())
def test_any_input_is_accepted_or_refused_alike_at_length(raw: bytes) -> None:
    """The same law, searched longer (``-m slow``)."""
    same(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type":"JobRegistered","v":1,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,'
        b'"payload":{"job_id":"j","name":"n"}}',
        b'{"type":"JobRegistered","v":1,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,'
        b'"payload":{"job_id":"j","name":"n","bogus":1}}',
        b'{"type":"JobRegistered","v":1,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,'
        b'"payload":{"job_id":"j","name":"\\ud800"}}',
        b'{"type":"JobRegistered","v":1,"id":"i","job":null,"epoch":0,"ts":18446744073709551615,"cause":null,'
        b'"payload":{"job_id":"j","name":"n"}}',
        b'{"type":"JobRegistered","v":1,"id":"i","job":null,"epoch":0,"ts":18446744073709551616,"cause":null,'
        b'"payload":{"job_id":"j","name":"n"}}',
        b'{"type":"UpdateTaskExecutionState","v":3,"id":"i","job":"j","epoch":1,"ts":2,"cause":null,'
        b'"payload":{"job_id":"j","execution_id":"v:0:0","state":"RUNNING","error":null,"vertex_id":"v",'
        b'"subtask":0,"attempt":0,"taskmanager":null,"slot":null,"session":null}}',
        b'{"type":"UpdateTaskExecutionState","v":3,"id":"i","job":"j","epoch":1,"ts":2,"cause":null,'
        b'"payload":{"job_id":"j","execution_id":"v:0:0","state":"RUNNING","error":null,"vertex_id":"v",'
        b'"subtask":0,"attempt":0,"taskmanager":null,"slot":null,"session":null,"retryable":false}}',
        b'{"type":"UpdateTaskExecutionState","v":4,"id":"i","job":"j","epoch":1,"ts":2,"cause":null,'
        b'"payload":{"job_id":"j","execution_id":"v:0:0","state":"NOPE"}}',
    ],
    ids=["plain", "unknown field", "lone surrogate", "u64 max", "above u64", "upcast", "upcast, field given", "enum"],
)
def test_edges_alike(raw: bytes) -> None:
    same(raw)


def test_the_facts_a_replay_reads_most_are_decoded_by_msgspec() -> None:
    """Not a fallback for each: a task's moves (written as v3 where they can be, upcast to v4
    by adding a default) and restarts, at every version their upcasters only add defaults to."""
    from sluice.events import fastdecode

    fastdecode._compile()
    assert set(fastdecode._BY_TYPE["UpdateTaskExecutionState"] or ()) == {1, 2, 3, 4}
    assert set(fastdecode._BY_TYPE["TaskRestartScheduled"] or ()) == {1}
    assert fastdecode._BY_TYPE["CoordinatorCheckpointed"] is None  # a JSON field: decode_bytes
