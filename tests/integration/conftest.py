"""Fixtures of the integration tier: a SeaweedFS S3 server per session and a flushed Redis DB per test."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.platform.harness import flush_redis, start_seaweed


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    weed = start_seaweed(Path(tmp_path_factory.mktemp("seaweedfs")))
    yield weed
    weed.stop()


@pytest.fixture
def redis_db() -> Iterator[object]:
    """The test's Redis DB, emptied before and after (platforms started per module keep their broker
    bindings: see harness.flush_redis)."""
    client = flush_redis(full=False)
    yield client
    flush_redis(full=False).close()
    client.close()
