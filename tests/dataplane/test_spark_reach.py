"""Which storage roots and sinks Spark can reach: local paths and file:// only (the pyspark
wheel has no S3 connector); every refusal names the location, why, and what to do."""

from __future__ import annotations

import pytest

from sluice.services.dataplane.spark_reach import problem, problems


@pytest.mark.parametrize("location", ["/srv/sluice", "file:///srv/sluice", "file://localhost/srv/sluice"])
def test_local_paths_and_file_uris_are_reachable(location: str) -> None:
    assert problem("storage root", location) is None and problems(location, [("out", location)]) == []


@pytest.mark.parametrize(
    ("location", "says"),
    [
        ("s3://bucket/root", "Spark has no s3:// file system"),
        ("s3a://bucket/root", "s3a:// needs the hadoop-aws and AWS SDK jars"),
    ],
)
def test_other_schemes_are_refused_with_the_location_and_what_to_do(location: str, says: str) -> None:
    root, sink = problems(location, [("sum -> out", location + "/out"), ("other", "/srv/out")])
    assert root.startswith(f"the storage root {location!r} cannot be used: Spark writes and reads") and says in root
    assert sink.startswith(f"sink 'sum -> out' writes to '{location}/out', which cannot be used") and says in sink
    assert all("file://" in p and "README 'Storage on S3'" in p for p in (root, sink))


def test_a_storage_root_on_another_scheme_is_refused_but_a_sink_there_is_the_deployments_choice() -> None:
    (root,) = problems("hdfs://nn:8020/root", [("out", "hdfs://nn:8020/out"), ("sim", "sim://job/out")])
    assert "TaskManagers manage only file:// roots (scheme 'hdfs')" in root and "README" in root
