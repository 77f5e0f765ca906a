"""The embedded Redis's fsync policy is one setting away: ``always`` loses nothing (and the
cluster knows it: a restart then costs nothing), ``everysec`` is the default; anything
else is refused with what to write instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.config import appendfsync
from sluice.errors import ConfigError
from sluice.services.embedded import EmbeddedCluster
from sluice.store import EventLog, Keys, connect


@pytest.mark.parametrize("policy, durable", [("always", True), (None, False)])
def test_the_embedded_redis_fsyncs_as_configured(tmp_path: Path, policy: str | None, durable: bool) -> None:
    env = {"SLUICE_REDIS_APPENDFSYNC": policy} if policy else {}
    cluster = EmbeddedCluster(tmp_path / "home", env=env)
    url = cluster.redis_url(detach=False)
    try:
        log = EventLog(connect(url), Keys("t"))
        assert log.client.config_get("appendfsync")["appendfsync"] == (policy or "everysec")
        assert log.backend.durable() is durable
    finally:
        cluster.stop_redis()


def test_an_unknown_fsync_policy_is_refused_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_REDIS_APPENDFSYNC", "no")
    with pytest.raises(ConfigError, match="'no' is not one Sluice supports: use 'everysec' or 'always'"):
        appendfsync()
    assert appendfsync(" Always ") == "always"
