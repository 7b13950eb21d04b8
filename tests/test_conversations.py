"""Chats the client does not name stay apart: two chats that open with the same greeting
(and get the same reply) get their own conversation ids once they diverge, each chat keeps
its id turn after turn, and learning never mixes their transcripts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.conversations import ConversationChains
from proxy.identity import Identity, derive_conversation_id
from tests.fakes import FakeUpstream, make_settings, running_gateway

GREETING = {"role": "user", "content": "Hi!"}
REPLY = {"role": "assistant", "content": "Hello there!"}  # the fake upstream's reply


async def turn(gateway: Any, messages: list[dict[str, Any]]) -> str:
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", headers={"X-User-Id": "u1"},
                                     json={"model": "m", "messages": messages})
    assert response.status_code == 200, response.text
    return str(response.headers["x-memory-conversation-id"])


async def test_chats_sharing_an_opening_get_their_own_ids_and_transcripts(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """Chat A and chat B both open with "Hi!" (and get the same reply), then diverge: from
    the second turn on they have different ids, each keeps its own, and each learning
    batch holds one chat's lines only."""
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 50})
    async with running_gateway(settings, upstream) as gateway:
        opening_a = await turn(gateway, [GREETING])
        opening_b = await turn(gateway, [GREETING])
        assert opening_a == opening_b  # nothing tells the two first requests apart
        a1 = [GREETING, REPLY, {"role": "user", "content": "I am planning a trip to Oslo."}]
        b1 = [GREETING, REPLY, {"role": "user", "content": "My cat Miso is sick."}]
        id_a = await turn(gateway, a1)
        id_b = await turn(gateway, b1)
        assert id_a != id_b
        assert id_a == opening_a  # the first continuation keeps the opening's id
        assert await turn(gateway, a1) == id_a  # a retry stays
        a2 = [*a1, REPLY, {"role": "user", "content": "I want to see the fjords."}]
        b2 = [*b1, REPLY, {"role": "user", "content": "Miso will not eat her food."}]
        assert await turn(gateway, a2) == id_a
        assert await turn(gateway, b2) == id_b
        await gateway.flush_conversations()
    transcripts = [body["messages"][1]["content"] for kind, body in upstream.learning_calls
                   if kind == "score"]
    assert len(transcripts) == 2
    for text in transcripts:
        trip, cat = "Oslo" in text or "fjords" in text, "Miso" in text
        assert trip != cat


def _identity(**extra: Any) -> Identity:
    return Identity(tenant="t", user="u1", conversation="", derived=True, **extra)


def test_a_first_request_keeps_the_earlier_rules_id() -> None:
    """A chat's first request gets the id the gateway derived before chains existed, so
    conversations buffered under those ids carry on."""
    chains = ConversationChains()
    messages = [{"role": "system", "content": "Today is Monday."}, GREETING]
    assert chains.resolve(_identity(), messages) == derive_conversation_id(
        tenant="t", user="u1", channel="private", group=None, messages=messages)


def test_an_unrecorded_history_gets_an_id_of_its_own() -> None:
    """A long history no node records (a restart, another process) gets an id from its
    whole history — stable across its retries, different from the opening's."""
    chains = ConversationChains()
    history = [GREETING, REPLY, {"role": "user", "content": "Still there?"}]
    first = chains.resolve(_identity(), history)
    assert first == chains.resolve(_identity(), history)
    assert first != chains.resolve(_identity(), [GREETING])
    assert first.startswith("conv_")


def test_recorded_requests_are_bounded() -> None:
    """The map keeps at most max_nodes requests; a chat whose node went is split (a new
    id), never merged into another."""
    chains = ConversationChains(max_nodes=2)
    firsts = [chains.resolve(_identity(), [{"role": "user", "content": f"chat {n}"}])
              for n in range(3)]

    def later(n: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"chat {n}"}, {"role": "assistant",
                                                           "content": "ok"},
                {"role": "user", "content": "more"}]

    assert chains.resolve(_identity(), later(2)) == firsts[2]
    assert chains.resolve(_identity(), later(0)) != firsts[0]


def test_replies_the_client_resends_differently_do_not_split_a_chat() -> None:
    """The chain runs over user messages only: a client that stores the assistant's reply
    in its own way (trimmed, re-rendered) keeps one conversation."""
    chains = ConversationChains()
    first = chains.resolve(_identity(), [GREETING])
    second = chains.resolve(_identity(), [GREETING, {"role": "assistant", "content": "ok"},
                                          {"role": "user", "content": "one"}])
    third = chains.resolve(_identity(), [GREETING, {"role": "assistant", "content": "OK!"},
                                         {"role": "user", "content": "one"},
                                         {"role": "assistant", "content": "fine"},
                                         {"role": "user", "content": "two"}])
    assert first == second == third
