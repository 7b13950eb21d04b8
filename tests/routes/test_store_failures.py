"""Every write route answers 503 ``store_unavailable`` in OpenAI's error shape when the
storage fails — a SQLite file another process holds locked, a Redis that was stopped —
and answers within the store's busy timeout, not after several of them; when the storage
is back the same routes work again."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.backends.sqlite import database
from tests.fakes import FakeUpstream, Gateway, make_settings, redis_storage, running_gateway
from tests.redis_server import RedisServer

APP = {"Authorization": "Bearer app-a", "X-User-Id": "u1"}
ADMIN = {"Authorization": "Bearer admin-a"}
# The busy timeout of the SQLite file in these tests (seconds): short, so a locked file
# costs each route a fraction of a second.
BUSY_SECONDS = 0.4


@dataclass
class Failing:
    """A gateway and a switch that makes its storage fail (``broken()``)."""

    gw: Gateway
    broken: Callable[[], Any]
    backend: str


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Another process's write lock on the SQLite file at ``path`` while inside."""
    # Waits for a write the gateway itself has in flight (startup, a flush), then holds.
    other = sqlite3.connect(path, isolation_level=None, timeout=10)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


@contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    """The Redis server stopped while inside, started again (same port) after."""
    server.kill()
    try:
        yield
    finally:
        server.start()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def failing(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    upstream: FakeUpstream,
) -> AsyncIterator[Failing]:
    """A gateway (learning on, an app key and an admin key of tenant-a) on each backend."""
    monkeypatch.setenv("K_APP", "app-a")
    monkeypatch.setenv("K_ADMIN", "admin-a")
    monkeypatch.setattr(database, "BUSY_TIMEOUT_SECONDS", BUSY_SECONDS)
    auth = {
        "keys": [{"key": "os.environ/K_APP", "tenant": "tenant-a"}],
        "admin_keys": [{"key": "os.environ/K_ADMIN", "tenant": "tenant-a", "name": "ops"}],
    }
    server: RedisServer | None = None
    overrides: dict[str, Any] = {}
    if request.param == "redis":
        request.getfixturevalue("redis_url")  # the binaries are usable
        server = RedisServer(persistent=True).start()
        overrides["storage"] = redis_storage(tmp_path, server.url, "failing")
    try:
        settings = make_settings(
            tmp_path, learning={"enabled": True, "batch_messages": 1}, auth=auth, **overrides
        )
        async with running_gateway(settings, upstream) as gw:
            if server is None:
                yield Failing(gw, lambda: locked(tmp_path / "memory.db"), "sqlite")
            else:
                running = server
                yield Failing(gw, lambda: stopped(running), "redis")
    finally:
        if server is not None:
            server.stop()


async def call(
    gw: Gateway, method: str, path: str, headers: dict[str, str], **kwargs: Any
) -> httpx.Response:
    async with gw.client() as client:
        return await client.request(method, path, headers=headers, **kwargs)


async def prepared(gw: Gateway) -> dict[str, str]:
    """A personal memory to edit, one to delete and one to promote, a shared memory (their
    ids), and a first version of the scoring prompt to restore."""
    ids = {}
    for name, content in (("edit", "Likes green tea"), ("drop", "Plays the cello"),
                          ("share", "The canteen serves lunch at noon")):
        response = await call(gw, "POST", "/v1/memories", APP, json={"content": content})
        assert response.status_code == 201, response.text
        ids[name] = response.json()["id"]
    response = await call(
        gw,
        "POST",
        "/v1/admin/memories",
        ADMIN,
        json={"content": "Expense reports are due on Fridays"},
    )
    assert response.status_code == 201, response.text
    ids["shared"] = response.json()["id"]
    response = await call(
        gw, "PUT", "/v1/admin/prompts/scoring", ADMIN, json={"text": "Score what lasts."}
    )
    assert response.status_code == 200, response.text
    return ids


def write_routes(ids: dict[str, str]) -> list[tuple[str, str, dict[str, str], dict[str, Any]]]:
    """(method, path, headers, request arguments) of every route that writes."""
    return [
        ("POST", "/v1/memories", APP, {"json": {"content": "Keeps bees"}}),
        ("PATCH", f"/v1/memories/{ids['edit']}", APP, {"json": {"content": "Likes oolong"}}),
        ("DELETE", f"/v1/memories/{ids['drop']}", APP, {}),
        (
            "POST",
            "/v1/memories/import",
            APP,
            {"json": {"results": [{"id": "a", "memory": "Lives in Lyon"}]}},
        ),
        ("POST", "/v1/memories/flush", APP, {}),
        ("DELETE", "/v1/memories", APP, {"params": {"confirm": "true"}}),
        ("PATCH", "/v1/settings", APP, {"json": {"personal_learning": False}}),
        ("DELETE", "/v1/me", APP, {"params": {"confirm": "true"}}),
        ("PUT", "/v1/admin/prompts/scoring", ADMIN, {"json": {"text": "Score it."}}),
        ("POST", "/v1/admin/prompts/scoring/versions/1/restore", ADMIN, {}),
        ("PATCH", "/v1/admin/settings", ADMIN, {"json": {"learning.score_threshold": 0.7}}),
        ("POST", "/v1/admin/dead-letters/learn:x/requeue", ADMIN, {}),
        ("DELETE", "/v1/admin/dead-letters/learn:x", ADMIN, {}),
        ("POST", "/v1/admin/memories", ADMIN, {"json": {"content": "The office opens at 9"}}),
        ("PATCH", f"/v1/admin/memories/{ids['shared']}", ADMIN, {"json": {"enabled": False}}),
        ("DELETE", f"/v1/admin/memories/{ids['shared']}", ADMIN, {}),
        ("POST", f"/v1/admin/memories/{ids['share']}/promote", {**ADMIN, "X-User-Id": "u1"}, {}),
        # The usage views write the buffered usage rows first.
        ("GET", "/v1/admin/usage", ADMIN, {}),
        ("GET", "/v1/admin/users", ADMIN, {}),
    ]


async def test_every_write_route_answers_503_store_unavailable_quickly(failing: Failing) -> None:
    """With the storage failing each write route answers 503 ``store_unavailable`` (type
    ``service_unavailable``, Retry-After) within a few busy timeouts — never a 500 and
    never a wait of the worker's writes queued before it."""
    gw = failing.gw
    ids = await prepared(gw)
    answers: dict[str, tuple[int, Any, float]] = {}
    with failing.broken():
        # Chat goes on (a locked SQLite file still reads; a stopped Redis degrades
        # memory); its usage row stays buffered, unwritten, so the usage views below must
        # write it first.
        chat = await call(
            gw,
            "POST",
            "/v1/chat/completions",
            APP,
            json={"model": "m", "messages": [{"role": "user", "content": "I keep bees."}]},
        )
        assert chat.status_code == 200
        expected = "degraded" if failing.backend == "redis" else "injected"
        assert chat.headers["x-memory-status"] == expected
        for method, path, headers, kwargs in write_routes(ids):
            started = time.monotonic()
            response = await call(gw, method, path, headers, **kwargs)
            took = time.monotonic() - started
            body = (
                response.json()
                if response.headers.get("content-type", "").startswith("application/json")
                else response.text
            )
            answers[f"{method} {path}"] = (response.status_code, body, took)
    wrong = {
        route: (status, body)
        for route, (status, body, _) in answers.items()
        if status != 503 or body["error"]["code"] != "store_unavailable"
    }
    assert wrong == {}
    for route, (_, body, took) in answers.items():
        assert set(body["error"]) == {"message", "type", "param", "code"}, route
        assert body["error"]["type"] == "service_unavailable", route
        assert took < 4 * BUSY_SECONDS + 2.0, (route, took)


async def test_the_same_routes_work_once_the_storage_is_back(failing: Failing) -> None:
    """The negative case: after the failure ends, adding, editing and reading usage
    answer as usual (nothing was left locked or half-written)."""
    gw = failing.gw
    ids = await prepared(gw)
    with failing.broken():
        failed = await call(gw, "POST", "/v1/memories", APP, json={"content": "Keeps bees"})
        assert failed.status_code == 503
    added = await call(gw, "POST", "/v1/memories", APP, json={"content": "Keeps bees"})
    assert added.status_code == 201, added.text
    edited = await call(
        gw, "PATCH", f"/v1/memories/{ids['edit']}", APP, json={"content": "Likes oolong"}
    )
    assert edited.status_code == 200, edited.text
    usage = await call(gw, "GET", "/v1/admin/usage", ADMIN)
    assert usage.status_code == 200, usage.text
    listed = await call(gw, "GET", "/v1/memories", APP)
    assert sorted(m["content"] for m in listed.json()["data"]) == [
        "Keeps bees",
        "Likes oolong",
        "Plays the cello",
        "The canteen serves lunch at noon",
    ]


def usage_gauge(metrics: str) -> float:
    [line] = [
        x for x in metrics.splitlines() if x.startswith('memory_proxy_spool_items{spool="usage"}')
    ]
    return float(line.split()[-1])


async def test_usage_rows_a_crash_would_lose_show_in_the_spool_gauge(failing: Failing) -> None:
    """While the storage fails, each chat's usage row stays buffered and the gauge
    ``memory_proxy_spool_items{spool="usage"}`` counts it (what a kill would lose); once
    the rows are written the gauge is back to 0 and the usage report has them all."""
    gw = failing.gw
    with failing.broken():
        for text in ("Hello", "Hello again", "And once more"):
            chat = await call(
                gw,
                "POST",
                "/v1/chat/completions",
                APP,
                json={"model": "m", "messages": [{"role": "user", "content": text}]},
            )
            assert chat.status_code == 200
        metrics = await call(gw, "GET", "/metrics", {})
        assert usage_gauge(metrics.text) == 3
    await gw.res.usage.flush()
    assert usage_gauge((await call(gw, "GET", "/metrics", {})).text) == 0
    usage = (await call(gw, "GET", "/v1/admin/usage", ADMIN)).json()["data"]
    assert [(r["key"], r["requests"]) for r in usage] == [("u1", 3)]
