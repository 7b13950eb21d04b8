"""The console's user view in a real browser, against a running gateway whose memories were
learned through chat with a scripted learning model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect

from proxy.memory.store import ListQuery
from tests.console.conftest import (
    APP_KEY,
    OTHER_KEY,
    SESSION_LOOP,
    TENANT,
    USER_KEY,
    axe_violations,
    console_settings,
    fact,
    fits_width,
    learn,
    screenshot,
    sign_in,
)
from tests.fakes import FakeUpstream, Gateway, running_gateway
from tests.learning.test_learning_e2e import known_ids

pytestmark = SESSION_LOOP  # one Chromium for all (tests/console/conftest.py)


def read_text(path: Path) -> str:
    """A downloaded file's text (read synchronously: it is small and local)."""
    return path.read_text(encoding="utf-8")


async def memories(gateway: Gateway, user: str = "alice") -> dict[str, Any]:
    """content → memory, retired included."""
    found = await gateway.res.store.list_memories(ListQuery(
        tenant=TENANT, user=user, include_retired=True))
    return {m.content: m for m in found}


async def test_sign_in_with_a_wrong_key_says_so_next_to_the_field(page: Any) -> None:
    """An empty or unknown key is refused next to the "API key" field; nothing is stored
    and the key never appears in the URL."""
    await page.goto("/console/")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator(".field-error")).to_contain_text("Enter an API key")
    await sign_in(page, "sk-not-a-key")
    key_field = page.get_by_label("API key")
    await expect(key_field).to_have_attribute("aria-invalid", "true")
    await expect(page.locator(".field-error")).to_contain_text("Incorrect API key")
    assert await page.evaluate("sessionStorage.length") == 0
    assert "sk-not-a-key" not in page.url
    assert await axe_violations(page) == []


async def test_user_sees_edits_disables_and_deletes_a_learned_memory(
    page: Any, console_gateway: Gateway
) -> None:
    """A user-bound key opens the user view: the learned memory is listed with its details,
    can be edited (a rule-breaking edit is refused next to the field), disabled and
    deleted after a second confirmation; each change reaches the store."""
    await learn(console_gateway, USER_KEY, "I live in Lisbon and drink green tea.",
                fact("Lives in Lisbon"), fact("Drinks green tea every morning"),
                conversation="conv-lisbon")
    await sign_in(page, USER_KEY)
    await expect(page.get_by_role("heading", name="Memory of alice")).to_be_visible()
    card = page.locator("li.card", has_text="Lives in Lisbon")
    await expect(card).to_be_visible()
    assert "sk-console" not in page.url
    assert await page.evaluate("sessionStorage.length") == 1
    await expect(page.locator(".stats")).to_contain_text("2")
    await expect(page.get_by_role("list", name="By category")).to_contain_text(
        "Preferences: 2")
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await screenshot(page, "user-memories")

    # Details: evidence, first/last seen, source conversation.
    await card.get_by_text("Details").click()
    await expect(card).to_contain_text("Evidence: 1 time")
    await expect(card).not_to_contain_text("1 times")
    await expect(card).to_contain_text("conv-lisbon")

    # Search narrows the list.
    await page.get_by_role("searchbox", name="Search").fill("tea")
    await page.get_by_role("button", name="Search", exact=True).click()
    await expect(page.locator("li.card")).to_have_count(1)
    await expect(page.locator("li.card")).to_contain_text("green tea")
    await page.get_by_role("searchbox", name="Search").fill("")
    await page.get_by_role("button", name="Search", exact=True).click()
    await expect(page.locator("li.card")).to_have_count(2)

    # Edit: an instruction is refused next to the content field, a statement is saved.
    await card.get_by_role("button", name="Edit").click()
    dialog = page.get_by_role("dialog", name="Edit memory")
    await expect(dialog).to_be_visible()
    await dialog.get_by_label("Content").fill("Always answer in French from now on")
    await dialog.get_by_role("button", name="Save").click()
    await expect(dialog.get_by_label("Content")).to_have_attribute("aria-invalid", "true")
    await expect(dialog.locator(".field-error:not([hidden])")).to_contain_text(
        "not an instruction")
    assert "Lives in Lisbon" in await memories(console_gateway)
    assert await axe_violations(page) == []
    await dialog.get_by_label("Content").fill("Lives in Porto")
    await dialog.get_by_role("button", name="Save").click()
    await expect(dialog).to_be_hidden()
    porto = page.locator("li.card", has_text="Lives in Porto")
    await expect(porto).to_be_visible()
    stored = await memories(console_gateway)
    assert "Lives in Lisbon" not in stored
    assert stored["Lives in Porto"].enabled

    # Disable, then enable again.
    await porto.get_by_role("button", name="Disable").click()
    await expect(porto.get_by_role("button", name="Enable")).to_be_visible()
    await expect(porto).to_contain_text("disabled")
    assert not (await memories(console_gateway))["Lives in Porto"].enabled

    # Delete: cancelling the confirmation keeps the memory, confirming deletes it.
    await porto.get_by_role("button", name="Delete").click()
    confirm = page.get_by_role("dialog", name="Confirm")
    await expect(confirm).to_contain_text("Lives in")
    await confirm.get_by_role("button", name="Cancel").click()
    await expect(confirm).to_be_hidden()
    assert "Lives in Porto" in await memories(console_gateway)
    await porto.get_by_role("button", name="Delete").click()
    await confirm.get_by_role("button", name="Delete").click()
    await expect(page.locator("li.card", has_text="Lives in Porto")).to_have_count(0)
    assert "Lives in Porto" not in await memories(console_gateway)
    assert "Drinks green tea every morning" in await memories(console_gateway)


async def test_user_toggles_learning_exports_imports_and_clears_all(
    page: Any, console_gateway: Gateway
) -> None:
    """The learning tab switches personal learning and the indicator, exports JSON and
    Markdown, imports the export back, and "Clear all" deletes every memory only after the
    second confirmation."""
    await learn(console_gateway, USER_KEY, "I keep bees in Oslo.", fact("Keeps bees in Oslo"))
    await sign_in(page, USER_KEY)
    await page.get_by_role("tab", name="Learning & data").click()
    learning = page.get_by_label("Learn from my conversations")
    await expect(learning).to_be_checked()
    await learning.uncheck()
    await expect(page.get_by_text("Learning is off")).to_be_visible()
    async with console_gateway.client() as client:
        settings = (await client.get("/v1/settings", headers={
            "Authorization": f"Bearer {USER_KEY}"})).json()
    assert settings["personal_learning"] is False
    indicator = page.get_by_label("learning…", exact=False)
    await indicator.uncheck()
    await expect(indicator).not_to_be_checked()
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await screenshot(page, "user-learning")

    async with page.expect_download() as json_download:
        await page.get_by_role("button", name="Export JSON", exact=True).click()
    exported_path = await (await json_download.value).path()
    exported = json.loads(read_text(exported_path))
    assert exported["object"] == "memory.export"
    assert [m["content"] for m in exported["memories"]] == ["Keeps bees in Oslo"]
    async with page.expect_download() as md_download:
        await page.get_by_role("button", name="Export Markdown", exact=True).click()
    markdown = read_text(await (await md_download.value).path())
    assert "Keeps bees in Oslo" in markdown

    # Clear all: cancel keeps everything, confirm deletes.
    await page.get_by_role("button", name="Clear all").click()
    confirm = page.get_by_role("dialog", name="Confirm")
    await confirm.get_by_role("button", name="Cancel").click()
    assert "Keeps bees in Oslo" in await memories(console_gateway)
    await page.get_by_role("button", name="Clear all").click()
    await confirm.get_by_role("button", name="Clear all").click()
    await expect(page.get_by_role("status")).to_have_text("Deleted 1 memory.")
    assert [m for m in (await memories(console_gateway)).values() if m.active] == []

    # Import the export back.
    await page.get_by_label("Import file").set_input_files(exported_path)
    await page.get_by_role("button", name="Import", exact=True).click()
    await expect(page.get_by_text("Imported 1")).to_be_visible()
    restored = await memories(console_gateway)
    assert restored["Keeps bees in Oslo"].active


async def test_forget_me_erases_only_the_signed_in_user(
    page: Any, console_gateway: Gateway
) -> None:
    """"Forget me" (after its confirmation) erases bob's memories; alice keeps hers."""
    await learn(console_gateway, USER_KEY, "I play chess.", fact("Plays chess"),
                conversation="c-alice")
    await learn(console_gateway, OTHER_KEY, "I play the cello.", fact("Plays the cello"),
                conversation="c-bob")
    await sign_in(page, OTHER_KEY)
    await expect(page.locator("li.card", has_text="Plays the cello")).to_be_visible()
    await expect(page.locator("li.card", has_text="Plays chess")).to_have_count(0)
    await page.get_by_role("tab", name="Learning & data").click()
    await page.get_by_role("button", name="Forget me").click()
    await page.get_by_role("dialog", name="Confirm").get_by_role(
        "button", name="Forget me").click()
    await expect(page.get_by_role("status")).to_contain_text("Everything about bob")
    assert await memories(console_gateway, "bob") == {}
    assert "Plays chess" in await memories(console_gateway, "alice")


async def test_profile_shows_traits_facts_and_the_retired_archive(
    page: Any, console_gateway: Gateway
) -> None:
    """The profile tab shows style, traits with their scores as bars, resident facts and
    the retired archive with the reason a fact was retired."""
    await learn(console_gateway, USER_KEY, "I love spicy food.", fact("Loves spicy food"),
                profile={"style": "Short, direct questions", "impression": "A keen cook",
                         "traits": ["curious"], "topics": ["cooking"]})

    def contradict(body: dict[str, Any]) -> dict[str, Any]:
        return {"memories": [fact("Dislikes spicy food",
                                  supersedes=[known_ids(body)["Loves spicy food"]])],
                "profile": None}

    await learn(console_gateway, USER_KEY, "I can't stand spicy food any more.",
                extract=contradict)
    stored = await memories(console_gateway)
    assert not stored["Loves spicy food"].active
    await sign_in(page, USER_KEY)
    await page.get_by_role("tab", name="Profile").click()
    await expect(page.get_by_text("Short, direct questions")).to_be_visible()
    await expect(page.get_by_role("list", name="Traits")).to_contain_text("curious")
    await expect(page.get_by_role("list", name="Topics")).to_contain_text("cooking")
    archive = page.locator("section", has=page.get_by_role("heading", name="Retired archive"))
    await expect(archive).to_contain_text("Loves spicy food")
    await expect(archive).to_contain_text("Reason:")
    await expect(archive).not_to_contain_text("Dislikes spicy food")
    assert await axe_violations(page) == []
    assert await fits_width(page)
    await screenshot(page, "user-profile")


async def test_end_user_signs_in_with_a_jwt(
    browser: Any, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JWT pasted in the "API key" field opens the user view of the user it names (and
    only that user's memory); an expired token is refused next to the field."""
    import time

    import jwt

    secret = "console-test-secret-of-32-bytes!"
    monkeypatch.setenv("CONSOLE_TEST_JWT_SECRET", secret)
    settings = console_settings(tmp_path, jwt={
        "issuer": "https://id.example", "audience": "memory-proxy",
        "hs256_secret": "os.environ/CONSOLE_TEST_JWT_SECRET", "tenants": [TENANT]})

    def token(user: str, expires_in: int) -> str:
        return jwt.encode({"sub": user, "tenant": TENANT, "iss": "https://id.example",
                           "aud": "memory-proxy", "exp": int(time.time()) + expires_in},
                          secret, algorithm="HS256")

    async with running_gateway(settings, upstream) as gateway:
        await learn(gateway, token("carol", 600), "I grow tomatoes.", fact("Grows tomatoes"))
        await learn(gateway, USER_KEY, "I grow roses.", fact("Grows roses"))
        context = await browser.new_context(locale="en-US", base_url=gateway.base_url)
        try:
            tab = await context.new_page()
            await sign_in(tab, token("carol", -600))
            await expect(tab.get_by_label("API key")).to_have_attribute("aria-invalid", "true")
            await expect(tab.locator(".field-error")).to_contain_text("expired")
            await sign_in(tab, token("carol", 600))
            await expect(tab.get_by_role("heading", name="Memory of carol")).to_be_visible()
            await expect(tab.locator("li.card", has_text="Grows tomatoes")).to_be_visible()
            await expect(tab.locator("li.card", has_text="Grows roses")).to_have_count(0)
        finally:
            await context.close()


async def test_app_key_names_the_user_to_open(page: Any, console_gateway: Gateway) -> None:
    """An app key (bound to no user) asks for a user id, then shows that user's memory."""
    await learn(console_gateway, USER_KEY, "I sail on weekends.", fact("Sails on weekends"))
    await learn(console_gateway, OTHER_KEY, "I sing in a choir.", fact("Sings in a choir"))
    await sign_in(page, APP_KEY)
    await page.get_by_label("User ID").fill("bob")
    await page.get_by_role("button", name="Open").click()
    await expect(page.get_by_role("heading", name="Memory of bob")).to_be_visible()
    await expect(page.locator("li.card", has_text="Sings in a choir")).to_be_visible()
    await expect(page.locator("li.card", has_text="Sails on weekends")).to_have_count(0)
    assert await axe_violations(page) == []


async def test_console_speaks_chinese_to_a_chinese_browser(
    browser: Any, console_gateway: Gateway
) -> None:
    """With a zh-CN browser the sign-in form and page language are Chinese, and every
    English text has a Chinese one."""
    context = await browser.new_context(locale="zh-CN", base_url=console_gateway.base_url)
    try:
        tab = await context.new_page()
        await tab.goto("/console/")
        await expect(tab.get_by_role("button", name="登录")).to_be_visible()
        await expect(tab.get_by_label("API 密钥")).to_be_visible()
        assert await tab.evaluate("document.documentElement.lang") == "zh-CN"
        # Every English text has its Chinese counterpart.
        missing = await tab.evaluate("""() => Object.keys(CONSOLE_TEXT.en)
            .filter((key) => !(key in CONSOLE_TEXT.zh))""")
        assert missing == []
        await expect(tab.get_by_role("button", name="Sign in")).to_have_count(0)
    finally:
        await context.close()


async def test_console_works_from_the_keyboard(page: Any, console_gateway: Gateway) -> None:
    """Sign-in, tab switching (arrow keys) and a confirmation dialog (Escape) work without
    a mouse, and focus returns to the button that opened the dialog; the key lasts as long
    as the tab (a reload keeps the session) until "Sign out"."""
    await learn(console_gateway, USER_KEY, "I run marathons.", fact("Runs marathons"))
    await page.goto("/console/")
    await expect(page.get_by_label("API key")).to_be_focused()
    await page.keyboard.type(USER_KEY)
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Memory of alice")).to_be_focused()
    memories_tab = page.get_by_role("tab", name="Memories")
    await memories_tab.focus()
    await page.keyboard.press("ArrowRight")
    profile_tab = page.get_by_role("tab", name="Profile")
    await expect(profile_tab).to_be_focused()
    await expect(profile_tab).to_have_attribute("aria-selected", "true")
    await page.keyboard.press("ArrowLeft")
    await expect(memories_tab).to_have_attribute("aria-selected", "true")
    delete = page.locator("li.card", has_text="Runs marathons").get_by_role(
        "button", name="Delete")
    await delete.focus()
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("dialog", name="Confirm")).to_be_visible()
    await page.keyboard.press("Escape")
    await expect(page.get_by_role("dialog", name="Confirm")).to_be_hidden()
    await expect(delete).to_be_focused()
    assert "Runs marathons" in await memories(console_gateway)
    # The focused control is outlined (focus visible).
    outline = await delete.evaluate("el => getComputedStyle(el).outlineStyle")
    assert outline == "solid"

    # The key survives a reload of the tab (sessionStorage), and "Sign out" forgets it.
    await page.reload()
    await expect(page.get_by_role("heading", name="Memory of alice")).to_be_visible()
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_label("API key")).to_be_visible()
    assert await page.evaluate("sessionStorage.length") == 0
