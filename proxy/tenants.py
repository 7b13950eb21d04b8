"""Run-time settings per tenant: ``config.yaml`` gives the defaults, overrides stored by
``PATCH /v1/admin/settings`` win.

The overridable settings keep their config names (:data:`OVERRIDABLE`, derived from the one
declaration :data:`~proxy.settings.overrides.TENANT_OVERRIDABLE`). Overrides live in
the memory store (:meth:`~proxy.memory.store.MemoryStore.get_tenant_settings`), so every
gateway process and worker pointed at the same storage sees them; each process caches a
tenant's effective settings for :data:`REFRESH_SECONDS`, so a change reaches all of them
within 5 s without a restart (the process that made it sees it at once). When the store
cannot be read, the last known settings (else the config's) are used: settings never break
chat or learning.

**Reads are bounded.** A cached tenant is served from memory (a dict look-up); only a
miss or a stale entry reads the store. One read per tenant runs at a time, in a task that
the requests needing it share: each waits for it at most until :data:`READ_TIMEOUT_SECONDS`
after the read began, then goes on with the last known settings (else the config's). The
read itself may run on for up to :data:`READ_LIMIT_SECONDS` (a loaded store's late answer
still lands in the cache); when it fails or runs out, the last known settings are cached
from the moment the failure was seen, so the store is asked again :data:`REFRESH_SECONDS`
later, not on every request meanwhile. A store that stopped answering thus costs a
tenant's requests at most :data:`READ_TIMEOUT_SECONDS` once per refresh interval.

Validation is the startup validation: the merged section is rebuilt with pydantic, and an
invalid value is a 400 whose ``param`` is the dotted path of the value
(``learning.score_threshold``, ``learning.batch_messages.private``). The route takes JSON
booleans and numbers only (:class:`~proxy.routes.admin_models.SettingsPatch` is strict).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from proxy.errors import ConflictError, InvalidRequestError, invalid_value
from proxy.memory.store import MemoryStore, StoreUnavailableError
from proxy.settings import LearningSettings, MemorySettings, Settings
from proxy.settings.overrides import TENANT_OVERRIDABLE

log = structlog.get_logger("proxy.tenants")

# A cached tenant's settings are re-read after this many seconds: 4 s + one store read
# keeps "every process sees a change within 5 s".
REFRESH_SECONDS = 4.0
# The settings an admin may change at run time, by their config.yaml names.
OVERRIDABLE: tuple[str, ...] = tuple(setting.path for setting in TENANT_OVERRIDABLE)
# The settings whose override is added after config.yaml's value (Overridable.extends).
EXTENDING: frozenset[str] = frozenset(s.path for s in TENANT_OVERRIDABLE if s.extends)
# Longest wait for one settings read on the request path: one key read, sub-millisecond
# on a healthy store; a quarter second leaves room for a loaded one and bounds what a
# store that stopped answering adds to a chat.
READ_TIMEOUT_SECONDS = 0.25
# Longest a settings read runs on in the background after the requests stopped waiting.
READ_LIMIT_SECONDS = 2.0
# Cached tenants per process (LRU beyond this drops the least recently read).
MAX_CACHED_TENANTS = 10_000


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """A tenant's effective settings: the config sections with its overrides applied."""

    tenant: str
    learning: LearningSettings
    memory: MemorySettings
    overrides: Mapping[str, Any]

    def value(self, name: str) -> Any:
        """The effective value of one :data:`OVERRIDABLE` name, JSON-ready."""
        section, field_name = name.split(".", 1)
        return getattr(self, section).model_dump(mode="json")[field_name]


class TenantSettings:
    """Effective settings per tenant (module docstring). ``clock``: monotonic seconds."""

    def __init__(self, settings: Settings, store: MemoryStore, *,
                 clock: Callable[[], float] = time.monotonic,
                 refresh_seconds: float = REFRESH_SECONDS,
                 read_timeout_seconds: float = READ_TIMEOUT_SECONDS,
                 read_limit_seconds: float = READ_LIMIT_SECONDS) -> None:
        self._settings = settings
        self._store = store
        self._clock = clock
        self._refresh = refresh_seconds
        self._read_timeout = read_timeout_seconds
        self._read_limit = max(read_limit_seconds, read_timeout_seconds)
        self._cache: dict[str, tuple[float, TenantConfig]] = {}
        # The read in flight per tenant and when it began (event-loop seconds).
        self._reading: dict[str, tuple[asyncio.Task[TenantConfig], float]] = {}
        self._defaults = TenantConfig(tenant="", learning=settings.learning,
                                      memory=settings.memory, overrides={})

    @property
    def learning_available(self) -> bool:
        """Whether ``config.yaml`` switched learning on (only then is a sink built)."""
        return self._settings.learning.enabled

    @property
    def refresh_seconds(self) -> float:
        """How old a cached tenant's settings may get before they are read again (s)."""
        return self._refresh

    def now(self) -> float:
        """The cache's clock (monotonic seconds; the ``clock`` given)."""
        return self._clock()

    def cached(self) -> list[TenantConfig]:
        """The tenants this process has settings of (fresh or not)."""
        return [config for _, config in self._cache.values()]

    async def get(self, tenant: str) -> TenantConfig:
        """The tenant's effective settings, at most :data:`REFRESH_SECONDS` old when the
        store answers in time (module docstring: else the last known, or the config's)."""
        hit = self._cache.get(tenant)
        if hit is not None and self._clock() - hit[0] < self._refresh:
            return hit[1]
        loop = asyncio.get_running_loop()
        reading = self._reading.get(tenant)
        if reading is None:
            task = asyncio.create_task(self._read(tenant))
            reading = self._reading[tenant] = (task, loop.time())
            task.add_done_callback(lambda _: self._reading.pop(tenant, None))
        task, began = reading
        wait = began + self._read_timeout - loop.time()
        if wait > 0:
            await asyncio.wait({task}, timeout=wait)
        if task.done():
            return task.result()
        return hit[1] if hit is not None else self._merge(tenant, {})

    async def _read(self, tenant: str) -> TenantConfig:
        """Read and cache the tenant's settings, under :data:`READ_LIMIT_SECONDS`; on
        failure cache the last known (else the config's) as of now. Never raises."""
        began = self._clock()
        try:
            async with asyncio.timeout(self._read_limit):
                overrides = await self._store.get_tenant_settings(tenant)
            config = self._merge(tenant, overrides)
        except (StoreUnavailableError, InvalidRequestError, TimeoutError) as exc:
            log.warning("tenant_settings_unreadable", tenant=tenant,
                        error=str(exc) or type(exc).__name__)
            known = self._cache.get(tenant)
            config = known[1] if known is not None else self._merge(tenant, {})
            began = self._clock()  # the next read is due a refresh after the failure
        known = self._cache.get(tenant)
        if known is not None and known[0] > began:  # update() wrote it meanwhile
            return known[1]
        self._remember(tenant, config, began)
        return config

    async def update(self, tenant: str, patch: Mapping[str, Any]) -> tuple[TenantConfig,
                                                                           dict[str, Any]]:
        """Apply ``patch`` (name → value; ``None`` removes the override) and store it.

        Returns the new settings and the names that changed (old, new values). Raises
        :class:`InvalidRequestError` (400, ``param`` = the dotted name) for an unknown name
        or an invalid value, and :class:`ConflictError` (409) for ``learning.enabled:
        true`` while ``config.yaml`` has learning off (no learning sink is built)."""
        self._check(patch)
        return await self.change(tenant, lambda _stored: patch)

    async def change(self, tenant: str,
                     make_patch: Callable[[Mapping[str, Any]], Mapping[str, Any]]
                     ) -> tuple[TenantConfig, dict[str, Any]]:
        """As :meth:`update`, the patch made by ``make_patch`` from the tenant's stored
        overrides inside the store's atomic change
        (:meth:`~proxy.memory.store.MemoryStore.change_tenant_settings`), so a change
        computed from the current value (a synonym group added) never loses a concurrent
        one. ``make_patch`` must be pure (it may run more than once); what it raises
        propagates with nothing stored."""
        made: list[TenantConfig] = []

        def apply(before: dict[str, object]) -> dict[str, object]:
            patch = make_patch(before)
            self._check(patch)
            merged = {**before, **patch}
            overrides = {k: v for k, v in merged.items() if v is not None and k in OVERRIDABLE}
            config = self._merge(tenant, overrides)
            made[:] = [config]
            # Stored as validated (e.g. batch_messages as the full mapping); an extending
            # one as the tenant's part alone.
            return {name: overrides[name] if name in EXTENDING else config.value(name)
                    for name in overrides}

        before, stored = await self._store.change_tenant_settings(tenant, apply)
        old = self._merge(tenant, {k: v for k, v in before.items() if k in OVERRIDABLE})
        config = TenantConfig(tenant=tenant, learning=made[-1].learning,
                              memory=made[-1].memory, overrides=stored)
        self._remember(tenant, config, self._clock())
        changed = {name: {"from": old.value(name), "to": config.value(name)}
                   for name in OVERRIDABLE if old.value(name) != config.value(name)}
        return config, changed

    def _check(self, patch: Mapping[str, Any]) -> None:
        """Raise for a name that is not a run-time setting, or for switching learning on
        while ``config.yaml`` has it off (:meth:`update`)."""
        for name, value in patch.items():
            if name not in OVERRIDABLE:
                raise InvalidRequestError(
                    f"'{name}' is not a run-time setting; these are: "
                    f"{', '.join(OVERRIDABLE)}.", param=name, code="unknown_setting")
            if name == "learning.enabled" and value is True and not self.learning_available:
                raise ConflictError(
                    "Learning is off in config.yaml (learning.enabled: false), so this "
                    "gateway builds no learning pipeline; a tenant override cannot switch "
                    "it on. Enable it in the config and restart.",
                    code="learning_unavailable")

    def _merge(self, tenant: str, overrides: Mapping[str, Any]) -> TenantConfig:
        sections: dict[str, dict[str, Any]] = {"learning": {}, "memory": {}}
        for name, value in overrides.items():
            section, field_name = name.split(".", 1)
            # An extending setting: config.yaml's value first, then the tenant's.
            base = getattr(getattr(self._settings, section), field_name) \
                if name in EXTENDING else None
            sections[section][field_name] = value if base is None else [*base, *value]
        learning = _rebuild(self._settings.learning, sections["learning"], "learning")
        memory = _rebuild(self._settings.memory, sections["memory"], "memory")
        model = learning.model
        names = {d.model_name for d in self._settings.model_list}
        if "model" in sections["learning"] and model and model not in names:
            raise InvalidRequestError(
                f"learning.model '{model}' is not a model_name in model_list (known: "
                f"{', '.join(sorted(names)) or 'none'}).", param="learning.model",
                code="invalid_value")
        return TenantConfig(tenant=tenant, learning=learning, memory=memory,
                            overrides=dict(overrides))

    def _remember(self, tenant: str, config: TenantConfig, now: float) -> None:
        self._cache.pop(tenant, None)
        self._cache[tenant] = (now, config)
        while len(self._cache) > MAX_CACHED_TENANTS:
            self._cache.pop(next(iter(self._cache)))


def _rebuild(base: Any, changes: dict[str, Any], section: str) -> Any:
    """``base`` (a settings section) with ``changes``, validated as at startup."""
    if not changes:
        return base
    data = {**base.model_dump(), **changes}
    try:
        return type(base).model_validate(data)
    except ValidationError as exc:
        raise invalid_value(exc, data, prefix=section) from exc
