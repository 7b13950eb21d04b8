"""The app's lifespan stops its background tasks within bounds (proxy/app.py), on each
backend: a task whose cancellation is lost still ends, one that never ends is logged and
left, and the gateway stops either way."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.memory.store import MemoryStore
from proxy.resources import Resources, open_resources
from proxy.settings import Settings
from tests.fakes import FakeUpstream, backend_overrides, make_settings, running_gateway


class LosingCancellation:
    """A store whose ``maintain`` stays in flight until cancelled, and then *loses* the
    cancellation: it returns normally, as a Redis command does on Python 3.11 when the
    cancel lands in the loop turn its send completes in. With ``every_time`` it loses
    each cancellation and stays in flight until ``release`` is set. Everything else goes
    to the real ``store``."""

    def __init__(self, store: MemoryStore, *, every_time: bool = False) -> None:
        self._store = store
        self._every_time = every_time
        self.calls = 0
        self.lost = 0
        self.in_flight = asyncio.Event()
        self.release = asyncio.Event()
        self.returned = asyncio.Event()

    async def maintain(self) -> None:
        self.calls += 1
        await self._store.maintain()
        self.in_flight.set()
        try:
            while not self.release.is_set():
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    self.lost += 1
                    if not self._every_time:
                        return
        finally:
            self.returned.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """Index maintenance every 50 ms (it first runs at startup), on each backend."""
    overrides = backend_overrides(request, tmp_path)
    storage = {**overrides.get("storage", {}), "index_maintenance_seconds": 0.05}
    return make_settings(tmp_path, storage=storage)


@pytest.fixture
async def resources(settings: Settings) -> AsyncIterator[Resources]:
    async with open_resources(settings) as res:
        yield res


def stuck_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("event") == "background_tasks_not_stopped"]


async def test_a_task_whose_cancellation_is_lost_ends_at_stop_and_runs_no_more(
        settings: Settings, resources: Resources, upstream: FakeUpstream) -> None:
    """The index maintenance is in flight at shutdown and loses its cancellation: the
    gateway still stops, the periodic task does not run its action again, and nothing is
    logged as left running."""
    store = LosingCancellation(resources.store)
    resources.store = store  # type: ignore[assignment]  # a wrapper, duck-typed
    with capture_logs() as logs:
        async with running_gateway(settings, upstream, resources=resources):
            await asyncio.wait_for(store.in_flight.wait(), 30)
    assert (store.calls, store.lost) == (1, 1)
    assert store.returned.is_set()
    assert stuck_lines(logs) == []


async def test_a_task_that_never_ends_is_logged_and_left_and_the_gateway_stops(
        settings: Settings, resources: Resources, upstream: FakeUpstream) -> None:
    """The index maintenance loses every cancellation: the gateway stops anyway after the
    tasks' stop bound, logging ``background_tasks_not_stopped`` naming the task (which
    was cancelled again meanwhile); released, it ends."""
    store = LosingCancellation(resources.store, every_time=True)
    resources.store = store  # type: ignore[assignment]  # a wrapper, duck-typed
    try:
        with capture_logs() as logs:
            async with running_gateway(settings, upstream, resources=resources):
                await asyncio.wait_for(store.in_flight.wait(), 30)
        (line,) = stuck_lines(logs)
        assert line["tasks"] == ["index-maintenance"]
        assert store.lost > 1
        assert not store.returned.is_set()
    finally:
        store.release.set()
    await asyncio.wait_for(store.returned.wait(), 30)
    assert store.calls == 1


async def test_what_a_stopped_gateway_held_can_be_collected(tmp_path: Path) -> None:
    """The lifespan keeps what it loaded out of the cyclic collector while it runs and
    releases it when it ends: a second gateway in the same process does not keep the
    first one's resources (frozen objects are never freed)."""
    async def serve_once(path: Path) -> weakref.ref[Resources]:
        async with open_resources(make_settings(path)) as res:
            async with running_gateway(res.settings, FakeUpstream(), resources=res,
                                       freeze_gc=True) as gw:
                async with gw.client() as client:
                    assert (await client.get("/healthz")).status_code == 200
                assert gc.get_freeze_count() > 0  # frozen while it runs
            return weakref.ref(res)

    first = await serve_once(tmp_path / "first")
    second = await serve_once(tmp_path / "second")
    gc.collect()
    assert gc.get_freeze_count() == 0
    assert first() is None
    assert second() is None
