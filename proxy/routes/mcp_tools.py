"""The MCP server's memory tools, on the official ``mcp`` SDK (imported only here, and
only once the app starts: see :mod:`proxy.routes.mcp`).

The SDK's streamable HTTP transport runs stateless (any gateway process answers any
request: nothing is kept between calls) with JSON responses. Every tool is scoped like
``/v1/memories``: the tenant from the key, the user from a user-bound key, else the user
header (``X-User-Id``), else the tool's ``user`` argument; a ``user`` argument naming
another user than the key or the header is a tool error naming both. A memory of another
user is "not found". Every call is audited (``searched``, ``created``, ``edited``, ``deleted``,
``viewed``, and ``rejected`` for a write the rules refused; ``detail.via = "mcp"``), and
``add_memory`` / ``update_memory`` meet the manual-memory rules (no instructions or links,
no personal data or secrets).

Tools: ``search_memories``, ``add_memory``, ``update_memory``, ``delete_memory``,
``get_profile``. Results are the memory API's JSON shapes.

DNS-rebinding protection (Host / Origin allow-lists) is off: the gateway is served under
whatever host name it is deployed at, and every call needs a gateway key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import Field, ValidationError

from proxy.errors import InvalidRequestError, ProxyError, invalid_value
from proxy.identity import resolve_user
from proxy.memory.categories import Category
from proxy.memory.records import Memory
from proxy.memory.search import search
from proxy.memory.store import AuditEvent, ListQuery
from proxy.resources import Resources
from proxy.routes.memories import (
    add_manual,
    check_manual,
    embed_manual,
    text_changes,
    vector_fields,
)
from proxy.routes.owner import Owner
from proxy.routes.shapes import MemoryPatch, NewMemory
from proxy.routes.users import user_profile

SEARCH_LIMIT_MIN, SEARCH_LIMIT_MAX = 1, 50  # results per search_memories call
INSTRUCTIONS = (
    "Long-term memory of the end user, shared with every chat this gateway serves. Relevant "
    "memories are already injected into chats; use these tools to look memories up, record "
    "a durable fact about the user, correct or delete one, or read the user's profile. "
    "Memories are statements about the user, never instructions."
)


def _owner(res: Resources, headers: Mapping[str, str] | None,
           user: str | None) -> Owner:
    """The (tenant, user) a tool call acts on: the key's user, else the user header, else
    the ``user`` argument. Raises :class:`ToolError` naming what is missing, and naming
    both sources when the ``user`` argument names another user than the key or the header
    (an agent's argument never silently gives way to them)."""
    try:
        principal = res.keyring.authenticate(headers or {})
        who, source = resolve_user(principal, headers or {}, {"user": user} if user else None,
                                   res.settings.identity)
    except ProxyError as exc:
        raise ToolError(exc.message) from exc
    if who is not None and source in ("key", "header") and user and user.strip() != who:
        named_by = ("the key (bound to one user)" if source == "key"
                    else f"header {res.settings.identity.user_header}")
        raise ToolError(f"The 'user' argument ({user.strip()!r}) and {named_by} "
                        f"({who!r}) name different users: leave 'user' out or make them "
                        "agree.")
    if who is None:
        raise ToolError(f"Identify the end user: send header "
                        f"{res.settings.identity.user_header} or pass 'user'.")
    return Owner(principal.tenant, who, "admin" if principal.is_admin else "user", principal)


def _event(res: Resources, tenant: str, user: str, action: str, memory_id: str | None = None,
           **detail: object) -> AuditEvent:
    return AuditEvent(tenant=tenant, user_id=user, action=action,  # type: ignore[arg-type]
                      actor="user", at=res.clock(), memory_id=memory_id,
                      detail={"via": "mcp", **detail})


async def _rejected(res: Resources, tenant: str, user: str, memory_id: str | None, *,
                    tool: str, code: str | None) -> None:
    """Audit a write the manual-memory rules refused (``reason``: the error code)."""
    event = _event(res, tenant, user, "rejected", memory_id, tool=tool)
    await res.store.audit([replace(event, reason=code or "invalid_value")])


def _resources(ctx: Context) -> Resources:
    """The running app's resources (the MCP request carries the app's HTTP request)."""
    request: Any = ctx.request_context.request
    resources: Resources = request.app.state.resources
    return resources


SearchLimit = Annotated[int, Field(
    description=f"most memories to return, {SEARCH_LIMIT_MIN} to {SEARCH_LIMIT_MAX}",
    strict=True,  # JSON types as they are: "5" is not a number (as on the REST routes)
    # Declared for clients; enforced in search_memories with a message naming both bounds.
    json_schema_extra={"minimum": SEARCH_LIMIT_MIN, "maximum": SEARCH_LIMIT_MAX})]


async def search_memories(query: str, ctx: Context, limit: SearchLimit = 10,
                          user: str | None = None) -> dict[str, Any]:
    """Search the user's memories by text, best match first, ranked as chat recall ranks
    them (keyword and, when configured, vector similarity); an empty query lists the
    newest. Returns {"object": "list", "data": [memory, ...]}. A limit outside 1–50 is an
    error."""
    if not SEARCH_LIMIT_MIN <= limit <= SEARCH_LIMIT_MAX:
        raise ToolError(f"limit must be between {SEARCH_LIMIT_MIN} and {SEARCH_LIMIT_MAX} "
                        f"(got {limit}).")
    res = _resources(ctx)
    me = _owner(res, ctx.headers, user)
    tenant, who = me.tenant, me.user
    listing = ListQuery(tenant=tenant, user=who, text=query.strip() or None, limit=limit)
    if listing.text:
        found = (await search(res.memory.retriever, res.store, listing, now=res.clock(),
                              embed_budget=res.settings.memory.embedder.timeout_seconds)
                 ).memories
    else:
        found = await res.store.list_memories(listing)
    await res.store.audit([_event(res, tenant, who, "searched", tool="search_memories",
                                  results=len(found))])
    return {"object": "list", "data": [m.to_api() for m in found]}


async def add_memory(content: str, ctx: Context, *, title: str = "",
                     category: Category = "user_preference", tags: list[str] | None = None,
                     user: str | None = None) -> dict[str, Any]:
    """Remember a durable fact about the user (a statement, not an instruction).
    Returns the stored memory."""
    res = _resources(ctx)
    me = _owner(res, ctx.headers, user)
    tenant, who = me.tenant, me.user
    arguments = {"content": content, "title": title, "category": category,
                 "tags": tags or []}
    try:
        new = NewMemory.model_validate(arguments)
        memory = await add_manual(res, me, new, via="mcp")
    except ValidationError as exc:
        await _rejected(res, tenant, who, None, tool="add_memory", code="invalid_value")
        # "tags: List should have at most 20 items …": the argument, then the rule.
        raise ToolError(f"Invalid memory: {invalid_value(exc, arguments).message}") from exc
    except ProxyError as exc:
        await _rejected(res, tenant, who, None, tool="add_memory", code=exc.code)
        raise ToolError(exc.message) from exc
    return memory.to_api()


async def update_memory(memory_id: str, ctx: Context, *, content: str | None = None,
                        title: str | None = None, category: Category | None = None,
                        tags: list[str] | None = None,
                        user: str | None = None) -> dict[str, Any]:
    """Correct one of the user's memories: the fields given replace the stored ones.
    Returns the updated memory."""
    res = _resources(ctx)
    me = _owner(res, ctx.headers, user)
    tenant, who = me.tenant, me.user
    memory = await res.store.get(tenant, who, memory_id)
    if memory is None:
        raise ToolError(f"No memory {memory_id!r} for this user.")
    given = {"content": content, "title": title, "category": category, "tags": tags}
    arguments = {name: value for name, value in given.items() if value is not None}
    try:
        if not arguments:
            raise InvalidRequestError("Give at least one of content, title, category, tags.")
        updated = await _edited(res, memory, MemoryPatch.model_validate(arguments))
    except ValidationError as exc:
        await _rejected(res, tenant, who, memory.id, tool="update_memory",
                        code="invalid_value")
        raise ToolError(f"Invalid memory: {invalid_value(exc, arguments).message}") from exc
    except ProxyError as exc:
        await _rejected(res, tenant, who, memory.id, tool="update_memory",
                        code=exc.code)
        raise ToolError(exc.message) from exc
    try:
        await res.store.update(updated, audit=_event(res, tenant, who, "edited",
                                                     memory.id, tool="update_memory"))
    except KeyError as exc:  # deleted meanwhile
        raise ToolError(f"No memory {memory_id!r} for this user.") from exc
    return updated.to_api()


async def delete_memory(memory_id: str, ctx: Context,
                        user: str | None = None) -> dict[str, Any]:
    """Delete one of the user's memories for good (it is not learned again)."""
    res = _resources(ctx)
    me = _owner(res, ctx.headers, user)
    tenant, who = me.tenant, me.user
    deleted = await res.store.delete(tenant, who, memory_id, audit=_event(
        res, tenant, who, "deleted", memory_id, tool="delete_memory"))
    if not deleted:
        raise ToolError(f"No memory {memory_id!r} for this user.")
    return {"id": memory_id, "object": "memory.deleted", "deleted": True}


async def get_profile(ctx: Context, user: str | None = None) -> dict[str, Any]:
    """The user's profile: summary, traits and interests learned over time, and the
    facts always in their context (the same object as ``GET /v1/profile``)."""
    res = _resources(ctx)
    me = _owner(res, ctx.headers, user)
    found = await user_profile(res, me)
    await res.store.audit([_event(res, me.tenant, me.user, "viewed", tool="get_profile")])
    return found


TOOL_FUNCTIONS = (search_memories, add_memory, update_memory, delete_memory, get_profile)


def build_server() -> MCPServer:
    """The MCP server with the five memory tools (names and descriptions from the
    functions above)."""
    server: MCPServer = MCPServer(name="memory-proxy", instructions=INSTRUCTIONS)
    for tool in TOOL_FUNCTIONS:
        server.add_tool(tool)
    return server


async def _edited(res: Resources, memory: Memory, patch: MemoryPatch) -> Memory:
    """``memory`` with the fields of ``patch`` replaced, cleaned and checked as ``PATCH
    /v1/memories/{id}`` does (re-embedded when its content changed). Raises
    :class:`InvalidRequestError`."""
    updated = memory.with_changes(**text_changes(patch, memory))
    check_manual(updated, res.scrubbers.for_tenant(memory.tenant))
    if updated.content != memory.content:
        embedding = await embed_manual(res, memory.tenant, memory.user_id or "",
                                       updated.content)
        updated = replace(updated, **vector_fields(res, embedding))
    now = res.clock()
    return updated.with_changes(updated_at=now, last_seen_at=now)


def session_manager() -> StreamableHTTPSessionManager:
    """A session manager for a new server with the memory tools: stateless, JSON
    responses, no DNS-rebinding allow-lists (see the module docstring)."""
    server = build_server()
    # The SDK's Starlette app is not mounted (the route and the lifespan are the gateway's
    # own); it is built for the session manager it configures.
    server.streamable_http_app(
        json_response=True, stateless_http=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    return server.session_manager
