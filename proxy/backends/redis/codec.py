"""Records ↔ Redis values for the Redis backend (pure: no I/O).

A memory is one HASH. Its record fields (docs/design.md#memory-record) are stored under
their own names (optional ones absent when ``None``; times ISO 8601; ``tags`` JSON;
``enabled`` ``"1"``/``"0"``); the embedding is raw little-endian FLOAT32 bytes under
``emb_<n>``, ``n`` being its own dimension, so an index over ``emb_384`` never sees (and
never fails on) a 4-dimensional
vector. Fields named ``ix_*`` exist only for the search index:

- ``ix_id``: the memory id again, as a sortable tag (``id`` would clash with the key
  that RedisVL reports as ``id``);
- ``ix_tenant`` / ``ix_user`` / ``ix_ns``: digest tokens (:mod:`proxy.backends.redis.keys`);
  ``ix_user`` is ``"shared"`` for memories with no user;
- ``ix_active`` (enabled and not retired), ``ix_retired``, ``ix_about`` (subject is the
  user): ``"1"``/``"0"``; ``ix_chan``: digest of ``source_channel`` (absent when none);
- ``ix_terms``: :func:`proxy.memory.text.index_terms` of title + content + tags
  (:func:`proxy.memory.titles.indexed_text`: a title cut from the content left out) as
  :func:`stemmed_terms` (the terms SQLite's tokenizer would index), present only while the
  memory is active — like the SQLite keyword index, which holds active
  memories only, so BM25 statistics cover the same documents in both backends;
- ``ix_last_seen`` / ``ix_created``: epoch seconds (float).

Decoding ignores ``ix_*``; it reads what the record fields say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import numpy as np
import orjson

from proxy.backends.redis.keys import (
    SHARED_USER,
    channel_token,
    namespace_token,
    tenant_token,
    user_token,
)
from proxy.memory.records import ConversationRecord, Memory, from_iso, to_iso
from proxy.memory.store import AuditEvent, UserSettings
from proxy.memory.text import index_terms, normalize, stemmed_terms
from proxy.memory.titles import indexed_text

DOC_VERSION = "1"  # layout of a memory hash; a new layout bumps it and rewrites documents
EMBEDDING_FIELD_PREFIX = "emb_"
VECTOR_MODEL_FIELD = "vector_model"  # the embedder model id of the emb_<n> vector
# Stream entry ids are "<ms>-<seq>"; the integer audit id is ms × 1000 + seq. One stream
# gets fewer than 1000 entries in one millisecond (an apply writes a few dozen at most),
# and ms × 1000 stays below 2**53 until the year 2255, so ids survive JSON clients.
AUDIT_SEQ_SPAN = 1000

Hash = Mapping[bytes | str, bytes | str]  # what redis-py returns (bytes here)
Value = str | bytes | int | float


def embedding_field(dimension: int) -> str:
    """Hash field holding an embedding of ``dimension`` FLOAT32 values."""
    return f"{EMBEDDING_FIELD_PREFIX}{dimension}"


def _flag(value: bool) -> str:
    return "1" if value else "0"


def _text(data: Hash, name: str) -> str | None:
    raw = data.get(name.encode())
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else raw


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _required(data: Hash, name: str) -> str:
    value = _text(data, name)
    if value is None:
        raise ValueError(f"stored memory lacks field {name!r}")
    return value


def _time(data: Hash, name: str) -> datetime:
    parsed = from_iso(_required(data, name))
    assert parsed is not None
    return parsed


def memory_to_hash(memory: Memory) -> dict[str, Value]:
    """The hash of ``memory``, record fields and index fields (see module docstring)."""
    m = memory
    out: dict[str, Value] = {
        "doc_v": DOC_VERSION,
        "id": m.id, "tenant": m.tenant, "scope": m.scope, "category": m.category,
        "subcategory": m.subcategory, "title": m.title, "content": m.content,
        "tags": orjson.dumps(list(m.tags)), "subject": m.subject, "source": m.source,
        "score": repr(float(m.score)), "enabled": _flag(m.enabled), "hits": m.hits,
        "created_at": to_iso(m.created_at) or "", "updated_at": to_iso(m.updated_at) or "",
        "last_seen_at": to_iso(m.last_seen_at) or "", "access_count": m.access_count,
        "norm": normalize(m.content),
        "ix_id": m.id, "ix_tenant": tenant_token(m.tenant),
        "ix_user": SHARED_USER if m.user_id is None else user_token(m.tenant, m.user_id),
        "ix_ns": namespace_token(m.tenant, m.user_id),
        "ix_active": _flag(m.active), "ix_retired": _flag(m.superseded_at is not None),
        "ix_about": _flag(m.about_user),
        "ix_last_seen": m.last_seen_at.timestamp(), "ix_created": m.created_at.timestamp(),
    }
    optional: dict[str, str | None] = {
        "user_id": m.user_id, "source_conversation_id": m.source_conversation_id,
        "source_channel": m.source_channel, "last_access_at": to_iso(m.last_access_at),
        "superseded_at": to_iso(m.superseded_at), "superseded_by": m.superseded_by,
        "supersede_reason": m.supersede_reason, "conflict_with": m.conflict_with,
    }
    if m.conflict_yields:
        out["conflict_yields"] = "1"
    out.update({k: v for k, v in optional.items() if v is not None})
    if m.source_channel is not None:
        out["ix_chan"] = channel_token(m.source_channel)
    if m.embedding is not None:
        out[embedding_field(len(m.embedding))] = np.asarray(m.embedding, np.float32).tobytes()
        if m.embedding_model is not None:
            out[VECTOR_MODEL_FIELD] = m.embedding_model
    if m.active:
        out["ix_terms"] = terms_field(m.title, m.content, m.tags)
    return out


def terms_field(title: str, content: str, tags: Sequence[str]) -> str:
    """The ``ix_terms`` value of an active memory with this title, content and tags."""
    return stemmed_terms(index_terms(indexed_text(title, content, tags)))


def memory_from_hash(data: Hash) -> Memory:
    """Inverse of :func:`memory_to_hash`. Raises ``ValueError`` on a hash that is not a
    stored memory (a required field missing)."""
    f: dict[str, str] = {}
    embedding = None
    for raw_name, raw in data.items():
        name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
        if name.startswith(EMBEDDING_FIELD_PREFIX):
            embedding = tuple(np.frombuffer(_bytes(raw), dtype=np.float32).tolist())
        elif not name.startswith("ix_"):
            f[name] = raw.decode() if isinstance(raw, bytes) else raw
    get = f.get
    try:
        return Memory(
            id=f["id"], tenant=f["tenant"], user_id=get("user_id"), content=f["content"],
            title=f["title"], scope=f["scope"],  # type: ignore[arg-type]
            category=f["category"], subcategory=f["subcategory"],  # type: ignore[arg-type]
            tags=tuple(orjson.loads(f["tags"])), subject=f["subject"],
            source=f["source"],  # type: ignore[arg-type]
            source_conversation_id=get("source_conversation_id"),
            source_channel=get("source_channel"), score=float(f["score"]),
            embedding=embedding, enabled=f["enabled"] == "1", hits=int(f["hits"]),
            created_at=_iso(f["created_at"]), updated_at=_iso(f["updated_at"]),
            last_seen_at=_iso(f["last_seen_at"]), access_count=int(f["access_count"]),
            last_access_at=from_iso(get("last_access_at")),
            superseded_at=from_iso(get("superseded_at")), superseded_by=get("superseded_by"),
            supersede_reason=get("supersede_reason"),
            embedding_model=get(VECTOR_MODEL_FIELD) if embedding is not None else None,
            conflict_with=get("conflict_with"), conflict_yields=get("conflict_yields") == "1",
        )
    except KeyError as exc:
        raise ValueError(f"stored memory lacks field {exc}") from exc


def _iso(value: str) -> datetime:
    parsed = from_iso(value)
    assert parsed is not None
    return parsed


def stored_norm(data: Hash) -> str | None:
    """The normalised content a stored memory hash was written with."""
    return _text(data, "norm")


# conversation records ------------------------------------------------------------------

def conversation_fields(record: ConversationRecord) -> dict[str, Value]:
    """Fields overwritten by a learning batch; ``learned_messages`` is added separately
    (``HINCRBY``) because it accumulates across batches."""
    fields: dict[str, Value] = {
        "score": "" if record.score is None else repr(float(record.score)),
        "dimensions": orjson.dumps(record.dimensions),
        "reason": record.reason,
        "updated_at": to_iso(record.updated_at) or "",
    }
    if record.summary:  # an empty summary keeps the stored one
        fields["summary"] = record.summary
    return fields


def conversation_from_hash(tenant: str, user: str, conversation_id: str,
                           data: Hash) -> ConversationRecord:
    score = _required(data, "score")
    return ConversationRecord(
        tenant=tenant, user_id=user, conversation_id=conversation_id,
        score=float(score) if score else None,
        dimensions=orjson.loads(_required(data, "dimensions")),
        reason=_required(data, "reason"),
        learned_messages=int(_text(data, "learned_messages") or 0),
        updated_at=_time(data, "updated_at"),
        summary=_text(data, "summary") or "",
    )


# user settings -----------------------------------------------------------------------

def settings_from_hash(data: Hash) -> UserSettings:
    if not data:
        return UserSettings()
    defaults = UserSettings()
    learning = _text(data, "enable_personal_learning")
    indicator = _text(data, "show_learning_indicator")
    return UserSettings(
        enable_personal_learning=defaults.enable_personal_learning if learning is None
        else learning == "1",
        show_learning_indicator=defaults.show_learning_indicator if indicator is None
        else indicator == "1",
        cleared_at=from_iso(_text(data, "cleared_at")),
    )


def settings_fields(settings: UserSettings) -> dict[str, Value]:
    """The switches; ``cleared_at`` is set or deleted by the caller."""
    return {
        "enable_personal_learning": _flag(settings.enable_personal_learning),
        "show_learning_indicator": _flag(settings.show_learning_indicator),
    }


# audit events --------------------------------------------------------------------------

def audit_entry(event: AuditEvent) -> dict[str, Value]:
    """One stream entry: the event as JSON under ``e`` (``detail`` values that JSON cannot
    hold become strings, as in the SQLite store)."""
    return {"e": orjson.dumps({
        "at": to_iso(event.at), "tenant": event.tenant, "user_id": event.user_id,
        "conversation_id": event.conversation_id, "actor": event.actor,
        "action": event.action, "memory_id": event.memory_id, "reason": event.reason,
        "detail": event.detail,
    }, default=str)}


def audit_from_entry(fields: Hash) -> AuditEvent:
    data = orjson.loads(fields[b"e"])  # orjson reads bytes or str
    at = from_iso(data["at"])
    assert at is not None
    return AuditEvent(
        tenant=data["tenant"], user_id=data["user_id"], action=data["action"],
        actor=data["actor"], at=at, conversation_id=data["conversation_id"],
        memory_id=data["memory_id"], reason=data["reason"], detail=data["detail"],
    )


def audit_id(stream_id: bytes | str) -> int:
    """Integer id of a stream entry id ``<ms>-<seq>`` (see :data:`AUDIT_SEQ_SPAN`)."""
    text = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    ms, seq = text.split("-")
    return int(ms) * AUDIT_SEQ_SPAN + int(seq)


def stream_id(audit: int) -> str:
    """Inverse of :func:`audit_id`."""
    return f"{audit // AUDIT_SEQ_SPAN}-{audit % AUDIT_SEQ_SPAN}"
