"""Writes of memory rows on SQLite: upsert and delete, keeping the keyword index
(``memories_fts``: active memories only) and the evidence table in step, inside the
caller's write transaction. Errors are the caller's to translate.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from proxy.backends.sqlite.codec import COLUMNS, ns_token, row_values
from proxy.memory.records import Memory
from proxy.memory.text import index_terms
from proxy.memory.titles import indexed_text


def upsert_memory(conn: sqlite3.Connection, memory: Memory) -> None:
    """Insert or replace ``memory``'s row, and its keyword-index row while it is active."""
    conn.execute(
        f"INSERT INTO memories ({COLUMNS}, norm) VALUES ({', '.join('?' * 29)}) "
        "ON CONFLICT(id) DO UPDATE SET "
        + ", ".join(f"{c.strip()} = excluded.{c.strip()}" for c in COLUMNS.split(",")[1:])
        + ", norm = excluded.norm",
        row_values(memory),
    )
    rowid = conn.execute("SELECT rowid FROM memories WHERE id = ?", (memory.id,)).fetchone()[0]
    conn.execute("DELETE FROM memories_fts WHERE rowid = ?", (rowid,))
    if memory.active:
        text = indexed_text(memory.title, memory.content, memory.tags)
        conn.execute(
            "INSERT INTO memories_fts (rowid, ns, terms) VALUES (?, ?, ?)",
            (rowid, ns_token(memory), index_terms(text)),
        )


def delete_memories(conn: sqlite3.Connection, where: str,
                    args: tuple[Any, ...]) -> list[str]:
    """Delete the memories matching ``where`` (SQL over ``memories``, values bound from
    ``args``) with their keyword-index rows and evidence; returns their ids."""
    rows = conn.execute(f"SELECT rowid, id FROM memories WHERE {where}", args).fetchall()
    for row in rows:
        conn.execute("DELETE FROM memories_fts WHERE rowid = ?", (row[0],))
        conn.execute("DELETE FROM memory_evidence WHERE memory_id = ?", (row[1],))
    conn.execute(f"DELETE FROM memories WHERE {where}", args)
    return [row[1] for row in rows]


def reterm_index(conn: sqlite3.Connection) -> int:
    """Rewrite the keyword-index terms of every indexed memory whose stored terms differ
    from today's rule (:func:`~proxy.memory.titles.indexed_text` then
    :func:`~proxy.memory.text.index_terms`) — a migration, run whenever that rule changed:
    CJK text gained sub-words, and a title cut from the content stopped being indexed
    beside it. Rows already at today's terms are left alone. Runs in the caller's
    transaction; loads the Chinese dictionary when a memory holds CJK. Returns how many
    index rows were rewritten."""
    rows = conn.execute(
        "SELECT m.rowid, m.title, m.content, m.tags, f.terms FROM memories m "
        "JOIN memories_fts f ON f.rowid = m.rowid"
    ).fetchall()
    changed = 0
    for rowid, title, content, tags, old in rows:
        terms = index_terms(indexed_text(title, content, orjson.loads(tags)))
        if terms != old:
            conn.execute("UPDATE memories_fts SET terms = ? WHERE rowid = ?", (terms, rowid))
            changed += 1
    return changed
