"""Import under load and under the per-user quota (proxy/routes/transfer.py): the
gateway keeps answering while an import checks its items, and a manual add or an import
makes room only from retired and learned memories — on both backends, the refusals beside
the successes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.learning.pii import Scrubber, ScrubResult
from proxy.learning.privacy import Scrubbers
from proxy.settings import PiiSettings
from tests.fakes import (
    FakeUpstream,
    Gateway,
    backend_overrides,
    make_settings,
    running_gateway,
)

QUOTA = 3
U1 = {"X-User-Id": "u1"}


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path,
             upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    """A gateway whose users may hold :data:`QUOTA` memories, on each backend."""
    overrides = backend_overrides(request, tmp_path)
    settings = make_settings(tmp_path, learning={"max_memory_per_user": QUOTA}, **overrides)
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


async def call(gw: Gateway, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async with gw.client() as client:
        return await client.request(method, path, headers=U1, **kwargs)


async def contents(gw: Gateway) -> list[str]:
    listed = (await call(gw, "GET", "/v1/memories?include_retired=true")).json()["data"]
    return sorted(m["content"] for m in listed)


def learned(content: str, **fields: Any) -> dict[str, Any]:
    """An exported learned memory (``source: auto``) as an import item."""
    return {"content": content, "source": "auto", "score": 0.2, **fields}


async def evicted(gw: Gateway) -> int:
    return sum(e.action == "evicted" for _, e in await gw.res.store.audit_log(
        "default", "u1", limit=100))


class _GateScrubber(Scrubber):
    """A scrubber that, on its first scan, says so and waits until the test lets it go: the
    import is then provably in the middle of its checks."""

    def __init__(self, started: threading.Event, release: threading.Event) -> None:
        super().__init__()
        self._started, self._release = started, release

    def scrub(self, text: str) -> ScrubResult:
        if not self._started.is_set():
            self._started.set()
            self._release.wait(5)  # on the event loop (the old code) this stalls it
        return super().scrub(text)


class _GateScrubbers(Scrubbers):
    def __init__(self, scrubber: Scrubber) -> None:
        super().__init__(PiiSettings())
        self._gate = scrubber

    def for_tenant(self, tenant: str) -> Scrubber:
        return self._gate


async def test_healthz_is_answered_while_an_import_checks_its_items(gw: Gateway) -> None:
    """While an import is in the middle of its per-item checks, /healthz is answered — the
    import finishes after it, whole."""
    started, release = threading.Event(), threading.Event()
    gw.res.scrubbers = _GateScrubbers(_GateScrubber(started, release))
    finished: list[str] = []

    async def run_import() -> httpx.Response:
        response = await call(gw, "POST", "/v1/memories/import", json={
            "memories": [{"content": "Likes tea"}, {"content": "Plays chess"}]})
        finished.append("import")
        return response

    importing = asyncio.create_task(run_import())
    assert await asyncio.to_thread(started.wait, 10), "the import never reached its checks"
    health = await call(gw, "GET", "/healthz")
    finished.append("healthz")
    release.set()
    response = await importing
    assert health.status_code == 200, health.text
    assert finished == ["healthz", "import"]
    assert response.json()["imported"] == 2
    assert await contents(gw) == ["Likes tea", "Plays chess"]


async def test_import_over_the_quota_is_refused_whole(gw: Gateway) -> None:
    """More new memories than the quota holds: 400 memory_quota_exceeded naming the
    quota, nothing written; as many as it holds are imported."""
    items = [{"content": f"Likes fruit number {i}"} for i in range(QUOTA + 1)]
    response = await call(gw, "POST", "/v1/memories/import", json={"memories": items})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("memory_quota_exceeded", "memories")
    assert f"quota of {QUOTA}" in error["message"]
    assert await contents(gw) == []
    response = await call(gw, "POST", "/v1/memories/import", json={"memories": items[:QUOTA]})
    assert response.json()["imported"] == QUOTA
    assert len(await contents(gw)) == QUOTA


async def test_import_makes_room_from_learned_memories_never_manual_ones(
        gw: Gateway) -> None:
    """At the quota, an import evicts learned memories (audited ``evicted``) in the same
    write; when only the user's own manual memories fill it, 409 and nothing changes —
    while duplicates of stored memories merge at any count."""
    first = [learned("Drinks coffee"), learned("Walks daily"), {"content": "Plays chess"}]
    assert (await call(gw, "POST", "/v1/memories/import",
                       json={"memories": first})).json()["imported"] == QUOTA
    response = await call(gw, "POST", "/v1/memories/import", json={"memories": [
        {"content": "Likes tea"}, {"content": "Reads novels"}]})
    assert response.json()["imported"] == 2, response.text
    assert await contents(gw) == ["Likes tea", "Plays chess", "Reads novels"]
    assert await evicted(gw) == 2
    response = await call(gw, "POST", "/v1/memories/import", json={"memories": [
        {"content": "Collects stamps"}]})
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "memory_quota_exceeded"
    assert await contents(gw) == ["Likes tea", "Plays chess", "Reads novels"]
    again = await call(gw, "POST", "/v1/memories/import", json={"memories": [
        {"content": "likes tea"}, {"content": "Plays chess."}]})
    assert again.json() == {"object": "memory.import", "imported": 0, "merged": 2,
                            "rejected": []}


async def test_manual_add_makes_room_from_retired_then_learned_memories(
        gw: Gateway) -> None:
    """A manual add at the quota evicts a retired memory first, then a learned one; when
    only manual memories fill it, 409 memory_quota_exceeded and nothing is written."""
    await call(gw, "POST", "/v1/memories/import", json={"memories": [
        learned("Walks daily", score=0.1),
        {"content": "Lived in Porto", "created_at": "2025-01-01T00:00:00Z",
         "superseded_at": "2025-02-01T00:00:00Z"},
        {"content": "Plays chess"}]})
    response = await call(gw, "POST", "/v1/memories", json={"content": "Likes tea"})
    assert response.status_code == 201, response.text
    assert await contents(gw) == ["Likes tea", "Plays chess", "Walks daily"]
    response = await call(gw, "POST", "/v1/memories", json={"content": "Reads novels"})
    assert response.status_code == 201, response.text
    assert await contents(gw) == ["Likes tea", "Plays chess", "Reads novels"]
    assert await evicted(gw) == 2
    response = await call(gw, "POST", "/v1/memories", json={"content": "Collects stamps"})
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "memory_quota_exceeded"
    assert await contents(gw) == ["Likes tea", "Plays chess", "Reads novels"]
