"""Memory cards and the profile as an admin (or user) reads them, in a real browser: bars
scaled to the highest score, counts in the right plural, import refusals with their
reasons, sorting, bulk delete, auto vs manual on the card, Chinese subcategory names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playwright.async_api import expect

from tests.console.conftest import (
    SESSION_LOOP,
    USER_KEY,
    axe_violations,
    fact,
    fits_width,
    learn,
    screenshot,
    sign_in,
)
from tests.console.test_console_user import memories
from tests.fakes import Gateway
from tests.learning.test_learning_e2e import known_ids

pytestmark = SESSION_LOOP  # one Chromium for all (tests/console/conftest.py)

USER = {"Authorization": f"Bearer {USER_KEY}"}


async def test_profile_bars_are_scaled_to_the_highest_score(
    page: Any, console_gateway: Gateway
) -> None:
    """A trait mentioned twice fills its bar; one mentioned once does not (scores add up
    past 1, so a 0–1 scale made every bar full); evidence reads "1 time"."""
    await learn(console_gateway, USER_KEY, "I ask a lot of questions.", fact("Asks questions"),
                profile={"traits": ["curious", "patient"], "topics": ["cooking"]})
    await learn(console_gateway, USER_KEY, "Why is the sky blue?", conversation="c-2",
                profile={"traits": ["curious"], "topics": ["cooking", "physics"]})
    await sign_in(page, USER_KEY)
    await page.get_by_role("tab", name="Profile").click()
    traits = page.get_by_role("list", name="Traits")
    await expect(traits).to_contain_text("curious")

    async def width(name: str) -> float:
        bar = traits.locator("li", has_text=name).locator(".bar")
        share: float = await bar.evaluate(
            "b => b.getBoundingClientRect().width / b.parentElement.getBoundingClientRect().width")
        return share

    assert await width("curious") > 0.99
    assert 0.05 < await width("patient") < 0.9
    await expect(traits.locator("li", has_text="patient")).to_contain_text("(1 time)")
    facts = page.locator("section", has=page.get_by_role("heading", name="Resident facts"))
    await expect(facts).to_contain_text("Evidence: 1 time")
    await expect(facts).not_to_contain_text("1 times")
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await traits.scroll_into_view_if_needed()
    await screenshot(page, "user-profile-bars")


async def test_import_lists_each_rejected_item_with_its_reason(
    page: Any, console_gateway: Gateway, tmp_path: Path
) -> None:
    """Importing a file with a refused item says which item and why, as the API answers."""
    upload = tmp_path / "memories.json"
    upload.write_text(json.dumps({"memories": [
        {"content": "Plays the oboe"}, {"content": "Email me at pii@example.com"}]}))
    async with console_gateway.client(headers=USER) as client:
        expected = (await client.post("/v1/memories/import", json={"memories": [
            {"content": "Email me at pii@example.com"}]})).json()["rejected"][0]
    await sign_in(page, USER_KEY)
    await page.get_by_role("tab", name="Learning & data").click()
    await page.get_by_label("Import file").set_input_files(str(upload))
    await page.get_by_role("button", name="Import", exact=True).click()
    await expect(page.get_by_text("Imported 1, merged 0, rejected 1.")).to_be_visible()
    refused = page.get_by_role("list", name="Rejected items")
    await expect(refused).to_contain_text("Item 2:")
    await expect(refused).to_contain_text(expected["message"])
    await expect(refused).to_contain_text(expected["reason"])
    assert await axe_violations(page) == []


async def test_memory_cards_sort_bulk_delete_and_show_how_they_were_made(
    page: Any, console_gateway: Gateway
) -> None:
    """Cards say "learned" or "added by hand"; they sort newest, oldest or by evidence;
    two selected cards are deleted together after one confirmation."""
    await learn(console_gateway, USER_KEY, "I drink tea.", fact("Drinks tea"))
    await learn(console_gateway, USER_KEY, "I cycle to work.", fact("Cycles to work"),
                conversation="c-2")
    await learn(console_gateway, USER_KEY, "Tea again for me.", conversation="c-3",
                extract=lambda body: {"memories": [fact(
                    "Drinks tea", duplicate_of=known_ids(body)["Drinks tea"])], "profile": None})
    async with console_gateway.client(headers=USER) as client:
        added = await client.post("/v1/memories", json={"content": "Owns a red kayak",
                                                         "title": "Owns a red kayak"})
    assert added.status_code == 201
    assert (await memories(console_gateway))["Drinks tea"].hits == 2
    await sign_in(page, USER_KEY)
    cards = page.locator("li.card")
    await expect(cards).to_have_count(3)
    await expect(cards.filter(has_text="Owns a red kayak")).to_contain_text("added by hand")
    await expect(cards.filter(has_text="Cycles to work")).to_contain_text("learned")

    titles = cards.locator("h3")
    sort = page.get_by_label("Sort")
    await expect(titles).to_have_text(["Owns a red kayak", "Cycles to work", "Drinks tea"])
    await sort.select_option(label="Oldest first")
    await expect(titles).to_have_text(["Drinks tea", "Cycles to work", "Owns a red kayak"])
    await sort.select_option(label="Most evidence first")
    await expect(titles.first).to_have_text("Drinks tea")
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await screenshot(page, "user-cards-bulk")

    await page.get_by_label("Select “Drinks tea”").check()
    await page.get_by_label("Select “Owns a red kayak”").check()
    await expect(page.get_by_text("2 selected")).to_be_visible()
    await page.get_by_role("button", name="Delete selected").click()
    await page.get_by_role("dialog", name="Confirm").get_by_role("button", name="Delete").click()
    await expect(page.get_by_role("status")).to_have_text("Deleted 2 memories.")
    await expect(cards).to_have_count(1)
    left = [m.content for m in (await memories(console_gateway)).values() if m.active]
    assert left == ["Cycles to work"]


async def test_subcategory_badges_are_translated_in_chinese(
    browser: Any, console_gateway: Gateway
) -> None:
    """A preset subcategory shows its Chinese name in a zh-CN browser; a free-form one
    stays as written."""
    await learn(console_gateway, USER_KEY, "I prefer short answers.",
                fact("Prefers short answers", subcategory="style"))
    async with console_gateway.client(headers=USER) as client:
        added = await client.post("/v1/memories", json={
            "content": "Likes haiku", "title": "Likes haiku", "subcategory": "haiku-ish"})
    assert added.status_code == 201
    context = await browser.new_context(locale="zh-CN", base_url=console_gateway.base_url)
    try:
        tab = await context.new_page()
        await tab.goto("/console/")
        await tab.get_by_label("API 密钥").fill(USER_KEY)
        await tab.get_by_role("button", name="登录").click()
        card = tab.locator("li.card", has_text="Prefers short answers")
        await expect(card.locator(".badge", has_text="风格")).to_be_visible()
        await expect(card.locator(".badge", has_text="style")).to_have_count(0)
        await expect(card).to_contain_text("证据：1 次")
        other = tab.locator("li.card", has_text="Likes haiku")
        await expect(other.locator(".badge", has_text="haiku-ish")).to_be_visible()
    finally:
        await context.close()
