"""Group chats: facts go to the participant who stated them, names resolve only when
unique, and private memories never reach a group request (docs/design.md#group-chats)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.memory.inject import BLOCK_START
from proxy.memory.store import ListQuery
from tests.fakes import FakeUpstream, Gateway, make_settings, running_gateway

GROUP = {"X-Memory-Channel": "group", "X-Memory-Group-Id": "hikers"}


@pytest.fixture
async def gw(tmp_path: Path, upstream: FakeUpstream) -> Any:
    settings = make_settings(tmp_path, learning={"enabled": True,
                                                 "batch_messages": {"private": 1, "group": 50}})
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


async def chat(gateway: Gateway, user: str, messages: list[dict[str, Any]],
               headers: dict[str, str] | None = None) -> Any:
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", headers={
            "X-User-Id": user, **(headers or {})}, json={"model": "m", "messages": messages})
    assert response.status_code == 200, response.text
    return response


async def introduce(gateway: Gateway, user: str, name: str) -> None:
    """A participant's own request carries their display name: the gateway learns it."""
    await chat(gateway, user, [{"role": "user", "name": name, "content": "hello everyone"}],
               GROUP)


async def learn_group(gateway: Gateway, user: str = "u-alice") -> None:
    await gateway.res.sink.flush()
    assert gateway.res.worker is not None
    await gateway.res.worker.drain()
    async with gateway.client(headers={"X-User-Id": user, **GROUP}) as client:
        await client.post("/v1/memories/flush")
    await gateway.settle()
    for tenant, owner, conversation in await gateway.res.queue.idle_conversations(  # type: ignore[union-attr]
        idle_before=float("inf")
    ):
        await gateway.res.queue.seal(tenant, owner, conversation, now=0)  # type: ignore[union-attr]
    await gateway.settle()


async def memories_of(gateway: Gateway, user: str) -> list[tuple[str, str, str | None]]:
    found = await gateway.res.store.list_memories(ListQuery(tenant="default", user=user))
    return sorted((m.content, m.subject, m.source_channel) for m in found)


def group_fact(content: str, speaker: str, subject: str = "user") -> dict[str, Any]:
    return {"title": content[:30], "content": content, "category": "domain",
            "subject": subject, "speaker": speaker}


async def test_facts_are_attributed_to_who_said_them(gw: Gateway, upstream: FakeUpstream) -> None:
    """Alice's own statement is hers; what Bob says about Alice is Bob's knowledge about
    Alice, never Alice's own fact."""
    await introduce(gw, "u-alice", "Alice")
    await introduce(gw, "u-bob", "Bob")
    upstream.extract = lambda body: {"memories": [
        group_fact("Climbed Mont Blanc last summer", "Alice"),
        group_fact("Is afraid of heights", "Bob", subject="Alice"),
    ]}
    history = [
        {"role": "user", "name": "Alice", "content": "I climbed Mont Blanc last summer!"},
        {"role": "user", "name": "Bob", "content": "Funny, Alice is afraid of heights."},
    ]
    await chat(gw, "u-bob", history, GROUP)
    await learn_group(gw)
    assert await memories_of(gw, "u-alice") == [
        ("Climbed Mont Blanc last summer", "user", "group:hikers")]
    assert await memories_of(gw, "u-bob") == [
        ("Is afraid of heights", "Alice", "group:hikers")]
    calls = [body for kind, body in upstream.learning_calls if kind == "extract"]
    assert "GROUP chat" in calls[0]["messages"][0]["content"]
    assert "user (Alice): I climbed Mont Blanc" in calls[0]["messages"][1]["content"]


async def test_unknown_and_ambiguous_names_are_skipped(gw: Gateway,
                                                       upstream: FakeUpstream) -> None:
    """A name nobody goes by, or two users go by, attaches nothing to anyone."""
    await introduce(gw, "u-sam-1", "Sam")
    await introduce(gw, "u-sam-2", "Sam")
    await introduce(gw, "u-alice", "Alice")
    upstream.extract = lambda body: {"memories": [
        group_fact("Owns a kayak", "Sam"), group_fact("Runs ultramarathons", "Carol"),
        group_fact("Leads the Sunday hikes", "Alice")]}
    await chat(gw, "u-alice", [
        {"role": "user", "name": "Sam", "content": "I own a kayak."},
        {"role": "user", "name": "Carol", "content": "I run ultramarathons."},
        {"role": "user", "name": "Alice", "content": "I lead the Sunday hikes."}], GROUP)
    await learn_group(gw)
    assert await memories_of(gw, "u-sam-1") == []
    assert await memories_of(gw, "u-sam-2") == []
    assert await memories_of(gw, "u-alice") == [
        ("Leads the Sunday hikes", "user", "group:hikers")]


async def test_private_memories_never_reach_a_group_request(gw: Gateway,
                                                            upstream: FakeUpstream) -> None:
    """What Alice said in private is injected in her private chats, not in the group."""
    upstream.extract = lambda body: {"memories": [{
        "title": "Health", "content": "Has a knee injury", "category": "domain",
        "subject": "user"}]}
    await chat(gw, "u-alice", [{"role": "user", "content": "I have a knee injury."}])
    await gw.settle()
    await chat(gw, "u-alice", [{"role": "user", "content": "knee injury advice?"}])
    assert "Has a knee injury" in str(upstream.last_chat["messages"])
    response = await chat(gw, "u-alice", [
        {"role": "user", "name": "Alice", "content": "knee injury advice?"}], GROUP)
    assert BLOCK_START not in str(upstream.last_chat["messages"])
    assert response.headers["x-memory-injected"] == "0"


async def test_group_history_resent_by_several_participants_is_learned_once(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """Every participant's request resends the group's history: each message reaches the
    learner once."""
    await introduce(gw, "u-alice", "Alice")
    await introduce(gw, "u-bob", "Bob")
    history = [{"role": "user", "name": "Alice", "content": "I bought new boots."}]
    await chat(gw, "u-alice", history, GROUP)
    await chat(gw, "u-bob", [*history, {"role": "user", "name": "Bob",
                                        "content": "Nice boots!"}], GROUP)
    await learn_group(gw)
    prompts = [body["messages"][1]["content"] for kind, body in upstream.learning_calls
               if kind == "score"]
    assert sum(p.count("I bought new boots.") for p in prompts) == 1


async def test_group_chats_update_each_participants_shared_profile(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """The profile is one per user across channels: a group chat updates each resolved
    participant's traits and topics from the answer's ``profiles`` (by speaker name);
    an entry for a name nobody goes by changes nobody's profile."""
    await introduce(gw, "u-alice", "Alice")
    await introduce(gw, "u-bob", "Bob")
    before_bob = await gw.res.store.get_profile("default", "u-bob")
    upstream.extract = lambda body: {"memories": [group_fact("Leads the Sunday hikes", "Alice")],
                                     "profiles": [
        {"speaker": "Alice", "style": "short, upbeat", "traits": ["话少"],
         "topics": ["hiking"]},
        {"speaker": "Carol", "traits": ["talkative"]},
    ]}
    await chat(gw, "u-bob", [
        {"role": "user", "name": "Alice", "content": "I lead the Sunday hikes."},
        {"role": "user", "name": "Bob", "content": "Nice."}], GROUP)
    await learn_group(gw)
    alice = await gw.res.store.get_profile("default", "u-alice")
    assert alice is not None
    assert [t.text for t in alice.traits] == ["话少"]
    assert [t.text for t in alice.topics] == ["hiking"]
    assert alice.style == "short, upbeat"
    bob = await gw.res.store.get_profile("default", "u-bob")
    assert bob is not None
    assert bob.traits == (before_bob.traits if before_bob else ())
    extract = next(body for kind, body in upstream.learning_calls if kind == "extract")
    assert '"profiles"' in extract["messages"][0]["content"]
