"""The embedded database's schema: numbered migrations tracked in ``PRAGMA user_version``.

Each entry of :data:`MIGRATIONS` is one migration: a script of SQL statements separated by
``;`` at a line end, or ``"python:<name>"`` for a migration written in Python. A new schema
change is appended (never edited in place: files written by an older version apply only
the entries after their ``user_version``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from proxy.backends.sqlite.conflicts import CONFLICTS_MIGRATION
from proxy.backends.sqlite.rows import reterm_index

MIGRATIONS: tuple[str, ...] = (
    # 1: memories, keyword index, profiles, user settings, conversations, evidence, audit,
    #    ledgers, learning queue and buffer.
    """
    CREATE TABLE memories (
        rowid INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        user_id TEXT,
        scope TEXT NOT NULL,
        category TEXT NOT NULL,
        subcategory TEXT NOT NULL DEFAULT '',
        title TEXT NOT NULL DEFAULT '',
        content TEXT NOT NULL,
        tags TEXT NOT NULL DEFAULT '[]',
        subject TEXT NOT NULL DEFAULT 'user',
        source TEXT NOT NULL,
        source_conversation_id TEXT,
        source_channel TEXT,
        score REAL NOT NULL DEFAULT 0,
        embedding BLOB,
        enabled INTEGER NOT NULL DEFAULT 1,
        hits INTEGER NOT NULL DEFAULT 1,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        last_seen_at TEXT NOT NULL,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_access_at TEXT,
        superseded_at TEXT,
        superseded_by TEXT,
        supersede_reason TEXT,
        norm TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX memories_owner ON memories (tenant, user_id, enabled, superseded_at);
    CREATE INDEX memories_shared ON memories (tenant, scope) WHERE user_id IS NULL;
    CREATE VIRTUAL TABLE memories_fts USING fts5(
        ns, terms, tokenize = 'porter unicode61 remove_diacritics 2'
    );
    CREATE TABLE memory_evidence (
        memory_id TEXT NOT NULL,
        evidence_key TEXT NOT NULL,
        at TEXT NOT NULL,
        PRIMARY KEY (memory_id, evidence_key)
    ) WITHOUT ROWID;
    CREATE TABLE memory_tombstones (
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        norm TEXT NOT NULL,
        deleted_at TEXT NOT NULL,
        PRIMARY KEY (tenant, user_id, norm)
    ) WITHOUT ROWID;
    CREATE TABLE profiles (
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        data TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (tenant, user_id)
    ) WITHOUT ROWID;
    CREATE TABLE user_settings (
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        enable_personal_learning INTEGER NOT NULL DEFAULT 1,
        show_learning_indicator INTEGER NOT NULL DEFAULT 1,
        cleared_at TEXT,
        PRIMARY KEY (tenant, user_id)
    ) WITHOUT ROWID;
    CREATE TABLE conversations (
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        score REAL,
        dimensions TEXT NOT NULL DEFAULT '{}',
        reason TEXT NOT NULL DEFAULT '',
        learned_messages INTEGER NOT NULL DEFAULT 0,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (tenant, user_id, conversation_id)
    ) WITHOUT ROWID;
    CREATE TABLE applied_batches (
        batch_key TEXT PRIMARY KEY,
        applied_at TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE audit_log (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        tenant TEXT NOT NULL,
        user_id TEXT,
        conversation_id TEXT,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        memory_id TEXT,
        reason TEXT NOT NULL DEFAULT '',
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX audit_owner ON audit_log (tenant, user_id, id);
    CREATE TABLE usage_ledger (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        tenant TEXT NOT NULL,
        user_id TEXT,
        model TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        memory_tokens INTEGER NOT NULL,
        memories_injected INTEGER NOT NULL,
        estimated INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX usage_owner ON usage_ledger (tenant, user_id, at);
    CREATE TABLE learning_ledger (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        tenant TEXT NOT NULL,
        user_id TEXT,
        model TEXT NOT NULL,
        purpose TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        job_id TEXT
    );
    CREATE INDEX learning_owner ON learning_ledger (tenant, user_id, at);
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        payload BLOB NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        available_at REAL NOT NULL,
        leased_by TEXT,
        lease_until REAL,
        last_error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX jobs_ready ON jobs (status, available_at);
    CREATE TABLE seen_messages (
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        seen_at REAL NOT NULL,
        PRIMARY KEY (tenant, user_id, fingerprint)
    ) WITHOUT ROWID;
    CREATE INDEX seen_age ON seen_messages (seen_at);
    CREATE TABLE buffered_messages (
        id INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        channel TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        role TEXT NOT NULL,
        name TEXT,
        content TEXT NOT NULL,
        model TEXT NOT NULL,
        at REAL NOT NULL,
        batch_key TEXT
    );
    CREATE INDEX buffer_conv ON buffered_messages (tenant, user_id, conversation_id, batch_key);
    CREATE INDEX buffer_batch ON buffered_messages (batch_key);
    CREATE INDEX buffer_age ON buffered_messages (at);
    """,
    # 2: display names → users, for attributing group messages (docs/design.md#group-chats).
    """
    CREATE TABLE user_names (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        user_id TEXT NOT NULL,
        seen_at TEXT NOT NULL,
        PRIMARY KEY (tenant, name, user_id)
    ) WITHOUT ROWID;
    """,
    # 3: images users shared, kept with the buffered text (same TTL) for vision learning.
    """
    ALTER TABLE buffered_messages ADD COLUMN images TEXT NOT NULL DEFAULT '[]';
    """,
    # 4: learning prompts edited by admins at run time, every version kept.
    """
    CREATE TABLE prompts (
        tenant TEXT NOT NULL,
        kind TEXT NOT NULL,
        version INTEGER NOT NULL,
        text TEXT NOT NULL,
        actor TEXT NOT NULL,
        at TEXT NOT NULL,
        PRIMARY KEY (tenant, kind, version)
    ) WITHOUT ROWID;
    """,
    # 5: conversation summaries (medium-term memory, at most 60 per user).
    """
    ALTER TABLE conversations ADD COLUMN summary TEXT NOT NULL DEFAULT '';
    """,
    # 6: resident facts (every recall: a user's top facts by evidence, then recency) read
    # as an index walk of LIMIT rows instead of a sort of all the user's memories.
    """
    CREATE INDEX memories_resident
        ON memories (tenant, user_id, hits DESC, last_seen_at DESC)
        WHERE enabled = 1 AND superseded_at IS NULL AND subject = 'user';
    """,
    # 7: a learning job carries its tenant (the admin API is scoped to it); jobs queued
    # before have none and are listed to no tenant's admin (the CLI handles them). Active
    # memories by normalised text: apply() finds the stored copy of a new fact in it.
    """
    ALTER TABLE jobs ADD COLUMN tenant TEXT;
    CREATE INDEX jobs_dead ON jobs (status, tenant, updated_at);
    CREATE INDEX memories_fact ON memories (tenant, user_id, norm)
        WHERE enabled = 1 AND superseded_at IS NULL;
    """,
    # 8: the tenant → users index (GET /v1/admin/users), filled from the usage ledger;
    # tenant settings edited at run time (GET/PATCH /v1/admin/settings).
    """
    CREATE TABLE tenant_users (
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        last_seen TEXT NOT NULL,
        PRIMARY KEY (tenant, user_id)
    ) WITHOUT ROWID;
    INSERT INTO tenant_users (tenant, user_id, last_seen)
        SELECT tenant, user_id, max(at) FROM usage_ledger WHERE user_id IS NOT NULL
        GROUP BY tenant, user_id;
    CREATE INDEX usage_day ON usage_ledger (tenant, at);
    CREATE INDEX learning_day ON learning_ledger (tenant, at);
    CREATE TABLE tenant_settings (
        tenant TEXT PRIMARY KEY,
        data TEXT NOT NULL,
        updated_at TEXT NOT NULL
    ) WITHOUT ROWID;
    """,
    # 9: the embedder model id of each stored vector (a model change re-embeds instead of
    # mixing spaces), and the query-embedding tokens of a remote embedder per request.
    """
    ALTER TABLE memories ADD COLUMN embedding_model TEXT;
    ALTER TABLE usage_ledger ADD COLUMN recall_tokens INTEGER NOT NULL DEFAULT 0;
    """,
    # 10: two counters per memory owner (tenant, user id; '' for shared and system
    # memories), bumped by triggers in the transaction of every write of every connection
    # and process: ``generation`` on each insert, delete and update of a memory other than
    # its access statistics, ``accessed`` on each update of those (access_count,
    # last_access_at). The store reuses what it read of an owner's memories (decoded rows,
    # the vector matrix) while the counters it depends on are unchanged. A migration that
    # adds a column to memories must recreate memories_generation_update with it. No line
    # inside a trigger body ends with ";": the migration runner splits scripts at ";" +
    # newline.
    """
    CREATE TABLE memory_generations (
        tenant TEXT NOT NULL,
        owner TEXT NOT NULL,
        generation INTEGER NOT NULL DEFAULT 0,
        accessed INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (tenant, owner)
    ) WITHOUT ROWID;
    CREATE TRIGGER memories_generation_insert AFTER INSERT ON memories BEGIN
        INSERT INTO memory_generations (tenant, owner, generation)
        VALUES (NEW.tenant, coalesce(NEW.user_id, ''), 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET generation = generation + 1; END;
    CREATE TRIGGER memories_generation_delete AFTER DELETE ON memories BEGIN
        INSERT INTO memory_generations (tenant, owner, generation)
        VALUES (OLD.tenant, coalesce(OLD.user_id, ''), 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET generation = generation + 1; END;
    CREATE TRIGGER memories_generation_update AFTER UPDATE OF id, tenant, user_id, scope,
        category, subcategory, title, content, tags, subject, source, source_conversation_id,
        source_channel, score, embedding, enabled, hits, created_at, updated_at, last_seen_at,
        superseded_at, superseded_by, supersede_reason, norm, embedding_model ON memories BEGIN
        INSERT INTO memory_generations (tenant, owner, generation)
        VALUES (OLD.tenant, coalesce(OLD.user_id, ''), 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET generation = generation + 1; INSERT INTO
        memory_generations (tenant, owner, generation)
        VALUES (NEW.tenant, coalesce(NEW.user_id, ''), 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET generation = generation + 1; END;
    CREATE TRIGGER memories_accessed_update AFTER UPDATE OF access_count, last_access_at
        ON memories BEGIN
        INSERT INTO memory_generations (tenant, owner, accessed)
        VALUES (NEW.tenant, coalesce(NEW.user_id, ''), 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET accessed = accessed + 1; END;
    """,
    # 11: users who only wrote memories (manual adds, imports) join the tenant → users
    # index; from now on those writes register the user themselves (Ledger.register_user).
    """
    INSERT INTO tenant_users (tenant, user_id, last_seen)
        SELECT tenant, user_id, max(updated_at) FROM memories WHERE user_id IS NOT NULL
        GROUP BY tenant, user_id
        ON CONFLICT(tenant, user_id) DO NOTHING;
    """,
    # 12: keyword terms gained the character bigrams and characters of CJK runs (beside
    # jieba's words): memories whose terms changed are re-termed (reterm_index, in Python).
    "python:reterm_index",
    # 13: erasure leaves nothing of the user (docs/design.md#erasure). A buffered group
    # line records the user whose request brought it (``speaker``), so their erasure finds
    # it. ``generation_floor``: erasure deletes the user's counters row and raises the
    # floor above its generation; a row created later starts above the floor, so an
    # owner's generation never comes back to a value a cache saw before. ``purges``: when
    # the keyword index was last merged to drop erased terms, and whether one is owed.
    """
    ALTER TABLE buffered_messages ADD COLUMN speaker TEXT;
    CREATE TABLE generation_floor (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        value INTEGER NOT NULL
    );
    INSERT INTO generation_floor (id, value) VALUES (1, 0);
    CREATE TABLE purges (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        last_at REAL NOT NULL DEFAULT 0,
        owed INTEGER NOT NULL DEFAULT 0
    );
    INSERT INTO purges (id) VALUES (1);
    DROP TRIGGER memories_generation_insert;
    DROP TRIGGER memories_generation_delete;
    DROP TRIGGER memories_generation_update;
    DROP TRIGGER memories_accessed_update;
    CREATE TRIGGER memories_generation_insert AFTER INSERT ON memories BEGIN
        INSERT INTO memory_generations (tenant, owner, generation)
        VALUES (NEW.tenant, coalesce(NEW.user_id, ''),
                (SELECT value FROM generation_floor) + 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET generation = generation + 1; END;
    CREATE TRIGGER memories_generation_delete AFTER DELETE ON memories BEGIN
        INSERT INTO memory_generations (tenant, owner, generation)
        VALUES (OLD.tenant, coalesce(OLD.user_id, ''),
                (SELECT value FROM generation_floor) + 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET generation = generation + 1; END;
    CREATE TRIGGER memories_generation_update AFTER UPDATE OF id, tenant, user_id, scope,
        category, subcategory, title, content, tags, subject, source, source_conversation_id,
        source_channel, score, embedding, enabled, hits, created_at, updated_at, last_seen_at,
        superseded_at, superseded_by, supersede_reason, norm, embedding_model ON memories BEGIN
        INSERT INTO memory_generations (tenant, owner, generation)
        VALUES (OLD.tenant, coalesce(OLD.user_id, ''),
                (SELECT value FROM generation_floor) + 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET generation = generation + 1; INSERT INTO
        memory_generations (tenant, owner, generation)
        VALUES (NEW.tenant, coalesce(NEW.user_id, ''),
                (SELECT value FROM generation_floor) + 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET generation = generation + 1; END;
    CREATE TRIGGER memories_accessed_update AFTER UPDATE OF access_count, last_access_at
        ON memories BEGIN
        INSERT INTO memory_generations (tenant, owner, generation, accessed)
        VALUES (NEW.tenant, coalesce(NEW.user_id, ''),
                (SELECT value FROM generation_floor) + 1, 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET accessed = accessed + 1; END;
    """,
    # 14: candidate synonyms mined from merged profile traits and topics (per tenant) and
    # each user's observations of them (erasure removes a user's; proxy/memory/synonyms.py).
    """
    CREATE TABLE synonym_candidates (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        words TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'open',
        created_at TEXT NOT NULL,
        decided_at TEXT,
        decided_by TEXT,
        PRIMARY KEY (tenant, id)
    ) WITHOUT ROWID;
    CREATE TABLE synonym_observations (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        count INTEGER NOT NULL DEFAULT 0,
        examples TEXT NOT NULL DEFAULT '[]',
        updated_at TEXT NOT NULL,
        PRIMARY KEY (tenant, id, user_id)
    ) WITHOUT ROWID;
    CREATE INDEX synonym_observers ON synonym_observations (tenant, user_id);
    """,
    # 15: jobs put off by a spent learning budget are marked, so that lifting the budget
    # makes exactly those due at once (LearningQueue.resume_postponed).
    """
    ALTER TABLE jobs ADD COLUMN postponed INTEGER NOT NULL DEFAULT 0;
    """,
    # 16: conflicts a person settles and the weekly profile snapshots (the script and its
    # notes: proxy/backends/sqlite/conflicts.py).
    CONFLICTS_MIGRATION,
    # 17: injection records (docs/design.md#injection-records): ids, fields and scores of
    # what one reply injected, as the API's JSON; kept for a retention window and a
    # per-user cap (proxy.backends.sqlite.injections).
    """
    CREATE TABLE injections (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        record TEXT NOT NULL
    );
    CREATE INDEX injections_owner ON injections (tenant, user_id, created_at);
    CREATE INDEX injections_created ON injections (created_at);
    """,
    # 18: the tenants with jobs a spent learning budget put off, read by every worker once
    # per settings refresh (LearningQueue.postponed_tenants): a partial index holds only
    # those jobs, so the read touches none of the others (and nothing at all while no job
    # waits for a budget).
    """
    CREATE INDEX jobs_postponed ON jobs (tenant) WHERE postponed = 1 AND status = 'ready';
    """,
    # 19: a title cut from the content (learning's, proxy.memory.titles.indexed_text) is
    # no longer indexed beside it: memories whose terms changed are re-termed.
    "python:reterm_index",
)
# Migrations written in Python: the entry "python:<name>" runs the function of that name.
_PYTHON_MIGRATIONS: dict[str, Callable[[sqlite3.Connection], object]] = {
    "reterm_index": reterm_index,
}


def migrate(conn: sqlite3.Connection) -> None:
    """Apply the missing migrations, each in its own ``BEGIN IMMEDIATE`` transaction. The
    version is read inside that transaction: processes opening a new file at the same time
    (``serve --processes N``, a worker next to ``serve``) apply each migration once."""
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version >= len(MIGRATIONS):
                conn.execute("COMMIT")
                return
            script = MIGRATIONS[version]
            if script.startswith("python:"):
                _PYTHON_MIGRATIONS[script.removeprefix("python:")](conn)
            else:
                for statement in _statements(script):
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";\n") if s.strip()]
