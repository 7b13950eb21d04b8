"""Candidate synonyms in the store contract, on SQLite and on a real Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from proxy.memory.store import AuditEvent, MemoryStore
from proxy.memory.synonyms import SynonymExample, candidate_id

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def merge(
    kept: str, said: str, *, minutes: int = 0, how: str = "containment", field: str = "traits"
) -> SynonymExample:
    return SynonymExample(
        field=field,
        kept=kept,
        said=said,
        how=how,  # type: ignore[arg-type]
        at=T0 + timedelta(minutes=minutes),
    )


def _erasure(tenant: str, user: str) -> AuditEvent:
    return AuditEvent(tenant=tenant, user_id=user, action="erased", actor="user", at=T0)


async def test_observations_of_one_pair_add_up_across_users_and_directions(
    store: MemoryStore,
) -> None:
    """Either wording kept, any user: one candidate whose count sums the merges and whose
    examples are the newest first, with the words as first seen."""
    await store.count_synonyms("t1", "alice", [merge("话少", "很话少")])
    await store.count_synonyms("t1", "bob", [merge("很话少", "话少", minutes=5)])
    await store.count_synonyms("t1", "alice", [merge("话少", "很话少", minutes=9)])
    [candidate] = await store.synonym_candidates("t1", status=None, limit=10)
    assert candidate.id == candidate_id(["很话少", "话少"])
    assert candidate.words == ("话少", "很话少")
    assert candidate.count == 3
    assert candidate.status == "open"
    assert [e.at for e in candidate.examples] == [T0 + timedelta(minutes=m) for m in (9, 5, 0)]
    assert candidate.examples[1].kept == "很话少"


async def test_candidates_are_listed_most_counted_first(store: MemoryStore) -> None:
    await store.count_synonyms("t1", "alice", [merge("hiking", "mountain hiking")])
    await store.count_synonyms(
        "t1", "alice", [merge("quiet", "quiet person"), merge("quiet", "quiet person", minutes=1)]
    )
    listed = await store.synonym_candidates("t1", status=None, limit=10)
    assert [c.words for c in listed] == [("quiet", "quiet person"), ("hiking", "mountain hiking")]
    assert [c.count for c in listed] == [2, 1]
    assert len(await store.synonym_candidates("t1", status=None, limit=1)) == 1


async def test_a_decision_sets_the_status_and_filters_the_list(store: MemoryStore) -> None:
    await store.count_synonyms(
        "t1", "alice", [merge("quiet", "quiet person"), merge("hiking", "mountain hiking")]
    )
    cid = candidate_id(["quiet", "quiet person"])
    decided = await store.decide_synonym(
        "t1", cid, status="accepted", actor="ops", at=T0 + timedelta(hours=1)
    )
    assert decided is not None
    assert (decided.status, decided.decided_by) == ("accepted", "ops")
    assert decided.decided_at == T0 + timedelta(hours=1)
    assert decided.count == 1
    assert [c.id for c in await store.synonym_candidates("t1", status="accepted", limit=10)] == [
        cid
    ]
    assert [c.words for c in await store.synonym_candidates("t1", status="open", limit=10)] == [
        ("hiking", "mountain hiking")
    ]
    assert (
        await store.decide_synonym(
            "t1", "syn_0000000000000000", status="rejected", actor="ops", at=T0
        )
        is None
    )


async def test_tenants_never_see_each_others_candidates(store: MemoryStore) -> None:
    await store.count_synonyms("t1", "alice", [merge("quiet", "quiet person")])
    cid = candidate_id(["quiet", "quiet person"])
    assert await store.synonym_candidates("t2", status=None, limit=10) == []
    assert await store.decide_synonym("t2", cid, status="accepted", actor="x", at=T0) is None
    [mine] = await store.synonym_candidates("t1", status=None, limit=10)
    assert mine.status == "open"


async def test_erasure_removes_the_users_observations_and_orphaned_candidates(
    store: MemoryStore,
) -> None:
    """The erased user's merges stop counting; a candidate only they observed is gone; one
    another user observed stays with that user's count and examples only."""
    await store.count_synonyms(
        "t1", "alice", [merge("quiet", "quiet person"), merge("hiking", "mountain hiking")]
    )
    await store.count_synonyms("t1", "bob", [merge("hiking", "mountain hiking", minutes=3)])
    await store.count_synonyms("t2", "alice", [merge("quiet", "quiet person")])
    await store.erase_user("t1", "alice", audit=_erasure("t1", "alice"))
    [left] = await store.synonym_candidates("t1", status=None, limit=10)
    assert left.words == ("hiking", "mountain hiking")
    assert left.count == 1
    assert [e.at for e in left.examples] == [T0 + timedelta(minutes=3)]
    # Another tenant's user of the same id keeps theirs.
    assert len(await store.synonym_candidates("t2", status=None, limit=10)) == 1
