"""Near-synonym traits and topics with one light verdict (docs/design.md#growing-vocabulary).

With an embedder configured, a new trait or topic that today's rules (normalised equality,
containment, a synonym group) would not merge, but whose embedding lies within
``learning.trait_similarity`` (cosine) of a stored one of the same list, is merged into it
only after one short verdict call to the learning model says "same". At most one call per
batch (:class:`VerdictTurn`): the closest such pair of the batch's first owner that has one
gets it; every other wording follows today's rules. The call is booked in the learning
ledger (purpose ``verdict``) and is not made while the tenant's learning budget is spent.
Nothing here fails a batch: no embedder, a failed embedding, a spent budget, an upstream
error or an unreadable answer all leave the wording to today's rules (counted as
``learning_events{event="verdict"}``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import structlog

from proxy.errors import ProxyError
from proxy.learning.answers import ParseError, ProfileUpdate, parse_verdict
from proxy.learning.answers.verdict import VERDICT_SCHEMA
from proxy.learning.consolidate import canonical_tag, tag_matches
from proxy.learning.events import Counter, batch_event
from proxy.learning.model import LearningModel
from proxy.learning.prompts import VERDICT_MAX_TOKENS, Language, verdict_messages
from proxy.learning.queue import Batch
from proxy.learning.tenancy import TenantLearning
from proxy.memory.embed import Vector, cosine
from proxy.memory.records import Profile
from proxy.memory.store import AuditEvent
from proxy.memory.synonyms import TagField
from proxy.memory.text import normalize
from proxy.memory.vectors import MemoryVectors
from proxy.settings import LearningSettings

log = structlog.get_logger("proxy.learning")
FIELDS: tuple[TagField, ...] = ("traits", "topics")


@dataclass
class VerdictTurn:
    """The batch's one verdict call: ``used`` once it was made (or tried)."""

    used: bool = False


@dataclass(frozen=True, slots=True)
class Neighbour:
    """A new wording ``said`` of ``field`` close to the stored tag ``kept``."""

    field: TagField
    kept: str
    said: str
    similarity: float


@dataclass(frozen=True, slots=True)
class Judged:
    """The owner's profile update to consolidate (a wording judged the same as a stored
    tag rewritten to it), ``neighbours`` (normalised wording → stored tag text) and the
    audit events of the verdict."""

    update: ProfileUpdate | None
    neighbours: Mapping[str, str] = field(default_factory=dict)
    audit: tuple[AuditEvent, ...] = ()


def unmatched(
    profile: Profile,
    update: ProfileUpdate,
    synonyms: Sequence[Sequence[str]],
) -> list[tuple[TagField, str]]:
    """The update's wordings that no stored tag of their list takes by today's rules."""
    out = []
    for name in FIELDS:
        stored = [t.text for t in getattr(profile, name)]
        for raw in getattr(update, name):
            text = canonical_tag(raw, synonyms)
            if normalize(text) and not any(tag_matches(t, text, synonyms) for t in stored):
                out.append((name, raw.strip()))
    return out


def nearest(
    profile: Profile,
    wordings: Sequence[tuple[TagField, str]],
    *,
    vectors: Mapping[str, Vector],
    threshold: float,
) -> Neighbour | None:
    """The closest (wording, stored tag of the same list) pair at or above ``threshold``
    (cosine of their vectors), else ``None``."""
    best: Neighbour | None = None
    for name, said in wordings:
        for tag in getattr(profile, name):
            if said not in vectors or tag.text not in vectors:
                continue
            sim = cosine(vectors[said], vectors[tag.text])
            if sim >= threshold and (best is None or sim > best.similarity):
                best = Neighbour(field=name, kept=tag.text, said=said, similarity=sim)
    return best


def rewritten(update: ProfileUpdate, neighbour: Neighbour) -> ProfileUpdate:
    """``update`` with the neighbour's wording replaced by the stored tag's text."""
    said = normalize(neighbour.said)
    texts = tuple(
        neighbour.kept if normalize(t) == said else t for t in getattr(update, neighbour.field)
    )
    if neighbour.field == "traits":
        return replace(update, traits=texts)
    return replace(update, topics=texts)


class Neighbours:
    """The verdict stage of a batch's owners (module docstring)."""

    def __init__(
        self,
        *,
        vectors: MemoryVectors | None,
        tenancy: TenantLearning,
        count: Counter,
        clock: Callable[[], datetime],
    ) -> None:
        self._vectors = vectors
        self._tenancy = tenancy
        self._count = count
        self._clock = clock

    async def judge(
        self,
        batch: Batch,
        *,
        job_id: str,
        owner: str,
        profile: Profile | None,
        update: ProfileUpdate | None,
        synonyms: Sequence[Sequence[str]],
        config: LearningSettings,
        model: LearningModel,
        language: Language,
        turn: VerdictTurn,
    ) -> Judged:
        """The owner's update after at most one verdict (module docstring)."""
        if self._vectors is None or turn.used or update is None or profile is None:
            return Judged(update)
        wordings = unmatched(profile, update, synonyms)
        if not wordings:
            return Judged(update)
        stored = [t.text for name in FIELDS for t in getattr(profile, name)]
        vectors = await self._vectors.embed(
            [w for _, w in wordings] + stored,
            tenant=batch.tenant,
            user=owner,
            source="learn",
            job_id=job_id,
        )
        found = (
            None
            if vectors is None
            else nearest(profile, wordings, vectors=vectors, threshold=config.trait_similarity)
        )
        if found is None:
            return Judged(update)
        turn.used = True
        self._tenancy.forget(batch.tenant)  # this batch's calls count against the budget
        if await self._tenancy.budget_spent(batch.tenant, config):
            return self._outcome(batch, owner, found, update, "budget_spent")
        try:
            same = parse_verdict(
                await model.call(
                    purpose="verdict",
                    request_model=batch.model,
                    tenant=batch.tenant,
                    user=owner,
                    job_id=job_id,
                    max_tokens=VERDICT_MAX_TOKENS,
                    schema=VERDICT_SCHEMA,
                    messages=verdict_messages(
                        field=found.field, kept=found.kept, said=found.said, language=language
                    ),
                )
            )
        except (ProxyError, ParseError) as exc:
            log.warning(
                "learning_verdict_failed",
                batch=batch.key,
                error=f"{type(exc).__name__}: {exc}"[:300],
            )
            return self._outcome(batch, owner, found, update, "failed")
        return self._outcome(batch, owner, found, update, "same" if same else "different")

    def _outcome(
        self, batch: Batch, owner: str, found: Neighbour, update: ProfileUpdate, verdict: str
    ) -> Judged:
        """Counted and audited (field, similarity and verdict: no profile text)."""
        self._count("verdict", verdict)
        event = batch_event(
            batch,
            "profile_updated",
            f"near-neighbour verdict: {verdict}",
            self._clock(),
            {"field": found.field, "similarity": round(found.similarity, 3), "verdict": verdict},
            owner=owner,
        )
        if verdict != "same":
            return Judged(update, audit=(event,))
        return Judged(rewritten(update, found), {normalize(found.said): found.kept}, (event,))
