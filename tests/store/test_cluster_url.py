"""Redis Cluster URLs (``redis+cluster://``): what is accepted, and a clear error for the rest."""

from __future__ import annotations

import pytest

from sluice.errors import ConfigError
from sluice.store import connect, redact
from sluice.store.connection import ClusterURL, is_cluster_url, parse_cluster_url


def test_seeds_credentials_and_tls_are_read() -> None:
    assert parse_cluster_url("redis+cluster://h1:7000,h2:7001") == ClusterURL(("h1:7000", "h2:7001"), False, None, None)
    assert parse_cluster_url("rediss+cluster://app:s%40cret@h1:7000,[::1]:7001/") == ClusterURL(
        ("h1:7000", "::1:7001"), True, "app", "s@cret"
    )
    assert parse_cluster_url("redis+cluster://h1,h1:6379/0").seeds == ("h1:6379",)  # default port, once
    assert is_cluster_url("REDIS+CLUSTER://h:1") and not is_cluster_url("redis://h:1")


def test_the_password_is_redacted() -> None:
    assert redact("redis+cluster://app:secret@h1:7000,h2:7001") == "redis+cluster://app:***@h1:7000,h2:7001"
    assert redact("redis+cluster://h1:7000,h2:7001") == "redis+cluster://h1:7000,h2:7001"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://h1:7000,,h2:7001", "empty node"),
        ("redis+cluster://h1:7000,", "empty node"),
        ("redis+cluster://h1:notaport", "no valid port"),
        ("redis+cluster://h1:70000", "no valid port"),
        ("redis+cluster://:7000", "has no host"),
        ("redis+cluster://h1:7000/3", "only database 0"),
        ("redis+cluster://h1:7000?ssl=true", "no options"),
        ("redis+clusterx://h1:7000", "must start with redis\\+cluster://"),
    ],
)
def test_a_bad_cluster_url_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_cluster_url(url)


def test_a_cluster_url_is_not_a_single_redis() -> None:
    """``connect`` gives one Redis (RQ's queues, a state server): a cluster URL there is
    refused, naming what to use."""
    with pytest.raises(ConfigError, match="is a Redis Cluster.*open_backend.*SLUICE_RQ_REDIS_URL"):
        connect("redis+cluster://u:pw@h1:7000", check=False)
    with pytest.raises(ConfigError) as info:
        connect("redis+cluster://u:pw@h1:7000", check=False)
    assert "pw" not in str(info.value)
