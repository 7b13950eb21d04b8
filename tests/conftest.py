"""Shared fixtures.

The environment the suite needs is set here, before any test module can import litellm or
huggingface_hub (both read it at import), so plain ``python -m pytest`` behaves as
``scripts/test``: litellm's bundled model cost map (no download), litellm on httpx instead of
its aiohttp transport (so respx serves the litellm routes), Hugging Face offline. A value
already in the environment wins (tests/test_test_environment.py checks both ways).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DISABLE_AIOHTTP_TRANSPORT", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import structlog

from proxy import logs
from proxy.settings import Settings
from tests.fakes import Configure, FakeUpstream, Gateway, make_settings, running_gateway
from tests.redis_server import RedisServer, RedisServerError, purge_prefix


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Undo what ``configure_logging`` did in a test (the CLI's ``serve`` runs it in-process):
    it binds the root logger, structlog and the access line to that test's captured stderr,
    which pytest closes after the test — the next test's gateway would write to it."""
    root = logging.getLogger()
    level, stream, config = root.level, logs._json_stream, structlog.get_config()
    yield
    if logs._json_stream is stream and not any(
            h.get_name() == logs.HANDLER_NAME for h in root.handlers):
        return
    root.handlers = [h for h in root.handlers if h.get_name() != logs.HANDLER_NAME]
    root.setLevel(level)
    logs._json_stream = stream
    structlog.configure(**config)


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def configure(tmp_path: Path) -> Configure:
    """Test settings with these overrides (``make_settings``); backend suites override this
    fixture to put storage elsewhere (tests/routes/test_redis_backend_e2e.py)."""
    def build(**overrides: Any) -> Settings:
        return make_settings(tmp_path, **overrides)
    return build


@pytest.fixture
def learning_settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1})


@pytest.fixture
async def gateway(settings: Settings, upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    async with running_gateway(settings, upstream) as gw:
        yield gw


@pytest.fixture(params=["auto", "litellm"], ids=["relay", "litellm"])
async def any_gateway(
    request: pytest.FixtureRequest, tmp_path: Path, upstream: FakeUpstream
) -> AsyncIterator[Gateway]:
    """The gateway on each upstream transport: behaviour must not depend on it."""
    settings = make_settings(tmp_path, upstream={"transport": request.param})
    async with running_gateway(settings, upstream) as gw:
        yield gw


@pytest.fixture
async def learning_gateway(
    learning_settings: Settings, upstream: FakeUpstream
) -> AsyncIterator[Gateway]:
    async with running_gateway(learning_settings, upstream) as gw:
        yield gw


def user_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# Redis ------------------------------------------------------------------------------
# Tests marked ``redis`` need a real Redis with the Query Engine: the one named by
# MEMORY_PROXY_TEST_REDIS_URL, else one started from the test extra's wheels
# (tests/redis_server.py). When it cannot start, those tests fail loudly — unless
# MEMORY_PROXY_SKIP_REDIS=1 says to skip them.

REDIS_URL_ENV = "MEMORY_PROXY_TEST_REDIS_URL"
SKIP_REDIS_ENV = "MEMORY_PROXY_SKIP_REDIS"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """MEMORY_PROXY_SKIP_REDIS=1 skips every test marked ``redis`` — explicitly, never by
    default."""
    if os.environ.get(SKIP_REDIS_ENV) != "1":
        return
    skip = pytest.mark.skip(reason=f"{SKIP_REDIS_ENV}=1: Redis tests skipped on request")
    for item in items:
        if item.get_closest_marker("redis") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis with RediSearch for the whole session."""
    if os.environ.get(SKIP_REDIS_ENV) == "1":
        pytest.skip(f"{SKIP_REDIS_ENV}=1: Redis tests skipped on request")
    given = os.environ.get(REDIS_URL_ENV)
    if given:
        yield given
        return

    server = RedisServer()
    try:
        server.start()
    except RedisServerError as exc:
        pytest.fail(f"cannot start the test Redis ({exc}); set {REDIS_URL_ENV} to a Redis "
                    f"with the Query Engine, or {SKIP_REDIS_ENV}=1 to skip these tests",
                    pytrace=False)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test alone; its keys and indexes are removed afterwards, so
    tests never see each other's data (and a shared server stays clean)."""
    prefix = "t" + uuid.uuid4().hex[:12]
    yield prefix
    purge_prefix(redis_url, prefix)
