"""Export and import of one user's memory (issue 12): portable, round-trippable.

- ``GET /v1/memories/export?format=json|markdown``: JSON ``{"object": "memory.export",
  "version", "exported_at", "user", "memories" (retired included, every SPEC §4 field but
  the vector), "profile", "settings"}``; Markdown: a ``MEMORY.md`` grouped by category,
  retired facts in an "Archive" section with dates and reasons.
- ``POST /v1/memories/import``: our export JSON, or mem0's ``get_all`` answer
  (``{"results": [{"memory", "metadata", "created_at", …}]}``) →
  ``{"imported", "merged", "rejected": [{"index", "reason"}]}``.

Import rules: each item meets the manual-memory rules (a rejected item is listed with its
reason, the others go on); ids are new, ``superseded_by`` is remapped within the import;
an item whose normalised content equals one of the user's memories (active with active,
retired with retired) is merged as evidence (``hits`` added, last seen moved forward);
every accepted item is written in one atomic :meth:`~proxy.memory.store.MemoryStore.apply`
(nothing half-written), audited ``imported``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.errors import InvalidRequestError
from proxy.memory.records import CATEGORIES, Memory, from_iso, new_id, to_iso
from proxy.memory.store import AuditEvent, ChangeSet
from proxy.memory.text import normalize
from proxy.resources import Resources
from proxy.routes.json import json_response
from proxy.routes.memories import (
    all_memories,
    check_manual,
    clean_text,
    embed_texts,
    vector_fields,
)
from proxy.routes.owner import Owner, owner
from proxy.routes.shapes import (
    ExportedMemory,
    ExportOut,
    ExportParams,
    ImportBody,
    ImportResult,
    invalid,
    parse_body,
    parse_query,
    read_json,
)
from proxy.routes.users import settings_api, user_profile

EXPORT_VERSION = 1
# Items one import may carry: four times the per-user memory quota (seed 000 §6: 500).
MAX_IMPORT_ITEMS = 2_000


async def export_memories(request: Request) -> Response:
    res: Resources = request.app.state.resources
    params = parse_query(request, ExportParams)
    me = owner(request, res, dict(request.query_params))
    memories = await all_memories(res, me.tenant, me.user)
    now = res.clock()
    if params.format == "markdown":
        return Response(_markdown(me.user, memories, now), media_type="text/markdown",
                        headers={"content-disposition": 'attachment; filename="MEMORY.md"'})
    settings = await res.store.get_user_settings(me.tenant, me.user)
    return json_response({
        "object": "memory.export", "version": EXPORT_VERSION, "exported_at": to_iso(now),
        "user": me.user, "memories": [m.to_api() for m in memories],
        "profile": await user_profile(res, me), "settings": settings_api(settings),
    })


def _day(value: datetime | None) -> str:
    return value.date().isoformat() if value is not None else "?"


def _markdown(user: str, memories: list[Memory], now: datetime) -> str:
    """``MEMORY.md``: one section per category (oldest first), then the Archive."""
    lines = [f"# Memory of {user}", "", f"Exported {to_iso(now)}.", ""]
    live = [m for m in reversed(memories) if m.superseded_at is None]
    for category in CATEGORIES:
        chosen = [m for m in live if m.category == category]
        if not chosen:
            continue
        lines += [f"## {category}", ""]
        for m in chosen:
            tags = f" — tags: {', '.join(m.tags)}" if m.tags else ""
            off = " (disabled)" if not m.enabled else ""
            lines.append(f"- **{m.title}**{off}: {m.content} — since {_day(m.created_at)}, "
                         f"seen {m.hits}×, last {_day(m.last_seen_at)}{tags}")
        lines.append("")
    retired = [m for m in reversed(memories) if m.superseded_at is not None]
    if retired:
        lines += ["## Archive", ""]
        for m in retired:
            reason = f": {m.supersede_reason}" if m.supersede_reason else ""
            lines.append(f"- ~~{m.content}~~ — from {_day(m.created_at)} to "
                         f"{_day(m.superseded_at)}, retired{reason}")
        lines.append("")
    return "\n".join(lines)


def _from_mem0(item: Any) -> dict[str, Any]:
    """One mem0 ``get_all`` result as our item: ``memory`` → content, ``source: manual``,
    category from ``metadata.category`` when it is one of ours, else user_preference."""
    if not isinstance(item, dict):
        return {}
    metadata = item.get("metadata") if isinstance(item.get("metadata"), dict) else {}
    category = metadata.get("category") if isinstance(metadata, dict) else None
    out: dict[str, Any] = {
        "content": item.get("memory"), "source": "manual",
        "category": category if category in CATEGORIES else "user_preference",
    }
    for key in ("id", "created_at"):
        if item.get(key) is not None:
            out[key] = item[key]
    if item.get("updated_at") is not None:
        out["last_seen_at"] = item["updated_at"]
    return out


def _time(value: str | None, field: str) -> datetime | None:
    if value is None:
        return None
    try:
        return from_iso(value)
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"{field}: not an ISO 8601 time", param=field,
                                  code="invalid_value") from exc


def _accept(res: Resources, me: Owner, raw: Any, now: datetime) -> Memory:
    """Our memory for one import item (new id). Raises :class:`InvalidRequestError` with
    the rule it breaks."""
    if not isinstance(raw, dict):
        raise InvalidRequestError("an item must be an object", code="invalid_type")
    try:
        item = ExportedMemory.model_validate(raw)
    except ValidationError as exc:
        raise invalid(exc) from exc
    content, title = clean_text(item.content), clean_text(item.title)
    subject = clean_text(item.subject) or "user"
    if not content:
        raise InvalidRequestError("content: must not be blank", param="content",
                                  code="invalid_value")
    check_manual(f"{title}\n{content}\n{subject}", res.scrubbers.for_tenant(me.tenant))
    created = _time(item.created_at, "created_at") or now
    return Memory(
        id=new_id(), tenant=me.tenant, user_id=me.user, content=content,
        title=title or content[:30], category=item.category,
        subcategory=clean_text(item.subcategory),
        tags=tuple(dict.fromkeys(t for t in (clean_text(t) for t in item.tags) if t)),
        subject=subject, source="auto" if item.source == "auto" else "manual",
        source_conversation_id=item.source_conversation_id,
        source_channel=item.source_channel, score=min(item.score, 1.0),
        enabled=item.enabled, hits=item.hits, created_at=created,
        updated_at=_time(item.updated_at, "updated_at") or now,
        last_seen_at=_time(item.last_seen_at, "last_seen_at") or created,
        superseded_at=_time(item.superseded_at, "superseded_at"),
        superseded_by=item.superseded_by,  # the old id: remapped once all are read
        supersede_reason=item.supersede_reason,
    )


def _items(body: ImportBody) -> list[Any]:
    """The items to import, as our export's memory objects."""
    if body.memories is not None:
        items: list[Any] = list(body.memories)
    elif body.results is not None:
        items = [_from_mem0(r) for r in body.results]
    else:
        raise InvalidRequestError(
            "Send our export ({\"object\": \"memory.export\", \"memories\": [...]}) or "
            "mem0's get_all answer ({\"results\": [...]}).", param="memories",
            code="missing_required_parameter")
    if len(items) > MAX_IMPORT_ITEMS:
        raise InvalidRequestError(f"memories: at most {MAX_IMPORT_ITEMS} items an import.",
                                  param="memories", code="too_many_items")
    return items


async def import_memories(request: Request) -> Response:
    res: Resources = request.app.state.resources
    raw = await read_json(request)
    body = parse_body(raw, ImportBody)
    me = owner(request, res, {**request.query_params, **raw})
    items = _items(body)
    now = res.clock()
    batch = f"import:{new_id()}"
    existing: dict[tuple[str, bool], Memory] = {}
    for memory in await all_memories(res, me.tenant, me.user):
        existing.setdefault((normalize(memory.content), memory.superseded_at is not None),
                            memory)
    rejected: list[dict[str, Any]] = []
    created: dict[str, Memory] = {}
    merged: dict[str, Memory] = {}
    old_ids: dict[str, str] = {}
    audit: list[AuditEvent] = []
    for index, item in enumerate(items):
        try:
            memory = _accept(res, me, item, now)
        except InvalidRequestError as exc:
            rejected.append({"index": index, "reason": exc.code or exc.message,
                             "message": exc.message})
            continue
        key = (normalize(memory.content), memory.superseded_at is not None)
        twin = existing.get(key)
        if twin is not None:
            twin = merged.get(twin.id) or created.get(twin.id) or twin
            grown = twin.with_changes(hits=twin.hits + memory.hits,
                                      last_seen_at=max(twin.last_seen_at,
                                                       memory.last_seen_at),
                                      updated_at=now)
            # No evidence pair: the store counts one hit per pair, while an import adds the
            # item's own count (the upsert's hits, kept as the larger of stored and given).
            (created if twin.id in created else merged)[twin.id] = grown
            audit.append(me.audit(res, "imported", twin.id, reason="merged"))
            target = twin.id
        else:
            created[memory.id] = memory
            existing[key] = memory
            audit.append(me.audit(res, "imported", memory.id, reason="created"))
            target = memory.id
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            old_ids[item["id"]] = target
    for memory_id, memory in created.items():
        if memory.superseded_by is not None:
            created[memory_id] = memory.with_changes(
                superseded_by=old_ids.get(memory.superseded_by))
    vectors = await embed_texts(res, [m.content for m in created.values() if m.active],
                                tenant=me.tenant, user=me.user)
    upserts = [m.with_changes(**vector_fields(res, vectors.get(m.content))) if m.active else m
               for m in created.values()] + list(merged.values())
    if upserts:
        await res.store.apply(ChangeSet(
            tenant=me.tenant, user_id=me.user, batch_key=batch, upserts=tuple(upserts),
            audit=tuple(audit)))
    return json_response({
        "object": "memory.import", "imported": len(created),
        "merged": len(items) - len(created) - len(rejected),
        "rejected": rejected,
    })


openapi.register(
    openapi.Operation("GET", "/v1/memories/export", "Export the user's memory (JSON, or "
                      "MEMORY.md with format=markdown)", query=ExportParams,
                      response=ExportOut, alternative_media=("text/markdown",),
                      tags=("memories",)),
    openapi.Operation("POST", "/v1/memories/import", "Import our export or mem0's get_all "
                      "JSON", body=ImportBody, response=ImportResult, tags=("memories",)),
)
