"""README's client snippets whose client is a test dependency (openai, anthropic, mcp) run,
as printed, against a running gateway and do what the README says.

Each snippet is the first ```python block after its marker in README.md (a missing marker
or block is an error, never a skip), so an edit of the README is what is tested. It runs
as a reader runs it: written to a file, executed by this interpreter (the venv's, which
has the pinned clients) in a subprocess, in an empty directory, without any upstream key in
the environment. Only what a reader replaces is replaced: the gateway address
``127.0.0.1:8080`` by the test gateway's and the ``<gateway key>`` placeholder by its app
key. The gateway relays its models (``local``, ``gpt-4o-mini``) to the fake upstream;
alice has one memory, so a chat request that names alice reaches the upstream with it.
Snippets of clients that are not test dependencies stay "checked by hand" in the README
(``docs/clients-check.py``).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fakes import UPSTREAM_BASE, FakeUpstream, Gateway, make_settings, running_gateway

README = Path(__file__).resolve().parents[1] / "README.md"
README_ADDRESS = "127.0.0.1:8080"
KEY_PLACEHOLDER = "<gateway key>"
APP_KEY = "readme-app-key"
MEMORY = "Lives in Lisbon"
RUN_SECONDS = 120  # one snippet's subprocess, imports included
# The keys a reader's shell may hold that would send a snippet elsewhere.
UPSTREAM_KEYS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")


def snippet(text: str, marker: str) -> str:
    """The body of the first ```python block after ``<!-- marker -->`` in ``text``.
    Raises ``ValueError`` without the marker or without a block after it."""
    at = text.find(f"<!-- {marker} -->")
    if at < 0:
        raise ValueError(f"README has no <!-- {marker} -->")
    found = re.compile(r"```python\n(.*?)```", re.DOTALL).search(text, at)
    if found is None:
        raise ValueError(f"no ```python block after <!-- {marker} -->")
    return found.group(1)


def localise(code: str, *, base_url: str, key: str) -> str:
    """The snippet as a reader runs it against ``base_url``: the README's address and the
    key placeholder replaced, nothing else."""
    return code.replace(README_ADDRESS, base_url.removeprefix("http://")).replace(
        KEY_PLACEHOLDER, key)


async def run_snippet(marker: str, gw: Gateway, folder: Path, *,
                      key: str = APP_KEY) -> tuple[int, str]:
    """Run README's snippet ``marker`` against ``gw``; (exit code, stdout and stderr)."""
    code = localise(snippet(README.read_text(encoding="utf-8"), marker),
                    base_url=gw.base_url, key=key)
    script = folder / f"{marker.replace(':', '_').replace(' ', '')}.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in UPSTREAM_KEYS}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), cwd=folder, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=RUN_SECONDS)
    return proc.returncode or 0, out.decode(errors="replace")


def _model(name: str) -> dict[str, Any]:
    return {"model_name": name,
            "litellm_params": {"model": "openai/up-model", "api_base": UPSTREAM_BASE,
                               "api_key": "sk-upstream"},
            "model_info": {"max_input_tokens": 16000}}


async def _remember(gw: Gateway, user: str, content: str,
                    headers: dict[str, str] | None = None) -> None:
    async with gw.client(headers={"X-User-Id": user, **(headers or {})}) as client:
        response = await client.post("/v1/memories", json={"content": content})
    assert response.status_code in (200, 201), response.text


async def _memories(gw: Gateway, user: str) -> list[str]:
    async with gw.client(headers={"X-User-Id": user,
                                  "Authorization": f"Bearer {APP_KEY}"}) as client:
        response = await client.get("/v1/memories")
    assert response.status_code == 200, response.text
    return [m["content"] for m in response.json()["data"]]


def _with_memory(upstream: FakeUpstream) -> list[dict[str, Any]]:
    """The chat requests that reached the upstream carrying alice's memory."""
    return [r for r in upstream.chat_requests if MEMORY in orjson.dumps(r).decode()]


@pytest.fixture
async def keyed(tmp_path: Path, upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    """A gateway with one app key (tenant ``acme``, any user by ``X-User-Id``); alice
    remembers :data:`MEMORY`."""
    import hashlib

    settings = make_settings(
        tmp_path, model_list=[_model("local"), _model("gpt-4o-mini")],
        auth={"keys": [{"key_sha256": hashlib.sha256(APP_KEY.encode()).hexdigest(),
                        "tenant": "acme", "name": "app"}]})
    async with running_gateway(settings, upstream) as gateway:
        await _remember(gateway, "alice", MEMORY, {"Authorization": f"Bearer {APP_KEY}"})
        yield gateway


def test_a_missing_marker_is_an_error_not_a_skip() -> None:
    """The extractor raises on a README without the marker, or without a block after it."""
    with pytest.raises(ValueError, match="no <!-- client: gone -->"):
        snippet("text\n```python\nprint(1)\n```\n", "client: gone")
    with pytest.raises(ValueError, match="no ```python block"):
        snippet("<!-- client: bare -->\n```bash\nls\n```\n", "client: bare")
    assert snippet("<!-- client: ok -->\n\n```python\nprint(1)\n```\n", "client: ok") == \
        "print(1)\n"


async def test_quick_start_chat_completion_gets_alices_memory(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """The quick start's Chat Completions call, on an open gateway (no keys): it prints
    the reply, and the upstream got the request with alice's memory in it."""
    settings = make_settings(tmp_path, model_list=[_model("local"), _model("gpt-4o-mini")])
    async with running_gateway(settings, upstream) as gw:
        await _remember(gw, "alice", MEMORY)
        code, out = await run_snippet("quick-start-client", gw, tmp_path)
    assert code == 0, out
    assert out.strip() == upstream.reply_text
    assert len(_with_memory(upstream)) == 1
    assert upstream.last_chat["messages"][-1]["content"] == "I moved to Lisbon last month."


async def test_responses_snippet_prints_the_reply_and_the_stream(
        keyed: Gateway, upstream: FakeUpstream, tmp_path: Path) -> None:
    """The Responses snippet prints the reply, then the streamed deltas; both requests
    (one streamed) reached the upstream with alice's memory."""
    code, out = await run_snippet("client: openai-responses", keyed, tmp_path)
    assert code == 0, out
    assert out == f"{upstream.reply_text}\n{upstream.reply_text}"
    sent = _with_memory(upstream)
    assert [bool(r.get("stream")) for r in sent] == [False, True]


async def test_a_snippet_with_a_wrong_key_fails(
        keyed: Gateway, upstream: FakeUpstream, tmp_path: Path) -> None:
    """Negative case: the same Responses snippet with a key the gateway does not know
    exits non-zero on the 401, and nothing reaches the upstream."""
    code, out = await run_snippet("client: openai-responses", keyed, tmp_path,
                                  key="not-a-key")
    assert code != 0
    assert "401" in out
    assert upstream.chat_requests == []


async def test_anthropic_snippet_gets_memory_and_counts_it(
        keyed: Gateway, upstream: FakeUpstream, tmp_path: Path) -> None:
    """The Messages snippet prints the reply and a token count; the upstream got the
    client's system block and alice's memory; the count is larger than the same count
    for a user with no memory (the memory block is counted)."""
    code, out = await run_snippet("client: anthropic", keyed, tmp_path)
    assert code == 0, out
    reply, counted = out.strip().splitlines()
    assert reply == upstream.reply_text
    sent = _with_memory(upstream)
    assert len(sent) == 1
    assert "<long rules>" in orjson.dumps(sent[0]).decode()
    async with keyed.client(headers={"x-api-key": APP_KEY}) as client:
        response = await client.post("/v1/messages/count_tokens", json={
            "model": "local", "metadata": {"user_id": "nobody"},
            "messages": [{"role": "user", "content": "Where do I live?"}]})
    assert response.status_code == 200, response.text
    assert int(counted) > response.json()["input_tokens"] > 0


async def test_mcp_snippet_adds_and_finds_alices_memory(
        keyed: Gateway, tmp_path: Path) -> None:
    """The MCP snippet adds a memory for alice over /mcp and prints what the search found
    (it); the memory is alice's, and another user has none of it."""
    code, out = await run_snippet("client: mcp", keyed, tmp_path)
    assert code == 0, out
    assert "Allergic to peanuts" in out
    assert sorted(await _memories(keyed, "alice")) == ["Allergic to peanuts", MEMORY]
    assert await _memories(keyed, "bob") == []


async def test_previous_response_id_snippet_gets_400_then_resends_history(
        keyed: Gateway, upstream: FakeUpstream, tmp_path: Path) -> None:
    """The ``previous_response_id`` snippet prints the documented 400 and its code, then
    the reply to the resent history; the upstream got two requests with alice's memory
    (the first turn and the history), never the refused one."""
    code, out = await run_snippet("client: previous-response-id", keyed, tmp_path)
    assert code == 0, out
    assert out.strip().splitlines() == ["400 unsupported_parameter", upstream.reply_text]
    sent = _with_memory(upstream)
    assert len(sent) == 2
    assert [m["content"] for m in sent[1]["messages"] if m["role"] != "system"] == [
        "Where do I live?", upstream.reply_text, "Is it sunny there?"]
