"""Key layout of the Redis backend (pure: names only, no I/O).

Every key of one namespace — a (tenant, user) pair, or a tenant's shared space — carries
the same Redis Cluster hash tag, so all of them live in one slot and one ``MULTI`` can
change them together. The tag is a digest, never the raw id, so no tenant or user id can
contain ``{``/``}`` and move a key to another slot, and no tenant or user id appears in a
key name::

    P:m:{ns}:<memory id>       HASH    one memory (the only keys the search index covers)
    P:ids:{ns}                 SET     ids of the namespace's memories (clear() purges by it)
    P:ev:{ns}:<memory id>      SET     evidence keys counted for that memory
    P:tomb:{ns}                HASH    SHA-256 of deleted normalised content → deletion time
    P:prof:{ns}                STRING  profile JSON
    P:conv:{ns}:<conversation> HASH    conversation record; P:convs:{ns} SET lists them
    P:sums:{ns}                ZSET    conversations holding a summary → updated_at (cap 60)
    P:settings:{ns}            HASH    per-user switches and cleared_at
    P:gen:{ns}                 STRING  memory write generation (INCR with every write)
    P:chg:{ns}                 ZSET    memory id → generation it last changed at (the
                                       recall index's change log; ``*``: unknown)
    P:batches:{ns}             ZSET    applied learning batch keys → epoch seconds
    P:conflicts:{ns}           HASH    conflict id → JSON (docs/design.md#conflicts)
    P:phist:{ns}               HASH    ISO week → profile snapshot JSON (at most 104)
    P:audit:{ns}               STREAM  the user's learning log
    P:audit:{t…}               STREAM  the tenant's learning log (all users and shared)
    P:auditrefs:{ns}           LIST    ids of the user's entries in the tenant's log (erasure)
    P:auditrefs:{t…}           STRING  first tenant-log id written with refs kept (erasure)
    P:usage:{ns|t…}            HASH    usage ledger counters (per user / per tenant)
    P:learning:{ns|t…}         HASH    learning ledger counters (per user / per tenant)
    P:names:{t…}:<digest>      SET     users going by one display name (group attribution)
    P:unames:{ns}              SET     the name keys above the user is in (erasure)
    P:unametexts:{ns}          SET     the normalised names themselves (erasure)
    P:purge:owed · P:purge:slot STRING an erasure owes an AOF rewrite · one ran this period
    P:prompts:{t…}:<kind>      LIST    admin-edited prompt versions (JSON), oldest first
    P:day:{t…}:<YYYY-MM-DD>    HASH    the tenant's usage and learning counters of one UTC
                                       day, per (user, model): see the ledger module
    P:days:{t…}                ZSET    UTC days holding counters → days since 1970-01-01
    P:users:{t…}               ZSET    the tenant's users (score 0: ordered by id)
    P:seen:{t…}                HASH    user → time of their latest usage row (ISO 8601)
    P:tset:{t…}                STRING  the tenant's run-time settings overrides (JSON)
    P:syn:{t…}                 HASH    candidate synonym id → JSON (words, status, times)
    P:synobs:{t…}:<id>         HASH    ``ns`` → JSON of that user's count and examples
    P:synu:{t…}:<ns>           SET     candidate ids the user observed (erasure)
    P:inj:{ns}:<id>            STRING  one injection record (JSON), expiring after the
                                       retention window
    P:injs:{ns}                ZSET    the user's injection record ids → epoch seconds
                                       (per-user cap, erasure), expiring with them

The learning queue (:mod:`proxy.backends.redis.queue`) keeps its jobs under one tag of
its own, ``{P}`` (a Lua script moves a job between them atomically), and each user's
buffered messages under the user's tag (one script dedups, buffers and seals them)::

    P:lq:{P}:ready             STREAM  ready and leased jobs (field ``id``); group ``workers``
    P:lq:{P}:jobs              HASH    job id → JSON header (kind, attempts, state, times,
                                       last error, stream entry, holder)
    P:lq:{P}:payloads          HASH    job id → payload bytes
    P:lq:{P}:delayed           ZSET    job id → epoch seconds it becomes ready (retries)
    P:lq:{P}:leased            ZSET    job id → epoch seconds its lease runs out
    P:lq:{P}:dead              ZSET    job id → epoch seconds it was dead-lettered
    P:lq:{P}:idle              ZSET    ``<ns>:<cd>`` → newest buffered message time (hint)
    P:lq:{P}:aged              ZSET    ``<ns>:<cd>`` → oldest buffered message time (hint)
    P:lq:{P}:seen              ZSET    ``<ns>`` → oldest fingerprint time (hint)
    P:lq:{P}:buffered          STRING  unsealed messages in all buffers (a gauge)
    P:lq:seen:{ns}             ZSET    message fingerprint → epoch seconds first seen
    P:lq:buf:{ns}:<cd>         HASH    one conversation's unsealed messages and counters
    P:lq:bufs:{ns}             SET     conversation ids with unsealed messages
    P:lq:batch:{ns}:<digest>   HASH    one sealed batch awaiting learning
    P:lq:sealed:{ns}           SET     digests of the user's sealed batches (forget_user)
    P:lq:outbox:{ns}           SET     batch keys sealed but maybe not yet enqueued

``P`` is ``storage.key_prefix``; ``ns`` is ``u<digest(tenant, user)>`` for a user and
``s<digest(tenant)>`` for the tenant's shared and system memories; ``t<digest(tenant)>``
tags tenant-wide keys; ``cd`` is ``c<digest(conversation id)>``. Digests are the first 24
hex digits of SHA-256 (96 bits) — the same tokens the SQLite store uses in its keyword
index.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

DIGEST_HEX = 24  # 96 bits: collisions are not a practical concern at any tenant count
SHARED_USER = "shared"  # sentinel of the index's user tag for memories with no user


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_HEX]


def user_token(tenant: str, user: str) -> str:
    """Namespace token of one user's keys: ``u`` + 24 hex digits."""
    return "u" + _digest(f"{tenant}\x1f{user}")


def shared_token(tenant: str) -> str:
    """Namespace token of a tenant's shared and system memories: ``s`` + 24 hex digits."""
    return "s" + _digest(tenant)


def tenant_token(tenant: str) -> str:
    """Token of tenant-wide keys and of the index's tenant tag: ``t`` + 24 hex digits."""
    return "t" + _digest(tenant)


def namespace_token(tenant: str, user: str | None) -> str:
    """The namespace of a memory: the user's, or the tenant's shared space for ``None``."""
    return shared_token(tenant) if user is None else user_token(tenant, user)


def conversation_token(conversation: str) -> str:
    """Token of one conversation's buffer key: ``c`` + 24 hex digits."""
    return "c" + _digest(conversation)


def channel_token(channel: str) -> str:
    """Index tag of a ``source_channel`` (``c`` + digest): channel names such as
    ``group:<id>`` hold characters that tag syntax and case folding would alter."""
    return "c" + _digest(channel)


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """Key names under one ``prefix`` (``storage.key_prefix``)."""

    prefix: str

    @property
    def memory_prefix(self) -> str:
        """The search index covers exactly the keys starting with this."""
        return f"{self.prefix}:m:"

    def memory(self, ns: str, memory_id: str) -> str:
        return f"{self.prefix}:m:{{{ns}}}:{memory_id}"

    def ids(self, ns: str) -> str:
        return f"{self.prefix}:ids:{{{ns}}}"

    def evidence(self, ns: str, memory_id: str) -> str:
        return f"{self.prefix}:ev:{{{ns}}}:{memory_id}"

    def tombstones(self, ns: str) -> str:
        return f"{self.prefix}:tomb:{{{ns}}}"

    def profile(self, ns: str) -> str:
        return f"{self.prefix}:prof:{{{ns}}}"

    def conversation(self, ns: str, conversation_id: str) -> str:
        return f"{self.prefix}:conv:{{{ns}}}:{conversation_id}"

    def conversations(self, ns: str) -> str:
        return f"{self.prefix}:convs:{{{ns}}}"

    def summaries(self, ns: str) -> str:
        return f"{self.prefix}:sums:{{{ns}}}"

    def settings(self, ns: str) -> str:
        return f"{self.prefix}:settings:{{{ns}}}"

    def batches(self, ns: str) -> str:
        return f"{self.prefix}:batches:{{{ns}}}"

    def conflicts(self, ns: str) -> str:
        """HASH conflict id → conflict JSON (docs/design.md#conflicts)."""
        return f"{self.prefix}:conflicts:{{{ns}}}"

    def profile_history(self, ns: str) -> str:
        """HASH ISO week (``2026-W48``) → that week's profile snapshot JSON."""
        return f"{self.prefix}:phist:{{{ns}}}"

    def audit(self, token: str) -> str:
        """The learning-log stream of a namespace (``ns``) or of a tenant (``t…``)."""
        return f"{self.prefix}:audit:{{{token}}}"

    def audit_refs(self, token: str) -> str:
        """For a user (``ns``): the ids of their entries in the tenant's log; for a tenant
        (``t…``): the first tenant-log id written since such refs are kept."""
        return f"{self.prefix}:auditrefs:{{{token}}}"

    def usage(self, token: str) -> str:
        return f"{self.prefix}:usage:{{{token}}}"

    def learning(self, token: str) -> str:
        return f"{self.prefix}:learning:{{{token}}}"

    def names(self, tenant_tok: str, name_norm: str) -> str:
        return f"{self.prefix}:names:{{{tenant_tok}}}:{_digest(name_norm)}"

    def user_names(self, ns: str) -> str:
        """The :meth:`names` keys a user was added to (so erasure needs no key scan)."""
        return f"{self.prefix}:unames:{{{ns}}}"

    def user_name_texts(self, ns: str) -> str:
        """The normalised display names a user was bound to (erasure finds their lines in
        group buffers by them)."""
        return f"{self.prefix}:unametexts:{{{ns}}}"

    def prompts(self, tenant_tok: str, kind: str) -> str:
        return f"{self.prefix}:prompts:{{{tenant_tok}}}:{kind}"

    def day(self, tenant_tok: str, day: str) -> str:
        return f"{self.prefix}:day:{{{tenant_tok}}}:{day}"

    def days(self, tenant_tok: str) -> str:
        return f"{self.prefix}:days:{{{tenant_tok}}}"

    def tenant_users(self, tenant_tok: str) -> str:
        return f"{self.prefix}:users:{{{tenant_tok}}}"

    def last_seen(self, tenant_tok: str) -> str:
        return f"{self.prefix}:seen:{{{tenant_tok}}}"

    def tenant_settings(self, tenant_tok: str) -> str:
        return f"{self.prefix}:tset:{{{tenant_tok}}}"

    def synonyms(self, tenant_tok: str) -> str:
        return f"{self.prefix}:syn:{{{tenant_tok}}}"

    def synonym_observations(self, tenant_tok: str, candidate: str) -> str:
        return f"{self.prefix}:synobs:{{{tenant_tok}}}:{candidate}"

    def synonyms_of(self, tenant_tok: str, ns: str) -> str:
        return f"{self.prefix}:synu:{{{tenant_tok}}}:{ns}"

    # learning queue ------------------------------------------------------------------
    def queue(self, name: str) -> str:
        """A job key of the learning queue (``ready``, ``jobs``, ``payloads``, ``delayed``,
        ``leased``, ``dead``, ``flushes``) or one of its indexes (``idle``, ``aged``, ``seen``,
        ``buffered``, ``postponed``); all share the tag ``{prefix}``."""
        return f"{self.prefix}:lq:{{{self.prefix}}}:{name}"

    def seen(self, ns: str) -> str:
        return f"{self.prefix}:lq:seen:{{{ns}}}"

    def buffer(self, ns: str, conversation_tok: str) -> str:
        return f"{self.prefix}:lq:buf:{{{ns}}}:{conversation_tok}"

    def buffers(self, ns: str) -> str:
        return f"{self.prefix}:lq:bufs:{{{ns}}}"

    def batch(self, ns: str, digest: str) -> str:
        return f"{self.prefix}:lq:batch:{{{ns}}}:{digest}"

    def sealed(self, ns: str) -> str:
        return f"{self.prefix}:lq:sealed:{{{ns}}}"

    def outbox(self, ns: str) -> str:
        return f"{self.prefix}:lq:outbox:{{{ns}}}"

    def generation(self, ns: str) -> str:
        """STRING: the namespace's memory write generation, INCR'd in the transaction of
        every write of its memories (not access statistics) and never deleted, so it never
        returns to a value it had (the in-process recall index is reused while it holds)."""
        return f"{self.prefix}:gen:{{{ns}}}"

    def changes(self, ns: str) -> str:
        """ZSET: the namespace's change log, memory id → the generation it last changed
        at (:mod:`proxy.backends.redis.changes`)."""
        return f"{self.prefix}:chg:{{{ns}}}"

    def injection(self, ns: str, injection_id: str) -> str:
        return f"{self.prefix}:inj:{{{ns}}}:{injection_id}"

    def injections(self, ns: str) -> str:
        return f"{self.prefix}:injs:{{{ns}}}"

    def facts(self, ns: str) -> str:
        """HASH :func:`~proxy.memory.writes.fact_key` → id of the active memory written with
        it (a hint: apply verifies the memory before merging into it)."""
        return f"{self.prefix}:facts:{{{ns}}}"
