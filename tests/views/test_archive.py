"""Export and import of a job's log (sluice.views.archive): on the session's real
redis-server over the log of a job that failed once and ran again, and, for the file
format, without Redis."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from sluice.errors import SluiceError
from sluice.services.projector import Projector
from sluice.store import Blobs, EventLog
from sluice.views.archive import (
    EXPORT_VERSION,
    NotAnExport,
    PrefixInUse,
    collect,
    export_lines,
    free_prefix,
    load,
    parse,
)
from sluice.views.history import cluster_at, job_at, tables
from sluice.views.replay import check
from tests.services.failover_helpers import CODE
from tests.views.test_replay import run_with_a_restart, second_prefix

BAD_NAME, BAD_VALUE = b"\xff\xfename", b"\x00\xff not utf-8"


@pytest.fixture
def other(log: EventLog) -> Iterator[EventLog]:
    with second_prefix(log) as target:
        yield target


def _retagged(log: EventLog, rows: dict) -> dict:
    """Tables keyed by (tag relative to the prefix, table)."""
    return {(tag.replace(log.keys.prefix, "P", 1), name): t for (tag, name), t in rows.items()}


@pytest.mark.timeout(90)
def test_an_imported_job_is_the_job_that_was_exported(log: EventLog, other: EventLog, tmp_path: Path) -> None:
    run_with_a_restart(log, tmp_path)
    # An entry that is no event, parked by the leader in the job's dead letters, and one that
    # waits in the job's inbox: exported raw, names and values that are not UTF-8 included.
    log.append_raw(log.keys.dead(log.keys.job("j1")), {b"kind": b"undecodable", BAD_NAME: BAD_VALUE})
    log.append_raw(log.keys.inbox(log.keys.job("j1")), {b"e": BAD_VALUE})
    lines = list(export_lines(collect(log, "j1"), exported_at=1))
    header = orjson.loads(lines[0])
    assert header == {
        "sluice_export": EXPORT_VERSION,
        "job_id": "j1",
        "prefix": log.keys.prefix,
        "exported_at": 1,
        "counts": header["counts"],
    }
    streams = header["counts"]["streams"]
    assert {"{cluster}:facts", "{job:j1}:facts", "{job:j1}:inbox", "{job:j1}:outbox", "{job:j1}:dead"} <= set(streams)
    assert streams["{job:j1}:facts"] == log.length(log.keys.facts(log.keys.job("j1")))
    assert header["counts"]["blobs"] == 1
    assert orjson.loads(lines[-1]) == {
        "blob": hashlib.sha256(CODE).hexdigest(),
        "data": base64.b64encode(CODE).decode(),
    }
    cluster_types = {
        orjson.loads(orjson.loads(x)["fields"]["e"])["type"]
        for x in lines[1:]
        if orjson.loads(x).get("stream") == "{cluster}:facts"
    }
    assert cluster_types == {"LeadershipGranted", "TaskManagerRegistered", "TaskManagerStorageReach", "JobRegistered"}
    dead = [orjson.loads(x) for x in lines if '"{job:j1}:dead"' in x]
    assert dead[-1]["fields"] == [
        ["kind", "undecodable"],
        [{"b64": base64.b64encode(BAD_NAME).decode()}, {"b64": base64.b64encode(BAD_VALUE).decode()}],
    ]

    written = load(other, parse(lines, "j1.jsonl"))
    assert sum(written.values()) == header["counts"]["entries"]
    assert Blobs(other).get(hashlib.sha256(CODE).hexdigest()) == CODE
    # The same tables, at the same entries; the same export but for the header.
    assert _retagged(other, tables(other, cluster_at(other), [job_at(other, "j1")])) == _retagged(
        log, tables(log, cluster_at(log), [job_at(log, "j1")])
    )
    assert job_at(other, "j1").last_entry == job_at(log, "j1").last_entry
    again = list(export_lines(collect(other, "j1"), exported_at=2))
    assert again[1:] == lines[1:]
    assert orjson.loads(again[0])["prefix"] == other.keys.prefix
    # A projector there builds the tables replay --check finds equal to the log's.
    Projector(other).catch_up()
    Projector(other).catch_up()
    result = check(other)
    assert result.agree and all(t.lag == 0 for t in result.tables) and len(result.tables) == 5
    assert result.tables[-2].position == job_at(log, "j1").last_entry
    # Code the store lost is named, and the rest is exported without it.
    digest = hashlib.sha256(CODE).hexdigest()
    other.backend.delete(other.keys.blob(digest))
    without = collect(other, "j1")
    assert without.missing_blobs == [digest] and without.blobs == [] and len(without.entries) == len(lines) - 2
    # The prefix now holds the job: a second import there is refused, saying how to pick one.
    with pytest.raises(
        PrefixInUse,
        match=rf"prefix '{other.keys.prefix}' is not empty: it holds "
        r"\{.*; import into a fresh prefix: pass another --prefix",
    ):
        load(other, parse(lines, "j1.jsonl"))


@pytest.mark.timeout(30)
def test_the_generated_prefix_is_the_first_free_import_prefix(log: EventLog) -> None:
    def make(prefix: str) -> EventLog:
        return EventLog(log.backend, log.keys.__class__(log.keys.prefix + "-" + prefix))

    first = free_prefix(log, "j/1", make)
    assert first.keys.prefix == log.keys.prefix + "-import-j-1-1"
    try:
        Blobs(first).put(b"taken")
        assert free_prefix(log, "j/1", make).keys.prefix == log.keys.prefix + "-import-j-1-2"
    finally:
        first.backend.delete(first.keys.blob(hashlib.sha256(b"taken").hexdigest()))


def test_exporting_a_job_the_log_never_had_says_so(log: EventLog) -> None:
    with pytest.raises(SluiceError, match="job 'nope' not found under prefix .*sluice list"):
        collect(log, "nope")


# --- the file format, without Redis ---------------------------------------------------------


def _header(**counts: object) -> str:
    return orjson.dumps(
        {
            "sluice_export": 1,
            "job_id": "j1",
            "prefix": "p",
            "exported_at": 0,
            "counts": {"entries": 0, "blobs": 0, "streams": {}, **counts},
        }
    ).decode()


def _entry(stream: str, entry_id: str, fields: object = None) -> str:
    return orjson.dumps({"stream": stream, "id": entry_id, "fields": fields or {"e": "{}"}}).decode()


GOOD = [
    _header(entries=2, streams={"{job:j1}:facts": 1, "{cluster}:facts": 1}),
    _entry("{cluster}:facts", "1-0"),
    _entry("{job:j1}:facts", "5-1", [[{"b64": "/w=="}, "x"]]),
]


def test_a_good_file_reads_back_entry_by_entry() -> None:
    export = parse(GOOD + [""], "f")
    assert export.job_id == "j1" and export.prefix == "p"
    assert export.entries == [("{cluster}:facts", "1-0", {b"e": b"{}"}), ("{job:j1}:facts", "5-1", {b"\xff": b"x"})]


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        ([], r"f is empty: not a Sluice export \(`sluice job export JOB FILE` writes one\)"),
        (["hello"], r"f line 1: not a Sluice export"),
        (['{"rows": []}'], r"f line 1: not a Sluice export \(its first line is not a header"),
        (
            [_header().replace('"sluice_export":1', '"sluice_export":2')],
            r"f: export version 2 is not one this Sluice reads \(it reads 1\)",
        ),
        ([_header().replace('"j1"', '"a b"')], r"f line 1: the header's job_id is not usable"),
        ([GOOD[0], GOOD[1], "not json"], r"f line 3: not JSON"),
        ([GOOD[0], GOOD[1], '{"stream": "{job:j1}:facts"}'], r"f line 3: neither an entry"),
        ([GOOD[0], _entry("{job:j2}:facts", "1-0")], r"f line 2: stream '\{job:j2\}:facts' is neither one of job 'j1'"),
        ([GOOD[0], _entry("{cluster}:leader", "1-0")], r"line 2: stream '\{cluster\}:leader' is neither"),
        ([GOOD[0], _entry("{cluster}:facts", "soon")], r"f line 2: 'soon' is not a stream entry id"),
        (
            [GOOD[0], _entry("{cluster}:facts", "2-0"), _entry("{cluster}:facts", "1-5")],
            r"f line 3: entry 1-5 of \{cluster\}:facts comes after 2-0: entries must be in id order",
        ),
        (
            [GOOD[0], _entry("{cluster}:facts", "1-0", {"e": {"b64": "***"}})],
            r"f line 2: a field is .*neither a string",
        ),
        ([GOOD[0], _entry("{cluster}:facts", "1-0", {"e": 3})], r"f line 2: a field is 3, neither a string"),
        ([GOOD[0], _entry("{cluster}:facts", "1-0", "e")], r"f line 2: fields must be an object"),
        ([GOOD[0], '{"blob": "00", "data": "aGk="}'], r"f line 2: the blob's data does not hash to its name '00'"),
        (GOOD[:2], r"f: the header counts .* but the file holds .*: the file is cut short or was edited"),
    ],
)
def test_a_file_that_is_not_an_export_is_refused_naming_the_line(lines: list[str], error: str) -> None:
    with pytest.raises(NotAnExport, match=error):
        parse(lines, "f")
