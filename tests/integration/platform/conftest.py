"""A platform on fake (fast) services shared by a module's tests; Redis is flushed between tests."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.platform.harness import Platform, flush_redis, make_tenant, platform_env

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fake_platform(seaweed: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    flush_redis()
    platform = Platform(platform_env(seaweed), Path(tmp_path_factory.mktemp("platform")))  # type: ignore[arg-type]
    try:
        platform.start_gateway()
        for service in ("planner", "coder", "verifier"):
            platform.start_worker(service)
        yield platform
    except BaseException:
        print(platform.logs())
        raise
    finally:
        platform.stop()


@pytest.fixture
def api_key(fake_platform: Platform, redis_db: object) -> str:
    return make_tenant("acme")
