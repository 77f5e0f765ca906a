"""The shared ``spark`` fixture, stopped at the end of the session.

Why: the root fixture never stops its Spark Connect client session; once the server is
gone, the client's exit hook retries for minutes and the test process hangs after the
last test. Stopping the session first (idempotent, so harmless once the root fixture does
it too) keeps ``pytest tests/dataplane`` quick.
"""

from __future__ import annotations

from typing import Iterator

import pytest


@pytest.fixture(scope="session")
def spark(spark) -> Iterator[object]:  # noqa: F811 - wraps the root fixture of the same name
    yield spark
    spark.stop()
