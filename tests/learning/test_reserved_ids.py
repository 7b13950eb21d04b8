"""No end user can be called like one of the gateway's own namespaces, and group vs private
is decided by the channel recorded with a turn, never by a user id's spelling. Both
backends.

A user id starting with ``group:`` (a group chat's learning namespace) or the id
``__global__`` (the system memory namespace) is refused from every source: a header, the
body ``user``, ``metadata.user_id``, ``safety_identifier`` (400), a JWT (401) and a key
binding (a configuration error). A private turn buffered under such an id — as an earlier
version let a caller do — is learned as private: its display names never reach the users
they name.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from proxy.app import _report_reserved_users
from proxy.learning.exchange import Exchange, TranscriptMessage
from proxy.memory.store import ListQuery, ScanQuery
from proxy.settings import AuthSettings, reserved_user_id
from tests.fakes import FakeUpstream, Gateway, backend_overrides, make_settings, running_gateway

SECRET = "jwt-secret-for-tests-0123456789abcdef"
GROUP = {"X-Memory-Channel": "group", "X-Memory-Group-Id": "hikers"}
APP = {"Authorization": "Bearer app-key"}
# Bound keys whose ids look like a namespace but are not one (case, full-width colon,
# a space): ordinary users.
LOOKALIKES = ("Group:g1", "group：g1", "group g1", "__global", "groupie")
RESERVED = ("group:g1", "group:", "group:hikers", "__global__")


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def token(sub: str) -> dict[str, str]:
    body = {"iss": "https://id.example", "aud": "memory-proxy", "sub": sub, "tenant": "t",
            "exp": int(time.time()) + 600}
    return {"Authorization": f"Bearer {jwt.encode(body, SECRET)}"}


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path, upstream: FakeUpstream,
             monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("JWT_SECRET", SECRET)
    keys = [{"key_sha256": _sha("app-key"), "tenant": "t"}] + [
        {"key_sha256": _sha(f"bound-{i}"), "tenant": "t", "user": user}
        for i, user in enumerate(LOOKALIKES)]
    settings_ = make_settings(
        tmp_path, learning={"enabled": True, "batch_messages": {"private": 50, "group": 50}},
        auth={"keys": keys, "jwt": {"issuer": "https://id.example", "audience": "memory-proxy",
                                    "hs256_secret": "os.environ/JWT_SECRET", "tenants": ["t"]}},
        **backend_overrides(request, tmp_path))
    async with running_gateway(settings_, upstream) as gateway:
        yield gateway


def fact(content: str, speaker: str, subject: str = "user") -> dict[str, Any]:
    return {"title": content[:30], "content": content, "category": "domain",
            "subject": subject, "speaker": speaker}


async def post_chat(gw: Gateway, headers: dict[str, str], messages: list[dict[str, Any]],
                    **body: Any) -> Any:
    async with gw.client(headers=headers) as client:
        return await client.post("/v1/chat/completions",
                                 json={"model": "m", "messages": messages, **body})


async def owners_of_memories(gw: Gateway) -> dict[str, int]:
    found = await gw.res.store.scan(ScanQuery(tenant="t", limit=10_000))
    counts: dict[str, int] = {}
    for m in found:
        counts[m.user_id or ""] = counts.get(m.user_id or "", 0) + 1
    return counts


async def bind_carol(gw: Gateway) -> None:
    """Carol says hello in the app's group chat: the name Carol is hers."""
    response = await post_chat(gw, {**APP, **GROUP, "X-User-Id": "u-carol"},
                               [{"role": "user", "name": "Carol", "content": "hello all"}])
    assert response.status_code == 200, response.text
    await gw.flush_conversations()
    assert await gw.res.store.users_named("t", "Carol") == ["u-carol"]


@pytest.mark.parametrize("reserved", RESERVED)
async def test_reserved_ids_are_refused_from_every_request_source(
        gw: Gateway, reserved: str) -> None:
    """Header, body ``user``, ``metadata.user_id`` and ``safety_identifier``: 400 naming
    the source; a JWT: 401; nothing is learned."""
    hi = [{"role": "user", "content": "hi"}]
    for headers, body, param in (
            ({**APP, "X-User-Id": reserved}, {}, "X-User-Id"),
            (APP, {"user": reserved}, "user"),
            (APP, {"metadata": {"user_id": reserved}}, "metadata.user_id"),
            (APP, {"safety_identifier": reserved}, "safety_identifier")):
        response = await post_chat(gw, headers, hi, **body)
        assert response.status_code == 400, (param, response.text)
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param)
        assert "reserved" in error["message"]
    async with gw.client(headers={**APP, "X-User-Id": reserved}) as client:
        assert (await client.get("/v1/memories")).status_code == 400
    async with gw.client(headers=token(reserved)) as client:
        refused = await client.get("/v1/memories")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_token"
    assert (await post_chat(gw, token(reserved), hi)).status_code == 401
    await gw.flush_conversations()
    assert await owners_of_memories(gw) == {}


@pytest.mark.parametrize("where", ["keys", "admin_keys"])
@pytest.mark.parametrize("reserved", RESERVED)
def test_a_key_bound_to_a_reserved_id_is_a_configuration_error(where: str,
                                                               reserved: str) -> None:
    with pytest.raises(ValueError, match=rf"auth\.{where}\.0\.user: .*reserved"):
        AuthSettings.model_validate({where: [{"key_sha256": _sha("k"), "tenant": "t",
                                              "user": reserved}]})
    for lookalike in LOOKALIKES:
        AuthSettings.model_validate({where: [{"key_sha256": _sha("k"), "tenant": "t",
                                              "user": lookalike}]})


async def test_a_private_turn_under_a_group_like_id_stays_private(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """The probe, below the (now closed) identity layer: a private turn buffered under the
    user id ``group:hikers`` — the group's own namespace — whose lines carry Carol's name is
    learned as private; nothing reaches Carol, whose name is bound."""
    await bind_carol(gw)
    upstream.extract = lambda body: {
        "memories": [fact("Owes money to the mafia", "Carol")],
        "profiles": [{"speaker": "Carol", "traits": ["indebted"], "topics": ["debt"]}],
    } if "mafia" in str(body["messages"]) else {"memories": []}
    assert gw.res.queue is not None
    lines = ("I owe money to the mafia.", "Please keep it secret.")
    exchange = Exchange(
        id="x1", tenant="t", user="group:hikers", conversation="c-probe", channel="private",
        group=None, model="m", at=time.time(),
        messages=tuple(TranscriptMessage(role="user", text=text, fingerprint=f"fp{i}",
                                         name="Carol", new=True)
                       for i, text in enumerate(lines)))
    await gw.res.queue.buffer(exchange, batch_size=50, now=time.time())
    await gw.flush_conversations()
    assert await gw.res.store.list_memories(ListQuery(tenant="t", user="u-carol")) == []
    profile = await gw.res.store.get_profile("t", "u-carol")
    assert profile is None or not profile.traits


async def test_an_app_key_flushes_a_group_by_its_channel(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """``POST /v1/memories/flush`` with the group channel headers seals the group's buffer
    (202) and its lines are learned for their speaker; a user-bound key or JWT is 403."""
    await bind_carol(gw)
    upstream.extract = lambda body: {"memories": [fact("Climbed Mont Blanc", "Carol")]} \
        if "Mont Blanc" in str(body["messages"]) else {"memories": []}
    response = await post_chat(gw, {**APP, **GROUP, "X-User-Id": "u-bob"}, [
        {"role": "user", "name": "Carol", "content": "I climbed Mont Blanc!"},
        {"role": "user", "name": "Bob", "content": "Wow."}])
    assert response.status_code == 200
    await gw.res.sink.flush()
    assert gw.res.worker is not None
    await gw.res.worker.drain()
    assert await gw.res.store.list_memories(ListQuery(tenant="t", user="u-carol")) == []
    for refused in ({"Authorization": "Bearer bound-0"}, token("u-dave")):
        async with gw.client(headers={**refused, **GROUP}) as client:
            answer = await client.post("/v1/memories/flush")
        assert answer.status_code == 403, answer.text
    async with gw.client(headers={**APP, **GROUP}) as client:
        flushed = await client.post("/v1/memories/flush")
    assert flushed.status_code == 202, flushed.text
    await gw.res.worker.drain()
    learned = await gw.res.store.list_memories(ListQuery(tenant="t", user="u-carol"))
    assert [m.content for m in learned] == ["Climbed Mont Blanc"]


async def test_users_stored_under_a_reserved_id_are_reported_at_startup(gw: Gateway) -> None:
    """A user an earlier version knew under a reserved id is named in a warning; their
    data is not touched."""
    from datetime import UTC, datetime

    await gw.res.ledger.register_user("t", "group:legacy", datetime.now(UTC))
    await gw.res.ledger.register_user("t", "__global__", datetime.now(UTC))
    await gw.res.ledger.register_user("t", "groupie", datetime.now(UTC))
    with capture_logs() as logs:
        await _report_reserved_users(gw.res)
    warned = [e for e in logs if e["event"] == "reserved_user_ids"]
    assert [(e["tenant"], sorted(e["users"])) for e in warned] == \
        [("t", ["__global__", "group:legacy"])]
    assert {u.user for u in await gw.res.ledger.users("t")} >= {"group:legacy", "__global__"}


CALLERS = st.one_of(
    st.sampled_from([("key", i) for i in range(len(LOOKALIKES))]),
    st.tuples(st.just("jwt"), st.one_of(
        st.sampled_from((*RESERVED, "group:u-carol", "u-carol ", "Carol")),
        st.text(st.characters(blacklist_categories=("Cs", "Cc", "Z")), min_size=1,
                max_size=12))))
NAMES = st.lists(st.one_of(st.sampled_from(["Carol", "carol", "CAROL", "Bob"]),
                           st.text(st.characters(blacklist_categories=("Cs", "Cc")),
                                   min_size=1, max_size=8)), min_size=1, max_size=3)


@settings(max_examples=16, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(caller=CALLERS, names=NAMES, grouped=st.booleans())
async def test_no_caller_writes_outside_its_own_memory(
        gw: Gateway, upstream: FakeUpstream, caller: tuple[str, Any], names: list[str],
        grouped: bool) -> None:
    """Bound keys and JWT users with arbitrary ids send private or group chats whose lines
    carry arbitrary display names (Carol's among them); the model names every one of them
    as a speaker. Every memory written afterwards is the caller's own."""
    if await gw.res.store.users_named("t", "Carol") == []:
        await bind_carol(gw)
    kind, which = caller
    user = LOOKALIKES[which] if kind == "key" else which
    headers = {"Authorization": f"Bearer bound-{which}"} if kind == "key" else token(user)
    if grouped:
        headers = {**headers, **GROUP}
    upstream.extract = lambda body: {
        "memories": [fact(f"Has a secret number {i}", n) for i, n in enumerate(names)],
        "profiles": [{"speaker": n, "traits": ["secretive"], "topics": []} for n in names]}
    before = await owners_of_memories(gw)
    response = await post_chat(gw, headers, [
        {"role": "user", "name": n, "content": f"My secret number is {i}."}
        for i, n in enumerate(names)])
    expected = 401 if reserved_user_id(user) else 200
    assert response.status_code == expected, response.text
    await gw.flush_conversations()
    after = await owners_of_memories(gw)
    grown = {owner for owner, count in after.items() if count > before.get(owner, 0)}
    assert grown <= {user}, (user, names, grouped, grown)
    assert after.get("u-carol", 0) == before.get("u-carol", 0)
