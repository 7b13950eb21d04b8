"""No cross-namespace read, write or delete: a hypothesis state machine
drives random users of two tenants — through app keys and an admin key acting for a user —
through the user-memory API (add, get, edit, disable, delete, clear, export → import into
another user, forget me) on each backend, and after every step each namespace lists
exactly what the model says it holds."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.fakes import (
    FakeUpstream,
    Gateway,
    backend_overrides,
    make_settings,
    running_gateway,
)

TENANTS = {"tenant-a": "iso-app-a", "tenant-b": "iso-app-b"}
ADMIN_A = "iso-admin-a"
USERS = ("u1", "u2", "u3")
NAMESPACES = [(t, u) for t in TENANTS for u in USERS]
Namespace = tuple[str, str]


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    for name, value in {"ISO_A": TENANTS["tenant-a"], "ISO_B": TENANTS["tenant-b"],
                        "ISO_ADMIN": ADMIN_A}.items():
        monkeypatch.setenv(name, value)
    overrides = backend_overrides(request, tmp_path)
    config = make_settings(
        tmp_path, auth={"keys": [{"key": "os.environ/ISO_A", "tenant": "tenant-a"},
                                 {"key": "os.environ/ISO_B", "tenant": "tenant-b"}],
                        "admin_keys": [{"key": "os.environ/ISO_ADMIN",
                                        "tenant": "tenant-a"}]},
        **overrides)
    async with running_gateway(config, upstream) as gateway:
        yield gateway


def _machine(base_url: str, steps: Counter[str]) -> type[RuleBasedStateMachine]:
    words = itertools.count()

    class Isolation(RuleBasedStateMachine):
        """The model: namespace → {memory id: content}."""

        def __init__(self) -> None:
            super().__init__()
            self.client = httpx.Client(base_url=base_url, timeout=20)
            for tenant in TENANTS:  # every run starts from empty namespaces
                for user in USERS:
                    self.send((tenant, user), "DELETE", "/v1/me",
                              params={"confirm": "true"}, admin=False)
            self.model: dict[Namespace, dict[str, str]] = {ns: {} for ns in NAMESPACES}

        def teardown(self) -> None:
            self.client.close()

        def send(self, ns: Namespace, method: str, path: str, *, admin: bool,
                 **kwargs: Any) -> httpx.Response:
            tenant, user = ns
            key = ADMIN_A if admin and tenant == "tenant-a" else TENANTS[tenant]
            return self.client.request(method, path, headers={
                "Authorization": f"Bearer {key}", "X-User-Id": user}, **kwargs)

        def all_ids(self) -> list[str]:
            return sorted(i for held in self.model.values() for i in held)

        @initialize()
        def seed(self) -> None:
            """One memory in each tenant before the random steps, so that acts on another
            namespace's memory are possible from the first step (without it, a run of five
            short examples sometimes had none to refuse)."""
            for ns in (NAMESPACES[0], NAMESPACES[-1]):
                self.add(ns, admin=False)

        @rule(ns=st.sampled_from(NAMESPACES), admin=st.booleans())
        def add(self, ns: Namespace, admin: bool) -> None:
            content = f"Likes topic {next(words)}"
            response = self.send(ns, "POST", "/v1/memories", json={"content": content},
                                 admin=admin)
            assert response.status_code == 201, response.text
            self.model[ns][response.json()["id"]] = content
            steps["add"] += 1

        def touch(self, ns: Namespace, pick: int, action: str, admin: bool) -> None:
            """Any user acts on any memory: only the owner's act succeeds; everyone else
            gets 404 and changes nothing (checked by the invariant)."""
            ids = self.all_ids()
            memory_id = ids[pick % len(ids)]
            owner = next(n for n, held in self.model.items() if memory_id in held)
            path = f"/v1/memories/{memory_id}"
            content = f"Likes topic {next(words)}"
            if action == "get":
                response = self.send(ns, "GET", path, admin=admin)
            elif action == "delete":
                response = self.send(ns, "DELETE", path, admin=admin)
            else:
                body = {"content": content} if action == "edit" else {"enabled": False}
                response = self.send(ns, "PATCH", path, json=body, admin=admin)
            if ns != owner:
                assert response.status_code == 404, (ns, owner, action, response.text)
                steps[f"{action} refused"] += 1
                return
            assert response.status_code == 200, response.text
            if action == "get":
                assert response.json()["content"] == self.model[ns][memory_id]
            elif action == "delete":
                del self.model[ns][memory_id]
            elif action == "edit":
                self.model[ns][memory_id] = content
            steps[action] += 1

        @precondition(lambda self: any(self.model.values()))
        @rule(ns=st.sampled_from(NAMESPACES), pick=st.integers(0, 10_000),
              admin=st.booleans())
        def get(self, ns: Namespace, pick: int, admin: bool) -> None:
            self.touch(ns, pick, "get", admin)

        @precondition(lambda self: any(self.model.values()))
        @rule(ns=st.sampled_from(NAMESPACES), pick=st.integers(0, 10_000),
              admin=st.booleans())
        def edit(self, ns: Namespace, pick: int, admin: bool) -> None:
            self.touch(ns, pick, "edit", admin)

        @precondition(lambda self: any(self.model.values()))
        @rule(ns=st.sampled_from(NAMESPACES), pick=st.integers(0, 10_000),
              admin=st.booleans())
        def disable(self, ns: Namespace, pick: int, admin: bool) -> None:
            self.touch(ns, pick, "disable", admin)

        @precondition(lambda self: any(self.model.values()))
        @rule(ns=st.sampled_from(NAMESPACES), pick=st.integers(0, 10_000),
              admin=st.booleans())
        def delete(self, ns: Namespace, pick: int, admin: bool) -> None:
            self.touch(ns, pick, "delete", admin)

        @rule(ns=st.sampled_from(NAMESPACES), erase=st.booleans(), admin=st.booleans())
        def forget(self, ns: Namespace, erase: bool, admin: bool) -> None:
            path = "/v1/me" if erase else "/v1/memories"
            response = self.send(ns, "DELETE", path, params={"confirm": "true"}, admin=admin)
            assert response.status_code == 200, response.text
            self.model[ns] = {}
            steps["erase" if erase else "clear"] += 1

        @rule(source=st.sampled_from(NAMESPACES), into=st.sampled_from(NAMESPACES))
        def copy(self, source: Namespace, into: Namespace) -> None:
            """One user's export imported by another: only the source's memories leave,
            only the target gains them (same contents merge)."""
            exported = self.send(source, "GET", "/v1/memories/export", admin=False).json()
            assert sorted(m["content"] for m in exported["memories"]) == \
                sorted(self.model[source].values())
            assert {m["user_id"] for m in exported["memories"]} <= {source[1]}
            response = self.send(into, "POST", "/v1/memories/import", json=exported,
                                 admin=False)
            assert response.status_code == 200, response.text
            listed = self.send(into, "GET", "/v1/memories", params={"limit": 500},
                               admin=False).json()["data"]
            expected = set(self.model[into].values()) | set(self.model[source].values())
            assert {m["content"] for m in listed} == expected
            self.model[into] = {m["id"]: m["content"] for m in listed}
            steps["import"] += 1

        @invariant()
        def every_namespace_holds_exactly_its_own(self) -> None:
            for ns in NAMESPACES:
                listed = self.send(ns, "GET", "/v1/memories", params={"limit": 500},
                                   admin=False).json()["data"]
                assert {m["id"]: m["content"] for m in listed} == self.model[ns], ns
                assert {(m["tenant"], m["user_id"]) for m in listed} <= {ns}

    return Isolation


async def test_random_operations_never_cross_namespaces(gw: Gateway) -> None:
    """Random sequences of operations by random users of two tenants: every act on
    another namespace's memory is a 404 and each namespace lists exactly its own."""
    steps: Counter[str] = Counter()
    machine = _machine(gw.base_url, steps)
    await asyncio.to_thread(
        run_state_machine_as_test, machine,
        settings=settings(max_examples=5, stateful_step_count=10, deadline=None,
                          database=None, suppress_health_check=list(HealthCheck)))
    assert steps["add"] > 0
    assert sum(n for k, n in steps.items() if k.endswith("refused")) > 0
