"""Promotion to shared knowledge refuses facts about the memory's owner and promotes
general ones, on both backends (docs/design.md#promotion)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes import FakeUpstream, Gateway
from tests.routes.test_governance import ACME_ADMIN, ACME_APP, build, gw, say

__all__ = ["build", "gw"]  # the two-backend gateway fixtures of the governance tests


async def personal(gw: Gateway, content: str, **fields: Any) -> dict[str, Any]:
    async with gw.client(headers={**ACME_APP, "X-User-Id": "u1"}) as client:
        response = await client.post("/v1/memories", json={"content": content, **fields})
    assert response.status_code == 201, response.text
    return dict(response.json())


async def block_for(gw: Gateway, upstream: FakeUpstream, user: str, question: str) -> str:
    """The system prompt the upstream got for ``user`` asking ``question``."""
    await say(gw, question, user=user)
    return " ".join(str(m["content"]) for m in upstream.last_chat["messages"]
                    if m["role"] == "system")


async def promote(gw: Gateway, memory_id: str) -> Any:
    async with gw.client(headers=ACME_ADMIN) as admin:
        return await admin.post(f"/v1/admin/memories/{memory_id}/promote",
                                headers={"X-User-Id": "u1"})


@pytest.mark.parametrize("content", [
    "Is allergic to hazelnuts",
    "Prefers short answers with code examples",
    "My manager is Dana Whitfield",
    "我对坚果过敏",
])
async def test_a_fact_about_its_owner_is_not_promoted(
        gw: Gateway, upstream: FakeUpstream, content: str) -> None:
    """A subjectless note or a first-person text is refused with 400
    ``memory_about_user`` naming ``memory_id`` and saying what to do; the memory stays the
    owner's, active, and no other user gets it."""
    memory = await personal(gw, content)
    refused = await promote(gw, memory["id"])
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == \
        ("invalid_request_error", "memory_about_user", "memory_id")
    assert "fact about its owner" in error["message"]
    assert "POST /v1/admin/memories" in error["message"]
    async with gw.client(headers=ACME_ADMIN) as admin:
        assert (await admin.get("/v1/admin/memories")).json()["data"] == []
    stored = await gw.res.store.get("acme", "u1", memory["id"])
    assert stored is not None
    assert stored.active
    assert content not in await block_for(gw, upstream, "u2", content)
    assert content in await block_for(gw, upstream, "u1", content)


@pytest.mark.parametrize(("content", "fields", "injected"), [
    ("The office is closed on Fridays", {}, "The office is closed on Fridays"),
    ("我们公司周五不上班", {}, "我们公司周五不上班"),
    ("Is the team's release manager", {"subject": "Dana"}, "Dana"),
])
async def test_general_knowledge_is_promoted_for_every_user(
        gw: Gateway, upstream: FakeUpstream, content: str, fields: dict[str, str],
        injected: str) -> None:
    """A general statement, or a fact about a named person (injected as about them), is
    promoted: 201, shared, injected for another user of the tenant, and the owner's
    personal copy retired."""
    memory = await personal(gw, content, **fields)
    promoted = await promote(gw, memory["id"])
    assert promoted.status_code == 201, promoted.text
    assert promoted.json()["scope"] == "shared"
    block = await block_for(gw, upstream, "u2", content)
    assert content in block
    assert injected in block
    stored = await gw.res.store.get("acme", "u1", memory["id"])
    assert stored is not None
    assert stored.supersede_reason == "promoted"
