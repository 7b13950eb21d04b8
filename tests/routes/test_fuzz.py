"""A bounded fuzz of every route's parameters: no input makes the
gateway answer 5xx, and every 4xx is OpenAI's error envelope naming what was wrong.

A seeded generator of our own (schemathesis replaces it once the OpenAPI document exists)
mixes valid values with wrong types, out-of-range and overflowing integers, control
characters, RediSearch query syntax, huge and unicode strings, in query strings, JSON
bodies and the ``messages`` parts the gateway reads. Both storage backends.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import (
    FakeUpstream,
    Gateway,
    backend_overrides,
    make_settings,
    running_gateway,
)

REQUESTS_PER_BACKEND = 400
SEED = 10

STRINGS = ["", " ", "u1", "abc", "true", "false", "1", "0", "-1", "1e3", "0x10", "1.5",
           "99999999999999999999999999", "-99999999999999999999", "9223372036854775808",
           "\x00", "nul\x00byte", "\x1b[31m", "\x7f", "line\nbreak", "tab\there", "\u202e",
           "😀", "ｕ１", "a" * 5000, "@content:(x)", "*", "-", "|", "(", ")", "{", "}", "[",
           "]", "\"", "'", "~", ":", "%", "\\", "@tag:{x}", "x -y", "(a|b", "* -*",
           "NaN", "inf", "null", "[]", "{}", "user_preference", "manual"]
INTS: list[Any] = [0, 1, -1, 5, 500, 501, 2**31, 2**63, 2**64 + 1, -(2**63) - 1, 10**30,
                   1.5, 1e308]
VALUES: list[Any] = [None, True, False, [], {}, [1, "a"], {"a": 1}, *INTS, *STRINGS[:30]]
QUERY_NAMES = ["limit", "offset", "before", "user", "q", "category", "include_retired",
               "confirm", "kind", "x"]


def _value(rng: random.Random) -> Any:
    pick = rng.random()
    if pick < 0.45:
        return rng.choice(STRINGS)
    if pick < 0.75:
        return rng.choice(INTS)
    return rng.choice(VALUES)


def _query(rng: random.Random) -> dict[str, str]:
    return {name: str(_value(rng)) for name in rng.sample(QUERY_NAMES, rng.randint(0, 4))}


def _content(rng: random.Random) -> Any:
    return rng.choice([
        _value(rng), None, rng.choice(STRINGS),
        [{"type": "text", "text": _value(rng)}],
        [{"type": "image_url", "image_url": _value(rng)}],
        [{"type": rng.choice(["text", "image_url", "input_audio", 5]),
            rng.choice(["text", "image_url", "x"]): _value(rng)}],
        [_value(rng)],
    ])


def _message(rng: random.Random) -> Any:
    if rng.random() < 0.05:
        return _value(rng)
    message: dict[str, Any] = {"role": rng.choice(["user", "user", "assistant", "system",
                                                   "developer", "tool", _value(rng)]),
                               "content": _content(rng)}
    if rng.random() < 0.3:
        message["name"] = _value(rng)
    if rng.random() < 0.1:
        message["tool_calls"] = [{"id": "c1", "type": "function",
                                  "function": {"name": "f", "arguments": "{}"}}]
        message["content"] = None
    return message


def _chat_body(rng: random.Random) -> Any:
    if rng.random() < 0.05:
        return _value(rng)
    body: dict[str, Any] = {
        "model": rng.choice(["m", "m", _value(rng)]),
        "messages": [_message(rng) for _ in range(rng.randint(0, 4))] or _value(rng),
    }
    for field in rng.sample(["stream", "stream_options", "user", "metadata", "n",
                             "safety_identifier", "max_tokens", "temperature"],
                            rng.randint(0, 3)):
        body[field] = _value(rng) if field != "stream_options" else {
            "include_usage": _value(rng)}
    return body


def _memory_body(rng: random.Random) -> Any:
    if rng.random() < 0.1:
        return _value(rng)
    body: dict[str, Any] = {"content": rng.choice([_value(rng), "Likes tea", "喜欢喝茶"])}
    for field in rng.sample(["title", "category", "subcategory", "tags", "subject", "user",
                             "extra"], rng.randint(0, 3)):
        body[field] = _value(rng)
    return body


def requests(rng: random.Random, memory_id: str) -> list[tuple[str, str, dict[str, str],
                                                               Any, dict[str, str]]]:
    """(method, path, query, json body or ``...`` for none, headers) of every route."""
    headers = {"X-User-Id": rng.choice(["u1", "u2", "a" * 300, "x y", "%00"])}
    if rng.random() < 0.2:
        headers[rng.choice(["X-Memory", "X-Memory-Channel", "X-Memory-Group-Id",
                            "X-Conversation-Id"])] = rng.choice(
            ["on", "off", "read-only", "group", "private", "weird", "g1", "a" * 500])
    some_id = rng.choice([memory_id, "mem_nope", "%00", "a" * 3000, "..", "😀", "1"])
    prompt_kind = rng.choice(["scoring", "extraction", "x", "%2e%2e"])
    return [
        ("POST", "/v1/chat/completions", _query(rng), _chat_body(rng), headers),
        ("GET", "/v1/models", _query(rng), ..., headers),
        ("GET", "/v1/memories", _query(rng), ..., headers),
        ("POST", "/v1/memories", _query(rng), _memory_body(rng), headers),
        ("GET", f"/v1/memories/{some_id}", _query(rng), ..., headers),
        ("DELETE", f"/v1/memories/{some_id}", _query(rng), ..., headers),
        ("DELETE", "/v1/memories", _query(rng), ..., headers),
        ("POST", "/v1/memories/flush", _query(rng),
         rng.choice([..., {}, {"user": _value(rng)}, _value(rng)]), headers),
        ("GET", f"/v1/admin/prompts/{prompt_kind}", _query(rng), ..., ADMIN),
        ("PUT", f"/v1/admin/prompts/{prompt_kind}", _query(rng),
         rng.choice([{"text": _value(rng)}, _value(rng)]), ADMIN),
        ("GET", "/v1/admin/audit", _query(rng), ..., ADMIN),
        ("GET", "/v1/admin/usage", _query(rng), ..., ADMIN),
        ("GET", "/v1/admin/dead-letters", _query(rng), ..., ADMIN),
        ("POST", f"/v1/admin/dead-letters/{some_id}/requeue", _query(rng), ..., ADMIN),
        ("DELETE", f"/v1/admin/dead-letters/{some_id}", _query(rng), ..., ADMIN),
        ("GET", "/v1/admin/synonyms/candidates", _query(rng), ..., ADMIN),
        ("POST", f"/v1/admin/synonyms/candidates/{some_id}/accept", _query(rng), ..., ADMIN),
        ("POST", f"/v1/admin/synonyms/candidates/{some_id}/reject", _query(rng), ..., ADMIN),
        ("GET", "/readyz", _query(rng), ..., {}),
        ("GET", "/healthz", _query(rng), ..., {}),
    ]


ADMIN = {"Authorization": "Bearer fuzz-admin", "X-User-Id": "u1"}


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def fuzz_gateway(request: pytest.FixtureRequest, tmp_path: Path, upstream: FakeUpstream,
                       monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("FUZZ_ADMIN", "fuzz-admin")
    extra = backend_overrides(request, tmp_path)
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1},
                             auth={"admin_keys": [{"key": "os.environ/FUZZ_ADMIN",
                                                   "tenant": "default"}]}, **extra)
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


async def test_no_input_answers_5xx(fuzz_gateway: Gateway) -> None:
    """REQUESTS_PER_BACKEND random requests over every route: no 5xx; each 4xx is the error
    envelope; the keep-alive connection is never closed early by the gateway."""
    gw = fuzz_gateway
    rng = random.Random(SEED)
    async with gw.client() as client:
        made = await client.post("/v1/memories", headers={"X-User-Id": "u1"},
                                 json={"content": "Likes tea"})
        assert made.status_code == 201
        memory_id = made.json()["id"]
        sent, problems = 0, []
        while sent < REQUESTS_PER_BACKEND:
            for method, path, query, body, headers in requests(rng, memory_id):
                kwargs: dict[str, Any] = {"params": query, "headers": headers}
                if body is not ...:
                    kwargs["json"] = body
                response = await client.request(method, path, **kwargs)
                sent += 1
                if response.status_code >= 500:
                    problems.append((method, path, query, body, response.status_code,
                                     response.text[:300]))
                elif response.status_code >= 400:
                    error = response.json().get("error")
                    assert isinstance(error, dict), (method, path, response.text)
                    assert error.get("message"), (method, path, response.text)
        await gw.settle()
    assert problems == [], problems[:5]
