"""The Spark server's class-data archive (JDK AppCDS): where it lives, that servers map it
when it is there, that a damaged one costs nothing but the speed-up, and (slow) that one
can be built and used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from sluice.services.embedded.spark_connect import (
    SparkConnectServer,
    build_class_archive,
    class_archive,
    prune_class_archives,
    spark_home,
)


def test_the_archive_is_named_for_this_pyspark_in_the_cache_or_where_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLUICE_SPARK_CDS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    default = class_archive()
    assert default is not None and default.parent == tmp_path / "sluice"
    assert default.name.startswith(f"spark-connect-{pyspark.__version__}-") and default.suffix == ".jsa"
    assert class_archive() == default  # the same Java and PySpark: the same file
    monkeypatch.setenv("SLUICE_SPARK_CDS", str(tmp_path / "mine.jsa"))
    assert class_archive() == tmp_path / "mine.jsa"
    monkeypatch.setenv("SLUICE_SPARK_CDS", "off")
    assert class_archive() is None


def test_a_server_maps_the_archive_only_when_there_is_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "spark.jsa"
    monkeypatch.setenv("SLUICE_SPARK_CDS", str(archive))
    assert not any("SharedArchiveFile" in o for o in SparkConnectServer().java_options)
    archive.write_bytes(b"x")
    assert f"-XX:SharedArchiveFile={archive}" in SparkConnectServer().java_options
    assert not any("SharedArchiveFile" in o for o in SparkConnectServer(cds=False).java_options)
    monkeypatch.setenv("SLUICE_SPARK_CDS", "off")
    assert SparkConnectServer().java_options == []


def test_archives_of_installs_that_are_gone_are_pruned(tmp_path: Path) -> None:
    live, gone, unknown = (tmp_path / f"spark-connect-4-{n}.jsa" for n in ("live", "gone", "unknown"))
    for archive in (live, gone, unknown):
        archive.write_bytes(b"archive")
    live.with_suffix(".source").write_text(str(spark_home()))
    gone.with_suffix(".source").write_text(str(tmp_path / "deleted-venv" / "pyspark"))
    assert prune_class_archives(tmp_path) == [gone]
    assert live.is_file() and unknown.is_file() and not gone.exists() and not gone.with_suffix(".source").exists()


def _answers(server: SparkConnectServer) -> int:
    """A query on ``server`` from a process of its own: in this one, getOrCreate would hand
    back the test run's session on the shared server, and stopping it would end that one."""
    code = (
        "import sys; from pyspark.sql import SparkSession; "
        "s = SparkSession.builder.remote(sys.argv[1]).getOrCreate(); "
        "print(s.range(100).selectExpr('sum(id) AS s').collect()[0]['s'], flush=True); "
        "import os; os._exit(0)"
    )
    done = subprocess.run([sys.executable, "-c", code, server.url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.longer  # 10-30 s: run by CI in its own step (pytest -m longer)
@pytest.mark.timeout(180)
def test_a_damaged_archive_only_loses_the_speed_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "damaged.jsa"
    archive.write_bytes(b"not a class-data archive" * 1000)
    monkeypatch.setenv("SLUICE_SPARK_CDS", str(archive))
    server = SparkConnectServer(master="local[1]", log_file=tmp_path / "connect.log")
    server.start()
    try:
        assert _answers(server) == 4950
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_archive_is_built_and_a_server_started_with_it_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "cache" / "spark.jsa"
    took = build_class_archive(archive)
    assert archive.is_file() and archive.stat().st_size > 10_000_000, took
    assert not list(archive.parent.glob("*.partial"))
    assert archive.with_suffix(".source").read_text() == str(spark_home())
    monkeypatch.setenv("SLUICE_SPARK_CDS", str(archive))
    # -Xshare:on: a JVM that cannot map the archive refuses to start instead of going without it
    server = SparkConnectServer(master="local[1]", log_file=tmp_path / "connect.log", java_options=["-Xshare:on"])
    server.start()
    try:
        assert _answers(server) == 4950
    finally:
        server.stop()
