"""Run-time tenant settings: overrides win over config.yaml, are validated as at startup,
and reach every process within 5 s (two TenantSettings over one store stand for two
processes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from proxy.errors import ConflictError, InvalidRequestError
from proxy.memory.store import MemoryStore, StoreUnavailableError
from proxy.routes.admin_models import SettingsPatch
from proxy.settings import Settings
from proxy.settings.overrides import TENANT_OVERRIDABLE
from proxy.tenants import OVERRIDABLE, REFRESH_SECONDS, TenantSettings
from tests.fakes import make_settings
from tests.memory.conftest import store

__all__ = ["store"]


class Tick:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_change_reaches_another_process_within_five_seconds(
    store: MemoryStore, tmp_path: Path
) -> None:
    """Process A's change is seen by A at once and by B once B's cached copy is older
    than REFRESH_SECONDS (< 5 s); other tenants keep the config."""
    assert REFRESH_SECONDS < 5
    settings = make_settings(tmp_path, learning={"enabled": True})
    tick = Tick()
    a = TenantSettings(settings, store, clock=tick)
    b = TenantSettings(settings, store, clock=tick)
    assert (await b.get("acme")).learning.score_threshold == 0.6
    _, changed = await a.update("acme", {"learning.score_threshold": 0.8})
    assert changed == {"learning.score_threshold": {"from": 0.6, "to": 0.8}}
    assert (await a.get("acme")).learning.score_threshold == 0.8
    tick.now = REFRESH_SECONDS - 0.5
    assert (await b.get("acme")).learning.score_threshold == 0.6  # still cached
    tick.now = REFRESH_SECONDS + 0.1
    assert (await b.get("acme")).learning.score_threshold == 0.8
    assert (await b.get("globex")).learning.score_threshold == 0.6


async def test_two_processes_patching_different_settings_at_once_both_keep_theirs(
    store: MemoryStore, tmp_path: Path
) -> None:
    """Two processes each patching another setting of one tenant at the same moment: both
    overrides are stored (neither writes back the value it read before the other's
    write), and each reports only its own change."""
    settings = make_settings(tmp_path, learning={"enabled": True})
    a, b = TenantSettings(settings, store), TenantSettings(settings, store)
    (_, changed_a), (_, changed_b) = await asyncio.gather(
        a.update("acme", {"learning.score_threshold": 0.8}),
        b.update("acme", {"memory.injection_count": 3}))
    assert await store.get_tenant_settings("acme") == {
        "learning.score_threshold": 0.8, "memory.injection_count": 3}
    assert set(changed_a) == {"learning.score_threshold"}
    assert set(changed_b) == {"memory.injection_count"}


async def test_validation_names_the_setting(store: MemoryStore, tmp_path: Path) -> None:
    """Bad values are 400s naming the dotted path of the bad value (inside a nested
    setting too); nothing is stored; learning cannot be switched on over a config that has
    it off (409)."""
    tenants = TenantSettings(make_settings(tmp_path), store)
    for patch, param in (({"learning.score_threshold": 2}, "learning.score_threshold"),
                         ({"learning.retention_days": 0}, "learning.retention_days"),
                         ({"learning.budget": {"tokens_per_day": 0}},
                          "learning.budget.tokens_per_day"),
                         ({"learning.batch_messages": {"group": 0}},
                          "learning.batch_messages.group"),
                         ({"learning.pii": {}}, "learning.pii")):
        with pytest.raises(InvalidRequestError) as caught:
            await tenants.update("acme", patch)
        assert caught.value.param == param
    with pytest.raises(ConflictError):
        await tenants.update("acme", {"learning.enabled": True})
    assert await store.get_tenant_settings("acme") == {}


class DownStore:
    async def get_tenant_settings(self, tenant: str) -> dict[str, object]:
        raise StoreUnavailableError("down")


async def test_an_unreadable_store_falls_back_to_the_config(tmp_path: Path) -> None:
    """When the store cannot be read the config's settings are used (chat goes on)."""
    tenants = TenantSettings(make_settings(tmp_path), DownStore())  # type: ignore[arg-type]
    assert (await tenants.get("acme")).memory.injection_count == 5


class StallingStore:
    """Answers with an override until ``stalled``; then a read never returns (a store
    that stopped answering), and each read advances ``tick`` by ``wait`` as it begins."""

    def __init__(self, tick: Tick, wait: float) -> None:
        self.tick, self.wait = tick, wait
        self.stalled = False
        self.reads = 0

    async def get_tenant_settings(self, tenant: str) -> dict[str, object]:
        self.reads += 1
        if not self.stalled:
            return {"memory.injection_count": 3}
        self.tick.now += self.wait
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_late_read_keeps_the_last_known_settings_and_waits_a_refresh(
    tmp_path: Path
) -> None:
    """A read that runs past the read deadline answers within it with the last known
    settings; requests meanwhile share that one read; the store is not asked again until
    a refresh interval after the failure was seen (not after the read began)."""
    tick = Tick()
    store = StallingStore(tick, wait=3.0)
    tenants = TenantSettings(make_settings(tmp_path), store,  # type: ignore[arg-type]
                             clock=tick, read_timeout_seconds=0.05, read_limit_seconds=0.2)
    assert (await tenants.get("acme")).memory.injection_count == 3
    store.stalled = True
    tick.now = REFRESH_SECONDS + 0.1
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await tenants.get("acme")).memory.injection_count == 3  # last known
    assert loop.time() - started < 1.0
    assert (await tenants.get("acme")).memory.injection_count == 3
    assert store.reads == 2  # one read in flight, shared
    await asyncio.sleep(0.4)  # the read runs out its limit: the failure is seen
    tick.now += REFRESH_SECONDS - 0.5  # a refresh after the read began, not after the end
    assert (await tenants.get("acme")).memory.injection_count == 3
    assert store.reads == 2  # served from the cache
    tick.now += 1.0
    await tenants.get("acme")
    assert store.reads == 3


class SlowStore:
    async def get_tenant_settings(self, tenant: str) -> dict[str, object]:
        await asyncio.sleep(0.15)
        return {"memory.injection_count": 3}


async def test_a_late_answer_still_lands_in_the_cache(tmp_path: Path) -> None:
    """A read slower than the read deadline gives the first request the config's
    settings, and its answer, when it comes, serves the next requests."""
    tenants = TenantSettings(make_settings(tmp_path), SlowStore(),  # type: ignore[arg-type]
                             read_timeout_seconds=0.05)
    assert (await tenants.get("acme")).memory.injection_count == 5
    await asyncio.sleep(0.3)
    assert (await tenants.get("acme")).memory.injection_count == 3


async def test_a_late_first_read_uses_the_config(tmp_path: Path) -> None:
    """A tenant never read before gets the config's settings when its first read runs
    late."""
    store = StallingStore(Tick(), wait=0.0)
    store.stalled = True
    tenants = TenantSettings(make_settings(tmp_path), store,  # type: ignore[arg-type]
                             read_timeout_seconds=0.05, read_limit_seconds=0.1)
    assert (await tenants.get("acme")).memory.injection_count == 5
    await asyncio.sleep(0.2)  # the read gives up; nothing is left running
    assert (await tenants.get("acme")).memory.injection_count == 5


def test_the_overridable_settings_are_declared_once() -> None:
    """The tenant cache's names and the admin patch model's keys both come from
    TENANT_OVERRIDABLE, in its order, and each path names a field of its config section."""
    paths = [setting.path for setting in TENANT_OVERRIDABLE]
    assert list(OVERRIDABLE) == paths
    aliases = [field.alias for field in SettingsPatch.model_fields.values()]
    assert aliases == paths
    for setting in TENANT_OVERRIDABLE:
        section = Settings.model_fields[setting.section].annotation
        assert isinstance(section, type)
        assert setting.field in section.model_fields, setting.path
