"""The console's conflicts and profile timeline in a real browser (docs/design.md#conflicts,
docs/design.md#profile-over-time): the user view and the admin's view of a user mark both
kinds of conflict and settle them; the profile shows the top topics and traits month by
month."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime, timedelta
from typing import Any

from playwright.async_api import expect

from proxy.memory.conflicts import ProfileWeek, WeightedTag, iso_week
from proxy.memory.store import ChangeSet
from tests.console.conftest import (
    ADMIN_KEY,
    SESSION_LOOP,
    TENANT,
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


async def both_kinds(gateway: Gateway) -> None:
    """Alice's memory holds a supersede (spicy food) and an open conflict (office)."""
    await learn(gateway, USER_KEY, "I love spicy food.", fact("Loves spicy food"))
    for text in ("I work at the harbour office.", "Still the harbour office."):
        await learn(gateway, USER_KEY, text, fact("Works at the harbour office"))

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        ids = known_ids(body)
        return {"memories": [
            fact("Dislikes spicy food", supersedes=[ids["Loves spicy food"]]),
            fact("Works at the central office",
                 contradicts=[ids["Works at the harbour office"]])], "profile": None}

    await learn(gateway, USER_KEY, "No spicy food now; and I'm at the central office.",
                extract=answer)


async def test_user_sees_both_kinds_and_keeps_the_older_fact(
        page: Any, console_gateway: Gateway) -> None:
    """The memories list marks the held-back memory; the conflicts tab lists the unsure
    pair and the automatic replacement with both facts; "Keep the older" on the unsure
    pair retires the newer and the pair leaves the open list; a user with no conflicts
    sees "No conflicts."."""
    await both_kinds(console_gateway)
    await sign_in(page, USER_KEY)
    held = page.locator("li.card", has_text="Works at the central office")
    await expect(held.locator(".badge.conflict")).to_have_text("Held back until settled")
    await expect(page.locator("li.card", has_text="Works at the harbour office")
                 .locator(".badge.conflict")).to_have_text("In conflict")
    await page.get_by_role("tab", name="Conflicts").click()
    unsure = page.locator("li.card", has_text="Which one is true?")
    replaced = page.locator("li.card", has_text="A newer fact replaced an older one")
    await expect(unsure).to_contain_text("Works at the harbour office")
    await expect(unsure).to_contain_text("Works at the central office")
    await expect(replaced).to_contain_text("Loves spicy food")
    await expect(replaced).to_contain_text("Replaced automatically")
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await screenshot(page, "user-conflicts")
    await unsure.get_by_role("button", name="Keep the older").click()
    await expect(page.locator("li.card", has_text="Which one is true?")).to_have_count(0)
    await expect(replaced).to_be_visible()
    stored = await memories(console_gateway)
    assert stored["Works at the harbour office"].active
    assert not stored["Works at the central office"].active


async def test_admin_opens_a_user_and_confirms_the_automatic_replacement(
        page: Any, console_gateway: Gateway) -> None:
    """The admin's view of alice lists her conflicts (the admin route); confirming the
    replacement moves it to "Settled", where it shows as confirmed without buttons."""
    await both_kinds(console_gateway)
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Users").click()
    await page.get_by_role("button", name="Open alice").click()
    await page.get_by_role("tab", name="Conflicts").click()
    replaced = page.locator("li.card", has_text="A newer fact replaced an older one")
    await expect(replaced).to_contain_text("unconfirmed")
    await expect(page.locator("li.card", has_text="Which one is true?")).to_be_visible()
    await replaced.get_by_role("button", name="Keep the newer").click()
    await expect(page.locator("li.card", has_text="A newer fact replaced")).to_have_count(0)
    await page.get_by_label("Show").select_option("settled")
    settled = page.locator("li.card", has_text="A newer fact replaced an older one")
    await expect(settled).to_contain_text("confirmed")
    await expect(settled.get_by_role("button")).to_have_count(0)
    assert await axe_violations(page) == []


async def test_profile_timeline_shows_top_topics_month_by_month(
        page: Any, console_gateway: Gateway) -> None:
    """A week stored months ago and the live week: one row per month from then to now, each
    with its own top topics and traits — the stored week's carried through the months in
    which nothing was learned (the profile does not go blank), the live week's in the
    current month only."""
    await learn(console_gateway, USER_KEY, "I love long hikes.", fact("Loves long hikes"),
                profile={"traits": ["outdoorsy"], "topics": ["hiking"]})
    now = datetime.now(UTC)
    earlier = now - timedelta(days=120)
    await console_gateway.res.store.apply(ChangeSet(
        tenant=TENANT, user_id="alice", batch_key="earlier", snapshot=ProfileWeek(
            tenant=TENANT, user_id="alice", week=iso_week(earlier), at=earlier,
            traits=(WeightedTag("studious", 2.0),), topics=(WeightedTag("chess", 3.0),
                                                            WeightedTag("go", 1.0)))))
    await sign_in(page, USER_KEY)
    await page.get_by_role("tab", name="Profile").click()
    timeline = page.locator(".profile-timeline")
    rows = timeline.locator("tbody tr")
    months = months_of_weeks(earlier, now)
    assert len(months) >= 4  # 120 days span at least four calendar months
    await expect(rows).to_have_count(len(months))
    for index, month in enumerate(months[:-1]):
        await expect(rows.nth(index)).to_contain_text(month)
        await expect(rows.nth(index)).to_contain_text("chess, go")
        await expect(rows.nth(index)).to_contain_text("studious")
        await expect(rows.nth(index)).not_to_contain_text("hiking")
    await expect(rows.last).to_contain_text(months[-1])
    await expect(rows.last).to_contain_text("hiking")
    await expect(rows.last).to_contain_text("outdoorsy")
    assert await axe_violations(page) == []
    assert await fits_width(page)


def months_of_weeks(first: datetime, last: datetime) -> list[str]:
    """``YYYY-MM`` of every ISO week from ``first``'s to ``last``'s, in order, each week
    counted in the month its Thursday falls in (as the console groups them)."""
    months: list[str] = []
    day = first
    while True:
        year, week, _ = day.isocalendar()
        month = date.fromisocalendar(year, week, 4).strftime("%Y-%m")
        if month not in months:
            months.append(month)
        if iso_week(day) >= iso_week(last):
            return months
        day += timedelta(days=7)


async def test_a_late_answer_for_the_previous_filter_does_not_replace_the_list(
        page: Any, console_gateway: Gateway) -> None:
    """Switching the filter while the previous list is still loading shows the newer
    filter's list, even when the older answer arrives last."""
    await both_kinds(console_gateway)
    held = asyncio.Event()

    async def slow_open_list(route: Any) -> None:
        await held.wait()
        await route.continue_()

    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Users").click()
    await page.get_by_role("button", name="Open alice").click()
    await page.route("**/v1/admin/conflicts?*status=open*", slow_open_list)
    await page.get_by_role("tab", name="Conflicts").click()  # the open list: held back
    await page.get_by_label("Show").select_option("all")
    every = page.locator("li.card[data-conflict-id]")
    await expect(every).to_have_count(2)
    held.set()  # the open list's answer now arrives, last
    await page.wait_for_timeout(300)
    await expect(every).to_have_count(2)
    await expect(page.get_by_label("Show")).to_have_value("all")
