"""The hot path's memory step: recall → rank → budget → splice, under a deadline.

:meth:`MemoryService.prepare` never raises for memory reasons: a slow or failing store (or
embedder) gives the request its original messages and an ``Injection`` whose status says
why (SPEC §2.3, fail-open). The outcome becomes response headers (counts, tokens, status —
never memory text).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from proxy.identity import Identity
from proxy.memory.embed import Embedder
from proxy.memory.inject import choose_language, fit_block, splice
from proxy.memory.recall import RankWeights, distinct, rank
from proxy.memory.records import Memory, Profile, utcnow
from proxy.memory.store import MemoryStore, SearchQuery, StoreUnavailableError
from proxy.memory.text import load_segmenter_for, query_terms
from proxy.models import Route
from proxy.request import ChatRequest, Message, message_text
from proxy.settings import MemorySettings
from proxy.tokens import TokenCounter, upper_bound_tokens

log = structlog.get_logger("proxy.memory")
# Tokens kept free between prompt + memory + requested output and the context window.
OVERFLOW_MARGIN_TOKENS = 64


@dataclass(frozen=True, slots=True)
class Injection:
    """What memory did to one request."""

    messages: list[Message]
    status: str  # injected | empty | off | no_user | write_only | degraded | no_room
    reason: str | None = None
    count: int = 0
    tokens: int = 0
    memory_ids: tuple[str, ...] = ()
    recall_ms: float = 0.0
    trimmed: int = 0

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
        return out


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


def recall_query(messages: list[Message], *, context_turns: int) -> str:
    """The latest user turn plus ``context_turns`` earlier user turns (SPEC §2.3)."""
    turns = [message_text(m) for m in messages if m.get("role") == "user"]
    return "\n".join(turns[-(context_turns + 1):])


class MemoryService:
    def __init__(
        self,
        *,
        store: MemoryStore,
        settings: MemorySettings,
        counter: TokenCounter,
        embedder: Embedder | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._store = store
        self._settings = settings
        self._counter = counter
        self._embedder = embedder
        self._clock = clock
        ranking = settings.ranking
        self._weights = RankWeights(
            relevance=ranking.relevance, quality=ranking.quality, evidence=ranking.evidence,
            recency=ranking.recency, half_life_days=ranking.half_life_days,
        )
        self.access = AccessLog()

    @staticmethod
    def passthrough(request: ChatRequest, route: Route, status: str,
                    reason: str | None = None) -> Injection:
        messages = splice(request.messages, "", position="system",
                          developer_ok=route.supports_developer_role,
                          system_ok=route.supports_system_messages)
        return Injection(messages=messages, status=status, reason=reason)

    async def prepare(self, identity: Identity, request: ChatRequest, route: Route) -> Injection:
        """Recall and splice memory for this request, within ``recall_timeout_ms``."""
        if identity.user is None:
            return self.passthrough(request, route, "no_user")
        if identity.mode == "off":
            return self.passthrough(request, route, "off", "header")
        if not identity.can_read:
            return self.passthrough(request, route, "write_only", "header")
        if self._settings.injection_count == 0 and self._settings.resident_facts == 0:
            return self.passthrough(request, route, "off", "config")
        budget = self._budget(request, route)
        if budget <= 0:
            return self.passthrough(request, route, "no_room", "context_window")
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(self._settings.recall_timeout_ms / 1000):
                profile, relevant, resident = await self._recall(identity, request)
        except TimeoutError:
            log.warning("memory_recall_timeout", tenant=identity.tenant,
                        timeout_ms=self._settings.recall_timeout_ms)
            return self.passthrough(request, route, "degraded", "timeout")
        except StoreUnavailableError as exc:
            log.warning("memory_store_unavailable", tenant=identity.tenant, error=str(exc))
            return self.passthrough(request, route, "degraded", "store_unavailable")
        except Exception:
            log.exception("memory_recall_failed", tenant=identity.tenant)
            return self.passthrough(request, route, "degraded", "error")
        recall_ms = (loop.time() - started) * 1000
        facts = relevant + [
            resident[i] for i in distinct(resident, limit=len(resident), chosen=relevant)
        ]
        language = choose_language(request.messages, self._settings.language)
        template = self._settings.templates[language]
        tokenizer = route.tokenizer
        plan = fit_block(
            template=template, profile=profile, facts=facts, budget_tokens=budget,
            count=lambda text: self._counter.count(text, tokenizer), now=self._clock(),
        )
        if not plan.text:
            return Injection(
                messages=self.passthrough(request, route, "empty").messages, status="empty",
                reason="budget" if facts else None, recall_ms=recall_ms, trimmed=plan.trimmed,
            )
        messages = splice(request.messages, plan.text, position=self._settings.position,
                          developer_ok=route.supports_developer_role,
                          system_ok=route.supports_system_messages)
        ids = tuple(m.id for m in plan.memories)
        self.access.add(identity.tenant, ids)
        return Injection(
            messages=messages, status="injected", count=len(plan.memories), tokens=plan.tokens,
            memory_ids=ids, recall_ms=recall_ms, trimmed=plan.trimmed,
            reason="budget" if plan.trimmed else None,
        )

    async def _recall(
        self, identity: Identity, request: ChatRequest
    ) -> tuple[Profile | None, list[Memory], list[Memory]]:
        assert identity.user is not None
        channels = None if identity.channel == "private" else (f"group:{identity.group}",)
        text = recall_query(request.messages, context_turns=self._settings.query_context_turns)
        await load_segmenter_for(text)
        embedding = None
        if self._embedder is not None and text.strip():
            embedding = await self._embedder.embed_query(text)
        query = SearchQuery(
            tenant=identity.tenant, user=identity.user, terms=tuple(query_terms(text)),
            limit=self._settings.candidate_pool, embedding=embedding, channels=channels,
        )
        profile_task = self._store.get_profile(identity.tenant, identity.user)
        resident_task = self._store.resident(
            identity.tenant, identity.user, limit=self._settings.resident_facts,
            channels=channels,
        )
        profile, candidates, resident = await asyncio.gather(
            profile_task, self._store.search(query), resident_task
        )
        await load_segmenter_for(*(c.memory.content for c in candidates),
                                 *(m.content for m in resident))
        ranked = rank(candidates, now=self._clock(), weights=self._weights,
                      limit=self._settings.injection_count)
        return profile, [r.memory for r in ranked], resident

    def _budget(self, request: ChatRequest, route: Route) -> int:
        """Tokens the block may use: ``token_budget_percent`` of the context window, cut
        to what is left after the prompt and the requested output (case B04)."""
        window = route.context_window
        budget = int(window * self._settings.token_budget_percent / 100)
        requested = request.body.get("max_completion_tokens") or request.body.get("max_tokens")
        reserve = requested if isinstance(requested, int) and requested > 0 else 0
        if upper_bound_tokens(request.messages) + budget + reserve + OVERFLOW_MARGIN_TOKENS \
                <= window:
            return budget
        prompt = self._counter.count_messages(request.messages, route.tokenizer)
        return max(0, min(budget, window - prompt - reserve - OVERFLOW_MARGIN_TOKENS))

