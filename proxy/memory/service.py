"""The hot path's memory step: recall → rank → budget → splice, under a deadline.

:meth:`MemoryService.prepare` never raises for memory reasons: a slow or failing store (or
embedder) gives the request its original messages and an ``Injection`` whose status says why
(fail-open, docs/design.md#recall). The outcome becomes response headers (counts, tokens,
status — never memory text).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING

import structlog

from proxy.identity import Identity
from proxy.loop_lag import LoopLag, loop_free_deadline
from proxy.memory.directives import injectable
from proxy.memory.embed import Embedder
from proxy.memory.explain import InjectionLog, InjectionRecord, Item, Keeping, explain
from proxy.memory.index import RecallIndexes
from proxy.memory.inject import BlockPlan, choose_language, fit_block, splice
from proxy.memory.recall import Ranked, RankWeights, distinct
from proxy.memory.records import Memory, Profile, utcnow
from proxy.memory.retrieve import THROTTLE, Retriever, plan_queries
from proxy.memory.store import READ_TURN, MemoryStore, StoreBusyError, StoreUnavailableError
from proxy.memory.text import load_segmenter_for
from proxy.memory.when import mentioned_periods
from proxy.models import Route
from proxy.request import ChatRequest, Message, message_text
from proxy.settings import MemorySettings
from proxy.tokens import TokenCounter, upper_bound_tokens

if TYPE_CHECKING:
    from proxy.tenants import TenantSettings

log = structlog.get_logger("proxy.memory")
# Tokens kept free between prompt + memory + requested output and the context window.
OVERFLOW_MARGIN_TOKENS = 64
# A prompt of more UTF-8 bytes than this many per window token is far beyond the window
# for any text (English averages ~4 bytes per token); it gets no memory and is not counted.
HOPELESS_BYTES_PER_WINDOW_TOKEN = 64
# Share of the recall deadline the query embedding may take; the rest is left for the
# vector search and ranking, so a slow embedder falls back to keyword recall in time.
EMBED_DEADLINE_SHARE = 0.7
# Token counts of memory blocks kept per process (least recently used dropped): a user's
# block repeats while their top memories do (retries, follow-ups on one topic), and
# counting one costs ~0.1 ms (tiktoken, bench/gateway). A block is at most
# token_budget_percent of a context window, so this holds a few MB at worst.
BLOCK_COUNTS = 256


@dataclass(frozen=True, slots=True)
class Injection:
    """What memory did to one request."""

    messages: list[Message]
    # injected | empty | off | no_user | write_only | degraded | no_room; "degraded" with
    # count > 0: memory was injected from keyword recall only (reason says why). Reasons
    # of "degraded" without memory include timeout, store_unavailable and store_busy (no
    # free store connection within the pool's bounded wait).
    status: str
    reason: str | None = None
    count: int = 0
    tokens: int = 0
    memory_ids: tuple[str, ...] = ()
    recall_ms: float = 0.0
    trimmed: int = 0
    # The memory block itself ("" when none): protocols that carry it outside the chat
    # messages (Responses ``instructions``, Anthropic ``system``) place it themselves.
    block: str = ""
    # Stored lines (facts, profile texts) left out because they pose as instructions
    # (:func:`~proxy.memory.directives.injectable`: the write-time rules, applied again).
    refused: int = 0
    recall_tokens: int = 0  # provider tokens of the query embeddings (memory cost)
    # The injection record's id (``X-Memory-Injection-Id``; None when none was recorded)
    # and the items it holds (also built for a preview): docs/design.md#injection-records.
    injection_id: str | None = None
    items: tuple[Item, ...] = ()

    @property
    def injected(self) -> bool:
        return self.count > 0 or self.tokens > 0

    def headers(self) -> dict[str, str]:
        """Operator-facing response headers (never memory text)."""
        out = {
            "x-memory-status": self.status,
            "x-memory-injected": str(self.count),
            "x-memory-tokens": str(self.tokens),
        }
        if self.reason:
            out["x-memory-reason"] = self.reason
        if self.injection_id:
            out["x-memory-injection-id"] = self.injection_id
        return out


@dataclass(frozen=True, slots=True)
class Outcome:
    """The parts of an :class:`Injection` known before the block is spliced."""

    status: str
    recall_ms: float
    refused: int
    recall_tokens: int
    reason: str | None


@dataclass(slots=True)
class AccessLog:
    """Coalesces ``access_count`` updates so the hot path does not write per request."""

    pending: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, tenant: str, ids: tuple[str, ...]) -> None:
        if ids:
            self.pending.setdefault(tenant, Counter()).update(ids)

    async def flush(self, store: MemoryStore, at: datetime) -> None:
        pending, self.pending = self.pending, {}
        for tenant, counts in pending.items():
            await store.record_access(tenant, dict(counts), at)


def latest_user_text(messages: list[Message]) -> str:
    """Text of the latest user turn (``""`` when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message)
    return ""


class MemoryService:
    def __init__(
        self,
        *,
        store: MemoryStore,
        settings: MemorySettings,
        counter: TokenCounter,
        embedder: Embedder | None = None,
        clock: Callable[[], datetime] = utcnow,
        tenants: TenantSettings | None = None,
        loop_lag: LoopLag | None = None,
    ) -> None:
        """``tenants``: run-time settings per tenant (``memory.injection_count``
        and ``memory.token_budget_percent`` overrides); else ``settings`` for all.
        ``loop_lag``: the event loop's lag, which recall's deadline does not count while it
        runs (started by the app's lifespan; :func:`~proxy.loop_lag.loop_free_deadline`);
        without it, or before it starts, the deadline is on the wall clock."""
        self.loop_lag = loop_lag
        self._store = store
        self._settings = settings
        self._tenants = tenants
        self._counter = counter
        self._block_tokens = lru_cache(maxsize=BLOCK_COUNTS)(counter.count)
        self._clock = clock
        self.indexes = RecallIndexes(settings.recall_index_bytes) \
            if settings.recall_index_bytes > 0 else None
        self._retriever = Retriever(store=store, embedder=embedder,
                                    weights=rank_weights(settings),
                                    candidate_pool=settings.candidate_pool,
                                    indexes=self.indexes, loop_lag=loop_lag)
        self.access = AccessLog()
        self.injections = InjectionLog(Keeping(
            retention=timedelta(days=settings.injection_retention_days),
            per_user=settings.injections_per_user))

    @property
    def retriever(self) -> Retriever:
        """The recall retriever, shared with the memory search (:mod:`proxy.memory.search`)."""
        return self._retriever

    @staticmethod
    def passthrough(request: ChatRequest, route: Route, status: str,
                    reason: str | None = None) -> Injection:
        messages = splice(request.messages, "", position="system",
                          developer_ok=route.supports_developer_role,
                          system_ok=route.supports_system_messages)
        return Injection(messages=messages, status=status, reason=reason)

    async def prepare(self, identity: Identity, request: ChatRequest, route: Route, *,
                      count_access: bool = True, explain_only: bool = False) -> Injection:
        """Recall and splice memory for this request, within ``recall_timeout_ms``.
        ``count_access=False``: the injected memories' access counters are left as they
        are and no injection record is written (a request that only measures the prompt,
        e.g. counting its tokens). ``explain_only``: as ``count_access=False``, and the
        injection carries its items (``POST /v1/memories/preview``). Otherwise, when the
        tenant's ``memory.record_injections`` is on, an injected block is recorded
        (queued to :attr:`injections`; docs/design.md#injection-records)."""
        if identity.user is None:
            return self.passthrough(request, route, "no_user")
        if identity.mode == "off":
            return self.passthrough(request, route, "off", "header")
        if not identity.can_read:
            return self.passthrough(request, route, "write_only", "header")
        settings = self._settings if self._tenants is None else \
            (await self._tenants.get(identity.tenant)).memory
        if settings.injection_count == 0 and settings.resident_facts == 0:
            return self.passthrough(request, route, "off", "config")
        budget = await self._budget(request, route, settings)
        if budget <= 0:
            return self.passthrough(request, route, "no_room", "context_window")
        # The first Chinese text a process sees loads jieba's dictionary (~0.7 s, once):
        # outside the recall deadline, or that request (and any arriving meanwhile) would
        # lose its memory to a timeout after every restart.
        latest = latest_user_text(request.messages)
        await load_segmenter_for(latest)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with loop_free_deadline(
                    self._settings.recall_timeout_ms / 1000, lag=self.loop_lag,
                    hard_seconds=self._settings.recall_hard_timeout_ms / 1000):
                profile, ranked, resident, degraded, spent = await self._recall(
                    identity, request, latest, settings)
        except Exception as exc:
            return self.passthrough(request, route, "degraded",
                                    self._recall_failed(identity, exc))
        recall_ms = (loop.time() - started) * 1000
        relevant = [r.memory for r in ranked]
        facts = relevant + [
            resident[i] for i in distinct(resident, limit=len(resident), chosen=relevant)
        ]
        facts, profile, refused = held_as_data(facts, profile)
        language = choose_language(request.messages, self._settings.language)
        template = self._settings.templates[language]
        tokenizer = route.tokenizer
        now = self._clock()  # the block's moment: its tags' decay, its items' and record's
        plan = fit_block(
            template=template, profile=profile, facts=facts, budget_tokens=budget,
            count=lambda text: self._block_tokens(text, tokenizer), now=now,
        )
        if not plan.text:
            return Injection(
                messages=self.passthrough(request, route, "empty").messages,
                status="degraded" if degraded else "empty",
                reason=degraded or ("budget" if facts else None), recall_ms=recall_ms,
                trimmed=plan.trimmed, refused=refused, recall_tokens=spent,
            )
        outcome = Outcome(status="degraded" if degraded else "injected", recall_ms=recall_ms,
                          refused=refused, recall_tokens=spent,
                          reason=degraded or ("budget" if plan.trimmed else None))
        record = count_access and not explain_only and settings.record_injections
        return self._injected(identity, request, route, plan, outcome, count=count_access,
                              explained=(ranked, profile) if record or explain_only else None,
                              record=record, now=now)

    def _recall_failed(self, identity: Identity, exc: Exception) -> str:
        """Log why recall failed (rate-limited where it can repeat per request); the
        reason the reply's headers give: ``timeout``, ``store_busy`` (counted by the pool,
        alerted on apart from outages), ``store_unavailable`` or ``error``."""
        if isinstance(exc, TimeoutError):
            held = THROTTLE.allow("memory_recall_timeout")
            if held is not None:
                log.warning("memory_recall_timeout", tenant=identity.tenant,
                            timeout_ms=self._settings.recall_timeout_ms,
                            since_last_line=held)
            return "timeout"
        if isinstance(exc, StoreBusyError):
            held = THROTTLE.allow("memory_store_busy")
            if held is not None:
                log.warning("memory_store_busy", tenant=identity.tenant, error=str(exc),
                            since_last_line=held)
            return "store_busy"
        if isinstance(exc, StoreUnavailableError):
            log.warning("memory_store_unavailable", tenant=identity.tenant, error=str(exc))
            return "store_unavailable"
        log.error("memory_recall_failed", tenant=identity.tenant, exc_info=exc)
        return "error"

    def _injected(self, identity: Identity, request: ChatRequest, route: Route,
                  plan: BlockPlan, outcome: Outcome, *, count: bool,
                  explained: tuple[list[Ranked], Profile | None] | None,
                  record: bool, now: datetime) -> Injection:
        """The spliced request for a non-empty ``plan``; access counted with ``count``;
        its items built from ``explained`` (ranked memories, profile) when given, and
        recorded with ``record``; ``now``: the moment the block was fitted (its tags'
        effective scores), which the items' scores and the record's time share."""
        messages = splice(request.messages, plan.text, position=self._settings.position,
                          developer_ok=route.supports_developer_role,
                          system_ok=route.supports_system_messages)
        ids = tuple(m.id for m in plan.memories)
        items: tuple[Item, ...] = ()
        if explained is not None:
            items = explain(plan.memories, explained[0], explained[1], plan.profile_lines,
                            now)
        injection_id = self._record(identity, request, items, now) if record else None
        if count:
            self.access.add(identity.tenant, ids)
        return Injection(
            messages=messages, status=outcome.status, count=len(plan.memories),
            tokens=plan.tokens, memory_ids=ids, recall_ms=outcome.recall_ms,
            trimmed=plan.trimmed, refused=outcome.refused, reason=outcome.reason,
            block=plan.text, recall_tokens=outcome.recall_tokens,
            injection_id=injection_id, items=items,
        )

    def _record(self, identity: Identity, request: ChatRequest,
                items: tuple[Item, ...], at: datetime) -> str:
        """Queue the injection record of this request, made at ``at``; its id."""
        assert identity.user is not None
        injection_id = self.injections.ids(at)
        self.injections.add(InjectionRecord(
            injection_id, identity.tenant, identity.user, at, request.model,
            identity.conversation, identity.channel, items))
        return injection_id

    async def _recall(
        self, identity: Identity, request: ChatRequest, latest: str,
        settings: MemorySettings,
    ) -> tuple[Profile | None, list[Ranked], list[Memory], str | None, int]:
        """Profile, relevant memories (ranked), resident memories, why vectors were not used
        (``None`` when they were, or when no embedder is configured) and the tokens the
        query embeddings spent. ``latest``: the text of the latest user turn."""
        assert identity.user is not None
        channels = None if identity.channel == "private" else (f"group:{identity.group}",)
        queries = plan_queries(request.messages, context_turns=settings.query_context_turns,
                               max_subqueries=settings.max_subqueries,
                               subquery_weight=settings.subquery_weight)
        indexed = self.indexes is not None and bool(queries) and settings.injection_count > 0
        recall_task = self._retriever.recall(
            tenant=identity.tenant, user=identity.user, queries=queries,
            limit=settings.injection_count, now=self._clock(), channels=channels,
            periods=mentioned_periods(latest),
            embed_budget=settings.recall_timeout_ms / 1000 * EMBED_DEADLINE_SHARE,
            resident=settings.resident_facts if indexed else 0,
        )
        profile_task = self._store.get_profile(identity.tenant, identity.user)
        READ_TURN.set(object())  # this request's reads share one turn (store contract)
        if indexed:  # a current recall index answers the resident layer too
            profile, recalled = await asyncio.gather(profile_task, recall_task)
            resident = recalled.resident if recalled.resident is not None else \
                await self._store.resident(identity.tenant, identity.user,
                                           limit=settings.resident_facts, channels=channels)
        else:
            profile, recalled, resident = await asyncio.gather(
                profile_task, recall_task, self._store.resident(
                    identity.tenant, identity.user, limit=settings.resident_facts,
                    channels=channels))
        await load_segmenter_for(*(m.content for m in resident))  # near-duplicate check
        # Of an open conflict's pair only the memory with more evidence (then the newer)
        # is injected: the other carries the mark (docs/design.md#conflicts).
        return (profile, [r for r in recalled.ranked if not r.memory.conflict_yields],
                [m for m in resident if not m.conflict_yields], recalled.degraded,
                recalled.tokens)

    async def _budget(self, request: ChatRequest, route: Route,
                      settings: MemorySettings) -> int:
        """Tokens the block may use: ``token_budget_percent`` of the context window, cut
        to what is left after the prompt and the requested output, so the block
        never makes a prompt that fits overflow the window (docs/design.md#injection).

        Exact counting only happens near the window (a byte count bounds tokens from above),
        runs in a thread, and is skipped — no memory — for prompts over
        ``HOPELESS_BYTES_PER_WINDOW_TOKEN`` bytes per window token, which cannot fit."""
        window = route.context_window
        budget = int(window * settings.token_budget_percent / 100)
        requested = request.body.get("max_completion_tokens") or request.body.get("max_tokens")
        reserve = requested if isinstance(requested, int) and requested > 0 else 0
        bound = upper_bound_tokens(request.messages)
        if bound + budget + reserve + OVERFLOW_MARGIN_TOKENS <= window:
            return budget
        if bound > HOPELESS_BYTES_PER_WINDOW_TOKEN * window:
            return 0
        prompt = await asyncio.to_thread(self._counter.count_messages, request.messages,
                                         route.tokenizer)
        return max(0, min(budget, window - prompt - reserve - OVERFLOW_MARGIN_TOKENS))



def held_as_data(
    facts: list[Memory], profile: Profile | None
) -> tuple[list[Memory], Profile | None, int]:
    """The facts and profile texts that may appear in the block — each passes the rules a
    memory is written under (:func:`~proxy.memory.directives.injectable`), so memories
    stored before a rule existed, imported or edited in the store cannot pose as
    instructions — and how many lines were left out. Rules are memoised per text: a
    user's lines cost one dictionary look-up each from their second request on."""
    kept = [m for m in facts
            if injectable(m.content or m.title, "" if m.about_user else m.subject)]
    refused = len(facts) - len(kept)
    if profile is None or profile.empty:
        return kept, profile, refused
    style = profile.style if injectable(profile.style) else ""
    impression = profile.impression if injectable(profile.impression) else ""
    traits = tuple(t for t in profile.traits if injectable(t.text))
    topics = tuple(t for t in profile.topics if injectable(t.text))
    dropped = (len(profile.traits) - len(traits)) + (len(profile.topics) - len(topics)) + \
        (style != profile.style) + (impression != profile.impression)
    if dropped:
        profile = replace(profile, style=style, impression=impression, traits=traits,
                          topics=topics)
    return kept, profile, refused + dropped


def rank_weights(settings: MemorySettings) -> RankWeights:
    """The ranking knobs of ``memory.ranking`` as :class:`RankWeights`."""
    r = settings.ranking
    return RankWeights(
        relevance=r.relevance, quality=r.quality, evidence=r.evidence, recency=r.recency,
        when=r.when, context=r.context, half_life_days=r.half_life_days, fusion=r.fusion,
        vector_share=r.vector_share, feedback=r.feedback, feedback_docs=r.feedback_docs,
    )
