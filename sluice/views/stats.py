"""The log now: its streams, what flowed through them lately, the consumer groups and the
dead letters (``sluice inspect stats``, the dashboard's Streams page).

JSON::

    {"now": ms (Redis's clock), "window_s": float,
     "streams": [{"stream", "kind" (inbox, facts, outbox, dead), "length", "memory_bytes",
                  "last_entry"}],
     "events": [{"type", "count", "rate_per_s", "by_kind": {"inbox": n, "facts": n, "outbox": n}}],
     "events_sampled": [streams with more entries in the window than were read],
     "groups": [{"stream", "group", "consumers", "pending", "lag", "lag_counted", "oldest_pending",
                 "oldest_pending_age_s", "oldest_pending_idle_s"}],
     "dead_letters": {"total": n, "by_reason": [{"kind", "reason", "count"}]}}

Event counts cover the entries of the last ``window_s`` seconds (by their ids: Redis's
clock) of every inbox, fact stream and outbox; an event appears once per stream it is in
(a message in an inbox, then the fact it caused). A stream with more than
``READ_PER_STREAM`` entries in the window has only its newest ones counted, and its rates
are over the time they span (it is listed in ``events_sampled``). When Redis cannot say a
group's ``lag`` (after ``XGROUP SETID``), the entries after its last delivered one are
counted, up to ``LAG_COUNTED`` (then ``lag_counted`` is true). ``memory_bytes`` is Redis's
``MEMORY USAGE`` (an estimate from samples of the stream's nodes). The oldest pending
entry's age is since it was appended, its idle time since it was last delivered. Streams
and events are sorted by name, groups by stream, dead-letter reasons by count.
"""

from __future__ import annotations

from collections import Counter

import orjson

from sluice.store import EventLog, entry_order
from sluice.store.inspection import consumer_groups, count_after, entries_before, stream_summaries

from .deadletters import dead_letters

__all__ = ["stats", "READ_PER_STREAM", "LAG_COUNTED"]

LAG_COUNTED = 10_000
"""At most this many entries are counted for a group's lag when Redis cannot say it."""

READ_PER_STREAM = 20_000
"""At most this many of a stream's newest entries in the window are read for the event
counts (a stream busier than that is sampled: its rates cover what was read)."""


def _kind(log: EventLog, stream: str) -> str:
    return stream.rsplit(":", 1)[-1] if log.keys.is_stream_name(stream) else "other"


def stats(log: EventLog, window_s: float = 60) -> dict:
    now = log.backend.time_ms()
    streams = log.streams()
    summaries = stream_summaries(log, streams)
    start = max(now - int(window_s * 1000), 0)
    counts: Counter[str] = Counter()
    rates: dict[str, float] = {}
    by_kind: dict[str, Counter[str]] = {}
    rows = []
    sampled = []
    for s in streams:
        length, memory, last = summaries.get(s, (0, None, None))
        kind = _kind(log, s)
        rows.append({"stream": s, "kind": kind, "length": length, "memory_bytes": memory, "last_entry": last})
        if kind == "dead" or last is None or entry_order(last)[0] < start:
            continue
        newest = entries_before(log, s, None, READ_PER_STREAM, since=f"{start}-0")
        span_s = window_s
        if len(newest) == READ_PER_STREAM:  # more in the window than read: rates over what was read
            sampled.append(s)
            span_s = max(now - entry_order(newest[-1][0])[0], 1) / 1000
        for _, fields in newest:
            kind_of = _event_type(fields.get(b"e"))
            counts[kind_of] += 1
            rates[kind_of] = rates.get(kind_of, 0.0) + 1 / span_s
            by_kind.setdefault(kind_of, Counter())[kind] += 1
    events = [
        {"type": t, "count": n, "rate_per_s": round(rates[t], 6), "by_kind": dict(by_kind[t])}
        for t, n in sorted(counts.items())
    ]
    groups = [
        {
            "stream": g.stream,
            "group": g.name,
            "consumers": g.consumers,
            "pending": g.pending,
            "lag": g.lag if g.lag is not None else count_after(log, g.stream, g.last_delivered, limit=LAG_COUNTED),
            "lag_counted": g.lag is None,
            "oldest_pending": g.oldest_pending,
            "oldest_pending_age_s": None
            if g.oldest_pending is None
            else round(max(now - entry_order(g.oldest_pending)[0], 0) / 1000, 3),
            "oldest_pending_idle_s": None
            if g.oldest_pending_idle_ms is None
            else round(g.oldest_pending_idle_ms / 1000, 3),
        }
        for g in consumer_groups(log, [s for s in streams if _kind(log, s) != "dead"])
    ]
    letters = dead_letters(log) if any(_kind(log, s) == "dead" for s in streams) else []
    reasons = Counter((d["kind"] or "", d["reason"] or "") for d in letters)
    return {
        "now": now,
        "window_s": window_s,
        "streams": rows,
        "events": events,
        "events_sampled": sampled,
        "groups": groups,
        "dead_letters": {
            "total": len(letters),
            "by_reason": [
                {"kind": k, "reason": r, "count": n}
                for (k, r), n in sorted(reasons.items(), key=lambda x: (-x[1], x[0]))
            ],
        },
    }


def _event_type(data: bytes | None) -> str:
    if data is None:
        return "(no envelope)"
    try:
        env = orjson.loads(data)
    except orjson.JSONDecodeError:
        return "(not JSON)"
    kind = env.get("type") if isinstance(env, dict) else None
    return kind if isinstance(kind, str) else "(no type)"
