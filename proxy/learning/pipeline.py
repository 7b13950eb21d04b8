"""The ``learn`` job: one sealed batch through the learning pipeline, top-down.

:meth:`Pipeline.learn_batch` reads as the list of its stages:

1. gates — the tenant's learning on and its budget left (:meth:`Pipeline.learn`); a
   user message to learn from; owners who may learn (:mod:`proxy.learning.owners`);
2. known — each owner's stored memories most related to what they said;
3. score — worth learning at all? below ``learning.score_threshold`` only the score is kept;
4. extract — facts, profile, summary and image verdicts (:mod:`proxy.learning.calls`);
5. assign — each fact (and image memory) to its owner;
6. per owner: filter against their own words, embed, consolidate
   (:mod:`proxy.learning.consolidate`), commit, enforce quotas
   (:mod:`proxy.learning.evictions`).

Each stage returns its result and its audit events; the batch's audit is the sum of them,
committed with the batch. The store applies each batch key at most once, so a redelivered
batch never counts twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import structlog

from proxy.learning.answers import CandidateFact, ExtractionResult, ProfileUpdate, ScoreResult
from proxy.learning.calls import ModelCalls
from proxy.learning.consolidate import BatchContext, consolidate
from proxy.learning.events import Counter, batch_event
from proxy.learning.evictions import Evictions
from proxy.learning.exchange import TranscriptMessage
from proxy.learning.filters import FactFilter, contains_pii, is_directive
from proxy.learning.jobs import read_learn
from proxy.learning.model import LearningModel
from proxy.learning.neighbours import Neighbours, VerdictTurn
from proxy.learning.owners import Owners, OwnerStrategy, owners_for
from proxy.learning.pii import Scrubber
from proxy.learning.policy import Switches
from proxy.learning.privacy import Scrubbers
from proxy.learning.prompts import Language, batch_images, clip_batch, render_known
from proxy.learning.queue import Batch, Job, LearningQueue
from proxy.learning.tenancy import TenantLearning
from proxy.learning.vocabulary import profile_merges
from proxy.memory.embed import Vector
from proxy.memory.records import ConversationRecord, Memory
from proxy.memory.store import (
    AuditEvent,
    ChangeSet,
    MemoryStore,
    SearchQuery,
    StoreUnavailableError,
)
from proxy.memory.synonyms import SynonymExample
from proxy.memory.text import has_cjk, load_segmenter_for, normalize
from proxy.memory.titles import short_title
from proxy.memory.vectors import MemoryVectors, vector_similarity
from proxy.settings import LearningSettings

log = structlog.get_logger("proxy.learning")
# Nearest stored memories per new fact, by vector, offered to consolidation's dedup
# besides the keyword-related ones (a paraphrase shares few keywords).
VECTOR_NEIGHBOURS = 3
PerOwner = dict[str, list[CandidateFact]]
Count = Callable[[str, str], None]  # learning_events{event, label} += 1


class Pipeline:
    """The ``learn`` job handler and its stages."""

    def __init__(self, *, queue: LearningQueue, store: MemoryStore, tenancy: TenantLearning,
                 calls: ModelCalls, evictions: Evictions, scrubbers: Scrubbers,
                 vectors: MemoryVectors | None, count: Counter,
                 clock: Callable[[], datetime]) -> None:
        self.queue = queue
        self._store = store
        self._tenancy = tenancy
        self._settings = tenancy.settings
        self._calls = calls
        self._evictions = evictions
        self._scrubbers = scrubbers
        self._vectors = vectors
        self._count = count
        self._clock = clock
        self._neighbours = Neighbours(vectors=vectors, tenancy=tenancy, count=count,
                                      clock=clock)

    async def learn(self, job: Job) -> None:
        key = read_learn(job.payload)
        loaded = await self.queue.load_batch(key)
        if loaded is None:
            return  # learned (or discarded) already: redelivery
        # Messages are cut to MAX_MESSAGE_CHARS where they are buffered (exchange.transcript);
        # this covers batches buffered before that, for the calls and the checks alike.
        batch = clip_batch(loaded)
        setup = await self._tenant_setup(batch)
        if setup is None:
            return
        try:
            await self.learn_batch(job, batch, *setup)
        finally:  # this batch spent the tenant's tokens: its budget is read again
            self._tenancy.forget(batch.tenant)

    async def _tenant_setup(self, batch: Batch) -> tuple[LearningSettings,
                                                        LearningModel] | None:
        """The tenant's learning settings and learning model for ``batch``; ``None`` (the
        batch dropped, audited) when the tenant switched learning off. Raises
        :class:`~proxy.learning.budget.BudgetSpent` when its learning budget is spent (the
        job waits)."""
        config = await self._tenancy.config(batch.tenant)
        if not Switches(tenant=config.enabled).tenant_learns:
            await self._skip(batch, "learning switched off for the tenant",
                             "skipped_tenant_off", self._clock())
            return None
        await self._tenancy.check_budget(batch.tenant, config)
        return config, self._tenancy.model(config)

    async def learn_batch(self, job: Job, batch: Batch, config: LearningSettings,
                          model: LearningModel) -> None:
        """Learn ``batch`` (see the module docstring for the stages)."""
        now = self._clock()
        if not batch.user_messages:
            # Only assistant text (a retried reply, an explicit flush after a reply): no
            # statement of the user to learn from, so no learning call is made.
            await self._skip(batch, "no new user message", "skipped_empty", now)
            return
        strategy = owners_for(batch)
        owners = await strategy.resolve(batch, self._store)
        if not owners:
            await self._skip(batch, "learning off, memory cleared, or no participant "
                             "identified", "skipped_off", now)
            return
        user_text = "\n".join(m.text for m in batch.user_messages)
        await load_segmenter_for(user_text)
        language: Language = "zh" if has_cjk(user_text) else "en"
        related, known, known_text = await self._known(batch, strategy, owners)
        scored = await self._calls.score(job, batch, known_text, language, model)
        weighted = scored.weighted
        audit = [batch_event(batch, "scored", scored.reason[:500], now,
                             {"score": weighted, "dimensions": scored.dimensions})]
        record = _conversation_record(batch, weighted, scored.dimensions, scored.reason, now)
        if weighted < config.score_threshold:
            audit.append(batch_event(batch, "skipped", "score below threshold", now, {
                "score": weighted, "threshold": config.score_threshold}))
            await self._apply(batch, ChangeSet(tenant=batch.tenant, user_id=batch.user,
                                               batch_key=batch.key, audit=tuple(audit),
                                               conversation=record))
            self._count("learn_outcome", "below_threshold")
            return
        extracted = await self._calls.extract(
            job, batch, known_text=known_text, language=language, group=strategy.group,
            now=now, model=model)
        extraction = extracted.extraction
        audit += extracted.audit
        if extraction.summary:
            record = replace(record, summary=extraction.summary)
        audit.append(batch_event(batch, "extracted", "", now, {
            "facts": len(extraction.facts), "unusable": extraction.dropped}))
        per_owner, assigned = assign(batch, strategy, extraction, owners=owners, now=now,
                                     count=self._count)
        audit += assigned
        from_images: PerOwner = {}
        if extracted.vision:
            from_images, seen = image_facts(extracted.shown, strategy, extraction,
                                            owners=owners, now=now, count=self._count)
            audit += seen
        turn = VerdictTurn()  # at most one near-neighbour verdict call per batch
        for name, owner in owners.items():
            lines = strategy.spoken(batch, name)
            changes, merges = await self._owner_changes(
                batch, strategy, job_id=job.id, owner=owner, facts=per_owner[owner],
                image_facts=from_images.get(owner, []), lines=lines,
                names={owner, *(m.name for m in lines if m.name)},
                known={s: m for s, m in known.items() if m.user_id == owner},
                related=related[owner], weighted=weighted, scored=scored, now=now,
                profile_update=_clean_profile(strategy.profile(extraction, name),
                                              self._scrubbers.for_tenant(batch.tenant)),
                learning=Learning(config, model, language, turn),
            )
            await self._commit(batch, strategy, changes, audit=audit, record=record,
                               config=config, owner=owner, merges=merges)
        closing = strategy.closing(batch, audit=audit, record=record)
        if closing is not None:
            await self._apply(batch, closing)
        self._count("learn_outcome", "learned")

    async def _skip(self, batch: Batch, reason: str, outcome: str, at: datetime) -> None:
        """Drop ``batch`` unlearned, audited as ``skipped`` with ``reason``."""
        await self._store.audit([batch_event(batch, "skipped", reason, at)])
        await self.queue.drop_batch(batch.key)
        self._count("learn_outcome", outcome)

    async def _known(
        self, batch: Batch, strategy: OwnerStrategy, owners: Owners,
    ) -> tuple[dict[str, list[Memory]], dict[str, Memory], str]:
        """Each owner's stored memories most related to what they said, and the prompt's
        list of them with short ids (labelled with the participant in a group)."""
        related: dict[str, list[Memory]] = {}
        for name, owner in owners.items():
            spoken = "\n".join(m.text for m in strategy.spoken(batch, name))
            related[owner] = await self._store.related(
                batch.tenant, owner, spoken,
                limit=max(1, self._settings.related_memories // len(owners)))
        shown = [m for memories in related.values() for m in memories]
        known_text, short_ids = render_known(shown, owners=strategy.labels(owners, related))
        by_id = {m.id: m for m in shown}
        known = {short: by_id[memory_id] for short, memory_id in short_ids.items()}
        return related, known, known_text

    async def _owner_changes(
        self, batch: Batch, strategy: OwnerStrategy, *, job_id: str, owner: str,
        facts: list[CandidateFact], image_facts: list[CandidateFact],
        lines: list[TranscriptMessage], names: set[str], known: dict[str, Memory],
        related: list[Memory], weighted: float, scored: ScoreResult, now: datetime,
        profile_update: ProfileUpdate | None, learning: Learning,
    ) -> tuple[ChangeSet, list[SynonymExample]]:
        """Filter one owner's facts against their own words and consolidate them; the
        profile merges of two wordings (candidate synonyms) beside the change set."""
        tenant = batch.tenant
        await load_segmenter_for(*(f"{f.title}\n{f.content}" for f in (*facts, *image_facts)),
                                 *(m.content for m in related))
        accepted, audit = self._filter(batch, owner, facts=facts, image_facts=image_facts,
                                       lines=lines, names=names, now=now)
        existing = await self._existing(tenant, owner, accepted, related)
        tombstones = await self._store.tombstoned(
            tenant, owner, [normalize(f.content) for f in accepted]
        )
        vectors, existing = await self._embed_facts(job_id, batch, owner, accepted, existing)
        context = BatchContext(
            tenant=tenant, user=owner, batch_key=strategy.owner_key(batch, owner),
            conversation=batch.conversation, channel=batch.channel, now=now,
            batch_started=datetime.fromtimestamp(batch.oldest_at, UTC), score=weighted,
            known=known, existing=existing, tombstones=tombstones,
            dedup_similarity=self._settings.dedup_similarity,
            similarity=vector_similarity(vectors) if vectors else None,
            synonyms=learning.config.synonyms,
        )
        profile = await self._store.get_profile(tenant, owner)
        judged = await self._neighbours.judge(
            batch, job_id=job_id, owner=owner, profile=profile, update=profile_update,
            synonyms=context.synonyms, config=learning.config, model=learning.model,
            language=learning.language, turn=learning.turn)
        changes = consolidate(
            context, accepted, profile=profile, profile_update=judged.update,
            user_messages=len(lines), names=names - {owner},
            dimensions=scored.dimensions, reason=scored.reason[:500],
        )
        merges = profile_merges(profile, profile_update, synonyms=context.synonyms,
                                neighbours=judged.neighbours, now=now)
        upserts = changes.upserts
        if self._vectors is not None and vectors is not None:
            upserts = await self._vectors.attach(
                upserts, known=vectors, previous={m.id: m for m in existing}, tenant=tenant,
                user=owner, source="learn", job_id=job_id,
            )
        return replace(changes, upserts=upserts,
                       audit=(*audit, *judged.audit, *changes.audit),
                       learned_from=datetime.fromtimestamp(batch.oldest_at, UTC)), merges

    def _filter(self, batch: Batch, owner: str, *, facts: list[CandidateFact],
                image_facts: list[CandidateFact], lines: list[TranscriptMessage],
                names: set[str], now: datetime,
                ) -> tuple[list[CandidateFact], list[AuditEvent]]:
        """The owner's facts that pass :class:`FactFilter` against their own words (image
        facts need no grounding), and a ``rejected`` event per fact that does not."""
        facts_filter = FactFilter(user_text="\n".join(m.text for m in lines),
                                  scrubber=self._scrubbers.for_tenant(batch.tenant),
                                  user_names=names)
        accepted, rejected = facts_filter.split(facts)
        seen_in_images, rejected_images = facts_filter.split(image_facts, grounded=False)
        accepted += seen_in_images
        rejected += rejected_images
        audit = [batch_event(batch, "rejected", v.reason or "", now, owner=owner)
                 for v in rejected]
        for verdict in rejected:
            self._count("fact_rejected", verdict.reason or "unknown")
        return accepted, audit

    async def _existing(self, tenant: str, owner: str, accepted: list[CandidateFact],
                        related: list[Memory]) -> list[Memory]:
        """``related`` plus the stored memories closest to the facts themselves: a repeat
        must be found even when the user's wording this time led keyword recall
        elsewhere; then the other memory of each open conflict among them, so that new
        evidence or a retirement updates the pair's marks (docs/design.md#conflicts)."""
        existing = list(related)
        seen = {m.id for m in related}
        if accepted:
            for memory in await self._store.related(
                tenant, owner, "\n".join(f.content for f in accepted),
                limit=self._settings.related_memories,
            ):
                if memory.id not in seen:
                    existing.append(memory)
                    seen.add(memory.id)
        for partner_id in {m.conflict_with for m in existing if m.conflict_with} - seen:
            partner = await self._store.get(tenant, owner, partner_id)
            if partner is not None and partner.active:
                existing.append(partner)
        return existing

    async def _embed_facts(
        self, job_id: str, batch: Batch, owner: str, facts: list[CandidateFact],
        related: list[Memory],
    ) -> tuple[dict[str, Vector] | None, list[Memory]]:
        """Vectors of the facts and of related memories that lack one (``None`` when there
        is no embedder or it failed), and the memories to dedup against: ``related`` (with
        the vectors filled in) plus each fact's nearest stored memories by vector."""
        if self._vectors is None or not facts:
            return None, list(related)
        model = self._vectors.embedder.model

        def current(m: Memory) -> bool:
            return m.embedding is not None and m.embedding_model == model

        vectors = await self._vectors.embed(
            [f.content for f in facts] + [m.content for m in related if not current(m)],
            tenant=batch.tenant, user=owner, source="learn", job_id=job_id,
        )
        if vectors is None:
            return None, list(related)
        existing = [m if current(m) or m.content not in vectors
                    else m.with_changes(embedding=vectors[m.content], embedding_model=model)
                    for m in related]
        seen = {m.id for m in existing}
        found = await asyncio.gather(*(
            self._store.search(SearchQuery(
                tenant=batch.tenant, user=owner, terms=(), embedding=vectors[f.content],
                limit=VECTOR_NEIGHBOURS, include_shared=False, embedding_model=model,
            )) for f in facts
        ))
        for candidates in found:
            for c in candidates:
                if c.memory.id not in seen and (c.vector_score or 0.0) >= \
                        self._settings.dedup_similarity:
                    seen.add(c.memory.id)
                    existing.append(c.memory)
        return vectors, existing

    async def _commit(self, batch: Batch, strategy: OwnerStrategy, computed: ChangeSet, *,
                      audit: list[AuditEvent], record: ConversationRecord,
                      config: LearningSettings, owner: str,
                      merges: list[SynonymExample]) -> None:
        """Apply one owner's change set as the strategy says (closing the batch, or on its
        own), with its candidate synonyms, then evict what is over the owner's quotas."""
        changes, closes = strategy.commit(computed, batch=batch, audit=audit, record=record)
        if closes:
            await self._apply(batch, changes, merges)
        elif await self._store.apply(changes):
            await self._count_synonyms(changes, merges)
        else:
            log.info("learning_batch_not_applied", batch=changes.batch_key)
        if changes.upserts:
            await self._evictions.enforce_quotas(batch.tenant, owner, batch.channel,
                                                 max_per_user=config.max_memory_per_user)

    async def _count_synonyms(self, changes: ChangeSet, merges: list[SynonymExample]) -> None:
        """Count the merges of two wordings of a change set just applied as candidate
        synonyms of its owner: once, since a redelivered batch is not applied again; a
        store failure loses only them."""
        if not merges:
            return
        try:
            await self._store.count_synonyms(changes.tenant, changes.user_id, merges)
        except StoreUnavailableError as exc:
            log.warning("synonym_candidates_not_counted", error=str(exc)[:300])

    async def _apply(self, batch: Batch, changes: ChangeSet,
                     merges: list[SynonymExample] | None = None) -> None:
        """Apply the change set that closes ``batch`` (and count its ``merges`` when it
        was applied now), then drop the batch's raw text."""
        applied = await self._store.apply(changes)
        if applied:
            await self._count_synonyms(changes, merges or [])
        self._calls.forget(batch.key)
        if not applied:
            log.info("learning_batch_not_applied", batch=batch.key,
                     reason="applied before, or memory cleared since")
        await self.queue.drop_batch(batch.key)


@dataclass(frozen=True, slots=True)
class Learning:
    """What a batch learns with: the tenant's settings, model and the batch's language,
    and its one near-neighbour verdict (:class:`~proxy.learning.neighbours.VerdictTurn`)."""

    config: LearningSettings
    model: LearningModel
    language: Language
    turn: VerdictTurn


def assign(batch: Batch, strategy: OwnerStrategy, extraction: ExtractionResult, *,
           owners: Owners, now: datetime, count: Count) -> tuple[PerOwner, list[AuditEvent]]:
    """Facts by the user they belong to: the batch's user, or in a group the participant
    named as ``speaker``; facts whose speaker is not one resolved participant are
    dropped, and audited in the events returned."""
    audit: list[AuditEvent] = []
    per_owner: PerOwner = {owner: [] for owner in owners.values()}
    for fact in extraction.facts:
        target = strategy.owner_of(fact.speaker, owners)
        if target is None:
            audit.append(batch_event(batch, "rejected", "speaker not identified", now,
                                     {"speaker": fact.speaker}))
            count("fact_rejected", "speaker")
            continue
        per_owner[target].append(fact)
    return per_owner, audit


def image_facts(batch: Batch, strategy: OwnerStrategy, extraction: ExtractionResult, *,
                owners: Owners, now: datetime, count: Count,
                ) -> tuple[PerOwner, list[AuditEvent]]:
    """Memories a vision model read from the users' images, by owner: ``person`` and
    ``long`` are stored (as profile-level / ordinary memories), ``short`` and ``skip``
    are not; the event returned counts the verdicts by tier."""
    images = {number: message for number, _, message in batch_images(batch)}
    out: PerOwner = {}
    tiers: dict[str, int] = {}
    for verdict in extraction.images:
        message = images.get(verdict.image)
        if message is None:
            continue
        tiers[verdict.tier] = tiers.get(verdict.tier, 0) + 1
        count("images", verdict.tier)
        owner = strategy.owner_of(message.name, owners)
        if verdict.tier not in ("person", "long") or not verdict.memory or owner is None:
            continue
        person = verdict.tier == "person"
        out.setdefault(owner, []).append(CandidateFact(
            title=short_title(verdict.memory), content=verdict.memory,
            category="user_preference" if person else "domain",
            subcategory="appearance" if person else "image", tags=("image",),
            subject="user", supersedes=(), duplicate_of=None, source_turns=(),
        ))
    audit = [batch_event(batch, "extracted", "images", now, {"tiers": tiers})] \
        if tiers else []
    return out, audit


def _conversation_record(batch: Batch, score: float, dimensions: dict[str, float],
                         reason: str, now: datetime) -> ConversationRecord:
    return ConversationRecord(
        tenant=batch.tenant, user_id=batch.user, conversation_id=batch.conversation,
        score=score, dimensions=dimensions, reason=reason[:500],
        learned_messages=len(batch.user_messages), updated_at=now,
    )


def _clean_profile(update: ProfileUpdate | None, scrubber: Scrubber) -> ProfileUpdate | None:
    """Profile strings pass the same directive and PII checks as facts."""
    if update is None:
        return None

    def ok(text: str | None) -> bool:
        return bool(text) and not is_directive(text or "") and \
            not contains_pii(scrubber, text or "")

    return ProfileUpdate(
        style=update.style if ok(update.style) else None,
        impression=update.impression if ok(update.impression) else None,
        traits=tuple(t for t in update.traits if ok(t)),
        topics=tuple(t for t in update.topics if ok(t)),
    )
