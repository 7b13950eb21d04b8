"""Export and import of one user's memory: portable, round-trippable.

- ``GET /v1/memories/export?format=json|markdown``: JSON ``{"object": "memory.export",
  "version", "exported_at", "user", "memories" (retired included, every record field but
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
(nothing half-written), audited ``imported``. The per-item checks run in a worker thread
(:func:`_prepare`), so the event loop serves other requests meanwhile. Under the per-user
quota (``learning.max_memory_per_user``), the same write evicts retired, then learned
memories to make room; an import bringing more new memories than the quota is a 400, one
that only the user's own manual memories block a 409, both ``memory_quota_exceeded``
with nothing written (:func:`~proxy.routes.memories.room_for`).

The retirement links must hold together, or the whole import is a 400 (``param``
``memories.<index>.<field>``) and nothing is written: ``superseded_by`` names another item
of the import (by its ``id``) or a memory the user already has — never the item itself,
never a cycle (``a`` → ``b`` → ``a``, also one closed by two items merging into one), never
an unknown id or another user's memory — and comes with a ``superseded_at`` that is not
earlier than ``created_at``; ids are unique within the import. An item whose successor is
rejected by the rules keeps its retirement without the link.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from dataclasses import dataclass
from dataclasses import field as _field
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.errors import InvalidRequestError
from proxy.memory.categories import CATEGORIES
from proxy.memory.records import Memory, new_id, to_iso
from proxy.memory.store import AuditEvent, ChangeSet
from proxy.memory.text import normalize
from proxy.memory.titles import short_title
from proxy.resources import Resources
from proxy.routes.json import json_response
from proxy.routes.memories import (
    all_memories,
    check_manual,
    clean_text,
    embed_texts,
    room_for,
    vector_fields,
)
from proxy.routes.owner import Owner, owner
from proxy.routes.shapes import (
    ExportedMemory,
    ExportOut,
    ExportParams,
    ImportBody,
    ImportResult,
    given_time,
    invalid,
    parse_body,
    parse_query,
    read_json,
    request_conversation,
)
from proxy.routes.users import settings_api, user_profile

EXPORT_VERSION = 1
# Items one import may carry: four times the per-user memory quota (500).
MAX_IMPORT_ITEMS = 2_000
# Imports whose checks run at once (worker threads): more wait their turn, so a burst of
# imports cannot take every thread of the default executor (DNS, file reads) or all CPUs.
_IMPORT_SLOTS = 2
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = \
    weakref.WeakKeyDictionary()


def _import_slots() -> asyncio.Semaphore:
    """The running loop's semaphore of :data:`_IMPORT_SLOTS` (one per loop: a semaphore
    is bound to the loop it first waits on)."""
    return _slots.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(_IMPORT_SLOTS))


async def export_memories(request: Request) -> Response:
    res: Resources = request.app.state.resources
    params = parse_query(request, ExportParams)
    me = owner(request, res, dict(request.query_params), reads="query")
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
    """``value`` (ISO 8601) as a UTC time. Raises :class:`InvalidRequestError` for text
    that is not one, or a time UTC cannot hold (``0001-01-01T00:00:00+14:00``)."""
    return given_time(value, field)


def _link_error(field: str, index: int, name: str, message: str) -> InvalidRequestError:
    """A 400 naming item ``index``'s ``name`` (``memories.3.superseded_by``)."""
    param = f"{field}.{index}.{name}"
    return InvalidRequestError(f"{param}: {message}", param=param, code="invalid_value")


def _parsed_time(value: Any) -> datetime | None:
    """``value`` as a time, ``None`` when absent or not an ISO 8601 time (such an item is
    rejected by its own checks)."""
    if not isinstance(value, str):
        return None
    try:
        return _time(value, "")
    except InvalidRequestError:
        return None


def _cycle(links: dict[str, str]) -> list[str] | None:
    """The first cycle of ``links`` (id → successor id) in key order, as the ids on it
    (``[a, b]`` for a → b → a), or ``None``."""
    done: set[str] = set()
    for start in links:
        path: list[str] = []
        on_path: set[str] = set()
        node: str | None = start
        while node is not None and node in links and node not in done:
            if node in on_path:
                return path[path.index(node):]
            path.append(node)
            on_path.add(node)
            node = links[node]
        done.update(path)
    return None


def check_links(items: list[Any], field: str, stored: set[str]) -> None:
    """Refuse an import whose retirement links do not hold together (module docstring):
    raises :class:`InvalidRequestError` naming the item and field. ``stored``: the ids of
    the user's own memories."""
    position: dict[str, int] = {}
    for index, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            if item["id"] in position:
                raise _link_error(field, index, "id",
                                  f"the id is also item {position[item['id']]}'s; ids "
                                  "must be unique within an import")
            position[item["id"]] = index
    links: dict[str, str] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        target, own = item.get("superseded_by"), item.get("id")
        retired_at = _parsed_time(item.get("superseded_at"))
        created_at = _parsed_time(item.get("created_at"))
        if retired_at is not None and created_at is not None and retired_at < created_at:
            raise _link_error(field, index, "superseded_at",
                              f"{item['superseded_at']} is earlier than created_at "
                              f"{item['created_at']}")
        if not isinstance(target, str):
            continue
        if item.get("superseded_at") is None:
            raise _link_error(field, index, "superseded_at",
                              "an item with superseded_by must say when it was retired")
        if target == own:
            raise _link_error(field, index, "superseded_by",
                              "an item cannot be superseded by itself")
        if target not in position and target not in stored:
            raise _link_error(field, index, "superseded_by",
                              f"{target!r} is neither the id of an item of this import "
                              "nor one of your memories")
        if isinstance(own, str) and target in position:
            links[own] = target
    cycle = _cycle(links)
    if cycle is not None:
        first = min(cycle, key=lambda item_id: position[item_id])
        start = cycle.index(first)
        order = [position[i] for i in cycle[start:] + cycle[:start]]
        chain = " → ".join(f"item {i}" for i in [*order, order[0]])
        raise _link_error(field, position[first], "superseded_by",
                          f"the superseded_by links form a cycle: {chain}")


def _accept(me: Owner, raw: Any, now: datetime,
            conversation: str | None = None) -> Memory:
    """Our memory for one import item (new id), its fields validated and cleaned (the
    manual-memory rules are checked by the caller, :func:`_check`). An item naming no
    ``source_conversation_id`` takes ``conversation`` (the request's). Raises
    :class:`InvalidRequestError` with the rule it breaks (a ``created_at`` beyond the
    allowed clock skew after ``now`` is one)."""
    if not isinstance(raw, dict):
        raise InvalidRequestError("an item must be an object", code="invalid_type")
    try:
        item = ExportedMemory.model_validate(raw)
    except ValidationError as exc:
        raise invalid(exc, raw) from exc
    content, title = clean_text(item.content, "content"), clean_text(item.title, "title")
    subject = clean_text(item.subject, "subject") or "user"
    subcategory = clean_text(item.subcategory, "subcategory")
    tags = [clean_text(t, "tags") for t in item.tags]
    if not content:
        raise InvalidRequestError("content: must not be blank", param="content",
                                  code="invalid_value")
    given = {name: _time(getattr(item, name), name)
             for name in ("created_at", "updated_at", "last_seen_at", "superseded_at")}
    given_time(item.created_at, "created_at", now=now)  # not beyond the clock skew
    # Without created_at: the earliest time the item gives (never after its own retirement
    # or last sighting), else now.
    created = given["created_at"] or min(
        (t for t in given.values() if t is not None), default=now)
    return Memory(
        id=new_id(), tenant=me.tenant, user_id=me.user, content=content,
        title=title or short_title(content), category=item.category,
        subcategory=subcategory, tags=tuple(dict.fromkeys(t for t in tags if t)),
        subject=subject, source="auto" if item.source == "auto" else "manual",
        source_conversation_id=item.source_conversation_id or conversation,
        source_channel=item.source_channel, score=min(item.score, 1.0),
        enabled=item.enabled, hits=item.hits, created_at=created,
        updated_at=given["updated_at"] or now,
        last_seen_at=given["last_seen_at"] or created,
        superseded_at=given["superseded_at"],
        superseded_by=item.superseded_by,  # the old id: remapped once all are read
        supersede_reason=item.supersede_reason,
    )


def _check(res: Resources, me: Owner, memory: Memory) -> None:
    """The manual-memory rules (:func:`~proxy.routes.memories.check_manual`) on what an
    item would store. Raises :class:`InvalidRequestError`."""
    check_manual(memory, res.scrubbers.for_tenant(me.tenant))


def _items(body: ImportBody) -> tuple[list[Any], str]:
    """The items to import, as our export's memory objects, and the body field that holds
    them (``memories`` or mem0's ``results``)."""
    field = "memories"
    if body.memories is not None:
        items: list[Any] = list(body.memories)
    elif body.results is not None:
        items, field = [_from_mem0(r) for r in body.results], "results"
    else:
        raise InvalidRequestError(
            "Send our export ({\"object\": \"memory.export\", \"memories\": [...]}) or "
            "mem0's get_all answer ({\"results\": [...]}).", param="memories",
            code="missing_required_parameter")
    if len(items) > MAX_IMPORT_ITEMS:
        raise InvalidRequestError(f"{field}: at most {MAX_IMPORT_ITEMS} items an import.",
                                  param=field, code="too_many_items")
    return items, field


@dataclass
class _Prepared:
    """What one import would write, worked out off the event loop (:func:`_prepare`)."""

    created: dict[str, Memory] = _field(default_factory=dict)
    merged: dict[str, Memory] = _field(default_factory=dict)
    rejected: list[dict[str, Any]] = _field(default_factory=list)
    audit: list[AuditEvent] = _field(default_factory=list)
    indexes: dict[str, int] = _field(default_factory=dict)  # new id → its item's index


def _prepare(res: Resources, me: Owner, items: list[Any], *, field_name: str,
             stored: list[Memory], now: datetime,
             conversation: str | None = None) -> _Prepared:
    """Check, clean and deduplicate every item against the user's ``stored`` memories:
    pure CPU (the manual-memory rules scan each item's text: about 2 ms per 1,000
    characters, bench/import_latency.py), so :func:`import_memories` runs it in a worker
    thread. Raises :class:`InvalidRequestError` for broken retirement links."""
    check_links(items, field_name, {memory.id for memory in stored})
    existing: dict[tuple[str, bool], Memory] = {}
    for memory in stored:
        existing.setdefault((normalize(memory.content), memory.superseded_at is not None),
                            memory)
    out = _Prepared()
    created, merged = out.created, out.merged
    old_ids: dict[str, str] = {}
    for index, item in enumerate(items):
        try:
            memory = _accept(me, item, now, conversation)
            key = (normalize(memory.content), memory.superseded_at is not None)
            twin = existing.get(key)
            if twin is None:
                # Only text that will be stored is checked: an item that merges into a
                # memory the user has (or an earlier item) adds to its hits, its own text
                # is not kept — so re-importing an export costs no text scan.
                _check(res, me, memory)
        except InvalidRequestError as exc:
            out.rejected.append({"index": index, "reason": exc.code or exc.message,
                                 "message": exc.message})
            continue
        if twin is not None:
            twin = merged.get(twin.id) or created.get(twin.id) or twin
            grown = twin.with_changes(hits=twin.hits + memory.hits,
                                      last_seen_at=max(twin.last_seen_at,
                                                       memory.last_seen_at),
                                      updated_at=now)
            # No evidence pair: the store counts one hit per pair, while an import adds the
            # item's own count (the upsert's hits, kept as the larger of stored and given).
            (created if twin.id in created else merged)[twin.id] = grown
            out.audit.append(me.audit(res, "imported", twin.id, reason="merged"))
            target = twin.id
        else:
            created[memory.id] = memory
            out.indexes[memory.id] = index
            existing[key] = memory
            out.audit.append(me.audit(res, "imported", memory.id, reason="created"))
            target = memory.id
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            old_ids[item["id"]] = target
    stored_ids = {memory.id for memory in stored}
    for memory_id, memory in created.items():
        if memory.superseded_by is not None:
            # An item of the import (its new id, or the memory it merged into), else one of
            # the user's stored memories (check_links); a rejected successor: no link.
            successor = old_ids.get(memory.superseded_by) or (
                memory.superseded_by if memory.superseded_by in stored_ids else None)
            created[memory_id] = memory.with_changes(superseded_by=successor)
    _check_merged_links(created, out.indexes, field_name)
    return out


async def import_memories(request: Request) -> Response:
    res: Resources = request.app.state.resources
    raw = await read_json(request)
    body = parse_body(raw, ImportBody)
    me = owner(request, res, {**request.query_params, **raw})
    items, field_name = _items(body)
    conversation = request_conversation(request)
    now = res.clock()
    batch = f"import:{new_id()}"
    stored = await all_memories(res, me.tenant, me.user)
    # Off the event loop (a 2,000-item import of 4,000-character texts is seconds of CPU):
    # chat and /healthz are served meanwhile; nothing is written until it is all decided.
    async with _import_slots():
        prepared = await asyncio.to_thread(functools.partial(
            _prepare, res, me, items, field_name=field_name, stored=stored, now=now,
            conversation=conversation))
    created, merged = prepared.created, prepared.merged
    limit = (await res.tenants.get(me.tenant)).learning.max_memory_per_user
    evicted = room_for(stored, len(created), limit=limit, now=now, param=field_name)
    audit = [*prepared.audit, *(me.audit(res, "evicted", m.id, reason="over quota")
                                for m in evicted)]
    vectors = await embed_texts(res, [m.content for m in created.values() if m.active],
                                tenant=me.tenant, user=me.user)
    upserts = [m.with_changes(**vector_fields(res, vectors.get(m.content))) if m.active else m
               for m in created.values()] + list(merged.values())
    if upserts:
        # Listed by GET /v1/admin/users like a user who chatted (before the write: a
        # failure here leaves nothing written).
        await res.ledger.register_user(me.tenant, me.user, now)
        await res.store.apply(ChangeSet(
            tenant=me.tenant, user_id=me.user, batch_key=batch, upserts=tuple(upserts),
            deletes=tuple(m.id for m in evicted), audit=tuple(audit)))
    return json_response({
        "object": "memory.import", "imported": len(created),
        "merged": len(items) - len(created) - len(prepared.rejected),
        "rejected": prepared.rejected,
    })


def _check_merged_links(created: dict[str, Memory], indexes: dict[str, int],
                        field: str) -> None:
    """Refuse links that close on themselves once duplicates are merged (item 0 superseded
    by item 1 whose content is item 0's: both are one memory). Raises
    :class:`InvalidRequestError` naming the first item on such a cycle."""
    links = {m.id: m.superseded_by for m in created.values()
             if m.superseded_by is not None and m.superseded_by in created}
    cycle = _cycle(links)
    if cycle is None:
        return
    first = min(cycle, key=lambda memory_id: indexes[memory_id])
    param = f"{field}.{indexes[first]}.superseded_by"
    raise InvalidRequestError(
        f"{param}: once items with the same content are merged into one memory, the "
        "superseded_by links form a cycle (a memory superseded by itself)", param=param,
        code="invalid_value")


openapi.register(
    openapi.Operation("GET", "/v1/memories/export", "Export the user's memory (JSON, or "
                      "MEMORY.md with format=markdown)", query=ExportParams,
                      response=ExportOut, alternative_media=("text/markdown",),
                      tags=("memories",)),
    openapi.Operation("POST", "/v1/memories/import", "Import our export or mem0's get_all "
                      "JSON", body=ImportBody, response=ImportResult, errors=(409,),
                      tags=("memories",), description=(
                          "Items naming no source_conversation_id take the request's "
                          "X-Conversation-Id header; mem0's created_at and updated_at are "
                          "kept. An item whose created_at lies more than 5 minutes after "
                          "the gateway's clock is rejected (invalid_value).")),
)
