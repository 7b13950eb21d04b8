"""The console's static files: served from the package under a strict CSP, nothing
fetched from elsewhere, every file shipped as package data."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from proxy.routes.console import CONTENT_SECURITY_POLICY
from tests.fakes import Gateway

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = ROOT / "proxy" / "console"


async def test_console_is_served_with_a_strict_policy(gateway: Gateway) -> None:
    """/console/ answers the app's HTML with a CSP that allows only the gateway's own
    origin, no inline script or style and no framing."""
    async with gateway.client() as client:
        page = await client.get("/console/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script src="app.js"' in page.text
    policy = page.headers["content-security-policy"]
    assert policy == CONTENT_SECURITY_POLICY
    assert "script-src 'self';" in policy
    assert "unsafe-inline" not in policy
    assert "unsafe-eval" not in policy
    assert "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"


async def test_console_assets_carry_the_policy_and_types(gateway: Gateway) -> None:
    """Scripts and the stylesheet are served with their types and the same headers."""
    async with gateway.client() as client:
        script = await client.get("/console/app.js")
        style = await client.get("/console/console.css")
    assert script.status_code == style.status_code == 200
    assert "javascript" in script.headers["content-type"]
    assert style.headers["content-type"].startswith("text/css")
    assert script.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


async def test_bare_console_path_redirects_to_the_folder(gateway: Gateway) -> None:
    """/console redirects to /console/ so the page's relative asset paths resolve."""
    async with gateway.client() as client:
        answer = await client.get("/console")
    assert answer.status_code in (307, 308)
    assert answer.headers["location"].endswith("/console/")


async def test_unknown_console_file_is_a_404_in_openai_shape(gateway: Gateway) -> None:
    """A missing file (or a path escaping the folder) is a JSON 404, not a file."""
    async with gateway.client() as client:
        missing = await client.get("/console/nope.js")
        escape = await client.get("/console/..%2f..%2fsettings.py")
        post = await client.post("/console/app.js")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "unknown_url"
    assert escape.status_code == 404
    assert post.status_code == 405


def test_console_loads_nothing_from_another_origin() -> None:
    """No file of the console names a URL of another origin (no CDN, font or script)."""
    for path in CONSOLE.iterdir():
        text = path.read_text(encoding="utf-8")
        external = re.findall(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, flags=re.I)
        # The SVG namespace is a name, not a fetch.
        assert [u for u in external if u != "http://www.w3.org"] == [], path.name


def test_console_has_no_inline_script_or_style() -> None:
    """The page runs under script-src/style-src 'self': no inline script, style or
    event-handler attribute in the HTML."""
    html = (CONSOLE / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html) is None
    assert "<style" not in html
    assert re.search(r"\sstyle=", html) is None
    assert re.search(r"\son[a-z]+=", html) is None


def test_every_console_file_ships_as_package_data() -> None:
    """Each file in proxy/console/ matches a package-data pattern, so a wheel install
    serves the same console."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["proxy"]
    files = [p.relative_to(ROOT / "proxy").as_posix() for p in CONSOLE.iterdir()]
    assert files
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name
