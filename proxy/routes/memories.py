"""The end user's memory API, scoped to the caller's (tenant, user).

The user is identified exactly as for chat (:func:`proxy.identity.resolve_user`): a user-
bound key, else the user header, else ``user`` in the body (POST) or query string (GET,
DELETE); an admin key may act for a user of its tenant (:mod:`proxy.routes.owner`). A
memory of another user or tenant is indistinguishable from a missing one (404). Query and
body parameters are validated by the models in :mod:`proxy.routes.shapes` (400 naming the
parameter).

- ``GET /v1/memories`` → ``{"object": "list", "data": [memory…], "first_id", "last_id",
  "has_more"}``; query: ``limit`` (1–500, default 100), ``after`` (cursor: the previous
  page's ``last_id``), ``offset``, ``category``, ``q`` (text search), ``enabled``,
  ``source``, ``scope`` (``personal``; ``shared``/``system``: the tenant's, read-only),
  ``include_retired`` (default false). Newest first; with ``q`` best match first, ranked
  as chat recall ranks (:mod:`proxy.memory.search`), ``last_id`` an opaque page token
- ``PATCH /v1/memories/{id}`` ``{title?, content?, category?, subcategory?, tags?,
  enabled?}`` → the memory (:func:`patch_memory`)
- ``GET /v1/memories/stats`` → counts and learning switches (:func:`memory_stats`)
- ``POST /v1/memories`` ``{"content", "title"?, "category"?, "subcategory"?, "tags"?,
  "created_at"?}`` (header ``X-Conversation-Id``: the memory's conversation)
  → 201 with the memory (``source: "manual"``; embedded when an embedder is configured,
  stored without a vector when it fails — ``has_embedding`` says which); at the per-user
  quota it makes room from retired, then learned memories, else 409
  ``memory_quota_exceeded`` (:func:`room_for`)
- ``GET /v1/memories/{id}`` → the memory
- ``DELETE /v1/memories/{id}`` → ``{"id", "object": "memory.deleted", "deleted": true}``
- ``DELETE /v1/memories?confirm=true`` → deletes all of the user's memories and profile
- ``POST /v1/memories/flush`` → 202: learn now from what the user's conversations buffered;
  with ``X-Memory-Channel: group`` and ``X-Memory-Group-Id`` (app and admin keys only: 403
  for a user-bound key or JWT), from what the group's chat buffered
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.errors import ConflictError, InvalidRequestError, NotFoundError, PermissionDeniedError
from proxy.identity import resolve_channel
from proxy.learning import quotas
from proxy.learning.exchange import group_namespace
from proxy.learning.filters import is_directive, pii_kinds
from proxy.learning.jobs import Flush, flush_job
from proxy.learning.pii import Scrubber
from proxy.memory.records import Memory, new_id, to_iso
from proxy.memory.search import is_page_token, search
from proxy.memory.store import ChangeSet, ListQuery
from proxy.memory.text import strip_invisible
from proxy.memory.titles import retitled, short_title
from proxy.memory.vectors import MemoryVectors
from proxy.resources import Resources
from proxy.routes.conflicts import release_partner, switch_in_pair
from proxy.routes.json import json_response
from proxy.routes.owner import Owner, learning_state, owner
from proxy.routes.params import check_memory_cursor, check_text
from proxy.routes.shapes import (
    MAX_PAGE,
    ConfirmParams,
    FlushQueued,
    ListParams,
    MemoriesCleared,
    MemoryDeleted,
    MemoryList,
    MemoryOut,
    MemoryPatch,
    MemoryStats,
    NewMemory,
    UserParams,
    given_time,
    parse_body,
    parse_query,
    read_json,
    request_conversation,
)
from proxy.settings import GLOBAL_NAMESPACE

# The fields of a memory a person writes, in the order a refusal names the first bad one.
MANUAL_FIELDS = ("title", "content", "subject", "subcategory", "tags")


def check_manual(memory: Memory, scrubber: Scrubber, *,
                 fields: Sequence[str] = MANUAL_FIELDS) -> None:
    """A memory a person writes meets the rules learned ones do, in every field it stores
    (``fields`` of :data:`MANUAL_FIELDS`; its tags one by one): statements, not orders,
    links or role markers (docs/design.md#memory-text-is-data), and no personal data or
    secrets (docs/design.md#privacy). Both checks see through full-width, look-alike and
    invisible-character spellings (:func:`~proxy.memory.text.detection_form`). The fields
    are read together first (a rule's words split between title and content count); only a
    refusal reads them one by one, to name the first that breaks a rule (``title``,
    ``tags.N``; ``content`` when only their sum does). Raises :class:`InvalidRequestError`
    (400 ``instruction_not_allowed`` / ``pii_not_allowed``)."""
    parts: list[tuple[str, str]] = []
    for name in fields:
        value = getattr(memory, name)
        if name == "title" and value == short_title(memory.content):
            continue  # cut from the content: no text of its own, and no field the writer gave
        if isinstance(value, str):
            parts.append((name, value))
        else:
            parts.extend((f"{name}.{i}", tag) for i, tag in enumerate(value))
    whole = "\n".join(text for _, text in parts)
    if is_directive(whole):
        param = next((name for name, text in parts if is_directive(text)), "content")
        raise InvalidRequestError(
            "A memory is a statement about the user, not an instruction to the assistant "
            "(no orders, no links). Rephrase it, e.g. 'Prefers short answers'.",
            param=param, code="instruction_not_allowed",
        )
    found = pii_kinds(scrubber, whole)
    if found:
        param = next((name for name, text in parts if pii_kinds(scrubber, text)), "content")
        raise InvalidRequestError(
            f"The memory contains personal data or a secret ({', '.join(sorted(found))}); "
            "memories never store it.", param=param, code="pii_not_allowed",
        )


def room_for(stored: list[Memory], adding: int, *, limit: int, now: datetime,
             param: str = "content") -> list[Memory]:
    """The memories to evict so that ``adding`` memories the user asks for fit within the
    per-user quota ``limit`` (``learning.max_memory_per_user``, 500: docs/design.md#quotas)
    beside the user's ``stored`` ones (retired and disabled included): retired, then
    learned ones (:func:`~proxy.learning.quotas.make_room`). Raises
    :class:`InvalidRequestError` (400 ``memory_quota_exceeded``) when ``adding`` alone
    exceeds the quota, and :class:`ConflictError` (409 ``memory_quota_exceeded``) when the
    user's own manual or imported memories leave no room."""
    if adding > limit:
        raise InvalidRequestError(
            f"{param}: {adding} new memories exceed the quota of {limit} memories per user "
            "(learning.max_memory_per_user); nothing was written.", param=param,
            code="memory_quota_exceeded")
    victims = quotas.make_room(stored, adding=adding, limit=limit, now=now)
    if victims is None:
        raise ConflictError(
            f"The quota of {limit} memories per user (learning.max_memory_per_user) is "
            f"reached: you have {len(stored)}, and {adding} more would not fit even after "
            "retired and learned memories make room. Delete some memories first; nothing "
            "was written.", param=param, code="memory_quota_exceeded")
    return victims


def _flag(request: Request, name: str) -> bool:
    """A boolean query parameter (absent = false). Raises :class:`InvalidRequestError` for
    anything but a boolean word (true/false, 1/0, yes/no, on/off)."""
    return bool(getattr(parse_query(request, ConfirmParams), name))


async def list_memories(request: Request) -> Response:
    """``GET /v1/memories``: the user's memories, newest first (:class:`ListParams`);
    ``after=<last_id>`` pages by cursor, ``offset`` still works. With ``q``: best match
    first, ranked as chat recall ranks (:func:`proxy.memory.search.search`), ``last_id``
    then an opaque page token for ``after``. ``scope=shared|system`` lists the tenant's
    memories of that scope that this user receives. Raises :class:`InvalidRequestError`
    (400, param ``after``) for a search's page token without its ``q``, or a cursor a
    search does not know."""
    res: Resources = request.app.state.resources
    params = parse_query(request, ListParams)
    me = owner(request, res, dict(request.query_params), reads="query")
    # System memories live in the global namespace every tenant receives
    # (docs/design.md#categories).
    query = ListQuery(
        tenant=GLOBAL_NAMESPACE if params.scope == "system" else me.tenant, user=me.user,
        include_retired=params.include_retired,
        category=params.category, text=params.q, limit=params.limit + 1,
        offset=params.offset, enabled=params.enabled, source=params.source,
        after=params.after, scope=params.scope,
    )
    if params.q:
        found = await search(res.memory.retriever, res.store,
                             replace(query, limit=params.limit), now=res.clock(),
                             embed_budget=res.settings.memory.embedder.timeout_seconds)
        return json_response({
            "object": "list", "data": [m.to_api() for m in found.memories],
            "first_id": found.memories[0].id if found.memories else None,
            "last_id": found.next_after, "has_more": found.has_more,
        })
    if is_page_token(params.after):
        raise InvalidRequestError("after: that cursor continues a search; send it with "
                                  "the same q.", param="after", code="invalid_value")
    check_memory_cursor(params.after)
    memories = await res.store.list_memories(query)
    page = memories[:params.limit]
    return json_response({
        "object": "list", "data": [m.to_api() for m in page],
        "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None,
        "has_more": len(memories) > params.limit,
    })


async def create_memory(request: Request) -> Response:
    res: Resources = request.app.state.resources
    raw = await read_json(request)
    if not isinstance(raw, dict):
        raise InvalidRequestError("The request body must be a JSON object with 'content'.",
                                  code="invalid_json")
    new = parse_body(raw, NewMemory)
    me = owner(request, res, raw, reads="body")
    memory = await add_manual(res, me, new, conversation=request_conversation(request))
    return json_response(memory.to_api(), status_code=201)


async def add_manual(res: Resources, me: Owner, new: NewMemory, *,
                     via: str = "api", conversation: str | None = None) -> Memory:
    """Store a manual memory for the caller ``me`` — cleaned, checked
    (:func:`check_manual`), embedded when an embedder is configured — with a ``created``
    audit event (``detail.via``: the surface it came from when not the REST API, e.g.
    ``mcp``); the user joins the tenant's users index (``Ledger.register_user``). At the
    per-user quota, retired then learned memories are evicted in the same write
    (:func:`room_for`). ``conversation`` (the request's conversation id) and
    ``new.created_at`` (default now; also its last sighting) give the memory the date and
    conversation the ranking's signals read, as for a learned one. Raises
    :class:`InvalidRequestError` (also for a ``created_at`` that is not ISO 8601 or lies
    beyond the clock skew allowed), and :class:`ConflictError` when only the user's own
    manual memories fill the quota."""
    tenant, user = me.tenant, me.user
    now = res.clock()
    created = given_time(new.created_at, "created_at", now=now) or now
    # Refused with a control character; stored without invisible characters (clean_text).
    content = clean_text(new.content, "content")
    if not content:
        raise InvalidRequestError("content: must not be blank", param="content",
                                  code="invalid_value")
    title = clean_text(new.title, "title")
    subject = clean_text(new.subject, "subject") or "user"
    subcategory = clean_text(new.subcategory, "subcategory")
    tags = [clean_text(t, "tags") for t in new.tags]
    memory = Memory(
        id=new_id(), tenant=tenant, user_id=user, content=content,
        title=title or short_title(content), category=new.category,
        subcategory=subcategory, tags=tuple(dict.fromkeys(t for t in tags if t)),
        subject=subject, source="manual", score=1.0, source_conversation_id=conversation,
        created_at=created, updated_at=now, last_seen_at=created,
    )
    # The subject is injected too ("About <subject>: …"), so it meets the same rules.
    check_manual(memory, res.scrubbers.for_tenant(tenant))
    evicted = await _make_room(res, tenant, user, now)
    embedding = await embed_manual(res, tenant, user, memory.content)
    if embedding is not None:  # no vector (embedder down) → stored all the same
        memory = memory.with_changes(**vector_fields(res, embedding))
    audit = me.audit(res, "created", memory.id, reason="manual",
                     detail={"via": via} if via != "api" else None)
    # In the tenant → users index (GET /v1/admin/users) like a user who chatted; first,
    # so a failure leaves nothing half-done (the memory is not written either).
    await res.ledger.register_user(tenant, user, now)
    if not evicted:
        await res.store.add(memory, audit=audit)
        return memory
    # Over quota: the memory and the evictions that make room for it in one write.
    await res.store.apply(ChangeSet(
        tenant=tenant, user_id=user, batch_key=f"manual:{memory.id}", upserts=(memory,),
        deletes=tuple(m.id for m in evicted),
        audit=(audit, *(me.audit(res, "evicted", m.id, reason="over quota")
                        for m in evicted))))
    return memory


async def _make_room(res: Resources, tenant: str, user: str, now: datetime) -> list[Memory]:
    """The evictions one more manual memory needs under the per-user quota
    (:func:`room_for`; the tenant's ``learning.max_memory_per_user``). Raises
    :class:`ConflictError` when only the user's own manual memories fill the quota."""
    limit = (await res.tenants.get(tenant)).learning.max_memory_per_user
    counts = await res.store.count(tenant, user)
    if quotas.held(counts) + 1 <= limit:  # the usual case: no listing needed
        return []
    return room_for(await all_memories(res, tenant, user), 1, limit=limit, now=now)


async def embed_manual(res: Resources, tenant: str, user: str,
                       text: str) -> tuple[float, ...] | None:
    """The vector of a manual memory's text (``None``: no embedder, or it failed)."""
    return (await embed_texts(res, [text], tenant=tenant, user=user)).get(text)


async def get_memory(request: Request) -> Response:
    res: Resources = request.app.state.resources
    me = owner(request, res, dict(request.query_params), reads="query")
    memory = await res.store.get(me.tenant, me.user, request.path_params["memory_id"])
    if memory is None:
        raise NotFoundError("No such memory.", param="memory_id", code="memory_not_found")
    return json_response(memory.to_api())


async def delete_memory(request: Request) -> Response:
    res: Resources = request.app.state.resources
    me = owner(request, res, dict(request.query_params), reads="query")
    memory_id = request.path_params["memory_id"]
    memory = await res.store.get(me.tenant, me.user, memory_id)
    deleted = await res.store.delete(me.tenant, me.user, memory_id,
                                     audit=me.audit(res, "deleted", memory_id))
    if not deleted:
        raise NotFoundError("No such memory.", param="memory_id", code="memory_not_found")
    if memory is not None:  # the other memory of its open conflict is held back no more
        await release_partner(res, memory)
    return json_response({"id": memory_id, "object": "memory.deleted", "deleted": True})


async def flush_learning(request: Request) -> Response:
    """``POST /v1/memories/flush``: learn now from whatever the user's conversations have
    buffered, instead of waiting for the batch size or the idle timeout. 202: queued."""
    res: Resources = request.app.state.resources
    body = await read_json(request)
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object (or empty).",
                                  code="invalid_type")
    tenant, user = _flushed(request, res, body)
    if not res.learning_enabled or res.queue is None:
        raise ConflictError("Learning is not enabled on this gateway (learning.enabled).",
                            code="learning_disabled")
    await res.sink.flush()
    job = flush_job(Flush(tenant, user), unique=new_id())
    await res.queue.enqueue(job.kind, job.id, job.payload, tenant=job.tenant)
    return json_response({"object": "memory.flush", "queued": True}, status_code=202)


def _flushed(request: Request, res: Resources, body: dict[str, Any]) -> tuple[str, str]:
    """The (tenant, learning namespace) a flush seals: the group's
    (:func:`~proxy.learning.exchange.group_namespace`) for a group channel, else the
    caller's user, named like everywhere else (header, body or query string). Raises
    :class:`PermissionDeniedError` (403) for a group flush by a user-bound key or JWT: its
    group turns are learned as its own, and a plain flush seals them."""
    channel, group = resolve_channel(request.headers, body, res.settings.identity)
    if channel != "group" or group is None:
        me = owner(request, res, {**request.query_params, **body})
        return me.tenant, me.user
    principal = res.keyring.authenticate(request.headers)
    if principal.bound_user is not None:
        raise PermissionDeniedError(
            "A user-bound key or JWT speaks only for its own user: its group turns are "
            "buffered as its own, so flush without the group channel header.",
            param=res.settings.identity.channel_header, code="group_flush_not_allowed")
    return principal.tenant, group_namespace(group)


async def clear_memories(request: Request) -> Response:
    res: Resources = request.app.state.resources
    me = owner(request, res, dict(request.query_params), reads="query")
    if not _flag(request, "confirm"):
        raise InvalidRequestError(
            "Deleting all memories needs explicit confirmation: add ?confirm=true.",
            param="confirm", code="confirmation_required",
        )
    count = await res.store.clear(me.tenant, me.user, audit=me.audit(res, "cleared"))
    if res.queue is not None:
        await res.queue.forget_user(me.tenant, me.user)
    return json_response({"object": "memory.cleared", "deleted": count})


# edit, stats ----------------------------------------------------------------------------

async def embed_texts(res: Resources, texts: list[str], *, tenant: str,
                      user: str) -> dict[str, tuple[float, ...]]:
    """text → vector with the configured embedder; ``{}`` without one or when it fails
    (memories are then stored without a vector, as for ``POST /v1/memories``)."""
    if res.embedder is None or not texts:
        return {}
    vectors = await MemoryVectors(
        res.embedder, ledger=res.ledger, clock=res.clock, metrics=res.metrics,
        timeout_seconds=res.settings.memory.embedder.timeout_seconds,
    ).embed(texts, tenant=tenant, user=user, source="manual")
    return {text: tuple(v) for text, v in (vectors or {}).items()}


def vector_fields(res: Resources, vector: tuple[float, ...] | None) -> dict[str, Any]:
    """A memory's vector fields: the vector and the id of the embedder that made it
    (``None`` for both when there is no vector), so recall never compares spaces."""
    model = res.embedder.model if vector is not None and res.embedder is not None else None
    return {"embedding": vector, "embedding_model": model}


def clean_text(value: str, param: str) -> str:
    """Memory text as stored, on every write path alike (``POST`` and ``PATCH
    /v1/memories``, import, the admin memory routes, MCP ``add_memory`` and
    ``update_memory``): a control character other than tab and line breaks is refused
    (:func:`~proxy.routes.params.check_text`: :class:`InvalidRequestError` naming
    ``param``, never silently dropped), then zero-width, bidi-control and other invisible
    characters are removed and outer whitespace trimmed."""
    return strip_invisible(check_text(value, param)).strip()


def recut_title(memory: Memory, changes: dict[str, Any]) -> None:
    """Add to ``changes`` (an edit that gives no title) the title
    :func:`~proxy.memory.titles.retitled` cuts again from a changed content, when it
    differs from ``memory``'s."""
    if "content" in changes:
        derived = retitled(memory.title, memory.content, str(changes["content"]))
        if derived != memory.title:
            changes["title"] = derived


def text_changes(patch: MemoryPatch, memory: Memory) -> dict[str, Any]:
    """The text fields ``patch`` really changes, cleaned as stored (``PATCH
    /v1/memories/{id}`` and MCP ``update_memory``). Raises :class:`InvalidRequestError`
    (400) for a blank content or a control character."""
    changes: dict[str, Any] = {}
    if patch.content is not None:
        content = clean_text(patch.content, "content")
        if not content:
            raise InvalidRequestError("content: must not be blank", param="content",
                                      code="invalid_value")
        if content != memory.content:
            changes["content"] = content
    title = None if patch.title is None else clean_text(patch.title, "title")
    if title is not None and title != memory.title:
        changes["title"] = title or short_title(changes.get("content", memory.content))
    elif title is None:
        recut_title(memory, changes)
    if patch.category is not None and patch.category != memory.category:
        changes["category"] = patch.category
    subcategory = None if patch.subcategory is None else clean_text(patch.subcategory,
                                                                    "subcategory")
    if subcategory is not None and subcategory != memory.subcategory:
        changes["subcategory"] = subcategory
    if patch.tags is not None:
        tags = tuple(dict.fromkeys(t for t in (clean_text(t, "tags") for t in patch.tags)
                                   if t))
        if tags != memory.tags:
            changes["tags"] = tags
    return changes


async def patch_memory(request: Request) -> Response:
    """``PATCH /v1/memories/{memory_id}`` :class:`MemoryPatch` → the memory. Text meets
    the manual-memory rules (400 ``instruction_not_allowed`` / ``pii_not_allowed``); a new
    content is embedded again (no vector when the embedder fails). Audited ``edited``, or
    ``disabled``/``enabled`` for the switch, with actor ``user`` (``admin`` for an admin
    key). 404 for a memory that is not the user's."""
    res: Resources = request.app.state.resources
    raw = await read_json(request)
    patch = parse_body(raw, MemoryPatch)
    me = owner(request, res, {**request.query_params, **raw})
    memory_id = request.path_params["memory_id"]
    memory = await res.store.get(me.tenant, me.user, memory_id)
    if memory is None:
        raise NotFoundError("No such memory.", param="memory_id", code="memory_not_found")
    changes = text_changes(patch, memory)
    edited = sorted(changes)
    if changes.keys() & set(MANUAL_FIELDS):  # a category alone reads no text
        check_manual(memory.with_changes(**changes), res.scrubbers.for_tenant(me.tenant))
    switched = patch.enabled is not None and patch.enabled != memory.enabled
    if not edited and not switched:
        return json_response(memory.to_api())
    if "content" in changes:
        vectors = await embed_texts(res, [changes["content"]], tenant=me.tenant,
                                    user=me.user)
        changes.update(vector_fields(res, vectors.get(changes["content"])))
    if switched:
        changes["enabled"] = patch.enabled
    updated = memory.with_changes(updated_at=res.clock(), **changes)
    events = []
    if edited:
        events.append(me.audit(res, "edited", memory_id, detail={"fields": edited}))
    if switched:
        events.append(me.audit(res, "enabled" if patch.enabled else "disabled", memory_id))

    async def write(record: Memory) -> None:
        try:
            await res.store.update(record, audit=events[0])
        except KeyError as exc:  # deleted between the read and the write
            raise NotFoundError("No such memory.", param="memory_id",
                                code="memory_not_found") from exc

    if switched:  # the other memory of an open conflict: held back by it, or no more
        updated = await switch_in_pair(res, updated, write)
    else:
        await write(updated)
    if len(events) > 1:
        await res.store.audit(events[1:])
    return json_response(updated.to_api())


async def all_memories(res: Resources, tenant: str, user: str) -> list[Memory]:
    """Every memory of the user, retired and disabled included, newest first (paged by
    cursor, :data:`~proxy.routes.shapes.MAX_PAGE` a page)."""
    out: list[Memory] = []
    after: str | None = None
    while True:
        page = await res.store.list_memories(ListQuery(
            tenant=tenant, user=user, include_retired=True, limit=MAX_PAGE, after=after))
        out.extend(page)
        if len(page) < MAX_PAGE:
            return out
        after = page[-1].id


async def memory_stats(request: Request) -> Response:
    """``GET /v1/memories/stats`` → :class:`~proxy.routes.shapes.MemoryStats`."""
    res: Resources = request.app.state.resources
    parse_query(request, UserParams)
    me = owner(request, res, dict(request.query_params), reads="query")
    memories = await all_memories(res, me.tenant, me.user)
    settings = await res.store.get_user_settings(me.tenant, me.user)
    live = [m for m in memories if m.superseded_at is None]
    learned = [m.last_seen_at for m in memories if m.source == "auto"]
    return json_response({
        "object": "memory.stats", "total": len(memories),
        "enabled": sum(1 for m in live if m.enabled),
        "disabled": sum(1 for m in live if not m.enabled),
        "retired": len(memories) - len(live),
        "by_category": dict(Counter(m.category for m in live)),
        "by_source": dict(Counter(m.source for m in live)),
        "last_learned_at": to_iso(max(learned)) if learned else None,
        "learning": await learning_state(res, me.tenant, settings),
    })


_ADD_DESCRIPTION = (
    "The request's X-Conversation-Id header (the identity settings' conversation_header) "
    "becomes the memory's source_conversation_id; created_at (ISO 8601, UTC without an "
    "offset; default now) dates it and may lie at most 5 minutes after the gateway's "
    "clock, else 400 with param created_at.")

_LIST_DESCRIPTION = (
    "Without q: newest first (by id); after=<last_id> continues below that memory, offset "
    "skips. With q: best match first, ranked as chat recall ranks memories (keyword BM25, "
    "and vector similarity when an embedder is configured), every filter applying; "
    "retired and disabled memories (when the filters ask for them) match by the words "
    "they contain. last_id is then an opaque page token: pass it as after with the same q "
    "(offset still skips); a token without its q, or a damaged one, is a 400 with param "
    "after.")

openapi.register(
    openapi.Operation("GET", "/v1/memories", "List the user's memories (newest first; "
                      "with q best match first)", query=ListParams, response=MemoryList,
                      tags=("memories",), description=_LIST_DESCRIPTION),
    openapi.Operation("POST", "/v1/memories", "Add a memory by hand", body=NewMemory,
                      response=MemoryOut, status=201, errors=(409,), tags=("memories",),
                      description=_ADD_DESCRIPTION),
    openapi.Operation("DELETE", "/v1/memories", "Delete all of the user's memories and "
                      "profile (needs confirm=true)", query=ConfirmParams,
                      response=MemoriesCleared, tags=("memories",)),
    openapi.Operation("POST", "/v1/memories/flush", "Learn now from what the user's "
                      "conversations buffered", query=UserParams, response=FlushQueued,
                      status=202, errors=(403, 409), tags=("memories",)),
    openapi.Operation("GET", "/v1/memories/stats", "Counts, last learning, learning "
                      "switches", query=UserParams, response=MemoryStats,
                      tags=("memories",)),
    openapi.Operation("GET", "/v1/memories/{memory_id}", "One memory", query=UserParams,
                      response=MemoryOut, errors=(404,), tags=("memories",)),
    openapi.Operation("PATCH", "/v1/memories/{memory_id}", "Edit, disable or enable a "
                      "memory", body=MemoryPatch, response=MemoryOut, errors=(404,),
                      tags=("memories",)),
    openapi.Operation("DELETE", "/v1/memories/{memory_id}", "Delete one memory",
                      query=UserParams, response=MemoryDeleted, errors=(404,),
                      tags=("memories",)),
)
