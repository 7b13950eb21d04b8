"""Candidate synonyms mined from merged profile traits and topics, and their store contract
(docs/design.md#growing-vocabulary).

When consolidation merges two differently worded traits or topics of a user ("很话少" into
"话少", "reserved" into "quiet" after a verdict), the pair is one *observation* of a
candidate synonym of the tenant. A candidate is the unordered pair of words (its id a
digest of both normalised words, :func:`candidate_id`); its count sums every user's
observations; an admin accepts it (it joins the tenant's ``learning.synonyms``) or rejects
it. Each user's observations are kept apart so that erasing the user removes them, and a
candidate nobody observes any more goes with them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, cast

from proxy.memory.records import from_iso, to_iso
from proxy.memory.text import normalize

SynonymStatus = Literal["open", "accepted", "rejected"]
MergeKind = Literal["containment", "synonym", "neighbour"]
TagField = Literal["traits", "topics"]
# Longest word a candidate holds (characters): longer "traits" are sentences, not words;
# the same bound as one word of learning.synonyms in PATCH /v1/admin/settings.
MAX_WORD_CHARS = 60
EXAMPLES_PER_USER = 3  # newest merges kept per (candidate, user)
EXAMPLES_LISTED = 5  # newest merges a candidate lists, across its users
# Candidates a tenant holds; a new pair beyond this is not recorded (known ones still count).
MAX_CANDIDATES = 1000


def candidate_id(words: Sequence[str]) -> str:
    """``syn_`` + 16 hex digits of SHA-256 over the pair's normalised words, sorted: the same
    id whichever word was kept."""
    key = "\x1f".join(sorted(normalize(w) for w in words))
    return "syn_" + hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class SynonymExample:
    """One merge of a user's profile: in ``field``, the wording ``said`` joined the stored
    tag ``kept``, by ``how`` (containment, a synonym group, or a near neighbour confirmed
    by the verdict call), at ``at`` (UTC). Holds no user id."""

    field: TagField
    kept: str
    said: str
    how: MergeKind
    at: datetime

    @property
    def words(self) -> tuple[str, str]:
        return (self.kept, self.said)


@dataclass(frozen=True, slots=True)
class SynonymCandidate:
    """A candidate synonym of a tenant: ``words`` as first seen (kept word first), the
    merges counted across users, the newest examples (at most :data:`EXAMPLES_LISTED`),
    its status and, once decided, when and by which admin key."""

    id: str
    tenant: str
    words: tuple[str, ...]
    count: int
    examples: tuple[SynonymExample, ...]
    status: SynonymStatus
    created_at: datetime
    updated_at: datetime
    decided_at: datetime | None = None
    decided_by: str | None = None


def example_to_json(example: SynonymExample) -> dict[str, str]:
    """An example as the API and both stores write it (``at`` ISO 8601 UTC)."""
    return {
        "field": example.field,
        "kept": example.kept,
        "said": example.said,
        "how": example.how,
        "at": to_iso(example.at) or "",
    }


def example_from_json(data: Mapping[str, str]) -> SynonymExample:
    """The inverse of :func:`example_to_json`."""
    at = from_iso(data["at"])
    assert at is not None
    return SynonymExample(
        field=cast(TagField, data["field"]),
        kept=data["kept"],
        said=data["said"],
        how=cast(MergeKind, data["how"]),
        at=at,
    )


def newest(examples: Sequence[SynonymExample], limit: int) -> tuple[SynonymExample, ...]:
    """The ``limit`` newest of ``examples``, newest first."""
    return tuple(sorted(examples, key=lambda e: e.at, reverse=True)[:limit])


class SynonymStore(Protocol):
    """The part of :class:`~proxy.memory.store.MemoryStore` that keeps candidate synonyms.
    Every method raises :class:`~proxy.memory.store.StoreUnavailableError` when the store
    fails."""

    async def count_synonyms(
        self, tenant: str, user: str, examples: Sequence[SynonymExample]
    ) -> None:
        """Count each example as one observation by ``user`` of the candidate of its two
        words (created ``open`` when new and the tenant holds fewer than
        :data:`MAX_CANDIDATES`); the user keeps their :data:`EXAMPLES_PER_USER` newest."""
        ...

    async def synonym_candidates(
        self, tenant: str, *, status: SynonymStatus | None, limit: int
    ) -> list[SynonymCandidate]:
        """The tenant's candidates (``status`` ``None``: all), most counted first (then
        newest), at most ``limit``."""
        ...

    async def decide_synonym(
        self, tenant: str, candidate: str, *, status: SynonymStatus, actor: str, at: datetime
    ) -> SynonymCandidate | None:
        """Set the candidate's status (who decided, when); ``None`` when the tenant has no
        candidate of that id."""
        ...
