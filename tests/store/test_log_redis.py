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
