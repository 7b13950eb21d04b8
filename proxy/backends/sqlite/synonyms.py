"""Candidate synonyms on SQLite (:class:`~proxy.memory.synonyms.SynonymStore`): one row per
(tenant, candidate) in ``synonym_candidates``, one per (tenant, candidate, user) in
``synonym_observations`` with that user's count and newest examples. Functions of a
connection, run by :class:`~proxy.backends.sqlite.store.SqliteMemoryStore` in one
transaction each; ``sqlite3`` errors are the caller's to translate.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

import orjson

from proxy.memory.records import from_iso, to_iso
from proxy.memory.synonyms import (
    EXAMPLES_LISTED,
    EXAMPLES_PER_USER,
    MAX_CANDIDATES,
    SynonymCandidate,
    SynonymExample,
    SynonymStatus,
    candidate_id,
    example_from_json,
    example_to_json,
    newest,
)


def count_synonyms(
    conn: sqlite3.Connection, tenant: str, user: str, examples: Sequence[SynonymExample]
) -> None:
    """One observation per example (see :meth:`SynonymStore.count_synonyms`)."""
    for example in examples:
        cid = candidate_id(example.words)
        known = conn.execute(
            "SELECT 1 FROM synonym_candidates WHERE tenant = ? AND id = ?", (tenant, cid)
        ).fetchone()
        if known is None:
            held = conn.execute(
                "SELECT count(*) FROM synonym_candidates WHERE tenant = ?", (tenant,)
            ).fetchone()[0]
            if held >= MAX_CANDIDATES:
                continue
            conn.execute(
                "INSERT INTO synonym_candidates (tenant, id, words, created_at) "
                "VALUES (?, ?, ?, ?)",
                (tenant, cid, orjson.dumps(list(example.words)).decode(), to_iso(example.at)),
            )
        row = conn.execute(
            "SELECT count, examples FROM synonym_observations "
            "WHERE tenant = ? AND id = ? AND user_id = ?",
            (tenant, cid, user),
        ).fetchone()
        count, kept = (
            (0, [])
            if row is None
            else (int(row[0]), [example_from_json(e) for e in orjson.loads(row[1])])
        )
        mine = newest([*kept, example], EXAMPLES_PER_USER)
        conn.execute(
            "INSERT INTO synonym_observations (tenant, id, user_id, count, examples, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, id, user_id) DO "
            "UPDATE SET count = excluded.count, examples = excluded.examples, "
            "updated_at = excluded.updated_at",
            (
                tenant,
                cid,
                user,
                count + 1,
                orjson.dumps([example_to_json(e) for e in mine]).decode(),
                to_iso(example.at),
            ),
        )


def synonym_candidates(
    conn: sqlite3.Connection,
    tenant: str,
    *,
    status: SynonymStatus | None,
    limit: int,
    only: str | None = None,
) -> list[SynonymCandidate]:
    """The tenant's candidates with their counts and newest examples (``only``: that id)."""
    where, args = "c.tenant = ?", [tenant]
    if status is not None:
        where += " AND c.status = ?"
        args.append(status)
    if only is not None:
        where += " AND c.id = ?"
        args.append(only)
    rows = conn.execute(
        "SELECT c.id, c.words, c.status, c.created_at, c.decided_at, c.decided_by, "
        "coalesce(sum(o.count), 0), max(o.updated_at), json_group_array(o.examples) "
        "FROM synonym_candidates c LEFT JOIN synonym_observations o "
        "ON o.tenant = c.tenant AND o.id = c.id "
        f"WHERE {where} GROUP BY c.id "
        "ORDER BY 7 DESC, 8 DESC, c.id LIMIT ?",
        (*args, limit),
    ).fetchall()
    out = []
    for cid, words, state, created, decided_at, decided_by, count, seen, lists in rows:
        examples = [
            example_from_json(e) for part in orjson.loads(lists) if part for e in orjson.loads(part)
        ]
        created_at = from_iso(created)
        assert created_at is not None
        out.append(
            SynonymCandidate(
                id=cid,
                tenant=tenant,
                words=tuple(orjson.loads(words)),
                count=int(count),
                examples=newest(examples, EXAMPLES_LISTED),
                status=state,
                created_at=created_at,
                updated_at=from_iso(seen) or created_at,
                decided_at=from_iso(decided_at),
                decided_by=decided_by,
            )
        )
    return out


def decide_synonym(
    conn: sqlite3.Connection,
    tenant: str,
    candidate: str,
    *,
    status: SynonymStatus,
    actor: str,
    at: datetime,
) -> SynonymCandidate | None:
    """Set the candidate's status; ``None`` when the tenant has no such candidate."""
    changed = conn.execute(
        "UPDATE synonym_candidates SET status = ?, decided_at = ?, decided_by = ? "
        "WHERE tenant = ? AND id = ?",
        (status, to_iso(at), actor, tenant, candidate),
    ).rowcount
    if not changed:
        return None
    found = synonym_candidates(conn, tenant, status=None, limit=1, only=candidate)
    return found[0] if found else None


def erase_user(conn: sqlite3.Connection, tenant: str, user: str) -> None:
    """Remove the user's observations, then every candidate of the tenant nobody observes
    any more (its words came from the erased user's profile)."""
    conn.execute(
        "DELETE FROM synonym_observations WHERE tenant = ? AND user_id = ?", (tenant, user)
    )
    conn.execute(
        "DELETE FROM synonym_candidates WHERE tenant = ? AND id NOT IN "
        "(SELECT id FROM synonym_observations WHERE tenant = ?)",
        (tenant, tenant),
    )
