"""RQ's keys under the cluster's prefix: every key and channel RQ makes starts with
``{<p>:rq}`` (``Keys.rq_prefix``), one hash tag for all of RQ.

RQ builds all of them (queues, jobs, workers, registries, results, executions, the
suspension flag, the intermediate queue, the pub/sub channel of worker commands, the keys
its Lua scripts and scheduler use) from one prefix, ``RQ_KEY_PREFIX``, which it reads from
the environment once, when ``rq`` is first imported. Sub-classing Queue, Job and Worker
would not reach the keys RQ's modules build from that prefix at import (results,
executions, registrations, suspension, the channel), so Sluice gives RQ the prefix
instead: ``bind`` imports RQ with ``RQ_KEY_PREFIX`` set to the cluster's, before anything
else of this process imports it (and leaves the environment as it was).

One process, one RQ prefix: a process that has RQ under another prefix refuses with a
ConfigError (a TaskManager and its workers serve one cluster). RQ's own CLI sees Sluice's
queues with the prefix in its environment: ``RQ_KEY_PREFIX='{sluice:rq}' rq info --url …``
(``rq_environ``).
"""

from __future__ import annotations

import os
import sys
import threading

from sluice.errors import ConfigError

from .keys import Keys

__all__ = ["bind", "bound_prefix", "rq_environ", "RQ_PREFIX_ENV"]

RQ_PREFIX_ENV = "RQ_KEY_PREFIX"
"""The environment variable RQ reads its key prefix from, when ``rq`` is first imported."""

_lock = threading.Lock()


def bound_prefix() -> str | None:
    """The prefix RQ builds its keys from in this process (None: RQ is not imported yet)."""
    defaults = sys.modules.get("rq.defaults")
    return None if defaults is None else str(defaults.RQ_KEY_PREFIX)


def bind(keys: Keys) -> None:
    """Make RQ build its keys under ``keys.rq_prefix`` in this process: import it with that
    prefix if it is not imported yet; ConfigError if it was, under another prefix."""
    wanted = keys.rq_prefix
    with _lock:
        if bound_prefix() is None:
            saved = os.environ.get(RQ_PREFIX_ENV)
            os.environ[RQ_PREFIX_ENV] = wanted
            try:
                import rq.defaults  # noqa: F401  (reads RQ_KEY_PREFIX, once per process)
            finally:
                if saved is None:
                    os.environ.pop(RQ_PREFIX_ENV, None)
                else:
                    os.environ[RQ_PREFIX_ENV] = saved
        current = bound_prefix()
    if current != wanted:
        raise ConfigError(
            f"RQ in this process builds its keys under {current!r}, but the cluster with prefix "
            f"{keys.prefix!r} keeps them under {wanted!r}: one process serves one cluster's RQ "
            f"queues (rq was imported before Sluice bound it, or ${RQ_PREFIX_ENV} names another prefix)"
        )


def rq_environ(keys: Keys) -> dict[str, str]:
    """The environment RQ's own CLI needs to see this cluster's queues and workers."""
    return {RQ_PREFIX_ENV: keys.rq_prefix}
