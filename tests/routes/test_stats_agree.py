"""``GET /v1/memories/stats`` and ``GET /v1/admin/stats`` count one user's memories alike
and name what each ``total`` counts: the user's ``total`` is every stored memory
(``enabled + disabled + retired``, the admin's ``totals.stored``), the admin's scope
``total`` the active ones (the user's ``enabled``) — on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakeUpstream, Gateway, backend_overrides, make_settings, running_gateway

ALICE = {"Authorization": "Bearer app-key", "X-User-Id": "alice"}
ADMIN = {"Authorization": "Bearer admin-key"}


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    """An app key and an admin key of tenant ``acme``, on each backend."""
    monkeypatch.setenv("STATS_APP_KEY", "app-key")
    monkeypatch.setenv("STATS_ADMIN_KEY", "admin-key")
    settings = make_settings(
        tmp_path, auth={"keys": [{"key": "os.environ/STATS_APP_KEY", "tenant": "acme"}],
                        "admin_keys": [{"key": "os.environ/STATS_ADMIN_KEY",
                                        "tenant": "acme"}]},
        **backend_overrides(request, tmp_path))
    async with running_gateway(settings, FakeUpstream()) as gateway:
        yield gateway


async def both_stats(gw: Gateway) -> tuple[dict[str, Any], dict[str, Any]]:
    async with gw.client() as http:
        mine = await http.get("/v1/memories/stats", headers=ALICE)
        admin = await http.get("/v1/admin/stats", headers=ADMIN)
    assert mine.status_code == admin.status_code == 200, (mine.text, admin.text)
    return mine.json(), admin.json()["totals"]


async def test_both_stats_count_retired_and_disabled_memories_alike(gw: Gateway) -> None:
    """Two active, one disabled and one retired memory: the user sees total 4 = 2 + 1 + 1;
    the admin sees the same four as ``stored``, two as the scope's ``total``."""
    async with gw.client(headers=ALICE) as http:
        imported = await http.post("/v1/memories/import", json={"memories": [
            {"content": "Lived in Porto", "created_at": "2025-01-01T00:00:00Z",
             "superseded_at": "2025-02-01T00:00:00Z"},
            {"content": "Plays chess"}, {"content": "Likes tea"},
            {"content": "Uses vim"}]})
        assert imported.json()["imported"] == 4, imported.text
        vim = next(m for m in (await http.get("/v1/memories")).json()["data"]
                   if m["content"] == "Uses vim")
        await http.patch(f"/v1/memories/{vim['id']}", json={"enabled": False})
    mine, totals = await both_stats(gw)
    assert (mine["total"], mine["enabled"], mine["disabled"], mine["retired"]) == (4, 2, 1, 1)
    assert mine["total"] == mine["enabled"] + mine["disabled"] + mine["retired"]
    personal = totals["memories"]["personal"]
    assert (personal["total"], personal["disabled"], personal["retired"]) == (2, 1, 1)
    assert totals["stored"]["personal"] == mine["total"]
    assert personal["total"] == mine["enabled"]
    assert totals["retired"] == 1


async def test_an_empty_store_counts_nothing_in_either(gw: Gateway) -> None:
    """No memory: every count is zero, in every scope the admin view names."""
    mine, totals = await both_stats(gw)
    assert (mine["total"], mine["enabled"], mine["disabled"], mine["retired"]) == (0, 0, 0, 0)
    assert totals["stored"] == {"personal": 0, "shared": 0, "system": 0}


async def test_shared_memories_count_for_the_admin_not_for_the_user(gw: Gateway) -> None:
    """A shared memory is in the admin's ``shared`` scope, never in a user's own stats."""
    async with gw.client() as http:
        added = await http.post("/v1/admin/memories", headers=ADMIN,
                                json={"content": "Expense reports are due on Fridays"})
    assert added.status_code == 201, added.text
    mine, totals = await both_stats(gw)
    assert mine["total"] == 0
    assert (totals["stored"]["shared"], totals["stored"]["personal"]) == (1, 0)
