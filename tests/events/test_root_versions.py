"""The versions that tell a TaskManager the leader's storage root: AcknowledgeRegistration
and AlreadyRegistered v2 (``storage_root``, ``root_id``); a v1 reply reads as nothing to check."""

from __future__ import annotations

import orjson
import pytest

from sluice import events
from sluice.events import Envelope, decode, encode


@pytest.mark.parametrize("kind", [events.AcknowledgeRegistration, events.AlreadyRegistered])
def test_a_v1_acknowledgement_reads_with_no_root_to_check(kind: type) -> None:
    current = Envelope(kind("tm-1", "s1", 3, 1000, 5000, "file:///shared", "root-1"), "id", 3, 5)
    assert kind.VERSION == 2 and decode(encode(current)) == current  # type: ignore[attr-defined]
    v1 = orjson.loads(encode(current))
    v1["v"] = 1
    del v1["payload"]["storage_root"], v1["payload"]["root_id"]  # what a v1 leader wrote
    assert decode(orjson.dumps(v1)) == Envelope(kind("tm-1", "s1", 3, 1000, 5000, "", ""), "id", 3, 5)


def test_the_report_and_its_fact_round_trip() -> None:
    for ev in (
        events.ReportStorageReach("tm-1", "s1", "file:///s", "r", "/s/_SLUICE_ROOT", "missing"),
        events.TaskManagerStorageReach("tm-1", "s1", "file:///s", "r", "/s/_SLUICE_ROOT", None),
    ):
        e = Envelope(ev, "id", 1, 2)
        assert decode(encode(e)) == e
