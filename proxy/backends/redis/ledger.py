""":class:`~proxy.ledger.Ledger` on Redis: aggregate counters, no rows.

Each usage or learning record adds (``HINCRBY``) to two hashes: the user's
(``<prefix>:usage:{u…}`` / ``<prefix>:learning:{u…}``, in the user's hash slot — see
:mod:`proxy.backends.redis.keys`) and the tenant's (``…:{t…}``). Records without a user count
for the tenant only. Fields: ``requests``, ``prompt_tokens``, ``completion_tokens`` and,
for usage, ``memory_tokens``, ``memories_injected`` and ``estimated`` (records whose
tokens were estimated). Totals are therefore O(1) to read, at the cost of the per-request
history the SQLite ledger keeps. One flush is one pipeline (not a transaction: the two
hashes live in different slots); a failure raises
:class:`~proxy.memory.store.StoreUnavailableError`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from redis.asyncio import Redis

from proxy.backends.redis.client import require_resp2_bytes, unavailable_on_redis_error
from proxy.backends.redis.keys import KeyLayout, tenant_token, user_token
from proxy.ledger import LearningUsage, Totals, UsageRecord


class RedisLedger:
    """Usage and learning ledgers as counters in Redis (module docstring)."""

    def __init__(self, client: Redis, *, key_prefix: str = "mp") -> None:
        require_resp2_bytes(client)
        self._redis = client
        self._keys = KeyLayout(key_prefix)

    def _owners(self, tenant: str, user: str | None) -> list[str]:
        tokens = [tenant_token(tenant)]
        if user is not None:
            tokens.append(user_token(tenant, user))
        return tokens

    async def _add(self, sums: dict[str, Counter[str]]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, fields in sums.items():
                for name, amount in fields.items():
                    pipe.hincrby(key, name, amount)
            await pipe.execute()

    async def record_usage(self, records: Sequence[UsageRecord]) -> None:
        if not records:
            return
        sums: dict[str, Counter[str]] = {}
        for r in records:
            for token in self._owners(r.tenant, r.user_id):
                sums.setdefault(self._keys.usage(token), Counter()).update({
                    "requests": 1, "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens,
                    "memory_tokens": r.memory_tokens,
                    "memories_injected": r.memories_injected, "estimated": int(r.estimated),
                })
        with unavailable_on_redis_error("usage ledger write"):
            await self._add(sums)

    async def record_learning(self, records: Sequence[LearningUsage]) -> None:
        if not records:
            return
        sums: dict[str, Counter[str]] = {}
        for r in records:
            for token in self._owners(r.tenant, r.user_id):
                sums.setdefault(self._keys.learning(token), Counter()).update({
                    "requests": 1, "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens,
                })
        with unavailable_on_redis_error("learning ledger write"):
            await self._add(sums)

    async def _totals(self, key: str) -> Totals:
        with unavailable_on_redis_error("ledger read"):
            raw = await self._redis.hmget(key, ["requests", "prompt_tokens",
                                                "completion_tokens", "memory_tokens"])
        values = [int(v) if v is not None else 0 for v in raw]
        return Totals(values[0], values[1], values[2], values[3])

    async def usage_totals(self, tenant: str, user: str | None = None) -> Totals:
        token = tenant_token(tenant) if user is None else user_token(tenant, user)
        return await self._totals(self._keys.usage(token))

    async def learning_totals(self, tenant: str, user: str | None = None) -> Totals:
        token = tenant_token(tenant) if user is None else user_token(tenant, user)
        return await self._totals(self._keys.learning(token))

    async def erase_user(self, tenant: str, user: str) -> None:
        token = user_token(tenant, user)
        with unavailable_on_redis_error("ledger erase"):
            await self._redis.unlink(self._keys.usage(token), self._keys.learning(token))
