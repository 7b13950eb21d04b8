"""Explainable replies (docs/design.md#injection-records): what memory went into a reply,
and what recall would inject now.

- ``GET /v1/memories/injections/{id}`` → the injection record a reply's
  ``X-Memory-Injection-Id`` header names: ``{"id", "created_at", "request": {"model",
  "conversation_id", "channel"}, "items": [{"kind": "memory"|"profile", "memory_id" |
  "field", "rank", "score", "reasons"}]}`` — ids, fields and scores, never text or the
  prompt. The user, their app key naming them, or an admin key of the tenant naming them
  (``X-User-Id``) may read it; another user's record, one older than
  ``memory.injection_retention_days`` or one dropped by the per-user cap is a 404.
- ``POST /v1/memories/preview`` ``{"messages", "model"?}`` (identity and conversation
  headers as for chat) → ``{"object": "memory.preview", "status", "request", "items"}``:
  the items recall would inject for these messages now. Nothing changes: no model call,
  no access counters, no learning, no usage row, no injection record.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.errors import InvalidRequestError, NotFoundError
from proxy.identity import resolve_identity
from proxy.memory.explain import api_items
from proxy.request import parse_chat_body
from proxy.resources import Resources
from proxy.routes.json import json_response
from proxy.routes.owner import owner
from proxy.routes.shapes import UserParams, parse_body, read_json

# A record id is a ULID (proxy.memory.records.new_id): 26 Crockford base-32 characters.
_RECORD_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


class InjectedItem(BaseModel):
    kind: Literal["memory", "profile"]
    memory_id: str | None = Field(default=None, description="kind memory: the memory's id")
    field: str | None = Field(default=None, description="kind profile: style, impression, "
                              "traits[i] or topics[i] (i: the tag's index in the profile)")
    rank: int = Field(description="1 = first in injection order (profile, then facts)")
    score: float = Field(description="a fact's final ranking score; a resident fact's "
                         "quality score; a profile tag's effective score (1 for style "
                         "and impression)")
    reasons: list[Literal["keyword", "vector", "resident", "date", "conversation"]]


class InjectionRequest(BaseModel):
    model: str
    conversation_id: str | None
    channel: str


class InjectionOut(BaseModel):
    id: str
    created_at: str
    request: InjectionRequest
    items: list[InjectedItem]


class PreviewIn(BaseModel):
    messages: list[dict[str, Any]] = Field(min_length=1,
                                           description="chat messages, as for chat")
    model: str | None = Field(default=None, min_length=1, description="a configured model "
                              "(its context window sets the budget); default the first")


class PreviewOut(BaseModel):
    object: Literal["memory.preview"]
    status: str = Field(description="as X-Memory-Status: injected, empty, off, degraded…")
    request: InjectionRequest
    items: list[InjectedItem]


async def get_injection(request: Request) -> Response:
    """``GET /v1/memories/injections/{id}``. A record of the caller's still waiting in
    this process's buffer (a reply of the last second) is written first, so the id a reply
    just carried is found. Raises :class:`NotFoundError` (404 ``injection_not_found``) for
    an id that is not the caller's user's, is malformed, expired, was dropped by the
    per-user cap, or waits in another replica's buffer (written within about a second)."""
    res: Resources = request.app.state.resources
    me = owner(request, res, dict(request.query_params))
    injection_id = request.path_params["injection_id"]
    record = None
    if _RECORD_ID.fullmatch(injection_id):
        log = res.memory.injections
        since = res.clock() - log.keeping.retention
        record = await res.store.get_injection(me.tenant, me.user, injection_id, since=since)
        if record is None and log.holds(me.tenant, me.user, injection_id):
            await log.flush(res.store, res.clock())
            record = await res.store.get_injection(me.tenant, me.user, injection_id,
                                                   since=since)
    if record is None:
        raise NotFoundError("No such injection record (a reply's record is written about a "
                            "second after it and kept "
                            f"{res.settings.memory.injection_retention_days} days).",
                            param="injection_id", code="injection_not_found")
    return json_response(record.to_api())


async def preview(request: Request) -> Response:
    """``POST /v1/memories/preview``: recall for ``messages`` as chat would, without the
    model and without writing anything. Raises :class:`InvalidRequestError` (400) for a
    body that is not ``{"messages", "model"?}`` or bad identity headers, and
    :class:`NotFoundError` (404 ``model_not_found``) for an unknown model."""
    res: Resources = request.app.state.resources
    raw = await read_json(request)
    body = parse_body(raw, PreviewIn)
    me = owner(request, res, raw)
    model = body.model or next(iter(res.registry.names), None)
    if model is None:
        raise InvalidRequestError("No model is configured; name one in 'model'.",
                                  param="model", code="model_not_found")
    chat = parse_chat_body({**raw, "model": model})
    identity = resolve_identity(me.principal, request.headers, chat.body, chat.messages,
                                res.settings.identity)
    route = res.registry.route(model)
    injection = await res.memory.prepare(identity, chat, route, count_access=False,
                                         explain_only=True)
    return json_response({
        "object": "memory.preview", "status": injection.status,
        "request": {"model": model, "conversation_id": identity.conversation,
                    "channel": identity.channel},
        "items": api_items(injection.items),
    })


openapi.register(
    openapi.Operation("GET", "/v1/memories/injections/{injection_id}",
                      "Which memories and profile fields went into a reply (the id of "
                      "its X-Memory-Injection-Id header)", query=UserParams,
                      response=InjectionOut, errors=(404,), tags=("memories",),
                      description="Ids, profile fields, ranks, scores and reasons; never "
                      "memory text or the prompt. Kept memory.injection_retention_days "
                      "(default 7) and at most memory.injections_per_user (default 1000, "
                      "oldest dropped); a tenant may switch records off "
                      "(memory.record_injections)."),
    openapi.Operation("POST", "/v1/memories/preview", "What recall would inject for these "
                      "messages now (nothing is changed or recorded)", body=PreviewIn,
                      response=PreviewOut, errors=(404,), tags=("memories",)),
)
