"""The log contract against a real local redis-server (the session's)."""

from sluice.store import EventLog
from tests.store.contract import LogContract


class TestLogOnRedis(LogContract):
    pass


def test_a_script_the_server_lost_is_sent_again_with_its_text(log: EventLog) -> None:
    """Scripts go as EVALSHA; a server whose script cache was emptied (a restart, SCRIPT
    FLUSH) answers NOSCRIPT, and the call goes again as EVAL, which caches it again."""
    from sluice.store import Out
    from tests.helpers import env, heartbeat

    tag = log.keys.job("j1")
    client = log.backend.client
    client.script_flush()
    result = log.commit(tag, 1, [Out(log.keys.facts(tag), env(heartbeat()))])
    assert not result.duplicate and log.length(log.keys.facts(tag)) == 1
    assert client.script_exists(log.backend._scripts["commit"].sha) == [True]


def test_scripts_run_together_are_sent_again_with_their_text_when_the_server_lost_them(log: EventLog) -> None:
    """The same for a batch of scripts in one round trip (a delivery to several inboxes):
    the calls that came back NOSCRIPT go again, in order, as EVAL; a script's own error is
    its call's answer, not the batch's."""
    from sluice.store.backend import ScriptFailed

    b = log.backend
    client = b.client
    cursor, other = log.keys.outbox_cursor(log.keys.job("j1")), log.keys.outbox_cursor(log.keys.job("j2"))
    client.set(other, b"9-9")
    client.script_flush()
    calls = [
        ("advance_cursor", [cursor], ["", "3-0"]),
        ("advance_cursor", [other], ["", "1-0"]),
        ("advance_cursor", [cursor], ["", "5-0"]),
        ("advance_cursor", [cursor], ["another-run-id", "7-0"]),
    ]
    replies = b.script_many(calls)
    assert replies[:3] == [b"3-0", b"9-9", b"5-0"]
    assert isinstance(replies[3], ScriptFailed) and str(replies[3]).startswith("SLUICE_RESTARTED")
    assert client.get(cursor) == b"5-0" and client.script_exists(b._scripts["advance_cursor"].sha) == [True]
    assert b.script_many(calls[:1]) == [b"5-0"]  # cached again: EVALSHA answers
