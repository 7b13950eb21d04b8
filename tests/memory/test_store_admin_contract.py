"""The MemoryStore contract for admin governance, on both backends: the
filtered learning log, per-day audit counts, tenant memory counts and tenant settings.

Uses the shared ``store`` fixture of :mod:`tests.memory.test_store_contract`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

import pytest

from proxy.memory.store import AuditEvent, AuditFilter, MemoryStore, SearchQuery
from proxy.settings import GLOBAL_NAMESPACE
from tests.memory.test_store_contract import T0, ask, mem


def event(action: str, *, user: str | None = "u1", actor: str = "auto", minutes: int = 0,
          conversation: str | None = None, tenant: str = "t1") -> AuditEvent:
    return AuditEvent(tenant=tenant, user_id=user, action=action,  # type: ignore[arg-type]
                      actor=actor, at=T0 + timedelta(minutes=minutes),  # type: ignore[arg-type]
                      conversation_id=conversation)


async def _log(store: MemoryStore) -> None:
    await store.audit([
        event("created", minutes=0, conversation="c1"),
        event("merged", minutes=1, conversation="c1"),
        event("deleted", user="u2", actor="user", minutes=2),
        event("created", user=None, actor="admin", minutes=3),
        event("retired", minutes=60 * 24 + 5, conversation="c2"),
        event("created", minutes=4, tenant="t2"),
    ])


async def test_audit_search_filters_and_pages(store: MemoryStore) -> None:
    """The log filters by user, action, actor, conversation and time, newest first, and
    pages with ``before_id``; another tenant's events never appear."""
    await _log(store)
    everything = await store.audit_search("t1", AuditFilter())
    assert [e.action for _, e in everything] == ["retired", "created", "deleted", "merged",
                                                  "created"]
    assert [e.action for _, e in await store.audit_search(
        "t1", AuditFilter(user="u1"))] == ["retired", "merged", "created"]
    assert [e.user_id for _, e in await store.audit_search(
        "t1", AuditFilter(action="created"))] == [None, "u1"]
    assert [e.action for _, e in await store.audit_search(
        "t1", AuditFilter(actor="user"))] == ["deleted"]
    assert [e.action for _, e in await store.audit_search(
        "t1", AuditFilter(conversation="c1"))] == ["merged", "created"]
    window = AuditFilter(since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=3))
    assert [e.action for _, e in await store.audit_search("t1", window)] == ["deleted",
                                                                              "merged"]
    first = await store.audit_search("t1", AuditFilter(), limit=2)
    rest = await store.audit_search("t1", AuditFilter(), limit=10, before_id=first[-1][0])
    assert [e.action for _, e in first + rest] == [e.action for _, e in everything]
    assert await store.audit_search("t1", AuditFilter(action="promoted")) == []


async def test_audit_counts_per_day_action_and_actor(store: MemoryStore) -> None:
    """Counts group the tenant's events by UTC day, action and actor from ``since`` on."""
    await _log(store)
    counts = await store.audit_counts("t1", since=T0)
    assert counts == {("2025-01-01", "created", "auto"): 1,
                      ("2025-01-01", "merged", "auto"): 1,
                      ("2025-01-01", "deleted", "user"): 1,
                      ("2025-01-01", "created", "admin"): 1,
                      ("2025-01-02", "retired", "auto"): 1}
    assert await store.audit_counts("t1", since=T0 + timedelta(days=1)) == {
        ("2025-01-02", "retired", "auto"): 1}


async def test_tenant_counts_per_scope(store: MemoryStore) -> None:
    """Tenant counts split memories by scope and category; retired and disabled apart;
    another tenant's memories are not counted."""
    await store.add(mem("likes tea", category="user_preference"))
    await store.add(mem("uses rust", user="u2", category="technical"))
    await store.add(mem("old fact", superseded_at=T0))
    await store.add(mem("off fact", enabled=False))
    await store.add(mem("office opens at 9", user=None, category="organizational"))
    await store.add(mem("other tenant", tenant="t2"))
    counts = await store.tenant_counts("t1")
    assert counts["personal"] == {"total": 2, "retired": 1, "disabled": 1,
                                  "user_preference": 1, "technical": 1}
    assert counts["shared"] == {"total": 1, "retired": 0, "disabled": 0,
                                "organizational": 1}
    assert await store.tenant_counts("nobody") == {}


async def test_tenant_settings_round_trip(store: MemoryStore) -> None:
    """Tenant settings overrides are stored whole, per tenant."""
    assert await store.get_tenant_settings("t1") == {}
    await store.put_tenant_settings("t1", {"learning.score_threshold": 0.7,
                                           "learning.budget": {"tokens_per_day": 100}})
    await store.put_tenant_settings("t2", {"memory.injection_count": 3})
    assert await store.get_tenant_settings("t1") == {
        "learning.score_threshold": 0.7, "learning.budget": {"tokens_per_day": 100}}
    await store.put_tenant_settings("t1", {})
    assert await store.get_tenant_settings("t1") == {}
    assert await store.get_tenant_settings("t2") == {"memory.injection_count": 3}


async def test_system_memories_of_the_global_namespace_reach_every_tenant(
    store: MemoryStore
) -> None:
    """System memories stored in the global namespace join every tenant's search (with
    include_shared), keyword and vector alike; one tenant's shared memories never reach
    another tenant."""
    system = mem("Expense policy: receipts above 50 EUR", user=None, tenant=GLOBAL_NAMESPACE,
                 scope="system", source="system", embedding=(1.0, 0.0, 0.0, 0.0))
    shared = mem("Expense reports are due on Fridays", user=None, tenant="t2",
                 embedding=(0.0, 1.0, 0.0, 0.0))
    await store.add(system)
    await store.add(shared)
    for tenant in ("t1", "t2"):
        found = {c.memory.id for c in await store.search(ask("expense receipts",
                                                             tenant=tenant))}
        assert system.id in found
        assert (shared.id in found) == (tenant == "t2")
        nearest = await store.search(SearchQuery(tenant=tenant, user="u1", terms=(),
                                                 embedding=(1.0, 0.0, 0.0, 0.0)))
        assert system.id in {c.memory.id for c in nearest}
    assert await store.search(ask("expense receipts", include_shared=False)) == []


async def test_delete_shared_removes_only_that_tenants_memory(store: MemoryStore) -> None:
    """delete_shared removes a memory of the tenant's shared space (search no longer finds
    it); another tenant's id, or a personal memory's, is not found (False)."""
    shared = mem("Office closes at six", user=None)
    personal = mem("Office is my second home")
    await store.add(shared)
    await store.add(personal)
    assert not await store.delete_shared("t2", shared.id)
    assert not await store.delete_shared("t1", personal.id)
    assert await store.delete_shared("t1", shared.id, audit=event("deleted", user=None,
                                                                   actor="admin"))
    assert await store.get("t1", None, shared.id) is None
    assert {c.memory.id for c in await store.search(ask("office"))} == {personal.id}
    assert not await store.delete_shared("t1", shared.id)
    log = await store.audit_search("t1", AuditFilter(action="deleted"))
    assert [e.user_id for _, e in log] == [None]


async def test_concurrent_changes_of_tenant_settings_all_stay(store: MemoryStore) -> None:
    """Six changes made at once, each adding its own group to what it reads, all stay (none
    reads a value another overwrites); each returns what it read and what it wrote; other
    overrides and other tenants are untouched."""
    await store.put_tenant_settings("t1", {"memory.injection_count": 3})
    await store.put_tenant_settings("t2", {"memory.injection_count": 4})

    def adding(word: str) -> Callable[[dict[str, object]], dict[str, object]]:
        def change(current: dict[str, object]) -> dict[str, object]:
            groups = current.get("learning.synonyms")
            held = list(groups) if isinstance(groups, list) else []
            return {**current, "learning.synonyms": [*held, [word, word + "s"]]}
        return change

    words = [f"word{i}" for i in range(6)]
    results = await asyncio.gather(*(store.change_tenant_settings("t1", adding(w))
                                     for w in words))
    stored = await store.get_tenant_settings("t1")
    groups = stored["learning.synonyms"]
    assert isinstance(groups, list)
    assert sorted(g[0] for g in groups) == words
    assert stored["memory.injection_count"] == 3
    assert await store.get_tenant_settings("t2") == {"memory.injection_count": 4}
    assert sorted(len(after["learning.synonyms"]) for _, after in results) == \
        list(range(1, 7))  # type: ignore[arg-type]
    assert all(before.get("memory.injection_count") == 3 for before, _ in results)


async def test_a_change_that_raises_writes_nothing(store: MemoryStore) -> None:
    """What the change raises reaches the caller, and the overrides stay as they were."""
    await store.put_tenant_settings("t1", {"memory.injection_count": 3})

    def refuse(current: dict[str, object]) -> dict[str, object]:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await store.change_tenant_settings("t1", refuse)
    assert await store.get_tenant_settings("t1") == {"memory.injection_count": 3}
