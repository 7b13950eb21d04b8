"""The console's admin view in a real browser, against a running gateway: the learning log,
prompt versions, promotion to shared knowledge, run-time settings, usage, dead letters."""

from __future__ import annotations

import asyncio
from typing import Any

from playwright.async_api import expect

from proxy.memory.store import ListQuery
from tests.console.conftest import (
    ADMIN_KEY,
    GLOBAL_KEY,
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
from tests.fakes import Gateway

pytestmark = SESSION_LOOP  # one Chromium for all (tests/console/conftest.py)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


async def admin_get(gateway: Gateway, path: str, **params: str) -> Any:
    async with gateway.client() as client:
        answer = await client.get(path, params=params, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_admin_sees_totals_trend_and_the_filtered_learning_log(
    page: Any, console_gateway: Gateway
) -> None:
    """An admin key opens the admin view: totals, the daily trend chart and the "Learning
    log" with filters (a filter matching nothing shows an empty log)."""
    await learn(console_gateway, USER_KEY, "I work on the billing service.",
                fact("Works on the billing service", category="technical"))
    await sign_in(page, ADMIN_KEY)
    await expect(page.get_by_role("heading", name="admin · tenant acme")).to_be_visible()
    await expect(page.get_by_role("heading", name="Learning log")).to_be_visible()
    totals = page.locator(".stats")
    await expect(totals.locator("li", has_text="Personal memories")).to_contain_text("1")
    await expect(totals.locator("li", has_text="Users")).to_contain_text("1")
    await expect(page.get_by_role("list", name="By category")).to_contain_text("Technical: 1")
    await expect(page.get_by_role("img", name="Learned memories per day")).to_be_visible()
    log = page.get_by_role("table", name="Learning log", exact=True)
    await expect(log).to_contain_text("created")
    await expect(log).to_contain_text("alice")
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await screenshot(page, "admin-overview")

    filters = page.get_by_role("form", name="Filters")
    await filters.get_by_label("User").fill("nobody")
    await filters.get_by_role("button", name="Apply").click()
    await expect(page.get_by_role("table", name="Learning log", exact=True)).to_have_count(0)
    await filters.get_by_label("User").fill("alice")
    await filters.get_by_label("Action").select_option("created")
    await filters.get_by_role("button", name="Apply").click()
    await expect(page.get_by_role("table", name="Learning log", exact=True)).to_contain_text(
        "created")


async def test_admin_edits_a_prompt_and_restores_a_version(
    page: Any, console_gateway: Gateway
) -> None:
    """Saving the scoring prompt twice makes two versions; restoring the first makes its
    text current again, as the API reports."""
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Prompts").click()
    editor = page.get_by_role("textbox", name="scoring prompt")
    await expect(editor).to_be_visible()
    scoring = page.locator("section", has=page.get_by_role("heading", name="scoring prompt"))
    await editor.fill("Rate the conversation. Custom version one.")
    await scoring.get_by_role("button", name="Save").click()
    await expect(scoring.locator("li.card", has_text="Version 1 ·")).to_be_visible()
    await editor.fill("Rate the conversation. Custom version two.")
    await scoring.get_by_role("button", name="Save").click()
    await expect(scoring.locator("li.card", has_text="Version 2 ·")).to_be_visible()
    current = await admin_get(console_gateway, "/v1/admin/prompts/scoring")
    assert current["text"] == "Rate the conversation. Custom version two."
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await screenshot(page, "admin-prompts")

    version_one = scoring.locator("li.card", has_text="Version 1 ·")
    await version_one.get_by_role("button", name="Restore").click()
    await page.get_by_role("dialog", name="Confirm").get_by_role("button", name="Restore").click()
    await expect(editor).to_have_value("Rate the conversation. Custom version one.")
    await expect(scoring.locator("li.card", has_text="Version 3 ·")).to_be_visible()
    current = await admin_get(console_gateway, "/v1/admin/prompts/scoring")
    assert current["text"] == "Rate the conversation. Custom version one."


async def test_admin_opens_a_user_and_promotes_a_memory_to_shared(
    page: Any, console_gateway: Gateway
) -> None:
    """From the user list the admin opens alice's memory and promotes one: it is listed
    under shared knowledge and alice's personal copy is retired."""
    await learn(console_gateway, USER_KEY, "Our team deploys on Fridays.",
                fact("Team deploys on Fridays", category="organizational"))
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Users").click()
    await page.get_by_role("button", name="Open alice").click()
    await expect(page.get_by_role("heading", name="Memory of alice")).to_be_visible()
    card = page.locator("li.card", has_text="Team deploys on Fridays")
    await card.get_by_role("button", name="Promote").click()
    await page.get_by_role("dialog", name="Confirm").get_by_role("button", name="Promote").click()
    await expect(page.locator("li.card", has_text="Team deploys on Fridays")).to_have_count(0)
    personal = await console_gateway.res.store.list_memories(ListQuery(
        tenant=TENANT, user="alice", include_retired=True))
    assert [(m.content, m.active) for m in personal] == [("Team deploys on Fridays", False)]

    await page.get_by_role("button", name="Back to admin").click()
    await page.get_by_role("tab", name="Shared knowledge").click()
    shared = page.locator("section", has=page.get_by_role("heading", name="Shared memories"))
    await expect(shared.locator("li.card", has_text="Team deploys on Fridays")).to_be_visible()
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await screenshot(page, "admin-shared")


async def test_admin_changes_a_setting_and_sees_validation_next_to_the_field(
    page: Any, console_gateway: Gateway
) -> None:
    """An out-of-range score threshold is refused next to its field; a valid one is
    stored and reported by the settings API; a bad value inside a nested setting is shown
    at that setting and not stored."""
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Settings").click()
    threshold = page.get_by_label("Score threshold (0–1)")
    await expect(threshold).to_be_visible()
    await threshold.fill("1.5")
    await page.get_by_role("button", name="Save").click()
    await expect(threshold).to_have_attribute("aria-invalid", "true")
    await expect(threshold).to_be_focused()
    assert await axe_violations(page) == []
    await threshold.fill("0.7")
    await page.get_by_role("button", name="Save").click()
    await expect(threshold).not_to_have_attribute("aria-invalid", "true")
    await expect(page.get_by_role("status")).to_contain_text("Saved")
    stored = await admin_get(console_gateway, "/v1/admin/settings")
    assert stored["settings"]["learning.score_threshold"] == 0.7
    assert stored["overrides"] == {"learning.score_threshold": 0.7}
    assert await fits_width(page)
    await screenshot(page, "admin-settings")
    # A nested value's error (param learning.batch_messages.private) shows at its field.
    batch = page.get_by_role("group", name="Messages per learning batch")
    private = batch.get_by_label("Private chats")
    await private.fill("0")
    await page.get_by_role("button", name="Save").click()
    await expect(private).to_have_attribute("aria-invalid", "true")
    await expect(batch.get_by_label("Group chats")).not_to_have_attribute("aria-invalid", "true")
    stored = await admin_get(console_gateway, "/v1/admin/settings")
    assert stored["overrides"] == {"learning.score_threshold": 0.7}


async def dead_jobs(gateway: Gateway, count: int) -> list[Any]:
    """``count`` learning jobs dead-lettered by an unreadable extraction answer."""
    def unreadable(body: dict[str, Any]) -> str:
        return "I could not find anything useful, sorry."

    for index in range(count):
        await learn(gateway, USER_KEY, f"Something worth keeping, number {index}.",
                    extract=unreadable, conversation=f"c-dead-{index}")
        await asyncio.sleep(0.05)
        await gateway.settle()
    assert gateway.res.queue is not None
    dead = await gateway.res.queue.dead_letters()
    assert len(dead) == count
    return dead


async def test_admin_sees_usage_and_requeues_a_dead_letter(
    page: Any, console_gateway: Gateway
) -> None:
    """Usage lists user and learning tokens apart (by day and by model); a failed learning
    job shows under dead letters with its error and "Requeue" puts it back in the queue."""
    dead = await dead_jobs(console_gateway, 2)
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Usage").click()
    usage = page.get_by_role("table", name="Usage", exact=True)
    await expect(usage).to_contain_text("Learning tokens")
    await expect(usage).to_contain_text("Recall tokens")
    await expect(usage).to_contain_text("extract")
    await page.get_by_label("Group by").select_option("model")
    await expect(usage.get_by_role("cell", name="m", exact=True)).to_be_visible()
    assert await axe_violations(page) == []

    await page.get_by_role("tab", name="Dead letters").click()
    letters = page.get_by_role("table", name="Dead letters", exact=True)
    await expect(letters).to_contain_text("ParseError")
    assert await axe_violations(page) == []
    await page.get_by_role("button", name=f"Requeue {dead[0].id}").click()
    await expect(page.get_by_role("button", name=f"Requeue {dead[0].id}")).to_have_count(0)
    assert console_gateway.res.queue is not None
    assert [d.id for d in await console_gateway.res.queue.dead_letters()] == [dead[1].id]


async def test_admin_drops_a_dead_letter_after_confirmation(
    page: Any, console_gateway: Gateway
) -> None:
    """"Drop" removes a failed job for good, only once the confirmation is accepted."""
    dead = await dead_jobs(console_gateway, 1)
    await sign_in(page, ADMIN_KEY)
    await page.get_by_role("tab", name="Dead letters").click()
    drop = page.get_by_role("button", name=f"Drop {dead[0].id}")
    await drop.click()
    confirm = page.get_by_role("dialog", name="Confirm")
    await confirm.get_by_role("button", name="Cancel").click()
    assert console_gateway.res.queue is not None
    assert len(await console_gateway.res.queue.dead_letters()) == 1
    await drop.click()
    await confirm.get_by_role("button", name="Drop").click()
    await expect(page.get_by_role("table", name="Dead letters", exact=True)).to_have_count(0)
    assert await console_gateway.res.queue.dead_letters() == []


async def test_global_admin_manages_system_memories_and_reads_a_tenant(
    page: Any, console_gateway: Gateway
) -> None:
    """A global admin key opens the system memories (adding one stores it in the global
    namespace) and reads a named tenant's totals; tenant-only tabs are not offered."""
    await learn(console_gateway, USER_KEY, "I write Rust.", fact("Writes Rust",
                                                                category="technical"))
    await sign_in(page, GLOBAL_KEY)
    await expect(page.get_by_role("heading", name="global admin")).to_be_visible()
    await expect(page.get_by_role("tab", name="Prompts")).to_have_count(0)
    await expect(page.get_by_role("tab", name="Settings")).to_have_count(0)
    await expect(page.get_by_role("tab", name="Dead letters")).to_have_count(0)
    # The tenants of the configuration are offered (the first one open), never the API's
    # "add ?tenant=<name>".
    tenant = page.get_by_label("Tenant")
    await expect(tenant).to_have_value(TENANT)
    assert await tenant.locator("option").all_inner_texts() == [TENANT]
    await expect(page.locator(".stats li", has_text="Personal memories")).to_contain_text("1")
    await expect(page.get_by_role("alert")).to_have_count(0)
    await tenant.select_option(TENANT)
    await page.get_by_role("button", name="Open", exact=True).click()
    await expect(page.locator(".stats li", has_text="Personal memories")).to_contain_text("1")
    await expect(page.get_by_text("?tenant=")).to_have_count(0)

    await page.get_by_role("tab", name="Shared knowledge").click()
    system = page.locator("section", has=page.get_by_role("heading", name="System memories"))
    await expect(page.get_by_role("heading", name="Shared memories")).to_have_count(0)
    await system.get_by_label("Content").fill("The support line is open on weekdays")
    await system.get_by_role("button", name="Add").click()
    await expect(system.locator("li.card", has_text="support line")).to_be_visible()
    assert await axe_violations(page) == []
    async with console_gateway.client() as client:
        listed = (await client.get("/v1/admin/memories", params={"scope": "system"},
                                   headers={"Authorization": f"Bearer {GLOBAL_KEY}"})).json()
    assert [m["content"] for m in listed["data"]] == ["The support line is open on weekdays"]
