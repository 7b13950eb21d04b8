"""Property: whatever tenants, users, keys, group names and operations a client mixes, no
write or read crosses a (tenant, user) namespace — through any memory route, the admin
audit log, the memory block injected into chat, or a reply's injection record. Both
backends.

Each example starts a fresh gateway with two tenants; each has an app key (names any user
with ``X-User-Id``), two user-bound keys and an admin key. A random sequence of operations
— create, list, search, get, delete, clear, chat in a private or a group channel, open a
conflict (a learned contradiction, written as learning writes it), list, confirm or
reverse conflicts, the admin's conflict list, the profile history, read an injection
record — is sent with random keys and random (possibly foreign) user headers and ids, and
checked after every step against a model of who owns which memory and conflict.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.memory.conflicts import Conflict, mark_pair
from proxy.memory.records import Memory, new_id
from proxy.memory.store import ChangeSet, ListQuery
from tests.fakes import FakeUpstream, make_settings, redis_storage, running_gateway
from tests.redis_server import purge_prefix

TENANTS = ("t0", "t1")
USERS = ("u0", "u1", "u2")
BOUND = ("u0", "u1")  # each tenant has a key bound to each of these users
GROUPS = ("g0", "g1")
MARKER = re.compile(r"zq[0-9]+x")
EXAMPLES = 10
INJECTED = [0]  # own memories seen injected (the injection check is not vacuous)
OPENED = [0]  # conflicts opened (the conflict checks are not vacuous)


def _key(name: str) -> str:
    return f"key-{name}"


def _digest(name: str) -> str:
    return hashlib.sha256(_key(name).encode()).hexdigest()


def gateway_settings(tmp_path: Path, storage: dict[str, Any] | None) -> Any:
    keys: list[dict[str, Any]] = []
    admins: list[dict[str, Any]] = []
    for tenant in TENANTS:
        keys.append({"key_sha256": _digest(f"{tenant}-app"), "tenant": tenant})
        keys += [{"key_sha256": _digest(f"{tenant}-{u}"), "tenant": tenant, "user": u}
                 for u in BOUND]
        admins.append({"key_sha256": _digest(f"{tenant}-admin"), "tenant": tenant})
    extra: dict[str, Any] = {"storage": storage} if storage else {}
    return make_settings(tmp_path, auth={"keys": keys, "admin_keys": admins}, **extra)


# One caller: (tenant, key kind, the user header sent). The identity it acts as is the bound
# user for a bound key, else the header.
callers = st.tuples(st.sampled_from(TENANTS), st.sampled_from(("app", *BOUND)),
                    st.sampled_from(USERS))
operations = st.lists(st.one_of(
    st.tuples(st.just("create"), callers),
    st.tuples(st.just("list"), callers),
    st.tuples(st.just("search"), callers, st.integers(0, 30)),
    st.tuples(st.just("get"), callers, st.integers(0, 30)),
    st.tuples(st.just("delete"), callers, st.integers(0, 30)),
    st.tuples(st.just("clear"), callers),
    st.tuples(st.just("chat"), callers, st.integers(0, 30),
              st.sampled_from((None, None, *GROUPS))),
    st.tuples(st.just("audit"), st.sampled_from(TENANTS), st.sampled_from(USERS)),
    st.tuples(st.just("contest"), callers),
    st.tuples(st.just("conflicts"), callers),
    st.tuples(st.just("settle"), callers, st.integers(0, 30), st.booleans()),
    st.tuples(st.just("admin_conflicts"), st.sampled_from(TENANTS), st.sampled_from(USERS)),
    st.tuples(st.just("history"), callers),
    st.tuples(st.just("injection"), callers, st.integers(0, 30)),
), min_size=4, max_size=14)


async def open_conflict(gw: Any, me: tuple[str, str], old_id: str, marker: str) -> str:
    """A contradicts conflict between the caller's memory ``old_id`` and a new memory
    holding ``marker``, applied as learning applies it; returns the conflict id."""
    tenant, user = me
    old = await gw.res.store.get(tenant, user, old_id)
    new = Memory(id=new_id(), tenant=tenant, user_id=user, content=f"Likes {marker} less")
    old_marked, new_marked = mark_pair(old, new)
    conflict = Conflict(id=new_id(), tenant=tenant, user_id=user, kind="contradicts",
                        status="open", retired_id=old.id, successor_id=new.id,
                        reason="test", created_at=datetime.now(UTC))
    assert await gw.res.store.apply(ChangeSet(
        tenant=tenant, user_id=user, batch_key=f"contest:{conflict.id}",
        upserts=(old_marked, new_marked), conflicts=(conflict,)))
    return conflict.id


async def conflict_step(client: Any, gw: Any, op: tuple[Any, ...], *,
                        headers: dict[str, str], me: tuple[str, str],
                        state: dict[str, Any]) -> bool:
    """One conflict or history operation checked against the model in ``state``
    (``owners``: marker → owner, ``ids``: marker → memory id, ``conflicts``: conflict id
    → owner); ``False`` when it had nothing to do."""
    owners, ids, conflicts = state["owners"], state["ids"], state["conflicts"]
    mine = {m for m, o in owners.items() if o == me}
    kind = op[0]
    if kind == "contest":
        if not mine:  # a memory of the caller's to contradict, as the API writes one
            first = f"zq{state['made']}x"
            state["made"] += 1
            added = await client.post("/v1/memories", headers=headers,
                                      json={"content": f"Likes {first} a lot"})
            assert added.status_code == 201
            owners[first], ids[first] = me, added.json()["id"]
            mine = {first}
        marker = f"zq{state['made']}x"
        state["made"] += 1
        conflicts[await open_conflict(gw, me, ids[min(mine)], marker)] = me
        OPENED[0] += 1
        owners[marker] = me
        ids[marker] = next(m.id for m in await gw.res.store.list_memories(
            ListQuery(tenant=me[0], user=me[1])) if marker in m.content)
        return True
    if kind in ("conflicts", "history"):
        path = "/v1/memories/conflicts" if kind == "conflicts" else "/v1/profile/history"
        response = await client.get(path, headers=headers, params={"status": "all"})
        assert response.status_code == 200
        assert set(MARKER.findall(response.text)) <= mine
        if kind == "conflicts":
            listed = {c["id"] for c in response.json()["data"]}
            assert listed <= {c for c, o in conflicts.items() if o == me}
        return True
    if kind == "settle" and conflicts:
        target = sorted(conflicts)[op[2] % len(conflicts)]
        verb = "reverse" if op[3] else "confirm"
        response = await client.post(f"/v1/memories/conflicts/{target}/{verb}",
                                     headers=headers)
        if conflicts[target] != me:
            assert response.status_code == 404, (me, conflicts[target])
        else:
            assert response.status_code in (200, 404, 409), response.text
            assert set(MARKER.findall(response.text)) <= mine
        return True
    return False


async def admin_conflicts_step(client: Any, op: tuple[Any, ...],
                               state: dict[str, Any]) -> None:
    """The admin's list of one user's conflicts holds only that user's pairs."""
    tenant, user = op[1], op[2]
    response = await client.get("/v1/admin/conflicts", params={"user": user, "status": "all"},
                                headers={"Authorization": f"Bearer {_key(tenant + '-admin')}"})
    assert response.status_code == 200
    owned = {m for m, o in state["owners"].items() if o == (tenant, user)}
    assert set(MARKER.findall(response.text)) <= owned
    assert all(c["user_id"] == user and state["conflicts"].get(c["id"]) == (tenant, user)
               for c in response.json()["data"])


async def run_scenario(tmp_path: Path, storage: dict[str, Any] | None,
                       ops: list[tuple[Any, ...]]) -> int:
    """Run ``ops``; assert after each; return how many requests were checked."""
    upstream = FakeUpstream()
    owners: dict[str, tuple[str, str]] = {}  # marker → (tenant, user)
    ids: dict[str, str] = {}  # marker → memory id
    # injection record id → (its owner, the ids of the owner's memories at the time)
    records: dict[str, tuple[tuple[str, str], set[str]]] = {}
    made = 0
    checked = 0
    async with running_gateway(gateway_settings(tmp_path, storage), upstream) as gw, \
            gw.client() as client:
        state: dict[str, Any] = {"owners": owners, "ids": ids, "conflicts": {}, "made": 0}
        for op in ops:
            kind = op[0]
            state["made"] = max(state["made"], made)
            if kind == "admin_conflicts":
                await admin_conflicts_step(client, op, state)
                checked += 1
                continue
            if kind == "audit":
                tenant, user = op[1], op[2]
                response = await client.get("/v1/admin/audit", params={"user": user},
                                            headers={"Authorization":
                                                     f"Bearer {_key(tenant + '-admin')}"})
                assert response.status_code == 200
                for event in response.json()["data"]:
                    assert event["user_id"] == user
                    found = [m for m, i in ids.items() if i == event["memory_id"]]
                    assert all(owners[m] == (tenant, user) for m in found)
                checked += 1
                continue
            tenant, key_kind, header_user = op[1]
            me = (tenant, header_user if key_kind == "app" else key_kind)
            headers = {"Authorization": f"Bearer {_key(f'{tenant}-{key_kind}')}",
                       "X-User-Id": header_user}
            if kind in ("contest", "conflicts", "settle", "history"):
                checked += await conflict_step(client, gw, op, headers=headers, me=me,
                                               state=state)
                made = max(made, state["made"])
                continue
            mine = {m for m, o in owners.items() if o == me}
            markers = sorted(owners)
            pick = markers[op[2] % len(markers)] if len(op) > 2 and markers \
                and isinstance(op[2], int) else None
            if kind == "create":
                marker = f"zq{made}x"
                made += 1
                response = await client.post("/v1/memories", headers=headers,
                                             json={"content": f"Likes {marker} a lot"})
                assert response.status_code == 201, response.text
                owners[marker], ids[marker] = me, response.json()["id"]
            elif kind in ("list", "search"):
                params = {"q": pick} if kind == "search" and pick else {}
                response = await client.get("/v1/memories", headers=headers, params=params)
                assert response.status_code == 200
                seen = set(MARKER.findall(response.text))
                assert seen <= mine, (me, seen - mine)
                if kind == "list":
                    assert seen == mine
            elif kind in ("get", "delete") and pick:
                target = ids[pick]
                method = client.get if kind == "get" else client.delete
                response = await method(f"/v1/memories/{target}", headers=headers)
                expected = 200 if owners[pick] == me else 404
                assert response.status_code == expected, (me, owners[pick])
                if kind == "delete" and expected == 200:
                    del owners[pick], ids[pick]
            elif kind == "clear":
                response = await client.delete("/v1/memories", headers=headers,
                                               params={"confirm": "true"})
                assert response.status_code == 200
                assert response.json()["deleted"] == len(mine)
                for marker in mine:
                    del owners[marker], ids[marker]
            elif kind == "chat":
                group = op[3]
                chat_headers = {**headers, **({"X-Memory-Channel": "group",
                                               "X-Memory-Group-Id": group} if group else {})}
                question = f"What about {' '.join(markers[:6])} {pick}?"
                response = await client.post("/v1/chat/completions", headers=chat_headers,
                                             json={"model": "m", "messages": [
                                                 {"role": "user", "content": question}]})
                assert response.status_code == 200
                # Everything sent upstream but the client's own question: the memory block.
                sent = "\n".join(str(m.get("content")) for m in upstream.last_chat["messages"])
                sent = sent.replace(question, "")
                injected = set(MARKER.findall(sent))
                # Manual memories are private-channel knowledge: a group gets none.
                assert injected <= (set() if group else mine), (me, group, injected)
                INJECTED[0] += len(injected)
                record = response.headers.get("x-memory-injection-id")
                if record:
                    records[record] = (me, {ids[m] for m in mine})
            elif kind == "injection" and records:
                record = sorted(records)[op[2] % len(records)]
                await gw.res.memory.injections.flush(gw.res.store, gw.res.clock())
                response = await client.get(f"/v1/memories/injections/{record}",
                                            headers=headers)
                owner_of, owned = records[record]
                assert response.status_code == (200 if owner_of == me else 404), \
                    (me, owner_of)
                if response.status_code == 200:
                    shown = {i["memory_id"] for i in response.json()["items"]
                             if i["kind"] == "memory"}
                    assert shown <= owned, (me, shown - owned)
            else:
                continue
            checked += 1
        # Finally every owner asks about everyone's memories in a private chat.
        for owner in sorted(set(owners.values())):
            tenant, user = owner
            question = f"What about {' '.join(sorted(owners))}?"
            response = await client.post(
                "/v1/chat/completions", json={"model": "m", "messages": [
                    {"role": "user", "content": question}]},
                headers={"Authorization": f"Bearer {_key(tenant + '-app')}", "X-User-Id": user})
            assert response.status_code == 200
            sent = "\n".join(str(m.get("content")) for m in upstream.last_chat["messages"])
            injected = set(MARKER.findall(sent.replace(question, "")))
            assert injected <= {m for m, o in owners.items() if o == owner}, (owner, injected)
            INJECTED[0] += len(injected)
            checked += 1
    return checked


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_no_operation_crosses_a_namespace(backend: str, tmp_path_factory: pytest.TempPathFactory,
                                          request: pytest.FixtureRequest) -> None:
    """Random tenants, users, keys, groups and operations: every read shows only the
    caller's own memories, every write lands only in the caller's namespace, and every
    injected block holds only the caller's memories."""
    totals = {"requests": 0, "examples": 0}
    INJECTED[0] = OPENED[0] = 0

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(ops=operations)
    def scenario(ops: list[tuple[Any, ...]]) -> None:
        tmp_path = tmp_path_factory.mktemp("iso")
        storage, prefix = None, ""
        if backend == "redis":
            prefix = "p" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10]
            storage = redis_storage(tmp_path, request.getfixturevalue("redis_url"), prefix)
        try:
            totals["requests"] += asyncio.run(run_scenario(tmp_path, storage, ops))
        finally:
            if backend == "redis":
                purge_prefix(request.getfixturevalue("redis_url"), prefix)
        totals["examples"] += 1

    scenario()
    assert totals["examples"] >= EXAMPLES
    assert INJECTED[0] > 0  # the injection checks saw real memory blocks
    assert OPENED[0] > 0  # the conflict routes had conflicts to list and settle
    print(f"isolation property ({backend}): {totals['examples']} examples, "
          f"{totals['requests']} checked requests, {INJECTED[0]} own memories injected, "
          f"{OPENED[0]} conflicts opened, "
          "0 crossings")
