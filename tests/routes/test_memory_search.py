"""Ranked search: ``GET /v1/memories?q=`` and the MCP tool ``search_memories`` rank as chat
recall ranks (keyword BM25, plus vectors when an embedder is configured), best match
first, on both backends; every listing filter applies, pages continue by an opaque token
in ``last_id``, access counters stay as they were, and without ``q`` the listing is newest
first as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.memory.embed import CachedEmbedder, EmbedderError
from proxy.memory.search import page_token
from tests.fakes import (
    ConceptBackend,
    FakeUpstream,
    Gateway,
    backend_overrides,
    concept_embedder,
    make_settings,
    running_gateway,
)
from tests.routes.test_mcp import call, mcp_client

ALICE = {"X-User-Id": "alice"}
# Oldest first: the best match is rarely the newest memory.
MEMORIES = [
    "Is allergic to hazelnuts",
    "Drinks green tea every morning",
    "Works as a nurse at the city hospital",
    "Has a dog named Biscuit",
    "Plays tennis on Saturdays",
    "Lives in Lisbon near the river",
    "Cooks pasta with hazelnut-free pesto for friends",
]
# query → the memory that must come first (None: nothing may be found).
TABLE = [
    ("hazelnuts allergy", "Is allergic to hazelnuts"),
    ("What does the user drink in the morning?", "Drinks green tea every morning"),
    ("Which hospital do I work at?", "Works as a nurse at the city hospital"),
    ("what is my dog called", "Has a dog named Biscuit"),
    ("tennis on saturday", "Plays tennis on Saturdays"),
    ("Where do I live? Lisbon?", "Lives in Lisbon near the river"),
    ("pasta for my friends", "Cooks pasta with hazelnut-free pesto for friends"),
    ("quantum physics homework", None),
    ("volcano eruption", None),
    ("Which car do I drive?", None),
]


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path, upstream: FakeUpstream,
             monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    """A keyword-only gateway holding :data:`MEMORIES` for alice (and one for bob), with
    an admin key of the open tenant."""
    monkeypatch.setenv("K_SEARCH_ADMIN", "admin-search")
    settings = make_settings(
        tmp_path, auth={"admin_keys": [{"key": "os.environ/K_SEARCH_ADMIN",
                                        "tenant": "default", "name": "ops"}]},
        **backend_overrides(request, tmp_path))
    async with running_gateway(settings, upstream) as gateway:
        await add(gateway, *MEMORIES)
        await add(gateway, "Is allergic to hazelnuts and peanuts", user="bob")
        yield gateway


async def add(gw: Gateway, *contents: str, user: str = "alice",
              **fields: Any) -> list[dict[str, Any]]:
    out = []
    async with gw.client(headers={"X-User-Id": user}) as client:
        for content in contents:
            response = await client.post("/v1/memories", json={"content": content, **fields})
            assert response.status_code == 201, response.text
            out.append(response.json())
    return out


async def listed(gw: Gateway, headers: dict[str, str] = ALICE, **params: Any) -> httpx.Response:
    async with gw.client(headers=headers) as client:
        return await client.get("/v1/memories", params=params)


def contents(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [m["content"] for m in response.json()["data"]]


@pytest.mark.parametrize(("q", "first"), TABLE)
async def test_search_finds_what_recall_finds_best_first(gw: Gateway, q: str,
                                                         first: str | None) -> None:
    """Each query's memory comes first through the route and through MCP; a query about
    nothing stored finds nothing; bob's memory never reaches alice."""
    found = contents(await listed(gw, q=q))
    if first is None:
        assert found == []
    else:
        assert found[0] == first
    assert "Is allergic to hazelnuts and peanuts" not in found
    async with mcp_client(gw, user="alice") as client:
        tool = await call(client, "search_memories", query=q)
    assert [m["content"] for m in tool["data"]] == found[:10]


async def test_chat_recall_and_search_agree(gw: Gateway) -> None:
    """The memory chat recall injects for a question is the search's first result."""
    question = "What does the user drink in the morning?"
    async with gw.client(headers=ALICE) as client:
        answer = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": question}]})
    assert answer.status_code == 200
    assert "Drinks green tea every morning" in str(gw.upstream.last_chat["messages"])
    assert contents(await listed(gw, q=question))[0] == "Drinks green tea every morning"


async def test_without_q_the_listing_stays_newest_first(gw: Gateway) -> None:
    """No ``q``: every memory, newest first, ``last_id`` a memory id for ``after``."""
    page = await listed(gw, limit=3)
    assert contents(page) == MEMORIES[::-1][:3]
    after = page.json()["last_id"]
    assert after == page.json()["data"][-1]["id"]
    assert contents(await listed(gw, limit=3, after=after)) == MEMORIES[::-1][3:6]


async def test_pages_of_a_search_continue_by_token_or_offset(gw: Gateway) -> None:
    """``limit`` pages of a search, continued by ``last_id`` or by ``offset``, give the one
    ranked list in order; the last page says ``has_more: false``."""
    await add(gw, "Eats hazelnut cake", "Buys hazelnuts at the market",
              "Grows hazelnut trees")
    everything = contents(await listed(gw, q="hazelnuts", limit=50))
    assert len(everything) == 5
    pages: list[str] = []
    after = None
    while True:
        page = await listed(gw, q="hazelnuts", limit=2, **({"after": after} if after else {}))
        pages += contents(page)
        body = page.json()
        after = body["last_id"]
        if not body["has_more"]:
            break
        assert after is not None
        assert not after.startswith("01")  # a page token, not a memory id
    assert pages == everything
    assert contents(await listed(gw, q="hazelnuts", limit=2, offset=2)) == everything[2:4]
    first = (await listed(gw, q="hazelnuts", limit=1)).json()["data"][0]["id"]
    assert contents(await listed(gw, q="hazelnuts", limit=1, after=first)) == \
        everything[1:2]


async def test_a_page_token_survives_the_deletion_of_its_memory(gw: Gateway) -> None:
    """The next page after a deleted memory starts where the page ended."""
    await add(gw, "Eats hazelnut cake", "Grows hazelnut trees")
    everything = (await listed(gw, q="hazelnut", limit=50)).json()["data"]
    page = (await listed(gw, q="hazelnut", limit=2)).json()
    async with gw.client(headers=ALICE) as client:
        await client.delete(f"/v1/memories/{page['data'][-1]['id']}")
    rest = await listed(gw, q="hazelnut", limit=50, after=page["last_id"])
    assert [m["id"] for m in rest.json()["data"]] == [m["id"] for m in everything[2:]]


@pytest.mark.parametrize(("params", "fragment"), [
    ({"after": page_token(0, "01J0000000000000000000000")}, "continues a search"),
    ({"q": "hazelnuts", "after": "rk_!!!"}, "not a cursor"),
    ({"q": "hazelnuts", "after": "01J0000000000000000000000"}, "not among"),
])
async def test_cursors_a_search_does_not_know_are_a_400(gw: Gateway, params: dict[str, str],
                                                        fragment: str) -> None:
    """A search token without its ``q``, a damaged token, an id outside the results."""
    response = await listed(gw, **params)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "after"
    assert fragment in error["message"]


async def test_filters_apply_to_the_ranked_order(gw: Gateway) -> None:
    """category, enabled, source and include_retired narrow a search as they narrow the
    listing; retired and disabled memories are found only when asked for."""
    (health,) = await add(gw, "Allergy to hazelnuts confirmed by a doctor",
                          category="technical")
    assert contents(await listed(gw, q="hazelnuts", category="technical")) == \
        [health["content"]]
    assert contents(await listed(gw, q="hazelnuts", source="auto")) == []
    assert health["content"] in contents(await listed(gw, q="hazelnuts", source="manual"))
    async with gw.client(headers=ALICE) as client:
        await client.patch(f"/v1/memories/{health['id']}", json={"enabled": False})
    assert contents(await listed(gw, q="hazelnuts", enabled="false")) == [health["content"]]
    assert health["content"] not in contents(await listed(gw, q="hazelnuts", enabled="true"))
    memory = await gw.res.store.get("default", "alice", health["id"])
    assert memory is not None
    await gw.res.store.update(memory.with_changes(
        enabled=True, superseded_at=memory.created_at + timedelta(seconds=1)))
    assert health["content"] not in contents(await listed(gw, q="hazelnuts"))
    assert health["content"] in contents(await listed(gw, q="hazelnuts",
                                                      include_retired="true"))
    assert health["content"] not in contents(await listed(gw, q="volcano",
                                                          include_retired="true"))


async def test_shared_scope_is_searched_on_its_own(gw: Gateway) -> None:
    """``scope=shared`` searches the tenant's shared memories, never the user's own."""
    async with gw.client(headers={"Authorization": "Bearer admin-search"}) as admin:
        created = await admin.post("/v1/admin/memories", json={
            "content": "The office cafeteria serves hazelnut coffee", "scope": "shared"})
    assert created.status_code == 201, created.text
    shared = contents(await listed(gw, q="hazelnuts", scope="shared"))
    assert shared == ["The office cafeteria serves hazelnut coffee"]
    assert "The office cafeteria serves hazelnut coffee" not in \
        contents(await listed(gw, q="hazelnuts"))


async def test_a_search_does_not_count_as_an_access(gw: Gateway) -> None:
    """Searching leaves access counters as the listing does; chat recall counts."""
    for q in ("hazelnuts allergy", "green tea"):
        await listed(gw, q=q)
    async with mcp_client(gw, user="alice") as client:
        await call(client, "search_memories", query="hazelnuts")
    stored = {m["content"]: m for m in (await listed(gw, limit=50)).json()["data"]}
    assert stored["Is allergic to hazelnuts"]["access_count"] == 0


async def test_vectors_rank_a_paraphrase_when_an_embedder_is_configured(
    tmp_path: Path,
) -> None:
    """With an embedder, a query sharing no word with a memory finds it by meaning; the
    same gateway without one does not."""
    concepts = [["dog", "puppy", "hound"], ["allergic", "allergy", "intolerant"]]
    for embedder, found in ((concept_embedder(concepts), True), (None, False)):
        settings = make_settings(tmp_path / str(found))
        async with running_gateway(settings, embedder=embedder) as gateway:
            await add(gateway, "Owns a puppy called Rex", "Plays chess on Sundays")
            result = contents(await listed(gateway, q="my hound"))
        assert (result[:1] == ["Owns a puppy called Rex"]) is found
        assert "Plays chess on Sundays" not in result[:1]



async def test_a_failing_embedder_leaves_a_keyword_search(tmp_path: Path) -> None:
    """The embedder down: the search still answers from keywords (200), a paraphrase
    without a shared word then finds nothing."""
    settings = make_settings(tmp_path)
    backend = ConceptBackend([["dog", "puppy", "hound"]])
    embedder = CachedEmbedder(backend, dimension=backend.size)
    async with running_gateway(settings, embedder=embedder) as gateway:
        await add(gateway, "Owns a puppy called Rex", "Plays chess on Sundays")
        backend.fail = EmbedderError("provider down")
        assert contents(await listed(gateway, q="puppy")) == ["Owns a puppy called Rex"]
        assert contents(await listed(gateway, q="my hound")) == []
