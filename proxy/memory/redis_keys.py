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
    P:batches:{ns}             ZSET    applied learning batch keys → epoch seconds
    P:audit:{ns}               STREAM  the user's learning log
    P:audit:{t…}               STREAM  the tenant's learning log (all users and shared)
    P:usage:{ns|t…}            HASH    usage ledger counters (per user / per tenant)
    P:learning:{ns|t…}         HASH    learning ledger counters (per user / per tenant)
    P:names:{t…}:<digest>      SET     users going by one display name (group attribution)
    P:prompts:{t…}:<kind>      LIST    admin-edited prompt versions (JSON), oldest first

``P`` is ``storage.key_prefix``; ``ns`` is ``u<digest(tenant, user)>`` for a user and
``s<digest(tenant)>`` for the tenant's shared and system memories; ``t<digest(tenant)>``
tags tenant-wide keys. Digests are the first 24 hex digits of SHA-256 (96 bits) — the same
tokens the SQLite store uses in its keyword index.
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

    def audit(self, token: str) -> str:
        """The learning-log stream of a namespace (``ns``) or of a tenant (``t…``)."""
        return f"{self.prefix}:audit:{{{token}}}"

    def usage(self, token: str) -> str:
        return f"{self.prefix}:usage:{{{token}}}"

    def learning(self, token: str) -> str:
        return f"{self.prefix}:learning:{{{token}}}"

    def names(self, tenant_tok: str, name_norm: str) -> str:
        return f"{self.prefix}:names:{{{tenant_tok}}}:{_digest(name_norm)}"

    def prompts(self, tenant_tok: str, kind: str) -> str:
        return f"{self.prefix}:prompts:{{{tenant_tok}}}:{kind}"
