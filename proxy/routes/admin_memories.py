"""Organisation knowledge: shared and system memories, and promotion.

- ``GET`` / ``POST /v1/admin/memories?scope=shared|system`` — list (newest first, cursor
  ``after``) or create. Shared memories belong to the admin key's tenant and are injected
  for every user of it; system memories live in the reserved global namespace
  (:data:`~proxy.settings.GLOBAL_NAMESPACE`) that every tenant's recall reads, and are
  written only with a global admin key (a tenant admin key may list them).
- ``PATCH`` / ``DELETE /v1/admin/memories/{id}`` — edit (text, category, tags, enabled) or
  delete one: the tenant's shared memory for a tenant admin key, a system memory for a
  global admin key.
- ``POST /v1/admin/memories/{id}/promote`` with ``X-User-Id: <owner>`` — the owner's
  personal memory becomes shared: a shared copy (tag ``promoted-from:<id>``, same source,
  evidence and conversation) is stored, the personal one is retired with reason
  ``promoted`` (``superseded_by`` = the copy), so it is never injected twice. A memory
  that reads as a fact about its owner ("Is allergic to hazelnuts", "My manager is
  Dana": :func:`~proxy.memory.sharing.about_owner`) is refused, 400 ``memory_about_user``
  (``param`` ``memory_id``), and stays personal: shared, it would be injected for every
  user as if about them (docs/design.md#promotion).

Every text meets the manual-memory rules (no instructions or links, no personal data or
secrets: 400 ``instruction_not_allowed`` / ``pii_not_allowed``), promoted ones too; new
text is embedded when an embedder is configured. Audited with actor ``admin``:
``created``, ``edited``, ``enabled``/``disabled``, ``deleted``, ``promoted``.
"""

from __future__ import annotations

from dataclasses import replace

from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.errors import InvalidRequestError, NotFoundError, PermissionDeniedError
from proxy.memory.records import Memory, new_id
from proxy.memory.sharing import about_owner
from proxy.memory.store import AuditEvent, ListQuery
from proxy.memory.titles import short_title
from proxy.resources import Resources
from proxy.routes import admin_models as m
from proxy.routes.admin_scope import Admin, caller
from proxy.routes.governance import body, ok, query
from proxy.routes.json import json_response
from proxy.routes.memories import (
    check_manual,
    clean_text,
    embed_texts,
    recut_title,
    vector_fields,
)
from proxy.settings import GLOBAL_NAMESPACE

# What the manual-memory rules read of a shared or system memory: its subject is no one's.
ADMIN_FIELDS = ("title", "content", "subcategory", "tags")

PROMOTED_TAG = "promoted-from:"  # tag of shared copies made by earlier versions: dropped


def _space(request: Request, scope: str | None, admin: Admin | None = None) -> tuple[
        Resources, str, str, str]:
    """``(resources, tenant of the space, scope, actor)`` for the caller (``admin`` when the
    route authenticated it already). A global key works on system memories only, a tenant
    key on its shared memories (and reads system ones). Raises 403 otherwise."""
    admin = admin or caller(request, global_use="system")
    if admin.is_global:
        if scope not in (None, "system"):
            raise PermissionDeniedError("A global admin key manages system memories; "
                                        "shared ones belong to a tenant's admin key.",
                                        code="tenant_admin_required")
        return admin.res, GLOBAL_NAMESPACE, "system", admin.actor
    return admin.res, admin.tenant, scope or "shared", admin.actor


def _writable(scope: str, tenant: str) -> None:
    if scope == "system" and tenant != GLOBAL_NAMESPACE:
        raise PermissionDeniedError("System memories are written only with a global admin "
                                    "key (auth.global_admin_keys).",
                                    code="global_admin_required")


def _event(tenant: str, action: str, memory_id: str | None, at: object, *,
           reason: str = "", detail: dict[str, object] | None = None,
           user: str | None = None) -> AuditEvent:
    return AuditEvent(tenant=tenant, user_id=user, action=action,  # type: ignore[arg-type]
                      actor="admin", at=at, memory_id=memory_id,  # type: ignore[arg-type]
                      reason=reason, detail=detail or {})


async def _vector(res: Resources, text: str, tenant: str) -> tuple[float, ...] | None:
    vectors = await embed_texts(res, [text], tenant=tenant, user="")
    return vectors.get(text)


def _not_found() -> NotFoundError:
    return NotFoundError("No such memory in this space.", param="memory_id",
                         code="memory_not_found")


async def list_admin_memories(request: Request) -> Response:
    """``GET /v1/admin/memories`` (:class:`~proxy.routes.admin_models.AdminMemoryList`)."""
    admin = caller(request, global_use="system")  # a missing key is 401 before a bad query
    q = query(m.AdminMemoriesQuery, request)
    res, tenant, scope, _ = _space(request, q.scope, admin)
    if scope == "system":
        tenant = GLOBAL_NAMESPACE
    found = await res.store.list_memories(ListQuery(
        tenant=tenant, user="", scope=scope, include_retired=q.include_retired,  # type: ignore[arg-type]
        limit=q.limit + 1, after=q.after))
    page = found[:q.limit]
    return json_response({"object": "list", "data": [x.to_api() for x in page],
                          "first_id": page[0].id if page else None,
                          "last_id": page[-1].id if page else None,
                          "has_more": len(found) > q.limit})


async def create_admin_memory(request: Request) -> Response:
    """``POST /v1/admin/memories`` → 201 with the memory (``source: "system"`` for system
    memories, ``"manual"`` for shared ones)."""
    new = await body(m.NewAdminMemory, request)
    asked = new.scope or request.query_params.get("scope") or None
    if asked not in (None, "shared", "system"):
        raise InvalidRequestError("scope is 'shared' or 'system'.", param="scope",
                                  code="invalid_value")
    res, tenant, scope, actor = _space(request, asked)
    _writable(scope, tenant)
    content, title = clean_text(new.content, "content"), clean_text(new.title, "title")
    subcategory = clean_text(new.subcategory, "subcategory")
    tags = [clean_text(x, "tags") for x in new.tags]
    if not content:
        raise InvalidRequestError("content: must not be blank", param="content",
                                  code="invalid_value")
    now = res.clock()
    memory = Memory(
        id=new_id(), tenant=tenant, user_id=None, content=content,
        title=title or short_title(content), scope=scope,  # type: ignore[arg-type]
        category=new.category, subcategory=subcategory,
        tags=tuple(dict.fromkeys(t for t in tags if t)),
        source="system" if scope == "system" else "manual",
        score=1.0, created_at=now, updated_at=now, last_seen_at=now,
    )
    check_manual(memory, res.scrubbers.for_tenant(tenant), fields=ADMIN_FIELDS)
    memory = replace(memory, **vector_fields(res, await _vector(res, content, tenant)))
    await res.store.add(memory, audit=_event(tenant, "created", memory.id, now,
                                             reason=scope, detail={"by": actor}))
    return json_response(memory.to_api(), status_code=201)


async def patch_admin_memory(request: Request) -> Response:
    """``PATCH /v1/admin/memories/{id}`` → the memory (404 outside the caller's space)."""
    patch = await body(m.AdminMemoryPatch, request)
    res, tenant, scope, actor = _space(request, None)
    memory = await res.store.get(tenant, None, request.path_params["memory_id"])
    if memory is None or memory.scope != scope:
        raise _not_found()
    changes: dict[str, object] = {}
    for name in ("content", "title", "subcategory"):
        value = getattr(patch, name)
        cleaned = None if value is None else clean_text(value, name)
        if cleaned is not None and cleaned != getattr(memory, name):
            changes[name] = cleaned
    if changes.get("content") == "":
        raise InvalidRequestError("content: must not be blank", param="content",
                                  code="invalid_value")
    if patch.title is None:
        recut_title(memory, changes)
    if patch.category is not None and patch.category != memory.category:
        changes["category"] = patch.category
    if patch.tags is not None:
        tags = tuple(dict.fromkeys(t for t in (clean_text(x, "tags") for x in patch.tags)
                                   if t))
        if tags != memory.tags:
            changes["tags"] = tags
    if changes.keys() & set(ADMIN_FIELDS):  # a category alone reads no text
        check_manual(memory.with_changes(**changes), res.scrubbers.for_tenant(tenant),
                     fields=ADMIN_FIELDS)
    if "content" in changes:
        changes.update(vector_fields(res, await _vector(res, str(changes["content"]), tenant)))
    switched = patch.enabled is not None and patch.enabled != memory.enabled
    if not changes and not switched:
        return json_response(memory.to_api())
    now = res.clock()
    events = []
    if changes:
        events.append(_event(tenant, "edited", memory.id, now,
                             detail={"by": actor, "fields": sorted(set(changes) - {
                                 "embedding", "embedding_model"})}))
    if switched:
        changes["enabled"] = patch.enabled
        events.append(_event(tenant, "enabled" if patch.enabled else "disabled",
                             memory.id, now, detail={"by": actor}))
    updated = memory.with_changes(updated_at=now, **changes)
    try:
        await res.store.update(updated, audit=events[0])
    except KeyError as exc:
        raise _not_found() from exc
    if len(events) > 1:
        await res.store.audit(events[1:])
    return json_response(updated.to_api())


async def delete_admin_memory(request: Request) -> Response:
    """``DELETE /v1/admin/memories/{id}`` → ``{"id", "object": "memory.deleted",
    "deleted": true}`` (404 outside the caller's space)."""
    res, tenant, scope, actor = _space(request, None)
    memory_id = request.path_params["memory_id"]
    memory = await res.store.get(tenant, None, memory_id)
    if memory is None or memory.scope != scope:
        raise _not_found()
    deleted = await res.store.delete_shared(tenant, memory_id, audit=_event(
        tenant, "deleted", memory_id, res.clock(), reason=scope, detail={"by": actor}))
    if not deleted:
        raise _not_found()
    return ok(m.AdminMemoryDeleted(id=memory_id, deleted=True))


async def promote(request: Request) -> Response:
    """``POST /v1/admin/memories/{id}/promote`` (``X-User-Id``: the owner) → 201 with the
    shared copy. 400 without the owner, when the text breaks the manual-memory rules or
    reads as a fact about its owner (``memory_about_user``), 404 when the owner has no
    such active memory, 403 for a global admin key."""
    res, tenant, _, actor = _space(request, "shared")
    owner = request.headers.get(res.settings.identity.user_header) or \
        query(m.PromoteQuery, request).user
    if not owner:
        raise InvalidRequestError(
            f"Name the memory's owner: send header {res.settings.identity.user_header}.",
            param=res.settings.identity.user_header, code="missing_user")
    memory_id = request.path_params["memory_id"]
    personal = await res.store.get(tenant, owner, memory_id)
    if personal is None or not personal.active:
        raise NotFoundError("The user has no active memory with that id.",
                            param="memory_id", code="memory_not_found")
    # The personal memory passed the learning filters for its owner; shared, it reaches
    # every user of the tenant, so personal data is checked again, and it must not read
    # as a fact about whoever is asking (docs/design.md#promotion).
    check_manual(personal, res.scrubbers.for_tenant(tenant), fields=ADMIN_FIELDS)
    _general(personal)
    now = res.clock()
    # The shared copy names no owner, conversation or personal memory id (every user of
    # the tenant reads it); the link is kept in the two ``promoted`` audit events only.
    shared = personal.with_changes(
        id=new_id(), user_id=None, scope="shared", source_channel=None,
        source_conversation_id=None,
        tags=tuple(t for t in personal.tags if not t.startswith(PROMOTED_TAG)),
        created_at=now, updated_at=now, access_count=0, last_access_at=None)
    detail: dict[str, object] = {"by": actor, "owner": owner, "from_memory": personal.id,
                                 "shared_memory": shared.id}
    await res.store.add(shared, audit=_event(tenant, "promoted", shared.id, now,
                                             reason="promoted to shared", detail=detail))
    retired = personal.with_changes(superseded_at=now, superseded_by=shared.id,
                                    supersede_reason="promoted", updated_at=now)
    try:
        await res.store.update(retired, audit=_event(
            tenant, "promoted", personal.id, now, reason="promoted", detail=detail,
            user=owner))
    except KeyError as exc:  # deleted meanwhile: the shared copy goes too
        await res.store.delete_shared(tenant, shared.id)
        raise NotFoundError("The user deleted that memory meanwhile.", param="memory_id",
                            code="memory_not_found") from exc
    return json_response(shared.to_api(), status_code=201)


def _general(personal: Memory) -> None:
    """Raise 400 ``memory_about_user`` (``param`` ``memory_id``) when ``personal`` reads
    as a fact about its owner (:func:`proxy.memory.sharing.about_owner`)."""
    why = about_owner(content=personal.content, title=personal.title,
                      subject=personal.subject)
    if why is not None:
        raise InvalidRequestError(
            f"This memory reads as a fact about its owner ({why}): shared, every user's "
            "prompt would present it as a fact about them. Only general knowledge is "
            "promoted; to share what it says, create a shared memory in general words "
            "with POST /v1/admin/memories (e.g. 'The office is closed on Fridays').",
            param="memory_id", code="memory_about_user")


openapi.register(
    openapi.Operation("GET", "/v1/admin/memories", "Shared or system memories",
                      auth="admin", query=m.AdminMemoriesQuery,
                      response=m.AdminMemoryList, tags=("admin",)),
    openapi.Operation("POST", "/v1/admin/memories", "Create a shared (tenant admin key) or "
                      "system (global admin key) memory", auth="admin",
                      body=m.NewAdminMemory, response=m.AdminMemory, status=201,
                      tags=("admin",)),
    openapi.Operation("PATCH", "/v1/admin/memories/{memory_id}", "Edit, disable or enable "
                      "a shared or system memory", auth="admin", body=m.AdminMemoryPatch,
                      response=m.AdminMemory, errors=(404,), tags=("admin",)),
    openapi.Operation("DELETE", "/v1/admin/memories/{memory_id}", "Delete a shared or "
                      "system memory", auth="admin", response=m.AdminMemoryDeleted,
                      errors=(404,), tags=("admin",)),
    openapi.Operation("POST", "/v1/admin/memories/{memory_id}/promote", "Promote a user's "
                      "memory (X-User-Id or ?user=: the owner) to shared", auth="admin",
                      query=m.PromoteQuery, response=m.AdminMemory, status=201,
                      errors=(400, 404), tags=("admin",)),
)
