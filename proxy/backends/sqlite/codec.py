"""Rows of the SQLite ``memories`` table ⇄ :class:`~proxy.memory.records.Memory`, and the
namespace tokens the keyword index filters by.

Pure functions (no connection): the store, its recall reads and the erasure code share
them. Embeddings are stored as float32 blobs; timestamps as ISO 8601 text
(:func:`~proxy.memory.records.to_iso`); tags as a JSON array.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from proxy.memory.records import Memory, from_iso, to_iso
from proxy.memory.text import normalize

# The memory columns every read selects, in this order (decoded by position).
COLUMNS = (
    "id, tenant, user_id, scope, category, subcategory, title, content, tags, subject, source, "
    "source_conversation_id, source_channel, score, embedding, enabled, hits, created_at, "
    "updated_at, last_seen_at, access_count, last_access_at, superseded_at, superseded_by, "
    "supersede_reason, embedding_model, conflict_with, conflict_yields"
)
# SQL condition of an active memory (enabled and not retired) on the alias ``m``.
ACTIVE = "m.enabled = 1 AND m.superseded_at IS NULL"


def content_digest(norm: str) -> str:
    """What a tombstone keeps of deleted content: its SHA-256, never the text the user
    asked to delete (it only has to recognise the fact if learning brings it back)."""
    return hashlib.sha256(norm.encode()).hexdigest()


def user_token(tenant: str, user: str) -> str:
    """Namespace token of a user's memories in the keyword index."""
    return "u" + hashlib.sha256(f"{tenant}\x1f{user}".encode()).hexdigest()[:24]


def shared_token(tenant: str) -> str:
    """Namespace token of a tenant's shared and system memories."""
    return "s" + hashlib.sha256(tenant.encode()).hexdigest()[:24]


def ns_token(memory: Memory) -> str:
    """The namespace token ``memory`` is indexed under."""
    if memory.user_id is None:
        return shared_token(memory.tenant)
    return user_token(memory.tenant, memory.user_id)


def np() -> Any:
    """numpy, imported on first use: only stores holding embeddings need it (~15 MB)."""
    import numpy

    return numpy


def parse_time(value: str) -> datetime:
    """A stored non-null timestamp."""
    parsed = from_iso(value)
    assert parsed is not None
    return parsed


def memory_from_row(row: Sequence[Any]) -> Memory:
    """A :class:`Memory` from a row whose first columns are :data:`COLUMNS` (by position:
    ~3× cheaper than by name)."""
    blob = row[14]
    return Memory(
        id=row[0],
        tenant=row[1],
        user_id=row[2],
        scope=row[3],
        category=row[4],
        subcategory=row[5],
        title=row[6],
        content=row[7],
        tags=tuple(orjson.loads(row[8])),
        subject=row[9],
        source=row[10],
        source_conversation_id=row[11],
        source_channel=row[12],
        score=row[13],
        embedding=None if blob is None else tuple(
            np().frombuffer(blob, dtype=np().float32).tolist()),
        enabled=bool(row[15]),
        hits=row[16],
        created_at=parse_time(row[17]),
        updated_at=parse_time(row[18]),
        last_seen_at=parse_time(row[19]),
        access_count=row[20],
        last_access_at=from_iso(row[21]),
        superseded_at=from_iso(row[22]),
        superseded_by=row[23],
        supersede_reason=row[24],
        embedding_model=row[25],
        conflict_with=row[26],
        conflict_yields=bool(row[27]),
    )


def row_values(m: Memory) -> tuple[Any, ...]:
    """The values of :data:`COLUMNS` then ``norm`` (29) for an insert of ``m``."""
    numpy = np() if m.embedding is not None else None
    embedding = None if numpy is None else numpy.asarray(m.embedding, numpy.float32).tobytes()
    return (
        m.id, m.tenant, m.user_id, m.scope, m.category, m.subcategory, m.title, m.content,
        orjson.dumps(list(m.tags)).decode(), m.subject, m.source, m.source_conversation_id,
        m.source_channel, m.score, embedding, int(m.enabled), m.hits, to_iso(m.created_at),
        to_iso(m.updated_at), to_iso(m.last_seen_at), m.access_count, to_iso(m.last_access_at),
        to_iso(m.superseded_at), m.superseded_by, m.supersede_reason,
        m.embedding_model if m.embedding is not None else None, m.conflict_with,
        int(m.conflict_yields), normalize(m.content),
    )
