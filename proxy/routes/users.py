"""The end user's own records: who they are, their profile, their learning switches, and
"forget me". Scoped to the caller's (tenant, user) like the memory API
(:mod:`proxy.routes.owner`).

- ``GET /v1/me`` → ``{"object": "identity", "tenant", "user", "role", "learning"}`` (no
  user needed: ``user`` is null for app and admin keys without ``X-User-Id``); a global
  admin's answer also lists ``tenants`` (those the configuration names)
- ``DELETE /v1/me?confirm=true`` → erase everything about the user
- ``GET /v1/profile`` → names, first/last seen, style, impression, traits and topics with
  their decayed scores now, and the resident facts with hits and timeline
- ``GET``/``PATCH /v1/settings`` ``{"personal_learning", "learning_indicator"}``
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.errors import InvalidRequestError
from proxy.memory.records import Memory, Profile, to_iso
from proxy.memory.store import AuditEvent, UserSettings
from proxy.resources import Resources
from proxy.routes.json import json_response
from proxy.routes.owner import Owner, caller, learning_state, owner
from proxy.routes.shapes import (
    ConfirmParams,
    Erased,
    IdentityOut,
    ProfileOut,
    UserParams,
    UserSettingsOut,
    UserSettingsPatch,
    parse_body,
    parse_query,
    read_json,
)

# Audit events read to build the facts' timelines (newest first): a user's last ~50-200
# learning batches.
TIMELINE_EVENTS = 2_000


def settings_api(settings: UserSettings) -> dict[str, Any]:
    """The user's switches under their wire names (docs/design.md#user-control)."""
    return {"object": "settings", "personal_learning": settings.enable_personal_learning,
            "learning_indicator": settings.show_learning_indicator}


def configured_tenants(res: Resources) -> list[str]:
    """The tenants ``config.yaml`` names (``auth.keys``, ``auth.admin_keys``,
    ``auth.jwt.tenants``), sorted: the list a global admin picks a tenant from."""
    auth = res.settings.auth
    named = {k.tenant for k in auth.keys} | {k.tenant for k in auth.admin_keys}
    if auth.jwt is not None:
        named.update(auth.jwt.tenants)
    return sorted(named)


async def whoami(request: Request) -> Response:
    """``GET /v1/me``: the caller's tenant, user (or null), role and learning switches."""
    res: Resources = request.app.state.resources
    parse_query(request, UserParams)
    identity = res.keyring.identify(request.headers)
    if identity.is_global_admin:  # no tenant, no user, no end-user route
        return json_response({
            "object": "identity", "tenant": identity.tenant, "user": None,
            "role": identity.role, "learning": await learning_state(res, None, None),
            "tenants": configured_tenants(res),
        })
    principal, user = caller(request, res, dict(request.query_params))
    settings = None if user is None else \
        await res.store.get_user_settings(principal.tenant, user)
    return json_response({
        "object": "identity", "tenant": principal.tenant, "user": user,
        "role": principal.role,
        "learning": await learning_state(res, principal.tenant, settings),
    })


async def get_settings(request: Request) -> Response:
    res: Resources = request.app.state.resources
    parse_query(request, UserParams)
    me = owner(request, res, dict(request.query_params), reads="query")
    return json_response(settings_api(await res.store.get_user_settings(me.tenant, me.user)))


async def patch_settings(request: Request) -> Response:
    """``PATCH /v1/settings``: change either switch; audited ``settings_changed``.
    ``personal_learning: false`` → nothing of this user is queued or learned from then on
    (chat answers carry ``X-Memory-Learning: off``)."""
    res: Resources = request.app.state.resources
    raw = await read_json(request)
    patch = parse_body(raw, UserSettingsPatch)
    if patch.personal_learning is None and patch.learning_indicator is None:
        raise InvalidRequestError("Send personal_learning and/or learning_indicator.",
                                  param="personal_learning", code="missing_required_parameter")
    me = owner(request, res, {**request.query_params, **raw})
    current = await res.store.get_user_settings(me.tenant, me.user)
    updated = UserSettings(
        enable_personal_learning=current.enable_personal_learning
        if patch.personal_learning is None else patch.personal_learning,
        show_learning_indicator=current.show_learning_indicator
        if patch.learning_indicator is None else patch.learning_indicator,
        cleared_at=current.cleared_at,
    )
    if updated != current:
        await res.store.put_user_settings(me.tenant, me.user, updated)
        await res.store.audit([me.audit(res, "settings_changed", detail={
            k: v for k, v in settings_api(updated).items() if k != "object"})])
        if not updated.enable_personal_learning and res.queue is not None:
            await res.sink.flush()
            await res.queue.forget_user(me.tenant, me.user)  # nothing buffered is learned
    return json_response(settings_api(updated))


def _timeline(events: list[tuple[int, AuditEvent]]) -> dict[str, list[dict[str, Any]]]:
    by_memory: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _, event in reversed(events):  # oldest first
        if event.memory_id:
            by_memory[event.memory_id].append({
                "at": to_iso(event.at), "action": event.action, "actor": event.actor,
                "reason": event.reason})
    return by_memory


def profile_api(res: Resources, user: str, profile: Profile | None, facts: list[Memory],
                events: list[tuple[int, AuditEvent]]) -> dict[str, Any]:
    """The ``GET /v1/profile`` body (also the export's ``profile``)."""
    shown = profile.to_api(res.clock()) if profile is not None else {
        "names": [], "first_seen": None, "last_seen": None, "message_count": 0,
        "style": "", "impression": "", "traits": [], "topics": []}
    timeline = _timeline(events)
    return {
        "object": "profile", "user": user,
        **{k: shown[k] for k in ("names", "first_seen", "last_seen", "message_count",
                                 "style", "impression", "traits", "topics")},
        "facts": [{
            "id": m.id, "title": m.title, "content": m.content, "category": m.category,
            "subcategory": m.subcategory, "hits": m.hits, "created_at": to_iso(m.created_at),
            "last_seen_at": to_iso(m.last_seen_at), "timeline": timeline.get(m.id, []),
        } for m in facts],
    }


async def user_profile(res: Resources, me: Owner) -> dict[str, Any]:
    profile = await res.store.get_profile(me.tenant, me.user)
    facts = await res.store.resident(me.tenant, me.user,
                                     limit=res.settings.memory.resident_facts, channels=None)
    events = await res.store.audit_log(me.tenant, me.user, limit=TIMELINE_EVENTS)
    return profile_api(res, me.user, profile, facts, events)


async def get_profile(request: Request) -> Response:
    """``GET /v1/profile``: traits and topics carry ``effective_score`` (score × 0.9 per
    week since last seen, computed now: docs/design.md#traits); ``facts`` are the resident
    facts (docs/design.md#injection) with their audit timeline, oldest event first."""
    res: Resources = request.app.state.resources
    parse_query(request, UserParams)
    me = owner(request, res, dict(request.query_params), reads="query")
    return json_response(await user_profile(res, me))


async def erase_me(request: Request) -> Response:
    """``DELETE /v1/me?confirm=true``: forget the user (docs/design.md#erasure). Pending
    turns are written out; the queue forgets the user's fingerprints, buffers, lines in
    group buffers and every queued job naming them
    (:meth:`~proxy.learning.queue.LearningQueue.erase_user`, with the display names bound
    to them); usage rows and buffered injection records are
    deleted; then
    :meth:`~proxy.memory.store.MemoryStore.erase_user` removes everything else, keeps one
    content-free marker and one ``erased`` audit event, and purges the files. 400 without
    ``confirm=true``."""
    res: Resources = request.app.state.resources
    params = parse_query(request, ConfirmParams)
    me = owner(request, res, dict(request.query_params), reads="query")
    if not params.confirm:
        raise InvalidRequestError(
            "Erasing everything about the user needs explicit confirmation: add "
            "?confirm=true.", param="confirm", code="confirmation_required")
    profile = await res.store.get_profile(me.tenant, me.user)
    names = [*(profile.names if profile is not None else ()),
             *await res.store.names_of(me.tenant, me.user)]
    await res.sink.flush()
    res.sink.forget_seen()
    if res.queue is not None:
        await res.queue.erase_user(me.tenant, me.user, names=names)
    await res.usage.flush()
    await res.ledger.erase_user(me.tenant, me.user)
    res.memory.injections.forget(me.tenant, me.user)  # buffered records never land after
    deleted = await res.store.erase_user(me.tenant, me.user, audit=me.audit(res, "erased"))
    return json_response({"object": "identity.erased", "tenant": me.tenant, "user": me.user,
                          "memories_deleted": deleted})


openapi.register(
    openapi.Operation("GET", "/v1/me", "Who the caller is (tenant, user, role, learning)",
                      auth="key", query=UserParams, response=IdentityOut, tags=("users",)),
    openapi.Operation("DELETE", "/v1/me", "Forget the user: erase everything about them "
                      "(needs confirm=true)", query=ConfirmParams, response=Erased,
                      tags=("users",)),
    openapi.Operation("GET", "/v1/profile", "The user's profile and resident facts",
                      query=UserParams, response=ProfileOut, tags=("users",)),
    openapi.Operation("GET", "/v1/settings", "The user's learning switches",
                      query=UserParams, response=UserSettingsOut, tags=("users",)),
    openapi.Operation("PATCH", "/v1/settings", "Change the user's learning switches",
                      body=UserSettingsPatch, response=UserSettingsOut, tags=("users",)),
)
