"""The admin side of the console as admins work in it, in a real browser: dead letters
that say whose job failed and when, a learning log that names the memory and conversation,
settings edited as typed fields with their origin and a reset, forms offered only to the
role that can use them, usage over a date range with totals."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from playwright.async_api import expect

from tests.console.conftest import (
    ADMIN_KEY,
    OTHER_KEY,
    SESSION_LOOP,
    USER_KEY,
    axe_violations,
    fact,
    fits_width,
    learn,
    screenshot,
    sign_in,
)
from tests.console.test_console_admin import ADMIN, admin_get, dead_jobs
from tests.fakes import Gateway

pytestmark = SESSION_LOOP  # one Chromium for all (tests/console/conftest.py)


async def one_line_headers(page: Any, table: Any) -> list[str]:
    """The visible column headers of ``table`` laid out on more than one line."""
    broken: list[str] = await table.evaluate("""(table) => [...table.querySelectorAll("th")]
        .filter((th) => !th.querySelector(".visually-hidden")).filter((th) => {
            const range = document.createRange();
            range.selectNodeContents(th);
            const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
            return lines.size > 1;
        }).map((th) => th.textContent)""")
    return broken


async def test_dead_letters_say_when_whose_job_failed_and_show_its_messages(
    page: Any, console_gateway: Gateway
) -> None:
    """A dead letter shows today's date (``failed_at`` is epoch seconds), the user and
    conversation, and the batch's messages as stored; no header breaks inside a word."""
    dead = await dead_jobs(console_gateway, 1)
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Dead letters").click()
    letters = page.get_by_role("table", name="Dead letters", exact=True)
    row = letters.locator("tbody tr").first
    today = datetime.fromtimestamp(dead[0].failed_at, UTC)
    await expect(row).to_contain_text(f"{today.month}/{today.day}/{today.year}")
    await expect(row).not_to_contain_text("1970")
    await expect(row.get_by_role("cell", name="alice", exact=True)).to_be_visible()
    await expect(row.get_by_role("cell", name="c-dead-0", exact=True)).to_be_visible()
    await row.locator("summary", has_text="messages").click()
    await expect(row).to_contain_text("Something worth keeping, number 0.")
    assert await one_line_headers(page, letters) == []
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await page.locator(".table-wrap").evaluate("wrap => { wrap.scrollLeft = 0; }")
    await page.get_by_role("heading", name="Dead letters").scroll_into_view_if_needed()
    await screenshot(page, "admin-dead-letters")


async def test_learning_log_names_the_memory_and_conversation_and_links_to_it(
    page: Any, console_gateway: Gateway
) -> None:
    """The learning log shows what was learned (title and text, not an id), in which
    conversation, and opens the memory in its user's view; the daily chart has axes with
    dates."""
    await learn(console_gateway, USER_KEY, "I work on the billing service.",
                fact("Works on the billing service", category="technical"),
                conversation="conv-billing")
    [memory] = (await admin_get(console_gateway, "/v1/memories", user="alice"))["data"]
    await sign_in(page, ADMIN_KEY)
    log = page.get_by_role("table", name="Learning log", exact=True)
    created = log.locator("tbody tr", has_text="created")
    await expect(created).to_contain_text("Works on the billing service")
    await expect(created.get_by_role("cell", name="conv-billing", exact=True)).to_be_visible()
    await expect(log).not_to_contain_text(memory["id"])
    assert await one_line_headers(page, log) == []

    chart = page.get_by_role("img", name="Learned memories per day")
    ticks = await chart.locator("text").all_text_contents()
    now = datetime.now(UTC)
    assert now.strftime("%b ") + str(now.day) in ticks, ticks  # the last day, labelled
    assert "0" in ticks  # the y axis: 0 … the busiest day
    assert "1" in ticks
    await chart.scroll_into_view_if_needed()
    await screenshot(page, "admin-trend-chart")
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await created.scroll_into_view_if_needed()
    await screenshot(page, "admin-learning-log")

    await created.get_by_role("button", name="Open memory “Works on the billing service” "
                                            "of alice").click()
    await expect(page.get_by_role("heading", name="Memory of alice")).to_be_visible()
    card = page.locator("li.card", has_text="Works on the billing service")
    await expect(card).to_have_class(re.compile(r"\bfocus\b"))
    await page.get_by_role("button", name="Back to admin").click()
    await expect(page.get_by_role("heading", name="Learning log")).to_be_visible()


async def test_settings_are_typed_fields_with_their_origin_and_a_reset(
    page: Any, console_gateway: Gateway
) -> None:
    """Numbers are number fields and the switch a checkbox; the batch size is two fields
    (typing 3 for private chats keeps the group size); each setting says whether it is
    the tenant's override or the config.yaml default, and "Reset" removes the override."""
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Settings").click()
    await expect(page.get_by_label("Learning enabled")).to_have_attribute("type", "checkbox")
    await expect(page.get_by_label("Score threshold (0–1)")).to_have_attribute("type", "number")
    batch = page.get_by_role("group", name="Messages per learning batch")
    private, group = batch.get_by_label("Private chats"), batch.get_by_label("Group chats")
    await expect(private).to_have_attribute("type", "number")
    await expect(group).to_have_value("1")
    await expect(batch).to_contain_text("Default from config.yaml")
    await expect(batch.get_by_role("button", name="Reset")).to_have_count(0)

    await private.fill("3")
    await page.get_by_role("button", name="Save").click()
    await expect(page.get_by_role("status")).to_contain_text("Saved")
    stored = await admin_get(console_gateway, "/v1/admin/settings")
    assert stored["overrides"] == {"learning.batch_messages": {"private": 3, "group": 1}}
    await expect(batch).to_contain_text("Override for this tenant")
    await expect(batch).to_contain_text("config.yaml: Private chats 1 · Group chats 1")
    threshold = page.locator(".setting", has=page.get_by_label("Score threshold (0–1)"))
    await expect(threshold).to_contain_text("Default from config.yaml")
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await batch.scroll_into_view_if_needed()
    await screenshot(page, "admin-settings-typed")

    await batch.get_by_role("button", name="Reset Messages per learning batch to the "
                                           "config.yaml default").click()
    await expect(batch).to_contain_text("Default from config.yaml")
    await expect(private).to_have_value("1")
    stored = await admin_get(console_gateway, "/v1/admin/settings")
    assert stored["overrides"] == {}


async def test_a_tenant_admin_gets_no_form_that_could_only_fail_and_no_stale_error(
    page: Any, console_gateway: Gateway
) -> None:
    """A tenant admin reads system memories but gets no form to add one (that is a global
    admin's); an error shown on one tab is gone once the admin moves to another."""
    dead = await dead_jobs(console_gateway, 1)
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Shared knowledge").click()
    shared = page.locator("section", has=page.get_by_role("heading", name="Shared memories"))
    system = page.locator("section", has=page.get_by_role("heading", name="System memories"))
    await expect(shared.get_by_role("button", name="Add")).to_be_visible()
    await expect(system).to_contain_text("read-only")
    await expect(system.get_by_role("button", name="Add")).to_have_count(0)
    await expect(system.get_by_label("Content")).to_have_count(0)
    assert await axe_violations(page) == []

    await page.get_by_role("tab", name="Dead letters").click()
    requeue = page.get_by_role("button", name=f"Requeue {dead[0].id}")
    await expect(requeue).to_be_visible()
    async with console_gateway.client() as client:  # dropped elsewhere meanwhile
        await client.delete(f"/v1/admin/dead-letters/{dead[0].id}", headers=ADMIN)
    await requeue.click()
    await expect(page.get_by_role("status")).to_contain_text("No dead job")
    await page.get_by_role("tab", name="Usage").click()
    await expect(page.locator("#status")).to_be_empty()


async def test_usage_has_a_date_range_and_totals_and_users_say_what_they_count(
    page: Any, console_gateway: Gateway
) -> None:
    """Usage sums its rows in a "Total" row and narrows to a range of days (a range in
    the past has nothing); the Users tab says its count is of enabled memories."""
    await learn(console_gateway, USER_KEY, "I like jazz.", fact("Likes jazz"))
    await learn(console_gateway, OTHER_KEY, "I like opera.", fact("Likes opera"))
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Usage").click()
    usage = page.get_by_role("table", name="Usage", exact=True)
    total = usage.locator("tbody tr", has_text="Total")
    await expect(total).to_be_visible()
    rows = (await admin_get(console_gateway, "/v1/admin/usage"))["data"]
    requests = sum(r["requests"] for r in rows)
    assert len(rows) == 2
    await expect(total.locator("td").nth(1)).to_have_text(str(requests))
    today = datetime.now(UTC).date().isoformat()
    filters = page.get_by_role("form", name="Filters")
    await filters.get_by_label("Since").fill(today)
    await filters.get_by_label("Until").fill(today)
    await filters.get_by_role("button", name="Apply").click()
    await expect(total.locator("td").nth(1)).to_have_text(str(requests))
    await filters.get_by_label("Since").fill("2001-01-01")
    await filters.get_by_label("Until").fill("2001-01-31")
    await filters.get_by_role("button", name="Apply").click()
    await expect(usage).to_have_count(0)
    assert await axe_violations(page) == []
    assert await fits_width(page)

    await page.get_by_role("tab", name="Users").click()
    users = page.get_by_role("table", name="Users", exact=True)
    await expect(users.get_by_role("columnheader", name="Enabled memories")).to_be_visible()
    await expect(page.get_by_text("enabled memories only")).to_be_visible()
