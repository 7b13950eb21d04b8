"""The end user's memory API, scoped to the caller's (tenant, user).

The user is identified exactly as for chat (:func:`proxy.identity.resolve_user`): a user-
bound key, else the user header, else ``user`` in the body (POST) or query string (GET,
DELETE). A memory of another user or tenant is indistinguishable from a missing one (404).

- ``GET /v1/memories`` → ``{"object": "list", "data": [memory…], "has_more"}``;
  query: ``limit`` (1–500, default 100), ``offset``, ``category``, ``q`` (text search),
  ``include_retired`` (default false)
- ``POST /v1/memories`` ``{"content", "title"?, "category"?, "subcategory"?, "tags"?}``
  → 201 with the memory (``source: "manual"``; embedded when an embedder is configured,
  stored without a vector when it fails — ``has_embedding`` says which)
- ``GET /v1/memories/{id}`` → the memory
- ``DELETE /v1/memories/{id}`` → ``{"id", "object": "memory.deleted", "deleted": true}``
- ``DELETE /v1/memories?confirm=true`` → deletes all of the user's memories and profile
- ``POST /v1/memories/flush`` → 202: learn now from what the user's conversations buffered
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import ConflictError, InvalidRequestError, NotFoundError
from proxy.identity import resolve_user
from proxy.learning.filters import is_directive, pii_kinds
from proxy.learning.pii import Scrubber
from proxy.memory.records import MAX_CONTENT_CHARS, MAX_TITLE_CHARS, Memory, new_id
from proxy.memory.store import AuditEvent, ListQuery
from proxy.memory.text import strip_invisible
from proxy.memory.vectors import MemoryVectors
from proxy.resources import Resources
from proxy.routes.json import json_response


class NewMemory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    title: str = Field(default="", max_length=MAX_TITLE_CHARS)
    category: Literal["user_preference", "business", "technical", "organizational",
                      "domain"] = "user_preference"
    subcategory: str = Field(default="", max_length=60)
    tags: list[str] = Field(default_factory=list, max_length=20)
    subject: str = Field(default="user", max_length=120)
    user: str | None = None  # accepted like the chat body's ``user``


def _check_manual(text: str, scrubber: Scrubber) -> None:
    """Manual memories meet the rules learned ones do: statements, not orders, links or
    role markers (case B30), and no personal data or secrets (case B28). Both checks see
    through full-width, look-alike and invisible-character spellings
    (:func:`~proxy.memory.text.detection_form`). Raises :class:`InvalidRequestError`
    (400 ``instruction_not_allowed`` / ``pii_not_allowed``)."""
    if is_directive(text):
        raise InvalidRequestError(
            "A memory is a statement about the user, not an instruction to the assistant "
            "(no orders, no links). Rephrase it, e.g. 'Prefers short answers'.",
            param="content", code="instruction_not_allowed",
        )
    found = pii_kinds(scrubber, text)
    if found:
        raise InvalidRequestError(
            f"The memory contains personal data or a secret ({', '.join(sorted(found))}); "
            "memories never store it.", param="content", code="pii_not_allowed",
        )


def _owner(request: Request, res: Resources, source: dict[str, Any]) -> tuple[str, str]:
    principal = res.keyring.authenticate(request.headers)
    user, _ = resolve_user(principal, request.headers, source, res.settings.identity)
    if user is None:
        raise InvalidRequestError(
            f"Identify the end user: send header {res.settings.identity.user_header} "
            "(or 'user' in the body / query string).",
            param=res.settings.identity.user_header, code="missing_user",
        )
    return principal.tenant, user


def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"'{name}' must be an integer.", param=name) from exc
    if not low <= value <= high:
        raise InvalidRequestError(f"'{name}' must be between {low} and {high}.", param=name)
    return value


_TRUE, _FALSE = frozenset({"1", "true", "yes"}), frozenset({"", "0", "false", "no"})


def _flag(request: Request, name: str) -> bool:
    """A boolean query parameter (absent = false). Raises :class:`InvalidRequestError` for
    anything but 1/0, true/false, yes/no."""
    raw = request.query_params.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise InvalidRequestError(f"'{name}' must be true or false (got {raw[:40]!r}).",
                              param=name, code="invalid_value")


def _audit(tenant: str, user: str, action: str, memory_id: str | None, *, res: Resources,
           reason: str = "") -> AuditEvent:
    return AuditEvent(tenant=tenant, user_id=user, action=action,  # type: ignore[arg-type]
                      actor="user", at=res.clock(), memory_id=memory_id, reason=reason)


async def list_memories(request: Request) -> Response:
    res: Resources = request.app.state.resources
    tenant, user = _owner(request, res, dict(request.query_params))
    limit = _int(request, "limit", 100, 1, 500)
    offset = _int(request, "offset", 0, 0, 1_000_000)
    memories = await res.store.list_memories(ListQuery(
        tenant=tenant, user=user, include_retired=_flag(request, "include_retired"),
        category=request.query_params.get("category") or None,
        text=request.query_params.get("q") or None, limit=limit + 1, offset=offset,
    ))
    return json_response({
        "object": "list", "data": [m.to_api() for m in memories[:limit]],
        "has_more": len(memories) > limit,
    })


async def create_memory(request: Request) -> Response:
    res: Resources = request.app.state.resources
    try:
        raw = orjson.loads(await request.body() or b"null")
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError("The request body is not valid JSON.",
                                  code="invalid_json") from exc
    if not isinstance(raw, dict):
        raise InvalidRequestError("The request body must be a JSON object with 'content'.",
                                  code="invalid_json")
    try:
        new = NewMemory.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequestError(f"{param}: {first['msg']}", param=param,
                                  code="invalid_value") from exc
    tenant, user = _owner(request, res, raw)
    # Stored without zero-width, bidi-control and other invisible characters.
    content = strip_invisible(new.content).strip()
    if not content:
        raise InvalidRequestError("content: must not be blank", param="content",
                                  code="invalid_value")
    title = strip_invisible(new.title).strip()
    subject = strip_invisible(new.subject).strip() or "user"
    tags = (strip_invisible(t).strip() for t in new.tags)
    # The subject is injected too ("About <subject>: …"), so it meets the same rules.
    _check_manual(f"{title}\n{content}\n{subject}", res.scrubbers.for_tenant(tenant))
    now = res.clock()
    memory = Memory(
        id=new_id(), tenant=tenant, user_id=user, content=content,
        title=title or content[:30], category=new.category,
        subcategory=strip_invisible(new.subcategory).strip(),
        tags=tuple(dict.fromkeys(t for t in tags if t)),
        subject=subject, source="manual", score=1.0,
        created_at=now, updated_at=now, last_seen_at=now,
    )
    if res.embedder is not None:  # no vector (embedder down) → stored all the same
        vectors = await MemoryVectors(
            res.embedder, ledger=res.ledger, clock=res.clock, metrics=res.metrics,
            timeout_seconds=res.settings.memory.embedder.timeout_seconds,
        ).embed(
            [memory.content], tenant=tenant, user=user, source="manual")
        if vectors:
            memory = memory.with_changes(embedding=vectors[memory.content],
                                         embedding_model=res.embedder.model)
    audit = _audit(tenant, user, "created", memory.id, res=res, reason="manual")
    await res.store.add(memory, audit=audit)
    return json_response(memory.to_api(), status_code=201)


async def get_memory(request: Request) -> Response:
    res: Resources = request.app.state.resources
    tenant, user = _owner(request, res, dict(request.query_params))
    memory = await res.store.get(tenant, user, request.path_params["memory_id"])
    if memory is None:
        raise NotFoundError("No such memory.", param="memory_id", code="memory_not_found")
    return json_response(memory.to_api())


async def delete_memory(request: Request) -> Response:
    res: Resources = request.app.state.resources
    tenant, user = _owner(request, res, dict(request.query_params))
    memory_id = request.path_params["memory_id"]
    deleted = await res.store.delete(
        tenant, user, memory_id, audit=_audit(tenant, user, "deleted", memory_id, res=res)
    )
    if not deleted:
        raise NotFoundError("No such memory.", param="memory_id", code="memory_not_found")
    return json_response({"id": memory_id, "object": "memory.deleted", "deleted": True})


async def flush_learning(request: Request) -> Response:
    """``POST /v1/memories/flush``: learn now from whatever the user's conversations have
    buffered, instead of waiting for the batch size or the idle timeout. 202: queued."""
    res: Resources = request.app.state.resources
    raw = await request.body()
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError("The request body is not valid JSON.",
                                  code="invalid_json") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object (or empty).",
                                  code="invalid_type")
    # The user may be named like everywhere else: header, body, or query string.
    tenant, user = _owner(request, res, {**request.query_params, **body})
    if not res.learning_enabled or res.queue is None:
        raise ConflictError("Learning is not enabled on this gateway (learning.enabled).",
                            code="learning_disabled")
    await res.sink.flush()
    await res.queue.enqueue("flush", f"flush:{tenant}:{user}:{new_id()}",
                            orjson.dumps({"tenant": tenant, "user": user}))
    return json_response({"object": "memory.flush", "queued": True}, status_code=202)


async def clear_memories(request: Request) -> Response:
    res: Resources = request.app.state.resources
    tenant, user = _owner(request, res, dict(request.query_params))
    if not _flag(request, "confirm"):
        raise InvalidRequestError(
            "Deleting all memories needs explicit confirmation: add ?confirm=true.",
            param="confirm", code="confirmation_required",
        )
    count = await res.store.clear(tenant, user,
                                  audit=_audit(tenant, user, "cleared", None, res=res))
    if res.queue is not None:
        await res.queue.forget_user(tenant, user)
    return json_response({"object": "memory.cleared", "deleted": count})
