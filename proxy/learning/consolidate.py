"""Consolidation: extracted facts + what is stored → one :class:`ChangeSet` (pure).

Rules (docs/design.md#evidence, docs/design.md#contradictions):

- **Merge as evidence.** A fact that repeats a stored memory — the model's
  ``duplicate_of``, normalised equality, containment, or embedding similarity ≥
  ``dedup_similarity`` (0.85) — adds evidence to it: ``hits += 1`` (at most
  once per batch), ``last_seen_at`` refreshed, tags unioned, and its content replaced only
  by a strictly richer statement of the same thing. Nothing "skips identical facts": that
  guard would freeze hits at 1.
- **Subjects never cross.** ``duplicate_of``, ``supersedes`` and every other match apply
  only between memories with the same subject (:func:`subject_key`: "user" for the user,
  else the person's normalised name) and the learned scope: a fact about person X retires
  or strengthens only the user's facts about X, never the user's own.
- **A restatement is evidence.** A fact that repeats a stored memory word for word or by
  containment (:func:`restates`) merges with it even when the model marks it as
  superseding that memory: its hits grow instead of restarting at 1.
- **Retire, not delete.** A fact that ``supersedes`` stored memories is stored new, and each
  superseded one gets ``enabled = False``, ``superseded_at``, ``superseded_by`` and a reason:
  kept for audit and history, never injected again (after a contradiction exactly the new fact is
  active: never both, never neither).
- **Deleted stays deleted.** A fact the user deleted after saying it is not re-created from
  messages older than the deletion (docs/design.md#deletion).
- **Profile.** Traits and topics are ``{text, score, hits, at}``: a hit adds 1 to the decayed
  score and refreshes ``at``; effective score = score × 0.9^weeks; near-synonyms (normalised
  equality, containment, or one configured synonym group such as 话少/潜水/沉默) merge;
  each list keeps the 12 best (docs/design.md#traits). Style and impression are
  overwritten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from proxy.learning.answers import CandidateFact, ProfileUpdate
from proxy.memory.categories import CATEGORIES
from proxy.memory.conflicts import (
    Conflict,
    ConflictKind,
    mark_pair,
    retire,
    snapshot,
    unmarked,
)
from proxy.memory.records import (
    TAG_DECAY_PER_WEEK,
    USER_SUBJECT,
    ConversationRecord,
    Memory,
    Profile,
    ScoredTag,
    new_id,
)
from proxy.memory.store import AuditEvent, ChangeSet
from proxy.memory.text import has_cjk, normalize

MIN_CONTAINMENT_CHARS = 12  # shorter texts are too generic to merge by containment
TRAIT_CAP = 12  # docs/design.md#traits: 12 traits + 12 topics
TOPIC_CAP = 12

Similarity = Callable[[Memory, str], float]


@dataclass(frozen=True, slots=True)
class BatchContext:
    """Everything consolidation needs to know about the batch and the store."""

    tenant: str
    user: str
    batch_key: str
    conversation: str
    channel: str  # "private" | "group:<id>"
    now: datetime
    batch_started: datetime  # time of the batch's oldest message
    score: float  # the batch's weighted score (stored as the memories' quality)
    known: Mapping[str, Memory] = field(default_factory=dict)  # short id → memory
    existing: Sequence[Memory] = ()  # active memories to dedup against
    tombstones: Mapping[str, datetime] = field(default_factory=dict)  # norm → deleted_at
    dedup_similarity: float = 0.85
    similarity: Similarity | None = None
    synonyms: Sequence[Sequence[str]] = ()


# How a fact names the user as its subject (the extraction prompt asks for "user").
USER_SUBJECTS = frozenset({"user", "the user", "me", "i", "myself", "用户", "我"})
LEARNED_SCOPE = "personal"  # the scope of every learned memory


def subject_key(subject: str) -> str:
    """The subject a memory is about, compared across memories: ``"user"`` for the user
    (an empty subject, "user", "the user", "me", 用户 …), else the person's normalised
    name (:func:`~proxy.memory.text.normalize`)."""
    norm = normalize(subject.strip())
    return USER_SUBJECT if not norm or norm in USER_SUBJECTS else norm


def _same_subject(memory: Memory, subject: str) -> bool:
    """Whether ``memory`` may be merged with or retired by a learned fact about
    ``subject``: same subject key and the learned scope (subjects never cross: a fact
    about a named person never strengthens or retires the user's own facts, nor a
    shared or system memory)."""
    return memory.scope == LEARNED_SCOPE and subject_key(memory.subject) == subject_key(subject)


def _find_duplicate(
    fact: CandidateFact, subject: str, norm: str, ctx: BatchContext,
    active: Mapping[str, Memory],
) -> Memory | None:
    if fact.duplicate_of:
        known = ctx.known.get(fact.duplicate_of)
        if known is not None and known.id in active and \
                _same_subject(active[known.id], subject):
            return active[known.id]
    candidates = [m for m in active.values() if _same_subject(m, subject)]
    for memory in candidates:
        if normalize(memory.content) == norm:
            return memory
    for memory in candidates:
        if contains(normalize(memory.content), norm):
            return memory
    if ctx.similarity is not None:
        best, best_sim = None, ctx.dedup_similarity
        for memory in candidates:
            sim = ctx.similarity(memory, fact.content)
            if sim >= best_sim:
                best, best_sim = memory, sim
        return best
    return None


def contains(a: str, b: str) -> bool:
    """One normalised text contains the other on word boundaries (so "try 1" is not inside
    "try 10") and both are long enough to be specific (``MIN_CONTAINMENT_CHARS``)."""
    if min(len(a), len(b)) < MIN_CONTAINMENT_CHARS:
        return False
    padded_a, padded_b = f" {a} ", f" {b} "
    return padded_a in padded_b or padded_b in padded_a


# Words whose presence in a richer restatement turns it into a change of the stored fact
# ("Lives in Paris" → "No longer lives in Paris"): the supersedes then stands.
_CHANGE_WORDS = frozenset({"not", "no", "never", "longer", "anymore", "stopped", "quit",
                           "former", "formerly", "used", "ex", "was", "gave"})
_CHANGE_CHARS = ("不", "没", "再", "曾", "戒", "以前", "已经")


def restates(stored: str, new: str) -> bool:
    """Whether the normalised fact ``new`` says the normalised memory ``stored`` again
    rather than changing it: the same text, a part of it (:func:`contains`), or it with
    more words of which none marks a change (:data:`_CHANGE_WORDS`, :data:`_CHANGE_CHARS`).
    A fact that restates a memory merges as evidence even when the model says it
    supersedes it."""
    if new == stored:
        return True
    if not contains(stored, new):
        return False
    if f" {new} " in f" {stored} ":
        return True  # the fact is part of the stored memory: nothing changes
    extra = f" {new} ".replace(f" {stored} ", " ")
    return not (set(extra.split()) & _CHANGE_WORDS or any(c in extra for c in _CHANGE_CHARS))


def _merge(memory: Memory, fact: CandidateFact, ctx: BatchContext, *, count: bool) -> Memory:
    old, new = normalize(memory.content), normalize(fact.content)
    richer = new != old and f" {old} " in f" {new} "
    tags = tuple(dict.fromkeys((*memory.tags, *fact.tags)))[:20]
    return memory.with_changes(
        content=fact.content if richer else memory.content,
        title=memory.title or fact.title,
        tags=tags,
        hits=memory.hits + (1 if count else 0),
        last_seen_at=ctx.now,
        updated_at=ctx.now,
        score=max(memory.score, ctx.score),
    )


def _category(fact: CandidateFact) -> str:
    return fact.category if fact.category in CATEGORIES else "domain"


def consolidate(
    ctx: BatchContext,
    facts: Sequence[CandidateFact],
    *,
    profile: Profile | None,
    profile_update: ProfileUpdate | None,
    user_messages: int,
    names: Iterable[str] = (),
    dimensions: Mapping[str, float] | None = None,
    reason: str = "",
) -> ChangeSet:
    """The change set for one batch (see the module docstring for the rules)."""
    active: dict[str, Memory] = {m.id: m for m in ctx.existing if m.active}
    for memory in ctx.known.values():
        if memory.active:
            active.setdefault(memory.id, memory)
    upserts: dict[str, Memory] = {}
    evidence: list[tuple[str, str]] = []
    counted: set[str] = set()
    audit: list[AuditEvent] = []
    conflicts: list[Conflict] = []
    for fact in facts:
        subject = USER_SUBJECT if subject_key(fact.subject) == USER_SUBJECT \
            else fact.subject.strip()
        norm = normalize(fact.content)
        if not norm:
            continue
        deleted_at = ctx.tombstones.get(norm)
        if deleted_at is not None and deleted_at >= ctx.batch_started:
            audit.append(_event(ctx, "rejected", None, "deleted by the user after it was said"))
            continue
        superseded = [
            active[ctx.known[s].id] for s in fact.supersedes
            if s in ctx.known and ctx.known[s].id in active
            and _same_subject(active[ctx.known[s].id], subject)
        ]
        duplicate = _find_duplicate(fact, subject, norm, ctx, active)
        if duplicate is not None and restates(normalize(duplicate.content), norm):
            # "Supersedes" of a memory the fact only restates: evidence, not a contradiction.
            superseded = [m for m in superseded if m.id != duplicate.id]
        retiring = {m.id for m in superseded}
        if duplicate is not None and duplicate.id not in retiring:
            first = duplicate.id not in counted
            merged = _merge(duplicate, fact, ctx, count=first)
            counted.add(duplicate.id)
            upserts[merged.id] = active[merged.id] = merged
            _remark(merged, active, upserts)
            if first:
                evidence.append((merged.id, ctx.batch_key))
            audit.append(_event(ctx, "merged", merged.id, "repeated fact counted as evidence",
                                {"hits": merged.hits}))
            continue
        created = _created(fact, subject, ctx)
        upserts[created.id] = active[created.id] = created
        counted.add(created.id)
        evidence.append((created.id, ctx.batch_key))
        audit.append(_event(ctx, "created", created.id, "extracted from conversation",
                            {"category": created.category}))
        contradicted = _contradicted(fact, subject, ctx, active, retiring)
        _pairs(ctx, created, superseded, contradicted, active=active, upserts=upserts,
               audit=audit, conflicts=conflicts)
    new_profile = merge_profile(
        profile, profile_update, tenant=ctx.tenant, user=ctx.user, now=ctx.now,
        user_messages=user_messages, names=names, synonyms=ctx.synonyms,
    )
    if profile_update is not None:
        audit.append(_event(ctx, "profile_updated", None, "consolidation", {
            "traits": len(new_profile.traits), "topics": len(new_profile.topics)}))
    return ChangeSet(
        tenant=ctx.tenant, user_id=ctx.user, batch_key=ctx.batch_key,
        upserts=tuple(upserts.values()), evidence=tuple(evidence), profile=new_profile,
        conversation=ConversationRecord(
            tenant=ctx.tenant, user_id=ctx.user, conversation_id=ctx.conversation,
            score=ctx.score, dimensions=dict(dimensions or {}), reason=reason,
            learned_messages=user_messages, updated_at=ctx.now,
        ),
        audit=tuple(audit), conflicts=tuple(conflicts),
        snapshot=None if profile_update is None else snapshot(
            new_profile, tenant=ctx.tenant, user=ctx.user, now=ctx.now),
    )


def _pairs(ctx: BatchContext, created: Memory, superseded: Sequence[Memory],
           contradicted: Sequence[Memory], *, active: dict[str, Memory],
           upserts: dict[str, Memory], audit: list[AuditEvent],
           conflicts: list[Conflict]) -> None:
    """The new memory ``created`` against the stored ones it supersedes (each retired, a
    ``supersede`` pair) and those it may contradict (an ``open`` pair, both marked)."""
    for old in superseded:
        upserts[old.id] = _retired(old, by=created, ctx=ctx)
        active.pop(old.id, None)
        _unmark_partner(old, active, upserts)
        audit.append(_event(ctx, "retired", old.id, "superseded",
                            {"superseded_by": created.id}))
        conflicts.append(_conflict(ctx, "supersede", old, created))
    for old in contradicted:
        old_marked, new_marked = mark_pair(old, upserts.get(created.id, created))
        for memory in (old_marked, new_marked):
            upserts[memory.id] = active[memory.id] = memory
        conflicts.append(_conflict(ctx, "contradicts", old, created))
        audit.append(_event(ctx, "conflict_opened", old.id, "contradicted, unsure",
                            {"successor": created.id}))


def _contradicted(fact: CandidateFact, subject: str, ctx: BatchContext,
                  active: Mapping[str, Memory], retiring: set[str]) -> list[Memory]:
    """The active stored memories the fact names in ``contradicts`` (same subject, not
    superseded by it): each becomes an open conflict with the fact's new memory."""
    out: list[Memory] = []
    for short in fact.contradicts:
        known = ctx.known.get(short)
        if known is None or known.id not in active or known.id in retiring:
            continue
        memory = active[known.id]
        if _same_subject(memory, subject) and memory not in out:
            out.append(memory)
    return out


def _remark(memory: Memory, active: Mapping[str, Memory], upserts: dict[str, Memory]) -> None:
    """After new evidence for ``memory``: its open conflict's marks again (which of the
    pair recall keeps may have changed), when the other memory is loaded."""
    partner = active.get(memory.conflict_with or "")
    if partner is None or partner.conflict_with != memory.id:
        return
    mine, theirs = mark_pair(memory, partner)
    upserts[mine.id] = mine
    if theirs != partner:
        upserts[theirs.id] = theirs


def _unmark_partner(retired: Memory, active: Mapping[str, Memory],
                    upserts: dict[str, Memory]) -> None:
    """A memory in an open conflict was retired by another fact: the other memory of the
    pair is no longer held back by it."""
    partner = active.get(retired.conflict_with or "")
    if partner is not None and partner.conflict_with == retired.id:
        upserts[partner.id] = unmarked(upserts.get(partner.id, partner))


def _conflict(ctx: BatchContext, kind: ConflictKind, old: Memory, new: Memory) -> Conflict:
    """The recorded pair: ``supersede`` (retired now, unconfirmed) or ``contradicts``
    (open, nothing retired)."""
    return Conflict(
        id=new_id(), tenant=ctx.tenant, user_id=ctx.user, kind=kind,
        status="unconfirmed" if kind == "supersede" else "open",
        retired_id=old.id, successor_id=new.id, created_at=ctx.now,
        reason=(f"superseded by a later statement in {ctx.conversation}"
                if kind == "supersede" else
                f"may be contradicted by a later statement in {ctx.conversation}"),
    )


def _event(ctx: BatchContext, action: str, memory_id: str | None, why: str = "",
           detail: dict[str, object] | None = None) -> AuditEvent:
    """An automatic audit event of this batch's owner and conversation."""
    return AuditEvent(
        tenant=ctx.tenant, user_id=ctx.user, action=action,  # type: ignore[arg-type]
        actor="auto", at=ctx.now, conversation_id=ctx.conversation, memory_id=memory_id,
        reason=why, detail=detail or {},
    )


def _created(fact: CandidateFact, subject: str, ctx: BatchContext) -> Memory:
    """A new personal memory of ``fact`` (one hit, the batch's score and time)."""
    return Memory(
        id=new_id(), tenant=ctx.tenant, user_id=ctx.user, content=fact.content,
        title=fact.title, scope="personal", category=_category(fact),  # type: ignore[arg-type]
        subcategory=fact.subcategory, tags=fact.tags, subject=subject, source="auto",
        source_conversation_id=ctx.conversation, source_channel=ctx.channel,
        score=ctx.score, hits=1, created_at=ctx.now, updated_at=ctx.now,
        last_seen_at=ctx.now,
    )


def _retired(old: Memory, *, by: Memory, ctx: BatchContext) -> Memory:
    """``old`` disabled as superseded by the new memory ``by`` (any conflict mark gone)."""
    return retire(old, by=by.id, at=ctx.now,
                  reason=f"contradicted by a later statement in {ctx.conversation}")


def canonical_tag(text: str, synonyms: Sequence[Sequence[str]]) -> str:
    """The first word of the synonym group ``text`` belongs to, else ``text`` itself."""
    norm = normalize(text)
    for group in synonyms:
        if any(normalize(word) == norm for word in group):
            return group[0]
    return text.strip()


def merge_tags(
    existing: Sequence[ScoredTag], texts: Iterable[str], *, now: datetime,
    synonyms: Sequence[Sequence[str]], cap: int, decay: float = TAG_DECAY_PER_WEEK,
) -> tuple[ScoredTag, ...]:
    """Add one hit per text (matching by synonym group, equality or containment), then keep
    the ``cap`` best by effective score."""
    tags = list(existing)
    for raw in texts:
        text = canonical_tag(raw, synonyms)
        norm = normalize(text)
        if not norm:
            continue
        for index, tag in enumerate(tags):
            if tag_matches(tag.text, text, synonyms):
                tags[index] = ScoredTag(
                    text=tag.text, hits=tag.hits + 1, at=now,
                    score=tag.effective_score(now, decay_per_week=decay) + 1.0,
                )
                break
        else:
            tags.append(ScoredTag(text=text, score=1.0, hits=1, at=now))
    tags.sort(key=lambda t: (-t.effective_score(now, decay_per_week=decay), t.text))
    return tuple(tags[:cap])


def tag_matches(stored: str, text: str, synonyms: Sequence[Sequence[str]]) -> bool:
    """Whether the trait or topic ``text`` merges into the stored one: their synonym-group
    forms (:func:`canonical_tag`) are equal once normalised or one contains the other."""
    a = normalize(canonical_tag(stored, synonyms))
    b = normalize(canonical_tag(text, synonyms))
    return a == b or _tag_contains(a, b)


def _tag_contains(a: str, b: str) -> bool:
    """Short tags merge by containment: characters for CJK (话少 / 很话少), whole words
    otherwise ("hiking" / "mountain hiking", but not "trait 1" / "trait 10")."""
    if min(len(a), len(b)) < 2:
        return False
    if has_cjk(a) and has_cjk(b):
        return a in b or b in a
    return f" {a} " in f" {b} " or f" {b} " in f" {a} "


def merge_profile(
    profile: Profile | None,
    update: ProfileUpdate | None,
    *,
    tenant: str,
    user: str,
    now: datetime,
    user_messages: int,
    names: Iterable[str],
    synonyms: Sequence[Sequence[str]],
) -> Profile:
    base = profile or Profile(tenant=tenant, user_id=user, first_seen=now)
    known_names = tuple(dict.fromkeys((*base.names, *(n for n in names if n))))[:10]
    style, impression = base.style, base.impression
    traits, topics = base.traits, base.topics
    if update is not None:
        style = update.style.strip() if update.style else style
        impression = update.impression.strip() if update.impression else impression
        traits = merge_tags(traits, update.traits, now=now, synonyms=synonyms, cap=TRAIT_CAP)
        topics = merge_tags(topics, update.topics, now=now, synonyms=synonyms, cap=TOPIC_CAP)
    return Profile(
        tenant=tenant, user_id=user, names=known_names,
        first_seen=base.first_seen or now, last_seen=now,
        message_count=base.message_count + user_messages, style=style,
        impression=impression, traits=traits, topics=topics,
    )
