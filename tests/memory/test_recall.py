"""Ranking of recall candidates: fusion, feedback, dates, context, blend, diversity."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.memory.recall import (
    QueryHits,
    RankWeights,
    evidence_strength,
    fused_relevance,
    rank,
    recency,
)
from proxy.memory.records import Memory
from proxy.memory.store import Candidate
from proxy.memory.text import content_terms, normalize
from proxy.memory.when import Period, mentioned_periods, time_match

NOW = datetime(2024, 6, 30, tzinfo=UTC)
ONLY_RELEVANCE = RankWeights(quality=0, evidence=0, recency=0, when=0, context=0, feedback=0)


def mem(memory_id: str, content: str | None = None, *, vec: tuple[float, ...] | None = None,
        hits: int = 1, score: float = 0.5, seen: datetime = NOW, conv: str | None = None,
        created: datetime | None = None) -> Memory:
    return Memory(id=memory_id, tenant="t", user_id="u", content=content or f"note {memory_id * 3}",
                  embedding=vec, hits=hits, score=score, last_seen_at=seen,
                  created_at=created or seen, updated_at=seen, source_conversation_id=conv)


def kw(memory: Memory, rank_: int, score: float) -> Candidate:
    return Candidate(memory, keyword_rank=rank_, keyword_score=score)


def vec(memory: Memory, rank_: int) -> Candidate:
    return Candidate(memory, vector_rank=rank_, vector_score=0.5)


def order(hits: list[QueryHits], weights: RankWeights = ONLY_RELEVANCE,
          periods: tuple[Period, ...] = ()) -> list[str]:
    return [r.memory.id for r in rank(hits, now=NOW, weights=weights, limit=10,
                                      periods=periods)]


def test_keyword_only_relevance_follows_bm25() -> None:
    """Without query vectors, relevance is BM25 over the best BM25 of the query."""
    a, b = mem("a"), mem("b")
    relevance = fused_relevance([QueryHits([kw(a, 1, 6.0), kw(b, 2, 3.0)])], ONLY_RELEVANCE)
    assert relevance == {"a": 1.0, "b": 0.5}


def test_dense_similarity_scores_memories_found_by_keyword_only() -> None:
    """Every candidate is scored by the query vector too: of two equal keyword hits, the
    one whose meaning matches the query comes first."""
    off_topic = mem("a", vec=(0.0, 1.0, 0.0))
    on_topic = mem("b", vec=(1.0, 0.0, 0.0))
    other = mem("c", vec=(0.0, 0.0, 1.0))
    hits = [QueryHits([kw(off_topic, 1, 3.0), kw(on_topic, 2, 3.0), vec(other, 1)],
                      vector=(1.0, 0.0, 0.0))]
    assert order(hits)[0] == "b"
    assert order([QueryHits(hits[0].candidates)])[:2] == ["a", "b"]  # keyword-only: a tie


def test_memories_without_a_vector_are_still_ranked_by_keyword() -> None:
    """A memory stored without a vector (embedder was down) still competes on BM25."""
    plain = mem("plain")
    embedded = mem("emb", vec=(0.0, 1.0))
    hits = [QueryHits([kw(plain, 1, 9.0), kw(embedded, 2, 1.0)], vector=(1.0, 0.0))]
    assert "plain" in order(hits)


def test_feedback_query_lifts_facts_phrased_like_the_best_hit() -> None:
    """With Rocchio feedback, a fact close to the best hit overtakes one that is only
    loosely about the query; without it, the order is the other way round."""
    memories = {
        "best": (1.0, 0.6, 0, 0, 0, 0), "like_best": (0.3, 1.0, 0, 0, 0, 0),
        "loose": (0.5, 0, 1.0, 0, 0, 0), "f1": (0, 0, 0, 1.0, 0, 0),
        "f2": (0, 0, 0, 0, 1.0, 0), "f3": (0, 0, 0, 0, 0, 1.0),
    }
    hits = [QueryHits([vec(mem(k, vec=v), i) for i, (k, v) in enumerate(memories.items(), 1)],
                      vector=(1.0, 0, 0, 0, 0, 0))]
    plain = order(hits)
    assert plain[0] == "best"
    assert plain.index("loose") < plain.index("like_best")
    with_feedback = replace(ONLY_RELEVANCE, feedback=1.0, feedback_docs=1)
    assert order(hits, with_feedback)[:3] == ["best", "like_best", "loose"]


def test_each_query_counts_at_its_weight() -> None:
    """A memory only a sub-query found is ranked by that query's relevance times its
    weight (CombMAX): at weight 1 it ties the main query's best, at 0.5 it follows."""
    main, sub = mem("main"), mem("sub")
    for weight, expected in ((1.0, {"main": 1.0, "sub": 1.0}), (0.5, {"main": 1.0, "sub": 0.5})):
        relevance = fused_relevance([QueryHits([kw(main, 1, 4.0)]),
                                     QueryHits([kw(sub, 1, 2.0)], weight=weight)],
                                    ONLY_RELEVANCE)
        assert relevance == expected


def test_rrf_fusion_prefers_memories_both_methods_found() -> None:
    """``fusion: rrf`` sums 1/(k + rank) per method, so agreement wins."""
    both, keyword_only, vector_only = mem("both"), mem("kw"), mem("vec")
    hits = [QueryHits([kw(keyword_only, 1, 5.0), kw(both, 2, 4.0), vec(vector_only, 1),
                       Candidate(both, keyword_rank=2, keyword_score=4.0, vector_rank=2)])]
    assert order(hits, replace(ONLY_RELEVANCE, fusion="rrf"))[0] == "both"


def test_a_date_named_in_the_query_lifts_memories_from_that_day() -> None:
    """"What did I say on 3 June 2024?" puts the equally relevant fact from that day first;
    without the date, it does not."""
    early = mem("a", created=datetime(2024, 5, 1, tzinfo=UTC), seen=datetime(2024, 5, 1,
                                                                             tzinfo=UTC))
    that_day = mem("b", created=datetime(2024, 6, 3, 15, tzinfo=UTC),
                   seen=datetime(2024, 6, 3, 15, tzinfo=UTC))
    hits = [QueryHits([kw(early, 1, 2.0), kw(that_day, 2, 2.0)])]
    weights = replace(ONLY_RELEVANCE, when=0.2)
    assert order(hits, weights) == ["a", "b"]
    assert order(hits, weights, periods=mentioned_periods("on 3 June 2024")) == ["b", "a"]


def test_facts_learned_with_the_best_hit_are_lifted() -> None:
    """A weak match learned in the same conversation as the best hit overtakes an equally
    weak match from elsewhere (and not without the context weight)."""
    best = mem("best", conv="c1")
    sibling = mem("sibling", conv="c1")
    stranger = mem("stranger", conv="c2")
    hits = [QueryHits([kw(best, 1, 10.0), kw(stranger, 2, 3.0), kw(sibling, 3, 2.9)])]
    assert order(hits) == ["best", "stranger", "sibling"]
    assert order(hits, replace(ONLY_RELEVANCE, context=0.2)) == ["best", "sibling", "stranger"]


def test_evidence_and_recency_break_ties() -> None:
    """Between equally relevant memories, more evidence wins, then the fresher one."""
    weights = RankWeights(when=0, context=0, feedback=0)
    old = NOW - timedelta(days=200)
    hits = [QueryHits([kw(mem("once", seen=old), 1, 2.0), kw(mem("often", hits=5, seen=old),
                                                              2, 2.0)])]
    assert order(hits, weights) == ["often", "once"]
    hits = [QueryHits([kw(mem("old", seen=old), 1, 2.0), kw(mem("new"), 2, 2.0)])]
    assert order(hits, weights) == ["new", "old"]


def test_near_duplicates_never_fill_the_block_twice() -> None:
    """A second phrasing of a chosen memory (equal, contained, or ≥ 80 % shared terms) is
    skipped; a different fact is kept."""
    hits = [QueryHits([
        kw(mem("a", "Lives in Lisbon, Portugal"), 1, 5.0),
        kw(mem("b", "lives in lisbon"), 2, 4.0),
        kw(mem("c", "Lives in Lisbon Portugal!"), 3, 3.0),
        kw(mem("d", "Works in Porto"), 4, 2.0),
    ])]
    assert order(hits) == ["a", "d"]


def test_a_search_keeps_near_duplicates_in_rank_order() -> None:
    """``distinct_only=False`` (the memory search lists every match) keeps the second
    phrasings, still best first and within ``limit``; the default drops them."""
    hits = [QueryHits([
        kw(mem("a", "Lives in Lisbon, Portugal"), 1, 5.0),
        kw(mem("b", "lives in lisbon"), 2, 4.0),
        kw(mem("d", "Works in Porto"), 3, 2.0),
    ])]
    listed = rank(hits, now=NOW, weights=ONLY_RELEVANCE, limit=10, distinct_only=False)
    assert [r.memory.id for r in listed] == ["a", "b", "d"]
    two = rank(hits, now=NOW, weights=ONLY_RELEVANCE, limit=2, distinct_only=False)
    assert [r.memory.id for r in two] == ["a", "b"]
    assert order(hits) == ["a", "d"]


def test_nothing_to_rank() -> None:
    """No candidates or no room → an empty list."""
    assert rank([], now=NOW, weights=RankWeights(), limit=5) == []
    assert rank([QueryHits([kw(mem("a"), 1, 1.0)])], now=NOW, weights=RankWeights(),
                limit=0) == []


def test_a_store_that_returns_no_vectors_still_ranks_by_its_cosine() -> None:
    """Candidates that come without their vector (a backend that does not return them)
    are ranked by the cosine the store computed, not treated as dissimilar."""
    close = Candidate(mem("close"), vector_rank=1, vector_score=0.9)
    far = Candidate(mem("far"), vector_rank=2, vector_score=0.2)
    hits = [QueryHits([far, close], vector=(1.0, 0.0))]
    assert order(hits) == ["close", "far"]
    assert fused_relevance(hits, ONLY_RELEVANCE)["far"] > 0.0


def test_a_memory_whose_vector_changed_is_ranked_by_the_new_one() -> None:
    """A memory ranked before (its vector reused since) is ranked by its current vector
    once it carries another one under the same id; the unchanged one keeps its place."""
    near, far = mem("a", vec=(1.0, 0.1, 0.0)), mem("b", vec=(0.0, 1.0, 0.2))
    first = [QueryHits([vec(near, 1), vec(far, 2)], vector=(1.0, 0.0, 0.0))]
    assert order(first) == order(first) == ["a", "b"]
    moved = replace(near, embedding=(0.0, 0.9, 0.3))
    closer = replace(far, embedding=(0.9, 0.0, 0.1))
    assert order([QueryHits([vec(moved, 1), vec(closer, 2)], vector=(1.0, 0.0, 0.0))]) == \
        ["b", "a"]
    again = replace(far, embedding=(0.0, 1.0, 0.2))  # equal values, a new tuple
    assert order([QueryHits([vec(near, 1), vec(again, 2)], vector=(1.0, 0.0, 0.0))]) == \
        ["a", "b"]


# The final score and the near-duplicate pick written out plainly (the module docstring's
# formula, steps 4 and 5), to hold the optimised rank() to it.
def plain_rank(hits: list[QueryHits], *, now: datetime, weights: RankWeights, limit: int,
               periods: tuple[Period, ...], distinct_only: bool) -> list[tuple[object, ...]]:
    pool: dict[str, Memory] = {}
    for query in hits:
        for c in query.candidates:
            pool.setdefault(c.memory.id, c.memory)
    if limit <= 0 or not pool:
        return []
    relevance = fused_relevance(hits, weights)
    groups: dict[str, list[str]] = {}
    for m in pool.values():
        if m.source_conversation_id:
            groups.setdefault(m.source_conversation_id, []).append(m.id)
    context: dict[str, float] = {}
    for members in groups.values():
        if len(members) > 1:
            ordered = sorted(members, key=lambda i: -relevance[i])
            for i in members:
                context[i] = relevance[ordered[1]] if i == ordered[0] else relevance[ordered[0]]
    rows = []
    for m in pool.values():
        when = time_match((m.created_at, m.last_seen_at), periods) if periods else 0.0
        near = context.get(m.id, 0.0) if weights.context > 0 else 0.0
        final = (weights.relevance * relevance[m.id] + weights.when * when
                 + weights.context * near + weights.quality * max(0.0, min(1.0, m.score))
                 + weights.evidence * evidence_strength(m.hits)
                 + weights.recency * recency(m.last_seen_at, now, weights.half_life_days))
        keyword = any(c.memory.id == m.id and c.keyword_rank is not None
                      for q in hits for c in q.candidates)
        vector = any(c.memory.id == m.id and c.vector_rank is not None
                     for q in hits for c in q.candidates)
        rows.append((m, relevance[m.id], final, keyword, vector, when, near))
    rows.sort(key=lambda r: (-r[2], r[0].id))  # type: ignore[operator, attr-defined]
    if not distinct_only:
        return [(r[0].id, *r[1:]) for r in rows[:limit]]  # type: ignore[attr-defined]
    picked: list[tuple[object, ...]] = []
    keys: list[tuple[str, set[str]]] = []
    for row in rows:
        if len(picked) >= limit:
            break
        text = normalize(row[0].content)  # type: ignore[attr-defined]
        terms = set(content_terms(row[0].content))  # type: ignore[attr-defined]
        if any(text == other if not text or not other else (
                text == other or text in other or other in text or (
                    bool(terms | other_terms)
                    and len(terms & other_terms) / len(terms | other_terms) >= 0.8))
               for other, other_terms in keys):
            continue
        picked.append((row[0].id, *row[1:]))  # type: ignore[attr-defined]
        keys.append((text, terms))
    return picked


_WORDS = ("tea", "green", "hiking", "Lisbon", "rust", "code", "review", "sister", "Ana",
          "weekends", "likes", "prefers")


@st.composite
def ranking_case(draw: st.DrawFn) -> tuple[list[QueryHits], RankWeights, int,
                                           tuple[Period, ...], bool]:
    size = draw(st.integers(1, 14))
    with_vectors = draw(st.booleans())
    memories = []
    for n in range(size):
        words = draw(st.lists(st.sampled_from(_WORDS), min_size=0, max_size=6))
        memories.append(mem(
            f"m{n:02d}", " ".join(words) or draw(st.sampled_from(("", "x", "tea"))),
            vec=tuple(draw(st.floats(-1, 1)) for _ in range(3)) if with_vectors else None,
            hits=draw(st.integers(0, 9)), score=draw(st.floats(-0.5, 1.5)),
            seen=NOW - timedelta(microseconds=draw(st.integers(-10**11, 10**13))),
            conv=draw(st.sampled_from((None, "c1", "c2"))),
            created=NOW - timedelta(days=draw(st.integers(0, 400)))))
    hits = []
    for _ in range(draw(st.integers(1, 3))):
        chosen = draw(st.lists(st.sampled_from(memories), max_size=size, unique_by=id))
        hits.append(QueryHits(
            [Candidate(m, keyword_rank=i + 1, keyword_score=draw(st.floats(-1, 20)))
             if draw(st.booleans()) else Candidate(m, vector_rank=i + 1, vector_score=0.3)
             for i, m in enumerate(chosen)],
            vector=(1.0, 0.5, -0.2) if with_vectors else None,
            weight=draw(st.sampled_from((1.0, 0.8)))))
    weights = RankWeights(half_life_days=draw(st.sampled_from((90.0, 0.0, 7.5))),
                          context=draw(st.sampled_from((0.2, 0.0))),
                          fusion=draw(st.sampled_from(("convex", "rrf"))))
    periods = draw(st.sampled_from(((), tuple(mentioned_periods("on 3 June 2024")))))
    return hits, weights, draw(st.integers(-1, 8)), periods, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(ranking_case())
def test_rank_gives_the_plain_formulas_ranking(
        case: tuple[list[QueryHits], RankWeights, int, tuple[Period, ...], bool]) -> None:
    """On random pools (near-duplicate texts, scores outside 0–1, future sightings, shared
    conversations, dates, both fusions), rank() returns exactly the memories, scores and
    flags of the final-score formula and near-duplicate pick written out plainly."""
    hits, weights, limit, periods, distinct_only = case
    got = [(r.memory.id, r.relevance, r.final, r.keyword, r.vector, r.when, r.context)
           for r in rank(hits, now=NOW, weights=weights, limit=limit, periods=periods,
                         distinct_only=distinct_only)]
    assert got == plain_rank(hits, now=NOW, weights=weights, limit=limit, periods=periods,
                             distinct_only=distinct_only)


def test_plain_formula_differs_when_a_weight_differs() -> None:
    """The comparison above can fail: a different recency weight changes the scores."""
    a, b = mem("a", "tea in Lisbon", seen=NOW - timedelta(days=30)), mem("b", "rust code")
    hits = [QueryHits([kw(a, 1, 2.0), kw(b, 2, 2.0)])]
    plain = plain_rank(hits, now=NOW, weights=RankWeights(recency=0.3), limit=5, periods=(),
                       distinct_only=True)
    got = [(r.memory.id, r.relevance, r.final, r.keyword, r.vector, r.when, r.context)
           for r in rank(hits, now=NOW, weights=RankWeights(), limit=5)]
    assert [row[0] for row in got] == ["b", "a"]
    assert got != plain
