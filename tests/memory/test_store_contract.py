"""The MemoryStore contract: every behaviour, checked on both backends
(docs/design.md#storage).

The ``store`` fixture yields a fresh SQLite store and a fresh Redis store (its own key
prefix on the session's test Redis, vector index of dimension 4); each test runs on both.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.records import ConversationRecord, Memory, Profile, ScoredTag, new_id
from proxy.memory.store import (
    AuditEvent,
    ChangeSet,
    ListQuery,
    MemoryStore,
    SearchQuery,
    UserSettings,
    VectorUpdate,
)
from proxy.memory.text import normalize, query_terms

T0 = datetime(2025, 1, 1, tzinfo=UTC)




def mem(content: str, *, tenant: str = "t1", user: str | None = "u1", minutes: int = 0,
        **fields: Any) -> Memory:
    """A memory created ``minutes`` after T0 (ids are time-ordered by creation here)."""
    at = T0 + timedelta(minutes=minutes)
    return Memory(id=fields.pop("id", new_id()), tenant=tenant, user_id=user,
                  content=content, title=fields.pop("title", content[:30]),
                  scope=fields.pop("scope", "personal" if user else "shared"),
                  created_at=at, updated_at=at,
                  last_seen_at=fields.pop("last_seen_at", at), **fields)


def ask(text: str, *, tenant: str = "t1", user: str = "u1", **fields: Any) -> SearchQuery:
    return SearchQuery(tenant=tenant, user=user, terms=tuple(query_terms(text)), **fields)


async def found(store: MemoryStore, query: SearchQuery) -> list[str]:
    """Contents of the keyword candidates, best first."""
    hits = [c for c in await store.search(query) if c.keyword_rank is not None]
    return [c.memory.content for c in sorted(hits, key=lambda c: c.keyword_rank or 0)]


def event(action: str, *, user: str | None = "u1", tenant: str = "t1",
          minutes: int = 0, **fields: Any) -> AuditEvent:
    return AuditEvent(tenant=tenant, user_id=user, action=action,  # type: ignore[arg-type]
                      actor="auto", at=T0 + timedelta(minutes=minutes), **fields)


# basics -----------------------------------------------------------------------------

async def test_ping_answers_on_a_working_store(store: MemoryStore) -> None:
    """ping() returns quietly when the store can serve."""
    await store.ping()


async def test_add_then_get_round_trips_every_field(store: MemoryStore) -> None:
    """A memory comes back from get() exactly as written, optional fields included."""
    memory = mem("Prefers dark roast coffee", tags=("coffee", "咖啡"), category="domain",
                 subcategory="dynamic", subject="user", source="manual",
                 source_conversation_id="c-1", source_channel="group:g1", score=0.75,
                 embedding=(0.5, 0.25, 0.0, -1.0), hits=3, access_count=2,
                 last_access_at=T0 + timedelta(days=1))
    await store.add(memory)
    assert await store.get("t1", "u1", memory.id) == memory


async def test_get_is_scoped_to_the_namespace(store: MemoryStore) -> None:
    """get() finds a memory only under its own tenant and user; shared memories
    only with user None. A public failure: memory search not filtered by user showed one
    user's memories to another."""
    personal = mem("Lives in Porto")
    shared = mem("Office closes at six", user=None)
    await store.add(personal)
    await store.add(shared)
    assert await store.get("t1", "u1", personal.id) == personal
    assert await store.get("t1", "u2", personal.id) is None
    assert await store.get("t2", "u1", personal.id) is None
    assert await store.get("t1", None, personal.id) is None
    assert await store.get("t1", None, shared.id) == shared
    assert await store.get("t1", "u1", shared.id) is None
    assert await store.get("t1", "u1", "no-such-id") is None


async def test_update_replaces_the_record(store: MemoryStore) -> None:
    """update() stores the new version; a disabled memory leaves keyword search."""
    memory = mem("Plays chess on Sundays")
    await store.add(memory)
    changed = memory.with_changes(content="Plays chess on Saturdays", enabled=False)
    await store.update(changed)
    assert await store.get("t1", "u1", memory.id) == changed
    assert await found(store, ask("chess")) == []


async def test_update_of_a_missing_memory_raises_key_error(store: MemoryStore) -> None:
    """update() of an id that is not stored in that namespace raises KeyError and writes
    nothing."""
    memory = mem("Owns a bicycle")
    await store.add(memory)
    with pytest.raises(KeyError):
        await store.update(mem("Ghost"))
    with pytest.raises(KeyError):
        await store.update(memory.with_changes(user_id="u2"))
    assert await store.get("t1", "u2", memory.id) is None


# isolation -------------------------------------------------------------------------

OWNERS = [("t1", "u1"), ("t1", "u2"), ("t2", "u1")]


@pytest.mark.parametrize(("tenant", "user"), OWNERS)
async def test_identical_content_and_queries_stay_in_their_namespace(
    store: MemoryStore, tenant: str, user: str
) -> None:
    """Two users and two tenants with identical memories and identical queries each see
    only their own memory — in search, resident, related, list, count (a search that ignores
    the user filter would leak them)."""
    mine: dict[tuple[str, str], Memory] = {}
    for t, u in OWNERS:
        mine[(t, u)] = mem("My favourite band is Band-X", tenant=t, user=u,
                           embedding=(1.0, 0.0, 0.0, 0.0))
        await store.add(mine[(t, u)])
    expected = mine[(tenant, user)].id
    query = ask("favourite band", tenant=tenant, user=user, embedding=(1.0, 0.0, 0.0, 0.0))
    assert [c.memory.id for c in await store.search(query)] == [expected]
    resident = await store.resident(tenant, user, limit=10, channels=None)
    assert [m.id for m in resident] == [expected]
    related = await store.related(tenant, user, "band", limit=10)
    assert [m.id for m in related] == [expected]
    listed = await store.list_memories(ListQuery(tenant=tenant, user=user))
    assert [m.id for m in listed] == [expected]
    assert (await store.count(tenant, user))["total"] == 1


async def test_a_new_user_sees_nothing(store: MemoryStore) -> None:
    """A user with no memories gets empty results everywhere, never someone else's."""
    await store.add(mem("My favourite band is Band-X"))
    query = ask("What's my favourite band?", user="u-new", embedding=(1.0, 0.0, 0.0, 0.0))
    assert await store.search(query) == []
    assert await store.resident("t1", "u-new", limit=5, channels=None) == []
    assert await store.list_memories(ListQuery(tenant="t1", user="u-new")) == []
    assert await store.get_profile("t1", "u-new") is None


# keyword search -----------------------------------------------------------------------

async def test_keyword_search_ranks_the_matching_memory_first(store: MemoryStore) -> None:
    """The memory sharing the most query terms ranks first; unrelated ones are absent;
    ranks count from 1 and scores are positive, higher first."""
    await store.add(mem("Drinks green tea every morning"))
    await store.add(mem("Green is the favourite colour"))
    await store.add(mem("Works as a nurse in Lisbon"))
    candidates = sorted((c for c in await store.search(ask("green tea in the morning"))),
                        key=lambda c: c.keyword_rank or 0)
    assert [c.memory.content for c in candidates] == [
        "Drinks green tea every morning", "Green is the favourite colour"]
    assert [c.keyword_rank for c in candidates] == [1, 2]
    scores = [c.keyword_score or 0.0 for c in candidates]
    assert scores[0] > scores[1] > 0
    assert all(c.vector_rank is None for c in candidates)


async def test_index_maintenance_keeps_every_search_result(store: MemoryStore) -> None:
    """maintain() (periodic index upkeep) changes no search result, ranks or scores, and
    later writes and retirements are still seen after it."""
    for i in range(40):
        await store.add(mem(f"Visited city number {i} and liked the trams", minutes=i))
    await store.add(mem("Drinks green tea every morning", minutes=50))
    queries = [ask("green tea morning"), ask("city trams"), ask("visited number 7")]
    before = [[(c.memory.id, c.keyword_rank, c.keyword_score) for c in await store.search(q)]
              for q in queries]
    await store.maintain()
    await store.maintain()  # idempotent
    after = [[(c.memory.id, c.keyword_rank, c.keyword_score) for c in await store.search(q)]
             for q in queries]
    assert after == before
    assert before[0]
    assert before[1]
    await store.add(mem("Drinks black tea at night", minutes=60))
    assert "Drinks black tea at night" in await found(store, ask("tea"))


async def test_matching_more_query_terms_beats_repeating_one(store: MemoryStore) -> None:
    """Each matching query term adds to the BM25 score: a memory with both query words
    outranks one that repeats a single word (namespace filters add nothing)."""
    both = mem("Cooks pasta in the garden on weekends")
    repeated = mem("Pasta pasta and more pasta every day")
    await store.add(both)
    await store.add(repeated)
    for i, filler in enumerate(["Reads novels at night", "Plays chess online", "Owns a cat",
                                "Drives an old van", "Learns Japanese", "Runs on Mondays",
                                "Bakes sourdough bread", "Collects vinyl records"]):
        await store.add(mem(filler, minutes=i))
    assert await found(store, ask("pasta garden")) == [both.content, repeated.content]


async def test_keyword_search_without_terms_finds_nothing(store: MemoryStore) -> None:
    """A query of stopwords only (no terms) returns no keyword candidates."""
    await store.add(mem("Drinks green tea every morning"))
    assert query_terms("what is it") == []
    assert await store.search(ask("what is it")) == []


async def test_search_respects_the_limit(store: MemoryStore) -> None:
    """At most ``limit`` candidates per method."""
    for i in range(5):
        await store.add(mem(f"Tea note number {i}", minutes=i))
    assert len(await store.search(ask("tea", limit=3))) == 3


async def test_english_words_match_across_inflections(store: MemoryStore) -> None:
    """Latin words are stemmed alike at write and query time ("marathons" ~ "marathon")."""
    await store.add(mem("Runs marathons in the mountains"))
    assert await found(store, ask("marathon running")) == ["Runs marathons in the mountains"]


@pytest.mark.parametrize(("content", "question"), [
    ("Loves the café near the station", "cafe"),
    ("Loves the cafe near the station", "café"),
    ("Sent a résumé to München", "resume munchen"),
])
async def test_latin_diacritics_do_not_matter(
    store: MemoryStore, content: str, question: str
) -> None:
    """Accented and plain Latin spellings find each other, in both directions."""
    await store.add(mem(content))
    assert await found(store, ask(question)) == [content]


@pytest.mark.parametrize(("content", "question"), [
    ("我最喜欢喝的咖啡是拿铁", "我喜欢什么咖啡？"),
    ("住在上海浦东新区", "我住在上海哪里"),
    ("Works at 示例科技 as an engineer", "示例科技"),
])
async def test_chinese_text_is_found_by_a_chinese_query(
    store: MemoryStore, content: str, question: str
) -> None:
    """Chinese is segmented the same way when written and when asked, so a Chinese query
    finds the Chinese memory — and a query about something else does not."""
    await store.add(mem(content))
    await store.add(mem("喜欢在周末爬山"))
    assert (await found(store, ask(question)))[0] == content
    assert content not in await found(store, ask("绿茶"))


@pytest.mark.parametrize("inactive", [
    {"enabled": False},
    {"superseded_at": T0, "superseded_by": "other", "supersede_reason": "changed"},
])
async def test_inactive_memories_are_never_recalled(
    store: MemoryStore, inactive: dict[str, Any]
) -> None:
    """Disabled and retired memories never come back from search, resident or related,
    even when they match best; they stay listable for management."""
    stale = mem("Lives in Lisbon near the river", embedding=(1.0, 0.0, 0.0, 0.0), hits=9,
                **inactive)
    live = mem("Visited Lisbon once", embedding=(0.0, 1.0, 0.0, 0.0))
    await store.add(stale)
    await store.add(live)
    query = ask("lives in Lisbon river", embedding=(1.0, 0.0, 0.0, 0.0))
    assert [c.memory.id for c in await store.search(query)] == [live.id]
    assert [m.id for m in await store.resident("t1", "u1", limit=5, channels=None)] == \
        [live.id]
    assert [m.id for m in await store.related("t1", "u1", "Lisbon", limit=5)] == [live.id]
    everything = ListQuery(tenant="t1", user="u1", include_retired=True)
    assert {m.id for m in await store.list_memories(everything)} == {stale.id, live.id}


# shared memories and channels ---------------------------------------------------------

async def test_shared_memories_come_only_with_include_shared(store: MemoryStore) -> None:
    """The tenant's shared and system memories join search only with include_shared, and
    another tenant's never do."""
    shared = mem("Expense reports are due on Fridays", user=None)
    system = mem("Expense policy: receipts above 50 EUR", user=None, source="system",
                 scope="system")
    foreign = mem("Expense reports go to finance", user=None, tenant="t2")
    for memory in (shared, system, foreign):
        await store.add(memory)
    with_shared = {c.memory.id for c in await store.search(ask("expense reports"))}
    assert with_shared == {shared.id, system.id}
    assert await store.search(ask("expense reports", include_shared=False)) == []


@pytest.mark.parametrize(("channels", "visible"), [
    (None, {"private", "group-a", "group-b", "shared"}),
    (("group:a",), {"group-a", "shared"}),
    (("group:a", "group:b"), {"group-a", "group-b", "shared"}),
    ((), {"shared"}),
    ((None,), {"shared"}),
])
async def test_channel_rule_limits_personal_memories(
    store: MemoryStore, channels: tuple[str | None, ...] | None, visible: set[str]
) -> None:
    """In a group only memories learned in that group (plus shared ones) are visible;
    private facts never reach a group (docs/design.md#group-chats); channels=None means all."""
    tagged = {
        "private": mem("Hiking plan private", source_channel="private"),
        "group-a": mem("Hiking plan group a", source_channel="group:a"),
        "group-b": mem("Hiking plan group b", source_channel="group:b"),
        "shared": mem("Hiking plan shared", user=None),
    }
    for memory in tagged.values():
        await store.add(memory)
    names = {m.id: name for name, m in tagged.items()}
    result = await store.search(ask("hiking plan", channels=channels))
    assert {names[c.memory.id] for c in result} == visible
    resident = await store.resident("t1", "u1", limit=10, channels=channels)
    assert {names[m.id] for m in resident} == visible - {"shared"}


async def test_channel_names_are_case_sensitive(store: MemoryStore) -> None:
    """Group ids differing in case are different groups."""
    await store.add(mem("Hiking plan upper", source_channel="group:ABC"))
    result = await store.search(ask("hiking plan", channels=("group:abc",)))
    assert result == []


# vectors ----------------------------------------------------------------------------

async def test_vector_search_ranks_the_nearest_embedding_first(store: MemoryStore) -> None:
    """With a query embedding, candidates come back by cosine similarity, nearest first,
    with vector ranks and similarity scores; memories without embeddings are skipped."""
    near = mem("alpha", embedding=(1.0, 0.1, 0.0, 0.0))
    middle = mem("beta", embedding=(1.0, 1.0, 0.0, 0.0))
    far = mem("gamma", embedding=(0.0, 0.0, 1.0, 0.0))
    plain = mem("delta")
    for memory in (far, middle, near, plain):
        await store.add(memory)
    result = await store.search(SearchQuery(tenant="t1", user="u1", terms=(),
                                            embedding=(2.0, 0.0, 0.0, 0.0)))
    ordered = sorted(result, key=lambda c: c.vector_rank or 0)
    assert [c.memory.id for c in ordered] == [near.id, middle.id, far.id]
    assert [c.vector_rank for c in ordered] == [1, 2, 3]
    scores = [c.vector_score or 0.0 for c in ordered]
    assert scores[0] == pytest.approx(0.995, abs=1e-3)
    assert scores[1] == pytest.approx(0.7071, abs=1e-3)
    assert scores[2] == pytest.approx(0.0, abs=1e-3)


async def test_keyword_and_vector_ranks_merge_on_one_candidate(store: MemoryStore) -> None:
    """A memory found by both methods is one candidate carrying both ranks."""
    both = mem("Allergic to peanuts", embedding=(1.0, 0.0, 0.0, 0.0))
    words = mem("Peanuts are fine in sauces", embedding=(0.0, 1.0, 0.0, 0.0))
    await store.add(both)
    await store.add(words)
    result = {c.memory.id: c for c in await store.search(
        ask("peanuts allergic", embedding=(1.0, 0.0, 0.0, 0.0), limit=1))}
    assert result[both.id].keyword_rank == 1
    assert result[both.id].vector_rank == 1
    assert words.id not in result


async def test_query_vector_of_another_dimension_adds_no_vector_candidates(
    store: MemoryStore,
) -> None:
    """A query embedding whose dimension differs from the stored ones finds nothing by
    vector (keyword search still works)."""
    await store.add(mem("Allergic to peanuts", embedding=(1.0, 0.0, 0.0, 0.0)))
    result = await store.search(ask("peanuts", embedding=(1.0, 0.0, 0.0)))
    assert [(c.keyword_rank, c.vector_rank) for c in result] == [(1, None)]


# resident and related -----------------------------------------------------------------

async def test_resident_orders_by_evidence_then_recency(store: MemoryStore) -> None:
    """The resident layer is the user's active facts about themselves, by hits then
    last_seen_at, descending; facts about other people are not resident."""
    old_strong = mem("A", hits=5, last_seen_at=T0)
    new_strong = mem("B", hits=5, last_seen_at=T0 + timedelta(days=1))
    weak = mem("C", hits=1, last_seen_at=T0 + timedelta(days=9))
    other = mem("D", hits=9, subject="Alice")
    for memory in (weak, old_strong, other, new_strong):
        await store.add(memory)
    resident = await store.resident("t1", "u1", limit=10, channels=None)
    assert [m.content for m in resident] == ["B", "A", "C"]
    assert [m.content for m in await store.resident("t1", "u1", limit=2, channels=None)] \
        == ["B", "A"]
    assert await store.resident("t1", "u1", limit=0, channels=None) == []


async def test_related_puts_keyword_matches_first_then_evidence(store: MemoryStore) -> None:
    """related() lists keyword matches first, then fills up with the user's strongest
    facts; shared memories are never related."""
    match = mem("Keeps bees in the garden", hits=1)
    strong = mem("Speaks Portuguese", hits=7)
    await store.add(match)
    await store.add(strong)
    await store.add(mem("Bees policy for the office", user=None))
    related = await store.related("t1", "u1", "my bees", limit=5)
    assert [m.id for m in related] == [match.id, strong.id]
    assert [m.id for m in await store.related("t1", "u1", "my bees", limit=1)] == [match.id]


# apply --------------------------------------------------------------------------------

def batch(key: str, *upserts: Memory, **fields: Any) -> ChangeSet:
    return ChangeSet(tenant="t1", user_id="u1", batch_key=key, upserts=upserts, **fields)


async def test_apply_writes_everything_in_the_change_set(store: MemoryStore) -> None:
    """One apply stores upserts, deletes, the profile, the conversation record and the
    audit events."""
    doomed = mem("Old fact")
    await store.add(doomed)
    fresh = mem("Likes sailing")
    profile = Profile(tenant="t1", user_id="u1", style="brief", impression="friendly")
    record = ConversationRecord(tenant="t1", user_id="u1", conversation_id="conv-1",
                                score=0.8, dimensions={"density": 0.7}, reason="useful",
                                learned_messages=3, updated_at=T0)
    applied = await store.apply(batch(
        "b1", fresh, evidence=((fresh.id, "b1"),), deletes=(doomed.id,), profile=profile,
        conversation=record, audit=(event("extracted"), event("created", minutes=1)),
    ))
    assert applied is True
    assert await store.get("t1", "u1", fresh.id) == fresh
    assert await store.get("t1", "u1", doomed.id) is None
    assert await store.get_profile("t1", "u1") == profile
    assert await store.get_conversation("t1", "u1", "conv-1") == record
    assert [e.action for _, e in await store.audit_log("t1", "u1")] == ["created", "extracted"]
    assert await found(store, ask("sailing")) == ["Likes sailing"]


async def test_apply_is_at_most_once_per_batch_key(store: MemoryStore) -> None:
    """The same batch key applied twice: the second returns False and changes nothing,
    even when its contents differ (a redelivered job)."""
    first = mem("Likes sailing", hits=1)
    record = ConversationRecord(tenant="t1", user_id="u1", conversation_id="c",
                                learned_messages=2, updated_at=T0)
    assert await store.apply(batch("b1", first, conversation=record,
                                   audit=(event("created"),))) is True
    again = batch("b1", first.with_changes(hits=2), mem("Another fact"),
                  conversation=record, audit=(event("merged"),))
    assert await store.apply(again) is False
    assert (await store.get("t1", "u1", first.id)) == first
    assert [m.id for m in await store.list_memories(ListQuery(tenant="t1", user="u1"))] == \
        [first.id]
    conversation = await store.get_conversation("t1", "u1", "c")
    assert conversation is not None
    assert conversation.learned_messages == 2
    assert [e.action for _, e in await store.audit_log("t1", "u1")] == ["created"]


async def test_apply_for_another_namespace_raises_and_changes_nothing(
    store: MemoryStore,
) -> None:
    """A change set carrying another user's memory raises ValueError and writes nothing,
    not even its batch key: the corrected batch still applies."""
    mine = mem("Mine")
    theirs = mem("Theirs", user="u2")
    with pytest.raises(ValueError, match="namespace"):
        await store.apply(batch("b1", mine, theirs, audit=(event("created"),)))
    assert await store.get("t1", "u1", mine.id) is None
    assert await store.get("t1", "u2", theirs.id) is None
    assert await store.audit_log("t1", "u1") == []
    assert await store.apply(batch("b1", mine)) is True
    assert await store.get("t1", "u1", mine.id) == mine


async def test_conversation_learned_messages_accumulate(store: MemoryStore) -> None:
    """Each batch adds its learned messages to the conversation record; score and
    reason are the latest batch's."""
    for i, (count, score) in enumerate([(3, 0.7), (2, 0.9)]):
        await store.apply(batch(f"b{i}", conversation=ConversationRecord(
            tenant="t1", user_id="u1", conversation_id="c", score=score,
            dimensions={"depth": score}, reason=f"r{i}", learned_messages=count,
            updated_at=T0 + timedelta(minutes=i))))
    record = await store.get_conversation("t1", "u1", "c")
    assert record == ConversationRecord(
        tenant="t1", user_id="u1", conversation_id="c", score=0.9, dimensions={"depth": 0.9},
        reason="r1", learned_messages=5, updated_at=T0 + timedelta(minutes=1))
    assert await store.get_conversation("t1", "u1", "other") is None
    assert await store.get_conversation("t1", "u2", "c") is None


async def test_conversation_without_score_round_trips(store: MemoryStore) -> None:
    """A conversation record with no score keeps None."""
    record = ConversationRecord(tenant="t1", user_id="u1", conversation_id="c", score=None,
                                learned_messages=1, updated_at=T0)
    await store.apply(batch("b", conversation=record))
    assert await store.get_conversation("t1", "u1", "c") == record


# delete and clear ---------------------------------------------------------------

async def test_delete_leaves_a_tombstone_and_nothing_findable(store: MemoryStore) -> None:
    """delete() removes the memory from get, list, search (keyword and vector) and
    resident, records its normalised content as tombstoned, and is False the second
    time."""
    memory = mem("Lives in City B", embedding=(1.0, 0.0, 0.0, 0.0))
    await store.add(memory)
    before = datetime.now(UTC) - timedelta(seconds=5)
    assert await store.delete("t1", "u1", memory.id, audit=event("deleted")) is True
    assert await store.get("t1", "u1", memory.id) is None
    assert await store.list_memories(ListQuery(tenant="t1", user="u1",
                                                include_retired=True)) == []
    assert await store.search(ask("City B", embedding=(1.0, 0.0, 0.0, 0.0))) == []
    assert await store.resident("t1", "u1", limit=5, channels=None) == []
    norm = normalize("Lives in City B")
    tombs = await store.tombstoned("t1", "u1", [norm, "never stored"])
    assert set(tombs) == {norm}
    assert tombs[norm] >= before
    assert await store.tombstoned("t1", "u2", [norm]) == {}
    assert await store.delete("t1", "u1", memory.id) is False


async def test_delete_of_another_users_memory_is_refused(store: MemoryStore) -> None:
    """A user cannot delete another user's memory: False, and it stays."""
    memory = mem("Lives in City B", user="u2")
    await store.add(memory)
    assert await store.delete("t1", "u1", memory.id) is False
    assert await store.get("t1", "u2", memory.id) == memory


async def test_clear_removes_everything_of_the_user_only(store: MemoryStore) -> None:
    """clear() — one call for the whole user, not one delete per memory — deletes every
    memory, the profile and conversation records of the user — nothing is listable,
    searchable, resident or gettable afterwards — records cleared_at, keeps the user's
    switches, and leaves other users alone. Public failures: erasure looped over single
    deletes (minutes for hundreds of memories, half done on a failure), and deleted memories
    still came back from an index that was never purged."""
    memories = [mem(f"City B fact {i}", embedding=(1.0, 0.0, 0.0, float(i)))
                for i in range(3)]
    memories.append(mem("Retired City B fact", superseded_at=T0))
    for memory in memories:
        await store.add(memory)
    other = mem("City B fact of u2", user="u2")
    await store.add(other)
    await store.apply(batch("b1", evidence=((memories[0].id, "b1"),),
                            profile=Profile(tenant="t1", user_id="u1", style="terse"),
                            conversation=ConversationRecord(
                                tenant="t1", user_id="u1", conversation_id="c",
                                learned_messages=1, updated_at=T0)))
    await store.put_user_settings("t1", "u1", UserSettings(show_learning_indicator=False))
    before = datetime.now(UTC) - timedelta(seconds=5)

    assert await store.clear("t1", "u1", audit=event("cleared")) == 4

    assert await store.list_memories(ListQuery(tenant="t1", user="u1",
                                                include_retired=True)) == []
    assert await store.search(ask("City B fact", embedding=(1.0, 0.0, 0.0, 0.0))) == []
    assert await store.resident("t1", "u1", limit=10, channels=None) == []
    assert await store.related("t1", "u1", "City B", limit=10) == []
    for memory in memories:
        assert await store.get("t1", "u1", memory.id) is None
    assert await store.get_profile("t1", "u1") is None
    assert await store.get_conversation("t1", "u1", "c") is None
    assert await store.count("t1", "u1") == {"total": 0, "retired": 0, "disabled": 0}
    settings = await store.get_user_settings("t1", "u1")
    assert settings.cleared_at is not None
    assert settings.cleared_at >= before
    assert settings.show_learning_indicator is False
    assert [c.memory.id for c in await store.search(ask("City B", user="u2"))] == [other.id]
    assert "cleared" in [e.action for _, e in await store.audit_log("t1", "u1")]


async def test_clear_of_an_empty_namespace_still_records_cleared_at(
    store: MemoryStore,
) -> None:
    """Clearing a user with no memories deletes 0 and still stamps cleared_at."""
    assert await store.clear("t1", "u-none") == 0
    assert (await store.get_user_settings("t1", "u-none")).cleared_at is not None


# access counts ------------------------------------------------------------------------

async def test_record_access_counts_within_the_tenant(store: MemoryStore) -> None:
    """record_access adds to access_count and stamps last_access_at; ids of another
    tenant are not touched and unknown ids are ignored."""
    memory = mem("Likes jazz")
    foreign = mem("Likes jazz too", tenant="t2")
    await store.add(memory)
    await store.add(foreign)
    first, second = T0 + timedelta(days=1), T0 + timedelta(days=2)
    await store.record_access("t1", {memory.id: 2, "unknown": 1}, first)
    await store.record_access("t1", {memory.id: 3, foreign.id: 5}, second)
    stored = await store.get("t1", "u1", memory.id)
    assert stored is not None
    assert (stored.access_count, stored.last_access_at) == (5, second)
    untouched = await store.get("t2", "u1", foreign.id)
    assert untouched is not None
    assert untouched.access_count == 0
    await store.record_access("t1", {}, second)  # nothing to do


async def test_record_access_reaches_shared_memories(store: MemoryStore) -> None:
    """Injected shared memories count their accesses too."""
    shared = mem("Office closes at six", user=None)
    await store.add(shared)
    await store.record_access("t1", {shared.id: 1}, T0)
    stored = await store.get("t1", None, shared.id)
    assert stored is not None
    assert stored.access_count == 1


# counting and listing -----------------------------------------------------------------

async def test_count_reports_active_memories_per_category(store: MemoryStore) -> None:
    """count() gives active memories per category plus total; retired and disabled are
    counted apart (a retired memory is retired even when also disabled)."""
    await store.add(mem("a", category="technical"))
    await store.add(mem("b", category="technical"))
    await store.add(mem("c", category="business"))
    await store.add(mem("d", category="business", enabled=False))
    await store.add(mem("e", category="business", enabled=False, superseded_at=T0))
    await store.add(mem("f", category="technical", user="u2"))
    assert await store.count("t1", "u1") == {
        "total": 3, "retired": 1, "disabled": 1, "technical": 2, "business": 1}


async def test_list_is_newest_first_with_paging(store: MemoryStore) -> None:
    """Listing orders by id descending (newest first); limit and offset page through."""
    memories = [mem(f"fact {i}", id=f"01JA{i:022d}") for i in range(7)]
    for i in (3, 0, 6, 1, 5, 2, 4):  # written out of order: the id decides
        await store.add(memories[i])
    newest_first = [m.id for m in reversed(memories)]

    async def page(offset: int, limit: int) -> list[str]:
        query = ListQuery(tenant="t1", user="u1", limit=limit, offset=offset)
        return [m.id for m in await store.list_memories(query)]

    assert await page(0, 100) == newest_first
    assert await page(0, 3) == newest_first[:3]
    assert await page(3, 3) == newest_first[3:6]
    assert await page(6, 3) == newest_first[6:]
    assert await page(7, 3) == []


async def test_list_filters_retired_disabled_and_category(store: MemoryStore) -> None:
    """include_retired / include_disabled / category filter the listing."""
    live = mem("live", category="technical")
    off = mem("off", category="technical", enabled=False)
    retired = mem("retired", category="business", superseded_at=T0, enabled=False)
    for memory in (live, off, retired):
        await store.add(memory)

    async def ids(**fields: Any) -> set[str]:
        query = ListQuery(tenant="t1", user="u1", **fields)
        return {m.content for m in await store.list_memories(query)}

    assert await ids() == {"live", "off"}
    assert await ids(include_retired=True) == {"live", "off", "retired"}
    assert await ids(include_disabled=False) == {"live"}
    assert await ids(include_retired=True, category="business") == {"retired"}
    assert await ids(category="domain") == set()


@pytest.mark.parametrize(("text", "expected"), [
    ("coffee", {"Prefers dark roast coffee"}),
    ("COFF", {"Prefers dark roast coffee"}),
    ("dark roast", {"Prefers dark roast coffee"}),
    ("Pour", {"Travel notes"}),  # matches the title only
    ("咖啡", {"每天早上喝咖啡"}),
    ("tea", set()),
])
async def test_list_text_filter_matches_substrings_of_content_and_title(
    store: MemoryStore, text: str, expected: set[str]
) -> None:
    """The listing's text filter keeps memories whose content or title contains every
    query term, ignoring ASCII case."""
    await store.add(mem("Prefers dark roast coffee"))
    await store.add(mem("Travel notes", title="Pour-over in Kyoto"))
    await store.add(mem("每天早上喝咖啡"))
    query = ListQuery(tenant="t1", user="u1", text=text)
    assert {m.content for m in await store.list_memories(query)} == expected


# audit log ----------------------------------------------------------------------------

async def test_audit_log_is_newest_first_and_filtered_by_user(store: MemoryStore) -> None:
    """audit_log lists a user's events newest first; without a user, the whole tenant's;
    never another tenant's; before_id pages backwards."""
    await store.audit([event("scored", minutes=0), event("extracted", minutes=1),
                       event("merged", user="u2", minutes=2),
                       event("promoted", user=None, minutes=3),
                       event("scored", tenant="t2", minutes=4)])
    await store.audit([event("created", minutes=5, memory_id="m1", reason="why",
                             conversation_id="c1", detail={"n": 1, "at": T0})])
    mine = await store.audit_log("t1", "u1")
    assert [e.action for _, e in mine] == ["created", "extracted", "scored"]
    ids = [i for i, _ in mine]
    assert ids == sorted(ids, reverse=True)
    newest = mine[0][1]
    assert (newest.memory_id, newest.reason, newest.conversation_id, newest.at) == \
        ("m1", "why", "c1", T0 + timedelta(minutes=5))
    assert newest.detail == {"n": 1, "at": "2025-01-01T00:00:00+00:00"}
    tenant = [e.action for _, e in await store.audit_log("t1", None)]
    assert tenant == ["created", "promoted", "merged", "extracted", "scored"]
    assert [e.action for _, e in await store.audit_log("t1", "u1", limit=1)] == ["created"]
    older = await store.audit_log("t1", "u1", before_id=ids[0])
    assert [e.action for _, e in older] == ["extracted", "scored"]
    assert await store.audit_log("t1", "u1", before_id=ids[-1]) == []
    assert [e.action for _, e in await store.audit_log("t2", None)] == ["scored"]


# settings and profile -----------------------------------------------------------------

async def test_user_settings_round_trip(store: MemoryStore) -> None:
    """Settings read back as written; an unknown user has the defaults."""
    assert await store.get_user_settings("t1", "u1") == UserSettings()
    wanted = UserSettings(enable_personal_learning=False, show_learning_indicator=False,
                          cleared_at=T0)
    await store.put_user_settings("t1", "u1", wanted)
    assert await store.get_user_settings("t1", "u1") == wanted
    await store.put_user_settings("t1", "u1", UserSettings())
    assert await store.get_user_settings("t1", "u1") == UserSettings()
    assert await store.get_user_settings("t1", "u2") == UserSettings()


async def test_profile_round_trip(store: MemoryStore) -> None:
    """A profile with scored traits and topics reads back equal; put replaces it."""
    profile = Profile(
        tenant="t1", user_id="u1", names=("Ana", "安娜"), first_seen=T0,
        last_seen=T0 + timedelta(days=3), message_count=42, style="short, direct",
        impression="curious engineer",
        traits=(ScoredTag("话少", 0.8, 3, T0), ScoredTag("precise", 0.5, 1, T0)),
        topics=(ScoredTag("hiking", 0.9, 4, T0 + timedelta(days=1)),),
    )
    await store.put_profile(profile)
    assert await store.get_profile("t1", "u1") == profile
    assert await store.get_profile("t1", "u2") is None
    smaller = Profile(tenant="t1", user_id="u1", style="chatty")
    await store.put_profile(smaller)
    assert await store.get_profile("t1", "u1") == smaller


# maintenance, names, prompts, deletions racing learning -----------------------------

async def test_scan_finds_old_unused_memories_across_users(store: MemoryStore) -> None:
    """scan() lists personal memories by tenant, user, channel, age and use, oldest first;
    shared memories are never listed."""
    from proxy.memory.store import ScanQuery

    old_unused = mem("old unused", minutes=0)
    old_used = mem("old used", minutes=1, access_count=2)
    other_user_old = mem("other user old", user="u2", minutes=2)
    new = mem("new", minutes=500)
    group = mem("in the group", minutes=3, source_channel="group:g1")
    shared = mem("shared old", user=None, minutes=0)
    for memory in (old_unused, old_used, other_user_old, new, group, shared):
        await store.add(memory)
    cutoff = T0 + timedelta(minutes=100)
    stale = await store.scan(ScanQuery(created_before=cutoff, never_accessed=True))
    assert [m.content for m in stale] == ["old unused", "other user old", "in the group"]
    mine = await store.scan(ScanQuery(tenant="t1", user="u1"))
    assert [m.content for m in mine] == ["old unused", "old used", "in the group", "new"]
    in_group = await store.scan(ScanQuery(tenant="t1", channel="group:g1"))
    assert [m.content for m in in_group] == ["in the group"]
    assert await store.scan(ScanQuery(tenant="t2")) == []


async def test_names_resolve_per_tenant(store: MemoryStore) -> None:
    """A display name maps to the users who go by it, case- and width-insensitively, within
    one tenant."""
    await store.bind_names("t1", "u1", ["Alice"])
    await store.bind_names("t1", "u2", ["Sam", "ALICE"])
    await store.bind_names("t2", "u9", ["Alice"])
    assert await store.users_named("t1", "alice") == ["u1", "u2"]
    assert await store.users_named("t1", "Ｓａｍ") == ["u2"]
    assert await store.users_named("t1", "nobody") == []
    assert await store.users_named("t2", "Alice") == ["u9"]


async def test_prompt_versions_are_numbered_and_listed_newest_first(store: MemoryStore) -> None:
    """Saved prompt versions count from 1 per tenant and kind."""
    first = await store.save_prompt("t1", "scoring", "v1 text", "ops", T0)
    await store.save_prompt("t1", "scoring", "v2 text", "ops", T0 + timedelta(minutes=1))
    await store.save_prompt("t1", "extraction", "other", "ops", T0)
    assert first.version == 1
    versions = await store.prompt_versions("t1", "scoring")
    assert [(v.version, v.text) for v in versions] == [(2, "v2 text"), (1, "v1 text")]
    assert [v.version for v in await store.prompt_versions("t1", "scoring", limit=1)] == [2]
    assert await store.prompt_versions("t2", "scoring") == []


async def test_apply_after_clear_changes_nothing(store: MemoryStore) -> None:
    """A batch whose messages were said before the user cleared their memory is not
    applied: the deletion wins over learning in flight (a job queued before a
    delete-all must not bring the fact back)."""
    said = T0 + timedelta(minutes=1)
    await store.clear("t1", "u1")  # cleared "now", after the batch's messages
    applied = await store.apply(ChangeSet(
        tenant="t1", user_id="u1", batch_key="b-late", upserts=(mem("Lives in City Q"),),
        learned_from=said))
    assert applied is False
    assert await store.list_memories(ListQuery(tenant="t1", user="u1")) == []


async def test_apply_skips_new_memories_deleted_since(store: MemoryStore) -> None:
    """A new memory repeating a fact the user deleted after the batch's messages is not
    written; updates of stored memories and other new ones are."""
    kept = mem("Keeps bees", minutes=0)
    await store.add(kept)
    doomed = mem("Has a cat named Miso", minutes=1)
    await store.add(doomed)
    await store.delete("t1", "u1", doomed.id)
    said = T0 + timedelta(minutes=2)
    applied = await store.apply(ChangeSet(
        tenant="t1", user_id="u1", batch_key="b-race", learned_from=said,
        upserts=(mem("Has a cat named Miso", minutes=3), kept.with_changes(hits=2),
                 mem("Grows basil", minutes=3))))
    assert applied is True
    stored = {m.content: m.hits for m in await store.list_memories(
        ListQuery(tenant="t1", user="u1"))}
    assert stored == {"Keeps bees": 2, "Grows basil": 1}


async def test_tombstones_keep_no_deleted_text(store: MemoryStore, tmp_path: Path) -> None:
    """After a deletion the store still recognises the fact, but holds no copy of its text
    (SQLite: nowhere in the database file)."""
    secret = mem("Secretly plans to move to Reykjavik")
    await store.add(secret)
    await store.delete("t1", "u1", secret.id)
    assert normalize(secret.content) in await store.tombstoned(
        "t1", "u1", [normalize(secret.content)])
    if isinstance(store, SqliteMemoryStore):
        import sqlite3

        conn = sqlite3.connect(tmp_path / "memory.db")
        dump = "\n".join(conn.iterdump())
        conn.close()
        assert "reykjavik" not in dump.lower()


async def test_summaries_are_capped_per_user(store: MemoryStore) -> None:
    """A user keeps the 60 most recent conversation summaries; older ones are cleared,
    the records stay; an empty summary keeps the stored one."""
    from proxy.memory.records import MAX_SUMMARIES

    for index in range(MAX_SUMMARIES + 2):
        await store.apply(ChangeSet(
            tenant="t1", user_id="u1", batch_key=f"s{index}",
            conversation=ConversationRecord(
                tenant="t1", user_id="u1", conversation_id=f"c{index}", score=0.7,
                learned_messages=1, updated_at=T0 + timedelta(minutes=index),
                summary=f"summary {index}")))
    oldest = await store.get_conversation("t1", "u1", "c0")
    newest = await store.get_conversation("t1", "u1", f"c{MAX_SUMMARIES + 1}")
    assert oldest is not None
    assert oldest.summary == ""
    assert (await store.get_conversation("t1", "u1", "c1")).summary == ""  # type: ignore[union-attr]
    assert (await store.get_conversation("t1", "u1", "c2")).summary == "summary 2"  # type: ignore[union-attr]
    assert newest is not None
    assert newest.summary == f"summary {MAX_SUMMARIES + 1}"
    await store.apply(ChangeSet(
        tenant="t1", user_id="u1", batch_key="s-keep",
        conversation=ConversationRecord(tenant="t1", user_id="u1", conversation_id="c5",
                                        score=0.2, updated_at=T0 + timedelta(days=1))))
    kept = await store.get_conversation("t1", "u1", "c5")
    assert kept is not None
    assert kept.summary == "summary 5"
    assert kept.score == 0.2


# listing filters, cursor, erasure ------------------------------------------------------

async def test_list_filters_enabled_source_and_pages_by_cursor(store: MemoryStore) -> None:
    """enabled / source keep only matching memories; ``after`` lists ids below the
    cursor (older memories), newest first, and combines with the text filter."""
    memories = [mem(f"fact {i}", id=f"01JB{i:022d}", source="manual" if i % 2 else "auto",
                    enabled=i != 3) for i in range(6)]
    for memory in memories:
        await store.add(memory)

    async def ids(**fields: Any) -> list[str]:
        query = ListQuery(tenant="t1", user="u1", **fields)
        return [m.id for m in await store.list_memories(query)]

    newest_first = [m.id for m in reversed(memories)]
    assert await ids(after=newest_first[1], limit=2) == newest_first[2:4]
    assert await ids(after=newest_first[-1]) == []
    assert await ids(after=newest_first[1], text="fact") == newest_first[2:]
    assert await ids(enabled=False) == [memories[3].id]
    assert await ids(enabled=True, source="manual") == [memories[5].id, memories[1].id]
    assert await ids(source="auto") == [memories[4].id, memories[2].id, memories[0].id]


async def test_list_scope_shows_the_tenants_shared_or_system_memories_only(
    store: MemoryStore,
) -> None:
    """scope "shared"/"system" lists the tenant's memories of that scope, never a user's
    memories and never another tenant's."""
    shared = mem("Office opens at nine", user=None, scope="shared")
    system = mem("Answer in the user's language", user=None, scope="system",
                 source="system")
    for memory in (shared, system, mem("personal"), mem("t2 shared", tenant="t2", user=None)):
        await store.add(memory)
    for scope, expected in (("shared", [shared.id]), ("system", [system.id])):
        query = ListQuery(tenant="t1", user="u1", scope=scope)  # type: ignore[arg-type]
        assert [m.id for m in await store.list_memories(query)] == expected


async def test_erase_user_leaves_only_the_marker_and_one_audit_event(
    store: MemoryStore,
) -> None:
    """erase_user deletes memories (retired too), evidence, tombstones, profile,
    conversations, name bindings, settings and the user's audit events; keeps a
    cleared_at marker (a batch learned before it writes nothing) and the one tombstone
    event; other users and the shared space are untouched."""
    memories = [mem(f"City C fact {i}", embedding=(1.0, 0.0, 0.0, float(i)))
                for i in range(4)]
    memories.append(mem("Retired City C fact", superseded_at=T0, enabled=False))
    for memory in memories:
        await store.add(memory, audit=event("created", memory_id=memory.id))
    await store.delete("t1", "u1", memories[0].id)
    other = mem("City C fact of u2", user="u2")
    shared = mem("City C shared", user=None, scope="shared")
    await store.add(other, audit=event("created", user="u2"))
    await store.add(shared)
    await store.apply(batch("b-erase", evidence=((memories[1].id, "b1"),),
                            profile=Profile(tenant="t1", user_id="u1", style="terse"),
                            conversation=ConversationRecord(
                                tenant="t1", user_id="u1", conversation_id="c",
                                learned_messages=1, updated_at=T0, summary="talked")))
    await store.bind_names("t1", "u1", ["Alice"])
    await store.bind_names("t1", "u2", ["Alice"])
    await store.put_user_settings("t1", "u1", UserSettings(enable_personal_learning=False))
    before = datetime.now(UTC) - timedelta(seconds=5)

    tombstone = AuditEvent(tenant="t1", user_id="u1", action="erased", actor="user",
                           at=datetime.now(UTC))
    assert await store.erase_user("t1", "u1", audit=tombstone) == 4

    assert await store.list_memories(ListQuery(tenant="t1", user="u1",
                                                include_retired=True)) == []
    assert await store.search(ask("City C fact", embedding=(1.0, 0.0, 0.0, 0.0),
                                  include_shared=False)) == []
    assert await store.get_profile("t1", "u1") is None
    assert await store.get_conversation("t1", "u1", "c") is None
    assert await store.tombstoned("t1", "u1", [normalize(memories[0].content)]) == {}
    assert await store.users_named("t1", "Alice") == ["u2"]
    settings = await store.get_user_settings("t1", "u1")
    assert settings.enable_personal_learning is True  # back to defaults
    assert settings.cleared_at is not None
    assert settings.cleared_at >= before
    assert [e.action for _, e in await store.audit_log("t1", "u1")] == ["erased"]
    tenant_log = [(e.user_id, e.action) for _, e in await store.audit_log("t1", None)]
    assert ("u1", "erased") in tenant_log
    assert [a for u, a in tenant_log if u == "u1"] == ["erased"]
    assert ("u2", "created") in tenant_log
    late = batch("b-late", mem("learned before the erasure"), learned_from=before)
    assert await store.apply(late) is False
    assert {c.memory.id for c in await store.search(ask("City C", user="u2"))} == \
        {other.id, shared.id}
# concurrent learning -----------------------------------------------------------------

async def test_concurrent_merges_of_one_fact_count_every_hit(store: MemoryStore) -> None:
    """Several change sets consolidated from the same stale read (hits 1 → 2 each), applied
    together: every new evidence pair adds one hit; a redelivered pair adds none."""
    stored = mem("Likes sailing", hits=1)
    await store.apply(batch("b0", stored, evidence=((stored.id, "b0"),)))
    merges = [batch(f"b{i}", stored.with_changes(hits=2), evidence=((stored.id, f"b{i}"),))
              for i in range(1, 9)]
    assert all(await asyncio.gather(*(store.apply(m) for m in merges)))
    again = batch("b9", stored.with_changes(hits=2), evidence=((stored.id, "b3"),))
    assert await store.apply(again)
    found = await store.get("t1", "u1", stored.id)
    assert found is not None
    assert found.hits == 9


async def test_a_fact_created_twice_concurrently_is_one_row(store: MemoryStore) -> None:
    """Change sets that each create the same fact (same subject and scope, normalised text
    equal) from a read that saw neither make one active row with every hit; the audit of
    the merged creation names the stored row. Another subject is another fact."""
    creations = [
        batch(f"c{i}", created := mem(text, hits=1), evidence=((created.id, f"c{i}"),),
              audit=(event("created", memory_id=created.id),))
        for i, text in enumerate(["Has a dog named Rex", "has a dog named rex.",
                                  "Has a dog named Rex", "HAS A DOG NAMED REX"])]
    assert all(await asyncio.gather(*(store.apply(c) for c in creations)))
    other = mem("Has a dog named Rex", hits=1, subject="Alice")
    await store.apply(batch("c9", other, evidence=((other.id, "c9"),)))
    rows = await store.list_memories(ListQuery(tenant="t1", user="u1"))
    mine = [m for m in rows if m.subject == "user"]
    assert len(mine) == 1
    assert mine[0].hits == 4
    assert [m.id for m in rows if m.subject == "Alice"] == [other.id]
    logged = {e.memory_id for _, e in await store.audit_log("t1", "u1")}
    assert logged == {mine[0].id}


async def test_a_retired_fact_does_not_absorb_a_new_one(store: MemoryStore) -> None:
    """The uniqueness guard sees active rows only: a fact retired earlier and said again
    is stored as a new row."""
    old = mem("Lives in Lisbon", hits=3)
    await store.add(old)
    newer = mem("Lives in Porto")
    await store.apply(batch("r1", newer, old.with_changes(
        enabled=False, superseded_at=T0, superseded_by=newer.id)))
    again = mem("Lives in Lisbon", minutes=5)
    await store.apply(batch("r2", again, evidence=((again.id, "r2"),)))
    active = {m.content: m.id for m in await store.list_memories(
        ListQuery(tenant="t1", user="u1"))}
    assert active == {"Lives in Porto": newer.id, "Lives in Lisbon": again.id}
# vectors kept consistent with the embedder (memory-proxy reindex) ---------------------

async def walk_stale(store: MemoryStore, model: str, *, limit: int = 2) -> list[Memory]:
    """Every memory a full stale_vectors walk returns, by id (duplicates dropped)."""
    out: dict[str, Memory] = {}
    cursor = ""
    for _ in range(1000):
        page, cursor = await store.stale_vectors(model, limit=limit, cursor=cursor)
        out.update((m.id, m) for m in page)
        if not cursor:
            return list(out.values())
    raise AssertionError("the stale_vectors walk did not end")


async def test_stale_vectors_finds_memories_without_a_vector_of_the_model(
        store: MemoryStore) -> None:
    """A walk over every tenant finds active memories with no vector, another model's
    vector or a vector of no recorded model; current and retired ones are left out."""
    current = mem("current", embedding=(1.0, 0.0, 0.0, 0.0), embedding_model="m2")
    missing = mem("missing")
    other = mem("other model", embedding=(1.0, 0.0, 0.0, 0.0), embedding_model="m1")
    legacy = mem("legacy vector", embedding=(0.0, 1.0, 0.0, 0.0))
    shared = mem("shared fact", user=None, tenant="t2")
    retired = mem("retired", superseded_at=T0, superseded_by="x")
    disabled = mem("disabled", enabled=False)
    for m in (current, missing, other, legacy, shared, retired, disabled):
        await store.add(m)
    found = await walk_stale(store, "m2")
    assert sorted(m.content for m in found) == sorted(
        ["missing", "other model", "legacy vector", "shared fact"])
    assert {m.embedding_model for m in found if m.content == "other model"} == {"m1"}
    assert {m.content for m in await walk_stale(store, "m1", limit=50)} == {
        "current", "missing", "legacy vector", "shared fact"}


async def test_set_vectors_stores_vector_and_model_unless_the_content_changed(
        store: MemoryStore) -> None:
    """set_vectors writes the vector and model id of memories whose content is still the
    embedded text (other fields untouched); a changed or deleted memory is skipped."""
    kept = mem("kept", embedding=(0.0, 0.0, 1.0, 0.0), embedding_model="m1", hits=4)
    changed = mem("before edit")
    gone = mem("deleted soon")
    shared = mem("shared", user=None)
    for m in (kept, changed, gone, shared):
        await store.add(m)
    await store.update(changed.with_changes(content="after edit"))
    await store.delete("t1", "u1", gone.id)
    written = await store.set_vectors([
        VectorUpdate("t1", "u1", kept.id, "kept", (1.0, 0.0, 0.0, 0.0), "m2"),
        VectorUpdate("t1", "u1", changed.id, "before edit", (1.0, 0.0, 0.0, 0.0), "m2"),
        VectorUpdate("t1", "u1", gone.id, "deleted soon", (1.0, 0.0, 0.0, 0.0), "m2"),
        VectorUpdate("t1", None, shared.id, "shared", (0.0, 1.0, 0.0, 0.0), "m2"),
        VectorUpdate("t1", "u2", kept.id, "kept", (0.0, 1.0, 0.0, 0.0), "m2"),  # not theirs
    ])
    assert written == 2
    after = await store.get("t1", "u1", kept.id)
    assert after is not None
    assert after.embedding == pytest.approx((1.0, 0.0, 0.0, 0.0))
    assert (after.embedding_model, after.hits, after.updated_at) == ("m2", 4, kept.updated_at)
    edited = await store.get("t1", "u1", changed.id)
    assert edited is not None
    assert edited.embedding is None
    assert [m.content for m in await walk_stale(store, "m2")] == ["after edit"]
    result = await store.search(SearchQuery(tenant="t1", user="u1", terms=(),
                                            embedding=(0.0, 1.0, 0.0, 0.0),
                                            embedding_model="m2"))
    assert {c.memory.content for c in result} == {"kept", "shared"}


async def test_vector_search_compares_only_vectors_of_the_query_model(
        store: MemoryStore) -> None:
    """With ``embedding_model`` set, vectors of another model are never compared (legacy
    vectors of no recorded model are); without it, every vector of the length is."""
    same = mem("same model", embedding=(1.0, 0.0, 0.0, 0.0), embedding_model="m2")
    other = mem("other model", embedding=(1.0, 0.0, 0.0, 0.0), embedding_model="m1")
    legacy = mem("legacy", embedding=(0.9, 0.1, 0.0, 0.0))
    for m in (same, other, legacy):
        await store.add(m)
    query = SearchQuery(tenant="t1", user="u1", terms=(), embedding=(1.0, 0.0, 0.0, 0.0))
    strict = await store.search(replace(query, embedding_model="m2"))
    assert {c.memory.content for c in strict} == {"same model", "legacy"}
    stored = {c.memory.content: c.memory.embedding_model for c in strict}
    assert stored == {"same model": "m2", "legacy": None}
    assert {c.memory.content for c in await store.search(query)} == {
        "same model", "other model", "legacy"}


async def test_every_search_sees_the_writes_since_the_previous_one(store: MemoryStore) -> None:
    """Searching again after memories were added, edited, disabled, deleted or accessed
    returns the store as it is now, for keyword and vector search alike — whatever a
    backend reused between the two searches."""
    query = ask("Lisbon tram", embedding=(1.0, 0.0, 0.0, 0.0))

    async def state() -> dict[str, tuple[str, int]]:
        return {c.memory.id: (c.memory.content, c.memory.access_count)
                for c in await store.search(query)}

    tram = mem("Rides the Lisbon tram", embedding=(1.0, 0.0, 0.0, 0.0))
    river = mem("Walks by the Lisbon river", embedding=(0.8, 0.6, 0.0, 0.0))
    for m in (tram, river):
        await store.add(m)
    assert await state() == {tram.id: ("Rides the Lisbon tram", 0),
                             river.id: ("Walks by the Lisbon river", 0)}
    assert await state() == await state()  # nothing written: the same answer
    await store.record_access("t1", {tram.id: 2}, T0)
    assert await state() == {tram.id: ("Rides the Lisbon tram", 2),
                             river.id: ("Walks by the Lisbon river", 0)}
    late = mem("Took the Lisbon tram at night", embedding=(0.0, 1.0, 0.0, 0.0))
    await store.add(late)
    await store.update(river.with_changes(content="Walks by the Lisbon river at dawn"))
    assert await state() == {tram.id: ("Rides the Lisbon tram", 2),
                             river.id: ("Walks by the Lisbon river at dawn", 0),
                             late.id: ("Took the Lisbon tram at night", 0)}
    await store.update(tram.with_changes(enabled=False, access_count=2))
    assert await store.delete("t1", "u1", late.id)
    assert await state() == {river.id: ("Walks by the Lisbon river at dawn", 0)}
    await store.add(mem("Rides the Lisbon tram", user="u2", embedding=(1.0, 0.0, 0.0, 0.0)))
    assert await state() == {river.id: ("Walks by the Lisbon river at dawn", 0)}
