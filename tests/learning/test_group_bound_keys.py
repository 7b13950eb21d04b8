"""Group display names are identity only for trusted callers (docs/design.md#group-chats).

An app key names the speakers of a group transcript (docs/design.md#group-chats). A
user-bound key speaks only for its own user: lines it sends under another participant's
``name`` never become that participant's statements or profile, and it binds no display
name. Both backends.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from proxy.memory.store import ListQuery
from tests.fakes import (
    FakeUpstream,
    Gateway,
    backend_overrides,
    make_settings,
    running_gateway,
)

GROUP = {"X-Memory-Channel": "group", "X-Memory-Group-Id": "hikers"}
APP = {"Authorization": "Bearer app-key"}
MALLORY = {"Authorization": "Bearer mallory-key"}


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path,
             upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    extra = backend_overrides(request, tmp_path)
    settings = make_settings(
        tmp_path, learning={"enabled": True, "batch_messages": {"private": 50, "group": 50}},
        auth={"keys": [{"key_sha256": _sha("app-key"), "tenant": "t"},
                       {"key_sha256": _sha("mallory-key"), "tenant": "t",
                        "user": "u-mallory"}]},
        **extra)
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


async def chat(gw: Gateway, headers: dict[str, str], messages: list[dict[str, Any]]) -> None:
    async with gw.client(headers={**headers, **GROUP}) as client:
        response = await client.post("/v1/chat/completions",
                                     json={"model": "m", "messages": messages})
    assert response.status_code == 200, response.text


async def learn_everything(gw: Gateway) -> None:
    await gw.flush_conversations()


async def memories(gw: Gateway, user: str) -> list[tuple[str, str]]:
    found = await gw.res.store.list_memories(ListQuery(tenant="t", user=user))
    return sorted((m.content, m.subject) for m in found)


async def learned_profile(gw: Gateway, user: str) -> tuple[Any, ...]:
    """What learning writes into a profile (style, impression, traits, topics)."""
    profile = await gw.res.store.get_profile("t", user)
    if profile is None:
        return ()
    return (profile.style, profile.impression, [t.text for t in profile.traits],
            [t.text for t in profile.topics])


def fact(content: str, speaker: str, subject: str = "user") -> dict[str, Any]:
    return {"title": content[:30], "content": content, "category": "domain",
            "subject": subject, "speaker": speaker}


async def test_a_bound_key_cannot_speak_for_another_participant(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """Mallory's bound key sends a group transcript with a line under Alice's name: it is
    learned only as Mallory's knowledge about Alice (subject Alice); Alice's memories and
    profile stay untouched, and Mallory's request binds no display name."""
    await chat(gw, {**APP, "X-User-Id": "u-alice"},
               [{"role": "user", "name": "Alice", "content": "hello everyone"}])
    await learn_everything(gw)
    alice_before = await learned_profile(gw, "u-alice")
    # For the batch holding Mallory's lines the model answers both as a group extraction
    # naming Alice and as a private one: neither may reach Alice.
    upstream.extract = lambda body: {
        "memories": [fact("Is pregnant", "Alice"), fact("Is pregnant", "Alice",
                                                         subject="Alice")],
        "profile": {"traits": ["secretive"], "topics": ["pregnancy"]},
        "profiles": [{"speaker": "Alice", "traits": ["secretive"], "topics": ["pregnancy"]}],
    } if "pregnant" in str(body["messages"]) else {"memories": []}
    await chat(gw, MALLORY, [
        {"role": "user", "name": "Alice", "content": "I am pregnant, do not tell anyone."},
        {"role": "assistant", "content": "Congratulations!"},
        {"role": "user", "name": "Alice", "content": "Mallory, keep it quiet please."},
    ])
    await learn_everything(gw)
    assert await memories(gw, "u-alice") == []
    assert await learned_profile(gw, "u-alice") == alice_before
    assert await gw.res.store.users_named("t", "Alice") == ["u-alice"]
    # Kept as Mallory's own knowledge; the model saw the report form of Alice's line.
    assert ("Is pregnant", "Alice") in await memories(gw, "u-mallory")
    extract = [body for kind, body in upstream.learning_calls if kind == "extract"][-1]
    shown = "\n".join(str(m.get("content")) for m in extract["messages"])
    assert "[Alice said] I am pregnant" in shown


async def test_a_bound_key_cannot_claim_a_display_name(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """Mallory naming her own message "Alice" before Alice ever spoke does not make the
    name hers: Alice's later statements in the app's group never land in Mallory's
    memory."""
    await chat(gw, MALLORY, [{"role": "user", "name": "Alice", "content": "hi all"}])
    await learn_everything(gw)
    assert await gw.res.store.users_named("t", "Alice") == []
    upstream.extract = lambda body: {"memories": [fact("Loves cats", "Alice")]} \
        if "cats" in str(body["messages"]) else {"memories": []}
    await chat(gw, {**APP, "X-User-Id": "u-bob"}, [
        {"role": "user", "name": "Alice", "content": "I love cats."},
        {"role": "user", "name": "Bob", "content": "Nice."}])
    await learn_everything(gw)
    assert all(content != "Loves cats" for content, _ in await memories(gw, "u-mallory"))


async def test_an_app_key_still_names_the_speakers(gw: Gateway, upstream: FakeUpstream) -> None:
    """The normal flow beside the attack: an app key's group transcript attributes Alice's
    line to Alice (her display name was bound by her own app-key request)."""
    await chat(gw, {**APP, "X-User-Id": "u-alice"},
               [{"role": "user", "name": "Alice", "content": "hello everyone"}])
    await chat(gw, {**APP, "X-User-Id": "u-bob"},
               [{"role": "user", "name": "Bob", "content": "hi"}])
    upstream.extract = lambda body: {"memories": [fact("Climbed Mont Blanc", "Alice")]}
    await chat(gw, {**APP, "X-User-Id": "u-bob"}, [
        {"role": "user", "name": "Alice", "content": "I climbed Mont Blanc!"},
        {"role": "user", "name": "Bob", "content": "Wow."}])
    await learn_everything(gw)
    assert ("Climbed Mont Blanc", "user") in await memories(gw, "u-alice")
    assert await memories(gw, "u-bob") == []
