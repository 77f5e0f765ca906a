"""Where a TaskManager's Spark driver listens: it must still answer after the host's address
changed (compose-check: "Connection refused: HOST/NEW_ADDRESS:PORT" after a container was
connected again to its network at a new address)."""

from __future__ import annotations

from sluice.services.taskmanager.spark import driver_conf


def test_a_local_driver_listens_on_loopback_and_gives_out_loopback() -> None:
    for master in ("local[*]", "local", "local[2]"):
        assert driver_conf(master, "tm-7", {}) == {
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
        }


def test_a_clusters_driver_listens_everywhere_and_gives_out_the_host_name_not_an_address() -> None:
    assert driver_conf("spark://spark-master:7077", "tm-7", {}) == {
        "spark.driver.bindAddress": "0.0.0.0",
        "spark.driver.host": "tm-7",
    }


def test_sparks_own_settings_choose_when_given() -> None:
    assert driver_conf("local[*]", "tm-7", {"SPARK_LOCAL_IP": "10.0.0.5"}) == {}
    assert driver_conf("spark://m:7077", "tm-7", {"SPARK_LOCAL_HOSTNAME": "tm-7.example"}) == {}
