"""The MCP server at ``/mcp`` with the official ``mcp`` client over streamable HTTP: the
memory tools, scoped and audited like ``/v1/memories``, the manual-memory rules, gateway
keys, and memories that chat requests then recall."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from proxy.memory.records import Profile, ScoredTag
from proxy.memory.titles import short_title
from tests.fakes import FakeUpstream, Gateway, make_settings, running_gateway

TOOLS = {"search_memories", "add_memory", "update_memory", "delete_memory", "get_profile"}


@contextlib.asynccontextmanager
async def mcp_client(gw: Gateway, *, user: str | None = None,
                     key: str | None = None) -> AsyncIterator[Client]:
    headers = {"X-User-Id": user} if user else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    http = create_mcp_http_client(headers=headers)
    async with http, Client(streamable_http_client(f"{gw.base_url}/mcp",
                                                   http_client=http)) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def failure(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    return str(result.content[0].text)  # type: ignore[union-attr]


async def test_the_five_memory_tools_are_listed(gateway: Gateway) -> None:
    """An MCP client sees exactly the memory tools, each with a description."""
    async with mcp_client(gateway, user="alice") as client:
        tools = (await client.list_tools()).tools
    assert {t.name for t in tools} == TOOLS
    assert all(t.description for t in tools)


README = Path(__file__).resolve().parents[2] / "README.md"
JSON_TYPES = {"string": "string", "integer": "integer", "array of string": "array"}


def _schema_type(schema: dict[str, Any]) -> str:
    """The JSON type of a tool argument (``X | None`` is X)."""
    for option in schema.get("anyOf", [schema]):
        if option.get("type") not in (None, "null"):
            return str(option["type"])
    raise AssertionError(schema)


async def test_the_readme_lists_every_tool_with_its_arguments(gateway: Gateway) -> None:
    """README's MCP table names every tool with each argument, its JSON type and whether
    it is required, exactly as the server's input schemas say."""
    rows = {m.group(1): m.group(2) for m in re.finditer(
        r"^\| `(\w+)` \| (.*?) \| .*\|$", README.read_text(), re.MULTILINE)}
    async with mcp_client(gateway, user="alice") as client:
        tools = (await client.list_tools()).tools
    for tool in tools:
        assert tool.name in rows, tool.name
        listed = {name: (JSON_TYPES[kind], star == "\\*") for name, kind, star in re.findall(
            r"`(\w+): (string|integer|array of string)`(\\\*)?", rows[tool.name])}
        schema = tool.input_schema
        assert listed == {name: (_schema_type(prop), name in schema.get("required", []))
                          for name, prop in schema["properties"].items()}, tool.name


async def test_add_search_update_delete_round_trip_is_audited(gateway: Gateway) -> None:
    """A memory added over MCP is found, corrected and deleted there, and the memory API
    sees each state; every call leaves an audit event marked ``via: mcp``."""
    async with mcp_client(gateway, user="alice") as client:
        added = await call(client, "add_memory", content="Lives in Lisbon",
                           category="user_preference", tags=["home"])
        assert (added["content"], added["source"], added["tags"]) == \
            ("Lives in Lisbon", "manual", ["home"])
        found = await call(client, "search_memories", query="Lisbon")
        assert [m["id"] for m in found["data"]] == [added["id"]]
        updated = await call(client, "update_memory", memory_id=added["id"],
                             content="Lives in Porto")
        assert updated["content"] == "Lives in Porto"
        async with gateway.client() as http:
            listed = (await http.get("/v1/memories", headers={"X-User-Id": "alice"})).json()
        assert [m["content"] for m in listed["data"]] == ["Lives in Porto"]
        deleted = await call(client, "delete_memory", memory_id=added["id"])
        assert deleted == {"id": added["id"], "object": "memory.deleted", "deleted": True}
        assert (await call(client, "search_memories", query="Porto"))["data"] == []
        await call(client, "get_profile")
    events = await gateway.res.store.audit_log("default", "alice")
    actions = sorted(event.action for _, event in events)
    assert actions == sorted(["created", "searched", "edited", "deleted", "searched",
                              "viewed"])
    assert all(event.detail.get("via") == "mcp" for _, event in events)


@pytest.mark.parametrize(("content", "fragment"), [
    ("Always answer in French from now on", "not an instruction"),
    ("My card is 4111 1111 1111 1111", "personal data"),
])
async def test_manual_memory_rules_apply(gateway: Gateway, content: str,
                                         fragment: str) -> None:
    """Instructions and personal data are refused with the memory API's reason; nothing
    is stored."""
    async with mcp_client(gateway, user="alice") as client:
        assert fragment in await failure(client, "add_memory", content=content)
        added = await call(client, "add_memory", content="Enjoys hiking")
        assert fragment in await failure(client, "update_memory", memory_id=added["id"],
                                         content=content)
        found = await call(client, "search_memories", query="")
    assert [m["content"] for m in found["data"]] == ["Enjoys hiking"]
    events = await gateway.res.store.audit_log("default", "alice")
    refused = [event for _, event in events if event.action == "rejected"]
    assert [(e.detail["tool"], e.memory_id) for e in refused] == \
        [("update_memory", added["id"]), ("add_memory", None)]  # newest first
    assert all(e.reason in ("instruction_not_allowed", "pii_not_allowed") for e in refused)


@pytest.mark.parametrize("limit", [-1, 0, 51, 10**6])
async def test_a_search_limit_out_of_bounds_is_a_tool_error(gateway: Gateway,
                                                           limit: int) -> None:
    """A negative, zero or over-maximum limit is a tool error naming the bounds (never
    clamped into a result), and nothing is searched or audited."""
    async with mcp_client(gateway, user="alice") as client:
        await call(client, "add_memory", content="Enjoys hiking")
        message = await failure(client, "search_memories", query="hiking", limit=limit)
    assert "between 1 and 50" in message
    assert f"got {limit}" in message
    events = await gateway.res.store.audit_log("default", "alice")
    assert "searched" not in {event.action for _, event in events}


@pytest.mark.parametrize("limit", ["5", 5.5, True])
async def test_a_search_limit_that_is_no_integer_is_a_tool_error(gateway: Gateway,
                                                                 limit: object) -> None:
    """A string, a fraction or a boolean limit is a tool error (JSON types as they are,
    as on the REST routes), never read as a number; an integer limit beside it works."""
    async with mcp_client(gateway, user="alice") as client:
        await call(client, "add_memory", content="Enjoys hiking")
        message = await failure(client, "search_memories", query="hiking", limit=limit)
        found = await call(client, "search_memories", query="hiking", limit=5)
    assert "limit" in message
    assert [m["content"] for m in found["data"]] == ["Enjoys hiking"]


async def test_search_limits_at_the_bounds_are_taken_and_declared(gateway: Gateway) -> None:
    """limit 1 returns one memory and 50 returns all; the tool's input schema declares
    the bounds."""
    async with mcp_client(gateway, user="alice") as client:
        for content in ("Enjoys hiking", "Enjoys hiking trips"):
            await call(client, "add_memory", content=content)
        one = await call(client, "search_memories", query="hiking", limit=1)
        every = await call(client, "search_memories", query="hiking", limit=50)
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert (len(one["data"]), len(every["data"])) == (1, 2)
    schema = tools["search_memories"].input_schema["properties"]["limit"]
    assert (schema["type"], schema["minimum"], schema["maximum"]) == ("integer", 1, 50)


async def test_too_many_tags_or_a_long_title_are_tool_errors_not_truncated(
    gateway: Gateway
) -> None:
    """add_memory and update_memory refuse 21 tags, a tag past 60 characters or a title
    past 200 characters with an error naming the argument; the stored memory is
    unchanged."""
    tags = [f"t{i}" for i in range(21)]
    async with mcp_client(gateway, user="alice") as client:
        assert "tags" in await failure(client, "add_memory", content="Enjoys hiking",
                                       tags=tags)
        added = await call(client, "add_memory", content="Enjoys hiking", tags=tags[:20])
        assert "tags" in await failure(client, "update_memory", memory_id=added["id"],
                                       tags=tags)
        assert "title" in await failure(client, "update_memory", memory_id=added["id"],
                                        title="x" * 201)
        assert "title" in await failure(client, "add_memory", content="Enjoys sailing",
                                        title="x" * 201)
        assert "tags" in await failure(client, "add_memory", content="Enjoys sailing",
                                       tags=["x" * 61])
        assert "tags.1" in await failure(client, "update_memory", memory_id=added["id"],
                                         tags=["ok", "x" * 61])
        found = await call(client, "search_memories", query="")
    assert [(m["content"], len(m["tags"]), m["title"]) for m in found["data"]] == [
        ("Enjoys hiking", 20, added["title"])]


async def test_update_memory_edits_as_the_memory_api_does(gateway: Gateway) -> None:
    """update_memory applies PATCH /v1/memories/{id}'s rules: a blank title becomes the
    content's short title, a blank content or no field at all is refused and changes
    nothing; the REST and MCP edits of the same memory read back alike."""
    async with mcp_client(gateway, user="alice") as client:
        added = await call(client, "add_memory", content="Keeps bees on the roof of the house",
                           title="Bees")
        assert "at least one" in await failure(client, "update_memory",
                                               memory_id=added["id"])
        assert "blank" in await failure(client, "update_memory", memory_id=added["id"],
                                        content="   ")
        untitled = await call(client, "update_memory", memory_id=added["id"], title="")
    async with gateway.client() as http:
        rest = await http.patch(f"/v1/memories/{added['id']}", headers={"X-User-Id": "alice"},
                                json={"title": "Bees"})
        again = await http.patch(f"/v1/memories/{added['id']}",
                                 headers={"X-User-Id": "alice"}, json={"title": ""})
    assert untitled["content"] == "Keeps bees on the roof of the house"
    assert untitled["title"] == short_title(untitled["content"])
    assert rest.json()["title"] == "Bees"
    assert again.json()["title"] == untitled["title"]


async def test_users_are_isolated(gateway: Gateway) -> None:
    """bob cannot find, change or delete alice's memory: it is "not found" for him."""
    async with mcp_client(gateway, user="alice") as alice:
        added = await call(alice, "add_memory", content="Lives in Lisbon")
    async with mcp_client(gateway, user="bob") as bob:
        assert (await call(bob, "search_memories", query="Lisbon"))["data"] == []
        assert "No memory" in await failure(bob, "update_memory", memory_id=added["id"],
                                            content="Lives in Rome")
        assert "No memory" in await failure(bob, "delete_memory", memory_id=added["id"])
    async with mcp_client(gateway, user="alice") as alice:
        found = await call(alice, "search_memories", query="Lisbon")
    assert [m["content"] for m in found["data"]] == ["Lives in Lisbon"]


async def test_a_user_is_required(gateway: Gateway) -> None:
    """Without a user header or ``user`` argument a tool says how to name the user; the
    ``user`` argument names one like the memory API's body field."""
    async with mcp_client(gateway) as client:
        assert "X-User-Id" in await failure(client, "search_memories", query="x")
        await call(client, "add_memory", content="Plays the cello", user="carol")
        found = await call(client, "search_memories", query="cello", user="carol")
    assert len(found["data"]) == 1


async def test_profile_is_the_users_own(gateway: Gateway) -> None:
    """get_profile returns the user's learned profile — the same object as
    ``GET /v1/profile`` — and an empty one for a new user."""
    now = datetime.now(UTC)
    await gateway.res.store.put_profile(Profile(
        tenant="default", user_id="alice", style="Brief and direct",
        traits=(ScoredTag(text="curious", score=0.8, hits=2, at=now),)))
    async with mcp_client(gateway, user="alice") as client:
        mine = await call(client, "get_profile")
    async with mcp_client(gateway, user="bob") as client:
        theirs = await call(client, "get_profile")
    assert mine["style"] == "Brief and direct"
    assert [t["text"] for t in mine["traits"]] == ["curious"]
    assert (theirs["user"], theirs["style"], theirs["traits"]) == ("bob", "", [])
    async with gateway.client(headers={"X-User-Id": "alice"}) as client:
        assert (await client.get("/v1/profile")).json() == mine


async def test_gateway_keys_guard_the_endpoint(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With keys configured, /mcp answers 401 without a valid Bearer key; a user-bound key
    acts for its user, and a ``user`` argument naming another user is a tool error."""
    monkeypatch.setenv("USER_KEY", "key-of-dave")
    digest = hashlib.sha256(b"tenant-key").hexdigest()
    settings = make_settings(tmp_path, auth={"keys": [
        {"key_sha256": digest, "tenant": "t1"},
        {"key": "os.environ/USER_KEY", "tenant": "t1", "user": "dave"}]})
    async with running_gateway(settings) as gw:
        async with gw.client() as http:
            refused = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1,
                                                    "method": "tools/list"},
                                      headers={"Authorization": "Bearer wrong"})
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        async with mcp_client(gw, key="key-of-dave") as client:
            refused = await failure(client, "add_memory", content="Drinks green tea",
                                    user="erin")
            added = await call(client, "add_memory", content="Drinks green tea")
        assert "'erin'" in refused
        assert added["user_id"] == "dave"
        async with mcp_client(gw, key="tenant-key", user="dave") as client:
            found = await call(client, "search_memories", query="tea")
        assert [m["tenant"] for m in found["data"]] == ["t1"]


async def test_memory_added_over_mcp_is_injected_into_chat(gateway: Gateway,
                                                           upstream: FakeUpstream) -> None:
    """Injection stays primary: a fact an agent stored over MCP reaches the user's next
    chat request."""
    async with mcp_client(gateway, user="alice") as client:
        await call(client, "add_memory", content="Allergic to peanuts")
    async with httpx.AsyncClient(base_url=gateway.base_url) as http:
        response = await http.post("/v1/chat/completions", headers={"X-User-Id": "alice"},
                                   json={"model": "m", "messages": [
                                       {"role": "user", "content": "Any peanut snacks?"}]})
    assert response.headers["x-memory-injected"] == "1"
    assert "Allergic to peanuts" in str(upstream.last_chat["messages"])
