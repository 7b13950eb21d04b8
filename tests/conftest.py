"""Shared fixtures. Environment set here so that nothing reaches the network."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DISABLE_AIOHTTP_TRANSPORT", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from proxy.settings import Settings
from tests.fakes import FakeUpstream, Gateway, make_settings, running_gateway


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


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
