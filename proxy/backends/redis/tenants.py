"""A tenant's records on Redis: the admin's setting overrides (one JSON string) and the
versions of admin-edited learning prompts (a list, oldest first; version = position + 1).

Errors are the caller's to translate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from proxy.backends.redis.client import multi, transact
from proxy.backends.redis.keys import KeyLayout, tenant_token
from proxy.memory.records import from_iso, to_iso
from proxy.memory.store import PromptVersion


class TenantRecords:
    """Setting overrides and prompt versions of tenants."""

    def __init__(self, client: Redis, layout: KeyLayout) -> None:
        self._redis = client
        self._keys = layout

    async def get_settings(self, tenant: str) -> dict[str, object]:
        raw = await self._redis.get(self._keys.tenant_settings(tenant_token(tenant)))
        return {} if raw is None else dict(orjson.loads(raw))

    async def put_settings(self, tenant: str, overrides: Mapping[str, object]) -> None:
        await self._redis.set(self._keys.tenant_settings(tenant_token(tenant)),
                              orjson.dumps(dict(overrides)))

    async def change_settings(
        self, tenant: str, change: Callable[[dict[str, object]], dict[str, object]]
    ) -> tuple[dict[str, object], dict[str, object]]:
        """``change`` applied to the stored overrides under ``WATCH`` (run again when
        another writer changed them first, see :func:`~proxy.backends.redis.client.transact`);
        returns ``(before, after)``."""
        key = self._keys.tenant_settings(tenant_token(tenant))

        async def body(pipe: Pipeline) -> tuple[dict[str, object], dict[str, object]]:
            raw = await pipe.get(key)
            before: dict[str, object] = {} if raw is None else dict(orjson.loads(raw))
            after = change(dict(before))
            multi(pipe)
            pipe.set(key, orjson.dumps(dict(after)))
            await pipe.execute()
            return before, after

        return await transact(self._redis, [key], body)

    async def save_prompt(self, tenant: str, kind: str, *, text: str, actor: str,
                          at: datetime) -> PromptVersion:
        """Append the next version of the tenant's ``kind`` prompt."""
        entry = orjson.dumps({"text": text, "actor": actor, "at": to_iso(at)})
        version = await self._redis.rpush(self._keys.prompts(tenant_token(tenant), kind),
                                          entry)
        return PromptVersion(tenant=tenant, kind=kind, version=int(version),  # type: ignore[arg-type]
                             text=text, actor=actor, at=at)

    async def prompt_versions(self, tenant: str, kind: str, *,
                              limit: int) -> list[PromptVersion]:
        """The tenant's ``limit`` latest versions of the ``kind`` prompt, newest first."""
        key = self._keys.prompts(tenant_token(tenant), kind)
        total = int(await self._redis.llen(key))
        raw = await self._redis.lrange(key, max(0, total - limit), total - 1)
        out = []
        for offset, item in enumerate(raw):
            data = orjson.loads(item)
            at = from_iso(data["at"])
            assert at is not None
            out.append(PromptVersion(tenant=tenant, kind=kind,  # type: ignore[arg-type]
                                     version=max(0, total - limit) + offset + 1,
                                     text=data["text"], actor=data["actor"], at=at))
        return out[::-1]
