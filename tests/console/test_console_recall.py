"""The console's "Test recall" tab in a real browser, on both backends: a message shows
which memories recall would inject and why (recording nothing), and a reply's injection id
shows what went into that reply; another user's id is not found."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import expect

from tests.console.conftest import (
    OTHER_KEY,
    SESSION_LOOP,
    USER_KEY,
    axe_violations,
    console_settings,
    sign_in,
)
from tests.fakes import FakeUpstream, Gateway, backend_overrides, running_gateway

pytestmark = SESSION_LOOP  # one Chromium for all (tests/console/conftest.py)

ALICE = {"Authorization": f"Bearer {USER_KEY}"}
BOB = {"Authorization": f"Bearer {OTHER_KEY}"}


@pytest_asyncio.fixture(loop_scope="session",
                        params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def console_gateway(request: pytest.FixtureRequest, tmp_path: Path,
                          upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    settings = console_settings(tmp_path, **backend_overrides(request, tmp_path))
    async with running_gateway(settings, upstream) as gw:
        yield gw


async def reply_injection(gw: Gateway, headers: dict[str, str], content: str,
                          question: str) -> str:
    """Add ``content`` for the key's user, ask ``question``; the reply's injection id
    (its record written)."""
    async with gw.client(headers=headers) as client:
        added = await client.post("/v1/memories", json={"content": content})
        assert added.status_code == 201, added.text
        reply = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": question}]})
        assert reply.status_code == 200, reply.text
    await gw.res.memory.injections.flush(gw.res.store, gw.res.clock())
    return reply.headers["x-memory-injection-id"]


async def test_test_recall_and_a_replys_injection(page: Any, console_gateway: Gateway) -> None:
    gw = console_gateway
    mine = await reply_injection(gw, ALICE, "Drinks green tea every morning",
                                 "What do I drink in the morning?")
    theirs = await reply_injection(gw, BOB, "Has a dog named Biscuit", "my dog?")
    await sign_in(page, USER_KEY)
    await page.get_by_role("tab", name="Test recall").click()

    await page.get_by_label("Message").fill("what do I drink in the morning")
    await page.get_by_role("button", name="Test recall").click()
    shown = page.get_by_role("region", name="Test recall (table)")
    await expect(shown).to_contain_text("Drinks green tea every morning")
    await expect(shown).to_contain_text("keyword match")
    assert gw.res.memory.injections.pending == []  # the preview recorded nothing

    lookup = page.get_by_label("Injection ID")
    await lookup.fill(mine)
    await page.get_by_role("button", name="Show").click()
    reply = page.get_by_role("region", name="A reply's injection (table)")
    await expect(reply).to_contain_text("Drinks green tea every morning")
    assert await axe_violations(page) == []

    await lookup.fill(theirs)
    await page.get_by_role("button", name="Show").click()
    await expect(page.get_by_role("alert")).to_contain_text("No such injection record")
    await expect(page.get_by_text("Has a dog named Biscuit")).to_have_count(0)
