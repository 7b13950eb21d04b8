"""Near-synonym traits with one light verdict: with an embedder, a new trait close to a
stored one merges only when the learning model says "same" — one call per batch at most,
booked in the learning ledger, skipped while the budget is spent; without an embedder,
today's rules. On both storage backends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.memory.embed import CachedEmbedder
from proxy.memory.store import AuditFilter
from tests.fakes import (
    ConceptBackend,
    FakeUpstream,
    Gateway,
    Reply,
    backend_overrides,
    make_settings,
    running_gateway,
)

CONCEPTS = [["shy", "introverted", "timid"], ["chess", "go"]]
Open = Callable[..., Any]


def traits(*texts: str, topics: tuple[str, ...] = ()) -> Callable[[dict[str, Any]], Any]:
    return lambda _body: {
        "memories": [],
        "profile": {"traits": list(texts), "topics": list(topics)},
    }


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def open_gateway(request: pytest.FixtureRequest, tmp_path: Path, upstream: FakeUpstream) -> Open:
    """A gateway on the test's backend, with the concept embedder unless ``embedder`` is
    False; ``learning`` settings added."""
    extra = backend_overrides(request, tmp_path)

    def start(*, embedder: bool = True, **learning: Any) -> Any:
        settings = make_settings(
            tmp_path, learning={"enabled": True, "batch_messages": 1, **learning}, **extra
        )
        return running_gateway(
            settings,
            upstream,
            embedder=CachedEmbedder(ConceptBackend(CONCEPTS)) if embedder else None,
        )

    return start


async def say(gw: Gateway, text: str, user: str = "u1") -> None:
    async with gw.client(headers={"X-User-Id": user}) as client:
        reply = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": text}]},
        )
        assert reply.status_code == 200
    await gw.settle()


async def learned(gw: Gateway, user: str = "u1") -> list[tuple[str, int]]:
    profile = await gw.res.store.get_profile("default", user)
    assert profile is not None
    return sorted((t.text, t.hits) for t in profile.traits)


def verdicts(upstream: FakeUpstream) -> list[dict[str, Any]]:
    return [body for kind, body in upstream.learning_calls if kind == "verdict"]


async def verdict_tokens(gw: Gateway) -> int:
    rows = await gw.res.ledger.usage_report(
        "default", group_by="user", user=None, since=None, until=None
    )
    return sum(row.learning.get("verdict", 0) for row in rows)


async def two_batches(
    gw: Gateway, upstream: FakeUpstream, first: tuple[str, ...], second: tuple[str, ...]
) -> None:
    upstream.extract = traits(*first)
    await say(gw, "I am rather introverted and I like chess.")
    upstream.extract = traits(*second)
    await say(gw, "People say I am shy and timid.")


async def test_a_close_trait_merges_after_a_same_verdict(
    open_gateway: Open, upstream: FakeUpstream
) -> None:
    """One verdict call names both wordings; "same" merges them into the stored trait,
    books the call as learning tokens (purpose verdict) and lists the pair as a
    neighbour candidate."""
    upstream.verdict = lambda body: {"verdict": "same"}
    async with open_gateway() as gw:
        await two_batches(gw, upstream, ("introverted",), ("shy",))
        [call] = verdicts(upstream)
        assert "A: introverted" in call["messages"][1]["content"]
        assert "B: shy" in call["messages"][1]["content"]
        assert await learned(gw) == [("introverted", 2)]
        assert await verdict_tokens(gw) == 120  # the fake's usage of one call
        [candidate] = await gw.res.store.synonym_candidates("default", status=None, limit=10)
        assert candidate.words == ("introverted", "shy")
        assert candidate.examples[0].how == "neighbour"


async def test_a_different_verdict_keeps_both(open_gateway: Open, upstream: FakeUpstream) -> None:
    upstream.verdict = lambda body: {"verdict": "different"}
    async with open_gateway() as gw:
        await two_batches(gw, upstream, ("introverted",), ("shy",))
        assert len(verdicts(upstream)) == 1
        assert await learned(gw) == [("introverted", 1), ("shy", 1)]
        assert await gw.res.store.synonym_candidates("default", status=None, limit=10) == []


async def test_without_an_embedder_no_verdict_is_asked(
    open_gateway: Open, upstream: FakeUpstream
) -> None:
    upstream.verdict = lambda body: {"verdict": "same"}
    async with open_gateway(embedder=False) as gw:
        await two_batches(gw, upstream, ("introverted",), ("shy",))
        assert verdicts(upstream) == []
        assert await learned(gw) == [("introverted", 1), ("shy", 1)]
        assert await verdict_tokens(gw) == 0


async def test_unrelated_or_rule_merged_traits_need_no_verdict(
    open_gateway: Open, upstream: FakeUpstream
) -> None:
    """A far wording (different concept) and one containment already merges: no call."""
    upstream.verdict = lambda body: {"verdict": "same"}
    async with open_gateway() as gw:
        await two_batches(gw, upstream, ("introverted",), ("very introverted", "gardener"))
        assert verdicts(upstream) == []
        assert await learned(gw) == [("gardener", 1), ("introverted", 2)]


async def test_at_most_one_verdict_call_per_batch(
    open_gateway: Open, upstream: FakeUpstream
) -> None:
    """Two close wordings in one batch: one call (the closest pair); the other wording
    follows today's rules and becomes a trait of its own."""
    upstream.verdict = lambda body: {"verdict": "same"}
    async with open_gateway() as gw:
        await two_batches(gw, upstream, ("introverted",), ("shy", "timid"))
        assert len(verdicts(upstream)) == 1
        assert len(await learned(gw)) == 2
        assert ("introverted", 2) in await learned(gw)


async def test_no_verdict_while_the_budget_is_spent(
    open_gateway: Open, upstream: FakeUpstream
) -> None:
    """The second batch starts under the daily cap and spends past it: its verdict is not
    asked, the wording stays apart, and the skip is audited."""
    upstream.verdict = lambda body: {"verdict": "same"}
    async with open_gateway(budget={"tokens_per_day": 300}) as gw:
        await two_batches(gw, upstream, ("introverted",), ("shy",))
        assert verdicts(upstream) == []
        assert await learned(gw) == [("introverted", 1), ("shy", 1)]
        events = await gw.res.store.audit_search(
            "default", AuditFilter(user="u1", action="profile_updated"), limit=50
        )
        assert any(e.detail.get("verdict") == "budget_spent" for _, e in events)


@pytest.mark.parametrize(
    "answer",
    [
        Reply(status=500, json={"error": {"message": "boom", "type": "server_error"}}),
        "I cannot tell.",
    ],
    ids=["upstream-error", "unreadable"],
)
async def test_a_failed_verdict_leaves_todays_rules(
    open_gateway: Open, upstream: FakeUpstream, answer: Any
) -> None:
    upstream.verdict = lambda body: answer
    async with open_gateway() as gw:
        await two_batches(gw, upstream, ("introverted",), ("shy",))
        assert len(verdicts(upstream)) == 1
        assert await learned(gw) == [("introverted", 1), ("shy", 1)]
        assert gw.res.queue is not None
        assert await gw.res.queue.dead_letters(limit=10) == []
