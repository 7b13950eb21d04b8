"""Property: whatever tenants, users, keys, group names and operations a client mixes, no
write or read crosses a (tenant, user) namespace — through any memory route, the admin
audit log, the memory block injected into chat, or a reply's injection record. Both
backends.

Each example starts a fresh gateway with two tenants; each has an app key (names any user
with ``X-User-Id``), two user-bound keys and an admin key. A random sequence of operations
— create, list, search, get, delete, clear, chat in a private or a group channel, open a
conflict (a learned contradiction, written as learning writes it), list, confirm or
reverse conflicts, the admin's conflict list of one user or of the whole tenant, a weekly
profile snapshot (written as learning writes it) and the profile history, a recall
preview, read an injection record — is sent with random keys and random (possibly
foreign) user headers and ids, and checked after every step against a model of who owns
which memory, conflict and snapshot. At the end every owner's private chat, recall
preview and profile history are checked once more.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy.memory.conflicts import Conflict, ProfileWeek, WeightedTag, iso_week, mark_pair
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
PREVIEWED = [0]  # own memories seen in a recall preview (the preview check is not vacuous)
SNAPSHOTS = [0]  # snapshot markers seen in a profile history (nor is the history check)
# Run in every test beside the random examples, so each counter above is reached whatever
# the draw: two owners in two tenants, a conflict, chat and preview that recall, an
# injection record read by its owner and by a foreign key, snapshots read back.
COVERING = [
    ("create", ("t0", "app", "u0")),
    ("create", ("t1", "u0", "u1")),
    ("contest", ("t0", "app", "u0")),
    ("snapshot", ("t0", "app", "u0"), 1),
    ("chat", ("t0", "app", "u0"), 0, None),
    ("preview", ("t0", "app", "u0"), 0, None),
    ("injection", ("t0", "u1", "u2"), 0),
    ("injection", ("t0", "app", "u0"), 0),
    ("history", ("t0", "app", "u0")),
    ("snapshot", ("t1", "app", "u2"), 2),
    ("history", ("t1", "u1", "u0")),
]


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
    st.tuples(st.just("admin_conflicts"), st.sampled_from(TENANTS),
              st.sampled_from((None, *USERS))),
    st.tuples(st.just("snapshot"), callers, st.integers(1, 3)),
    st.tuples(st.just("history"), callers),
    st.tuples(st.just("preview"), callers, st.integers(0, 30),
              st.sampled_from((None, None, *GROUPS))),
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
    if kind == "conflicts":
        response = await client.get("/v1/memories/conflicts", headers=headers,
                                    params={"status": "all"})
        assert response.status_code == 200
        assert set(MARKER.findall(response.text)) <= mine
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


async def history_step(client: Any, gw: Any, op: tuple[Any, ...], *,
                       headers: dict[str, str], me: tuple[str, str],
                       state: dict[str, Any]) -> None:
    """``snapshot``: a weekly profile snapshot of the caller ``op[2]`` weeks ago whose trait
    is a new marker, applied as learning applies it (``state["weeks"]``: owner → {week:
    marker}; a later snapshot of the same week replaces it). ``history``: the caller's
    profile history holds exactly the markers of the caller's snapshots."""
    weeks = state["weeks"]
    if op[0] == "snapshot":
        marker = f"zq{state['made']}x"
        state["made"] += 1
        at = datetime.now(UTC) - timedelta(weeks=op[2])
        week = ProfileWeek(tenant=me[0], user_id=me[1], week=iso_week(at), at=at,
                           traits=(WeightedTag(f"likes {marker}", 1.0),))
        assert await gw.res.store.apply(ChangeSet(
            tenant=me[0], user_id=me[1], batch_key=f"snapshot:{marker}", snapshot=week))
        weeks.setdefault(me, {})[week.week] = marker
        return
    response = await client.get("/v1/profile/history", headers=headers)
    assert response.status_code == 200
    seen = set(MARKER.findall(response.text))
    assert seen == set(weeks.get(me, {}).values()), (me, seen)
    SNAPSHOTS[0] += len(seen)


async def preview_step(client: Any, question: str, *, headers: dict[str, str],
                       group: str | None, owned: set[str]) -> set[str]:
    """A recall preview for ``question`` holds only memories of ``owned`` (none in a
    group, whose recall has no manual memories) and writes no injection record; returns
    the memory ids it names."""
    preview_headers = {**headers, **({"X-Memory-Channel": "group",
                                      "X-Memory-Group-Id": group} if group else {})}
    response = await client.post("/v1/memories/preview", headers=preview_headers,
                                 json={"messages": [{"role": "user", "content": question}]})
    assert response.status_code == 200, response.text
    assert "x-memory-injection-id" not in response.headers
    assert not MARKER.findall(response.text.replace(question, ""))  # ids, never text
    shown = {i["memory_id"] for i in response.json()["items"] if i["kind"] == "memory"}
    assert shown <= (set() if group else owned), (group, shown - owned)
    PREVIEWED[0] += len(shown)
    return shown


async def admin_conflicts_step(client: Any, op: tuple[Any, ...],
                               state: dict[str, Any]) -> None:
    """The admin's list of one user's conflicts holds only that user's pairs; without a
    user, only pairs of the admin's tenant, each under the user who owns it."""
    tenant, user = op[1], op[2]
    params = {"status": "all", **({"user": user} if user else {})}
    response = await client.get("/v1/admin/conflicts", params=params,
                                headers={"Authorization": f"Bearer {_key(tenant + '-admin')}"})
    assert response.status_code == 200
    owned = {m for m, o in state["owners"].items()
             if o[0] == tenant and (user is None or o[1] == user)}
    assert set(MARKER.findall(response.text)) <= owned
    assert all((user is None or c["user_id"] == user)
               and state["conflicts"].get(c["id"]) == (tenant, c["user_id"])
               for c in response.json()["data"])


async def final_checks(client: Any, upstream: FakeUpstream, state: dict[str, Any]) -> int:
    """Every owner asks about everyone's memories in a private chat and in a recall
    preview (the preview names exactly the memories the chat injected), and reads their
    profile history; returns how many requests were checked."""
    owners, ids = state["owners"], state["ids"]
    checked = 0
    for owner in sorted(set(owners.values())):
        tenant, user = owner
        headers = {"Authorization": f"Bearer {_key(tenant + '-app')}", "X-User-Id": user}
        question = f"What about {' '.join(sorted(owners))}?"
        response = await client.post("/v1/chat/completions", headers=headers, json={
            "model": "m", "messages": [{"role": "user", "content": question}]})
        assert response.status_code == 200
        sent = "\n".join(str(m.get("content")) for m in upstream.last_chat["messages"])
        injected = set(MARKER.findall(sent.replace(question, "")))
        assert injected <= {m for m, o in owners.items() if o == owner}, (owner, injected)
        INJECTED[0] += len(injected)
        shown = await preview_step(client, question, headers=headers, group=None,
                                   owned={ids[m] for m, o in owners.items() if o == owner})
        assert shown == {ids[m] for m in injected}, (owner, shown, injected)
        checked += 2
    for owner in sorted(state["weeks"]):
        headers = {"Authorization": f"Bearer {_key(owner[0] + '-app')}", "X-User-Id": owner[1]}
        await history_step(client, None, ("history",), headers=headers, me=owner, state=state)
        checked += 1
    return checked


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
        state: dict[str, Any] = {"owners": owners, "ids": ids, "conflicts": {}, "made": 0,
                                 "weeks": {}}
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
            if kind in ("contest", "conflicts", "settle"):
                checked += await conflict_step(client, gw, op, headers=headers, me=me,
                                               state=state)
                made = max(made, state["made"])
                continue
            if kind in ("snapshot", "history"):
                await history_step(client, gw, op, headers=headers, me=me, state=state)
                made = max(made, state["made"])
                checked += 1
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
                state["weeks"].pop(me, None)  # clearing removes the profile history too
            elif kind == "preview":
                await preview_step(client, f"What about {' '.join(markers[:6])} {pick}?",
                                   headers=headers, group=op[3],
                                   owned={ids[m] for m in mine})
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
        checked += await final_checks(client, upstream, state)
    return checked


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_no_operation_crosses_a_namespace(backend: str, tmp_path_factory: pytest.TempPathFactory,
                                          request: pytest.FixtureRequest) -> None:
    """Random tenants, users, keys, groups and operations: every read shows only the
    caller's own memories, every write lands only in the caller's namespace, and every
    injected block holds only the caller's memories."""
    totals = {"requests": 0, "examples": 0}
    INJECTED[0] = OPENED[0] = PREVIEWED[0] = SNAPSHOTS[0] = 0

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(ops=operations)
    @example(ops=COVERING)
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
    assert totals["examples"] >= EXAMPLES + 1  # the random draws and COVERING
    assert INJECTED[0] > 0  # the injection checks saw real memory blocks
    assert OPENED[0] > 0  # the conflict routes had conflicts to list and settle
    assert PREVIEWED[0] > 0  # the previews named real memories
    assert SNAPSHOTS[0] > 0  # the histories held real snapshots
    print(f"isolation property ({backend}): {totals['examples']} examples, "
          f"{totals['requests']} checked requests, {INJECTED[0]} own memories injected, "
          f"{OPENED[0]} conflicts opened, {PREVIEWED[0]} previewed, "
          f"{SNAPSHOTS[0]} snapshot weeks seen, "
          "0 crossings")
