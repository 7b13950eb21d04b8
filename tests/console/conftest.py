"""Browser fixtures for the console: Debian's chromium driven by Playwright for Python.

The browser is the system one (``/usr/bin/chromium``, installed with apt by ``.ci/run``),
never a Playwright download, launched once per session (a fresh context per test). When
it is missing the browser tests fail with the install command, unless
``MEMORY_PROXY_SKIP_BROWSER=1`` asks to skip them. axe-core (vendored from npm in
``vendor/axe-core``) is added to every page through an init script, which the page's
Content-Security-Policy does not govern, so the policy under test stays exactly the one
the gateway sends. Screenshots go to ``test-artifacts/console/``
(``MEMORY_PROXY_TEST_ARTIFACTS`` moves them); with ``MEMORY_PROXY_UPDATE_SCREENSHOTS=1``
the README's copies in ``docs/console/`` are rewritten too.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from proxy.settings import Settings
from tests.fakes import FakeUpstream, Gateway, make_settings, running_gateway

ROOT = Path(__file__).resolve().parents[2]
AXE_VERSION = "4.14.1"
AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
CHROMIUM = os.environ.get("MEMORY_PROXY_TEST_CHROMIUM", "/usr/bin/chromium")
SKIP_ENV = "MEMORY_PROXY_SKIP_BROWSER"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]
# A phone-sized viewport: the console must work at 390 px wide.
VIEWPORT = {"width": 390, "height": 844}
ARTIFACTS = Path(os.environ.get("MEMORY_PROXY_TEST_ARTIFACTS",
                                ROOT / "test-artifacts")) / "console"
README_SHOTS = ROOT / "docs" / "console"

# The event loop of the console's tests and of their async fixtures (each module's
# ``pytestmark``): the session's, where the one shared browser (``browser``) runs —
# Playwright's objects belong to the loop that started them.
SESSION_LOOP = pytest.mark.asyncio(loop_scope="session")

USER_KEY = "sk-console-alice"
OTHER_KEY = "sk-console-bob"
ADMIN_KEY = "sk-console-admin"
GLOBAL_KEY = "sk-console-global"
APP_KEY = "sk-console-app"
TENANT = "acme"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def console_settings(tmp_path: Path, *, jwt: dict[str, Any] | None = None,
                     **overrides: Any) -> Settings:
    """A gateway with a user-bound key (alice), another user's key (bob), an app key (no
    user) and an admin key, all of tenant ``acme``, a global admin key, and learning on
    after every message; ``jwt`` adds ``auth.jwt`` (end users signed in with a token)."""
    return make_settings(tmp_path, auth={
        "keys": [{"key_sha256": digest(USER_KEY), "tenant": TENANT, "user": "alice",
                  "name": "alice-app"},
                 {"key_sha256": digest(OTHER_KEY), "tenant": TENANT, "user": "bob",
                  "name": "bob-app"},
                 {"key_sha256": digest(APP_KEY), "tenant": TENANT, "name": "chat-app"}],
        "admin_keys": [{"key_sha256": digest(ADMIN_KEY), "tenant": TENANT, "name": "ops"}],
        "global_admin_keys": [{"key_sha256": digest(GLOBAL_KEY), "name": "root"}],
        **({"jwt": jwt} if jwt is not None else {}),
    }, learning={"enabled": True, "batch_messages": 1, "max_attempts": 1,
                 "retry_base_seconds": 0.01}, **overrides)


@pytest_asyncio.fixture(loop_scope="session")
async def console_gateway(tmp_path: Path, upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    async with running_gateway(console_settings(tmp_path), upstream) as gw:
        yield gw


@dataclass
class PageErrors:
    """What went wrong inside the page: script errors, console errors (CSP violations are
    reported there) and failed requests."""

    messages: list[str] = field(default_factory=list)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """The system chromium; a missing one fails loudly (or skips, when asked to)."""
    if not Path(CHROMIUM).exists():
        if os.environ.get(SKIP_ENV) == "1":
            pytest.skip(f"{SKIP_ENV}=1 and no browser at {CHROMIUM}")
        pytest.fail(f"no chromium at {CHROMIUM}: install it (apt-get install -y chromium; "
                    f".ci/run does this as root), point MEMORY_PROXY_TEST_CHROMIUM at one, "
                    f"or set {SKIP_ENV}=1 to skip the browser tests", pytrace=False)
    return CHROMIUM


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser(chromium_path: str) -> AsyncIterator[Any]:
    """One Chromium for the whole session (launching one costs a second or two; each test
    gets a fresh context in :func:`page`, so no cookie or storage crosses tests)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Any, console_gateway: Gateway) -> AsyncIterator[Any]:
    """A fresh en-US page at 390 px with axe-core loaded; fails the test on any page error."""
    context = await browser.new_context(
        locale="en-US", viewport=VIEWPORT, base_url=console_gateway.base_url,
        accept_downloads=True, color_scheme="light")
    await context.add_init_script(path=str(AXE))
    errors = PageErrors()
    tab = await context.new_page()
    tab.on("pageerror", lambda exc: errors.messages.append(f"pageerror: {exc}"))
    tab.on("console", lambda msg: errors.messages.append(f"console: {msg.text}")
           if msg.type == "error" and "Failed to load resource" not in msg.text else None)
    tab.errors = errors
    try:
        yield tab
    finally:
        await context.close()
    assert errors.messages == [], errors.messages


async def axe_violations(page: Any) -> list[dict[str, Any]]:
    """Serious and critical axe-core violations of the page as it is now."""
    found: list[dict[str, Any]] = await page.evaluate("""async () => {
        const result = await axe.run(document, {resultTypes: ["violations"]});
        return result.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
            nodes: v.nodes.map(n => n.target.join(" "))}));
    }""")
    return [v for v in found if v["impact"] in ("serious", "critical")]


async def screenshot(page: Any, name: str) -> Path:
    """Save a screenshot of the page as a test artifact (and, on request, for the README)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=False)
    if os.environ.get("MEMORY_PROXY_UPDATE_SCREENSHOTS") == "1":
        README_SHOTS.mkdir(parents=True, exist_ok=True)
        (README_SHOTS / f"{name}.png").write_bytes(path.read_bytes())
    return path


async def learn(gateway: Gateway, key: str, text: str, *facts: dict[str, Any],
                conversation: str = "conv-console", profile: dict[str, Any] | None = None,
                extract: Callable[[dict[str, Any]], Any] | None = None) -> None:
    """One chat turn with ``key``, learned as ``facts`` (and ``profile``) by the scripted
    learning model — or as whatever ``extract`` answers to the extraction request."""
    gateway.upstream.extract = extract or (
        lambda body: {"memories": list(facts), "profile": profile})
    async with gateway.client() as client:
        answer = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": text}]},
            headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": conversation})
    assert answer.status_code == 200, answer.text
    await gateway.settle()


def fact(content: str, **extra: Any) -> dict[str, Any]:
    """A fact as the learning model writes it."""
    return {"title": content[:30], "content": content, "category": "user_preference",
            "subcategory": "", "tags": [], "subject": "user", "duplicate_of": None,
            "supersedes": [], **extra}


async def sign_in(page: Any, key: str) -> None:
    """Open the console and sign in with ``key`` through the form."""
    await page.goto("/console/")
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()


async def fits_width(page: Any) -> bool:
    """Nothing on the page is wider than the 390 px viewport (no sideways scrolling)."""
    width: int = await page.evaluate("document.documentElement.scrollWidth")
    return width <= VIEWPORT["width"]
