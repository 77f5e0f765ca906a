"""The log contract against a real local redis-server (the session's)."""

from tests.store.contract import LogContract


class TestLogOnRedis(LogContract):
    pass
