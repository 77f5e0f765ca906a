"""The Spark servers Sluice starts log at WARN unless asked otherwise: at INFO a job wrote
tens of thousands of lines (issue 11); ``$SLUICE_SPARK_LOG_LEVEL`` raises it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice.config import spark_log_level
from sluice.errors import ConfigError
from sluice.services.embedded.spark_connect import SparkConnectServer, log4j2_config


def test_the_level_comes_from_the_environment_and_a_bad_one_names_the_choices(monkeypatch) -> None:
    monkeypatch.delenv("SLUICE_SPARK_LOG_LEVEL", raising=False)
    assert spark_log_level() == "WARN"
    monkeypatch.setenv("SLUICE_SPARK_LOG_LEVEL", "debug")
    assert spark_log_level() == "DEBUG"
    assert SparkConnectServer(log_level="info").log_level == "INFO"
    with pytest.raises(
        ConfigError,
        match="'LOUD' is not a log4j level: use one of OFF, .*WARN, INFO.*"
        r"\$SLUICE_SPARK_LOG_LEVEL",
    ):
        spark_log_level("loud")


def test_the_log4j2_file_sets_the_root_level(tmp_path: Path) -> None:
    text = log4j2_config(tmp_path, "ERROR").read_text()
    assert "rootLogger.level = error" in text and "%d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex" in text


def test_the_shared_server_ran_queries_and_logged_nothing_below_warn(spark_server: Any, spark) -> None:
    assert spark.range(1000).selectExpr("sum(id) AS s").collect()[0]["s"] == 499500
    lines = Path(spark_server.log_file).read_text(errors="replace").splitlines()
    info = [ln for ln in lines if " INFO " in ln or '"level":"INFO"' in ln]
    assert info == [], info[:5]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_server_asked_for_info_logs_at_info(tmp_path: Path) -> None:
    server = SparkConnectServer(master="local[1]", log_file=tmp_path / "connect.log", log_level="INFO")
    server.start()
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.builder.remote(server.url).getOrCreate()
        session.range(10).count()
        session.stop()
    finally:
        server.stop()
    text = (tmp_path / "connect.log").read_text(errors="replace")
    assert text.count(" INFO ") > 20
