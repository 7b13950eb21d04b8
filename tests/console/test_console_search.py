"""The console's memory search in a real browser, on both backends: results come best
match first (ranked as chat recall ranks), "Load more" continues the ranked list without
repeating a card, and clearing the search goes back to newest first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import expect

from tests.console.conftest import SESSION_LOOP, USER_KEY, axe_violations, console_settings, sign_in
from tests.fakes import FakeUpstream, Gateway, backend_overrides, running_gateway

pytestmark = SESSION_LOOP  # one Chromium for all (tests/console/conftest.py)

ALICE = {"Authorization": f"Bearer {USER_KEY}"}
ORDERS = 51  # with the allergy memory, two more than the console's page of 50
ORDER = "Bought hazelnuts for the bakery order {}"


@pytest_asyncio.fixture(loop_scope="session",
                        params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def console_gateway(request: pytest.FixtureRequest, tmp_path: Path,
                          upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    """The console's gateway (see ``tests/console/conftest.py``) on each backend."""
    settings = console_settings(tmp_path, **backend_overrides(request, tmp_path))
    async with running_gateway(settings, upstream) as gw:
        yield gw


async def add(gw: Gateway, *contents: str) -> None:
    async with gw.client(headers=ALICE) as client:
        for content in contents:
            response = await client.post("/v1/memories", json={"content": content})
            assert response.status_code == 201, response.text


async def search_for(page: Any, text: str) -> None:
    await page.get_by_role("searchbox", name="Search").fill(text)
    await page.get_by_role("button", name="Search", exact=True).click()


async def test_search_is_best_match_first_and_load_more_continues_it(
    page: Any, console_gateway: Gateway
) -> None:
    """"hazelnuts allergy" puts the allergy first, above newer (and wordier) hazelnut
    memories; the
    morning-drink question finds the tea; "Load more" adds the rest of the ranked list
    once; a query about nothing stored shows none; clearing lists newest first again."""
    await add(console_gateway, "Is allergic to hazelnuts", "Drinks green tea every morning")
    await add(console_gateway, *(ORDER.format(n) for n in range(ORDERS)))
    await sign_in(page, USER_KEY)
    cards = page.locator("li.card")
    sort = page.get_by_label("Sort")
    await expect(cards).to_have_count(50)
    await expect(cards.first).to_contain_text(ORDER.format(ORDERS - 1))

    await search_for(page, "hazelnuts allergy")
    await expect(cards.first).to_contain_text("Is allergic to hazelnuts")
    await expect(cards).to_have_count(50)
    await expect(sort).to_have_value("match")
    more = page.get_by_role("button", name="Load more")
    await expect(more).to_be_visible()
    await more.click()
    await expect(cards).to_have_count(ORDERS + 1)
    await expect(more).to_be_hidden()
    shown = await cards.evaluate_all("cards => cards.map((c) => c.dataset.memoryId)")
    assert len(set(shown)) == ORDERS + 1
    await expect(page.locator("li.card", has_text="green tea")).to_have_count(0)
    assert await axe_violations(page) == []

    await search_for(page, "What does the user drink in the morning?")
    await expect(cards.first).to_contain_text("Drinks green tea every morning")

    await search_for(page, "volcano eruption")
    await expect(cards).to_have_count(0)
    await expect(page.get_by_text("Nothing here yet.")).to_be_visible()

    await search_for(page, "")
    await expect(sort).to_have_value("newest")
    await expect(cards.first).to_contain_text(ORDER.format(ORDERS - 1))
