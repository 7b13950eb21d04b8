"""Bad values the gateway reads are a 400 naming the parameter; nothing else is 5xx."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from proxy.errors import InvalidRequestError
from proxy.routes.params import check_text, flag_param, int_param, text_param
from tests.fakes import (
    FakeUpstream,
    Gateway,
    backend_overrides,
    make_settings,
    running_gateway,
)

USER = {"X-User-Id": "u1"}
ADMIN = {"Authorization": "Bearer v-admin"}


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path, upstream: FakeUpstream,
             monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("V_ADMIN", "v-admin")
    extra = backend_overrides(request, tmp_path)
    settings = make_settings(tmp_path, auth={"admin_keys": [{"key": "os.environ/V_ADMIN",
                                                             "tenant": "default"}]}, **extra)
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


@pytest.mark.parametrize(("path", "query", "param"), [
    ("/v1/memories", {"limit": "99999999999999999999999"}, "limit"),
    ("/v1/memories", {"limit": "1e3"}, "limit"),
    ("/v1/memories", {"offset": "-1"}, "offset"),
    ("/v1/memories", {"include_retired": "maybe"}, "include_retired"),
    ("/v1/memories", {"q": "tea\x00"}, "q"),
    ("/v1/memories", {"category": "\x1b[31m"}, "category"),
    ("/v1/admin/audit", {"before": "9223372036854775808"}, "before"),
    ("/v1/admin/audit", {"limit": "0"}, "limit"),
    ("/v1/admin/audit", {"user": "u\x07"}, "user"),
    ("/v1/admin/usage", {"user": "x" * 2000}, "user"),
])
async def test_bad_query_values_are_400_naming_the_parameter(
        gw: Gateway, path: str, query: dict[str, str], param: str) -> None:
    """Overflowing, fractional, negative, non-boolean and control-character values are a
    400 in the error envelope whose ``param`` names the parameter."""
    async with gw.client(headers={**USER, **ADMIN} if "admin" in path else USER) as client:
        response = await client.get(path, params=query)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(("field", "value"), [
    ("content", "Likes tea\x00"), ("title", "T\x1b"), ("subject", "Bob\x7f"),
    ("tags", ["ok", "bad\x08"]),
])
async def test_control_characters_in_a_memory_are_400(gw: Gateway, field: str,
                                                      value: Any) -> None:
    """A manual memory with a control character in a field is refused, naming the field;
    the same memory without it is stored."""
    async with gw.client(headers=USER) as client:
        bad = await client.post("/v1/memories", json={"content": "Likes tea", field: value})
        good = await client.post("/v1/memories", json={"content": "Likes tea\nand toast"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == field
    assert good.status_code == 201


async def test_search_syntax_in_q_is_text_not_an_outage(gw: Gateway) -> None:
    """RediSearch query syntax typed into ``q`` is searched as text: 200, never 503."""
    async with gw.client(headers=USER) as client:
        await client.post("/v1/memories", json={"content": "Likes green tea"})
        for q in ["@content:(x)", "(a|b", "* -*", "tea}", "\"tea", "~tea", "%tea%", "@",
                  "tea:*", "-", "||", "[1 2]", "$param", "green tea"]:
            response = await client.get("/v1/memories", params={"q": q})
            assert response.status_code == 200, (q, response.text)
        found = await client.get("/v1/memories", params={"q": "green tea"})
    assert [m["content"] for m in found.json()["data"]] == ["Likes green tea"]


async def test_fields_the_gateway_does_not_read_pass_through(gw: Gateway,
                                                             upstream: FakeUpstream) -> None:
    """An assistant tool-call turn with ``content: null`` and unknown fields stay valid and
    reach the upstream untouched."""
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]
    async with gw.client(headers=USER) as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": messages, "x_vendor": {"deep": [1, None]}})
    assert response.status_code == 200
    assert upstream.last_chat["x_vendor"] == {"deep": [1, None]}
    assert upstream.last_chat["messages"][-3]["content"] is None


async def _raw_exchange(base_url: str, requests: list[bytes]) -> list[bytes]:
    """Send ``requests`` one after the other on ONE TCP connection; each answer's head."""
    url = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    heads = []
    try:
        for raw in requests:
            writer.write(raw)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            heads.append(head)
    finally:
        writer.close()
    return heads


async def test_an_unexpected_error_is_500_and_keeps_the_connection(gw: Gateway) -> None:
    """A bug (an exception nothing expected) answers 500 in the error envelope, and the
    keep-alive connection still serves the next request."""
    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    gw.res.store.list_memories = broken  # type: ignore[method-assign]
    get = (b"GET /v1/memories HTTP/1.1\r\nHost: x\r\nX-User-Id: u1\r\n\r\n")
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    first, second = await _raw_exchange(gw.base_url, [get, health])
    assert first.startswith(b"HTTP/1.1 500")
    assert b"connection: close" not in first.lower()
    assert second.startswith(b"HTTP/1.1 200")


def test_the_shared_parameter_rules() -> None:
    """int_param, flag_param, text_param and check_text accept what they document and
    refuse the rest with the parameter named."""
    assert int_param({"n": " 42 "}, "n", 1, 0, 100) == 42
    assert int_param({}, "n", 7, 0, 100) == 7
    assert int_param({"n": ""}, "n", 7, 0, 100) == 7
    assert flag_param({"f": "YES"}, "f") is True
    assert flag_param({}, "f") is False
    assert text_param({"q": "  tea "}, "q") == "tea"
    assert text_param({"q": "   "}, "q") is None
    assert check_text("a\tb\nc\r", "x") == "a\tb\nc\r"
    for call in (lambda: int_param({"n": "1.0"}, "n", 1, 0, 9),
                 lambda: int_param({"n": "10"}, "n", 1, 0, 9),
                 lambda: int_param({"n": "9" * 30}, "n", 1, 0, 2**63 - 1),
                 lambda: flag_param({"n": "2"}, "n"),
                 lambda: text_param({"n": "a\u0085"}, "n"),
                 lambda: text_param({"n": "a" * 11}, "n", max_chars=10),
                 lambda: check_text("\x00", "n")):
        with pytest.raises(InvalidRequestError) as caught:
            call()
        assert caught.value.param == "n"


@pytest.mark.parametrize("name", [5, ["Alice"], "Al\x00ice", "Al\x1bice", "A" * 300])
async def test_a_bad_speaker_name_is_400(gw: Gateway, name: Any) -> None:
    """A message ``name`` (read as a group speaker's identity) of the wrong type, too long
    or with a control character is a 400 naming ``messages[0].name``."""
    async with gw.client(headers=USER) as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "name": name, "content": "hi"}]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].name"
