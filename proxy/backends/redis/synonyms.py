"""Candidate synonyms on Redis (:class:`~proxy.memory.synonyms.SynonymStore`), all under the
tenant's hash tag: ``P:syn:{t…}`` (candidate id → JSON of its words, status and times),
``P:synobs:{t…}:<id>`` (user namespace → JSON of that user's count and newest examples,
changed under ``WATCH``) and ``P:synu:{t…}:<ns>`` (the candidates a user observed, so
erasure needs no scan). Errors are the caller's to translate.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from proxy.backends.redis.client import multi, transact
from proxy.backends.redis.keys import KeyLayout, tenant_token, user_token
from proxy.memory.records import from_iso, to_iso
from proxy.memory.synonyms import (
    EXAMPLES_LISTED,
    EXAMPLES_PER_USER,
    MAX_CANDIDATES,
    SynonymCandidate,
    SynonymExample,
    SynonymStatus,
    candidate_id,
    example_from_json,
    example_to_json,
    newest,
)


class SynonymRecords:
    """A tenant's candidate synonyms and its users' observations of them."""

    def __init__(self, client: Redis, layout: KeyLayout) -> None:
        self._redis = client
        self._keys = layout

    async def count(self, tenant: str, user: str, examples: Sequence[SynonymExample]) -> None:
        tok, ns = tenant_token(tenant), user_token(tenant, user)
        table = self._keys.synonyms(tok)
        for example in examples:
            cid = candidate_id(example.words)
            if not await self._redis.hexists(table, cid):
                if await self._redis.hlen(table) >= MAX_CANDIDATES:
                    continue
                await self._redis.hsetnx(
                    table,
                    cid,
                    orjson.dumps(
                        {
                            "words": list(example.words),
                            "status": "open",
                            "created_at": to_iso(example.at),
                        }
                    ),
                )
            await self._observe(tok, ns, cid, example)

    async def _observe(self, tok: str, ns: str, cid: str, example: SynonymExample) -> None:
        key = self._keys.synonym_observations(tok, cid)

        async def body(pipe: Pipeline) -> None:
            raw = await pipe.hget(key, ns)
            mine: dict[str, Any] = (
                {"count": 0, "examples": []} if raw is None else orjson.loads(raw)
            )
            kept = [example_from_json(e) for e in mine["examples"]]
            multi(pipe)
            pipe.hset(
                key,
                ns,
                orjson.dumps(
                    {
                        "count": int(mine["count"]) + 1,
                        "updated_at": to_iso(example.at),
                        "examples": [
                            example_to_json(e) for e in newest([*kept, example], EXAMPLES_PER_USER)
                        ],
                    }
                ),
            )
            pipe.sadd(self._keys.synonyms_of(tok, ns), cid)
            await pipe.execute()

        await transact(self._redis, [key], body)

    async def candidates(
        self, tenant: str, *, status: SynonymStatus | None, limit: int
    ) -> list[SynonymCandidate]:
        tok = tenant_token(tenant)
        table = {
            k.decode() if isinstance(k, bytes) else k: orjson.loads(v)
            for k, v in (await self._redis.hgetall(self._keys.synonyms(tok))).items()
        }
        chosen = [
            (cid, data) for cid, data in table.items() if status is None or data["status"] == status
        ]
        async with self._redis.pipeline(transaction=False) as pipe:
            for cid, _ in chosen:
                pipe.hvals(self._keys.synonym_observations(tok, cid))
            observed = await pipe.execute()
        out = [
            _candidate(tenant, cid, data, [orjson.loads(v) for v in values])
            for (cid, data), values in zip(chosen, observed, strict=True)
        ]
        out.sort(key=lambda c: (-c.count, -c.updated_at.timestamp(), c.id))
        return out[:limit]

    async def decide(
        self, tenant: str, candidate: str, *, status: SynonymStatus, actor: str, at: datetime
    ) -> SynonymCandidate | None:
        tok = tenant_token(tenant)
        table = self._keys.synonyms(tok)

        async def body(pipe: Pipeline) -> bool:
            raw = await pipe.hget(table, candidate)
            if raw is None:
                return False
            data = {
                **orjson.loads(raw),
                "status": status,
                "decided_at": to_iso(at),
                "decided_by": actor,
            }
            multi(pipe)
            pipe.hset(table, candidate, orjson.dumps(data))
            await pipe.execute()
            return True

        if not await transact(self._redis, [table], body):
            return None
        found = [
            c
            for c in await self.candidates(tenant, status=status, limit=MAX_CANDIDATES)
            if c.id == candidate
        ]
        return found[0] if found else None

    async def erase_user(self, tenant: str, user: str) -> None:
        """Remove the user's observations, then each candidate they held that nobody else
        observes."""
        tok, ns = tenant_token(tenant), user_token(tenant, user)
        mine_key = self._keys.synonyms_of(tok, ns)
        mine = [
            c.decode() if isinstance(c, bytes) else c for c in await self._redis.smembers(mine_key)
        ]
        async with self._redis.pipeline(transaction=True) as pipe:
            for cid in mine:
                key = self._keys.synonym_observations(tok, cid)
                pipe.hdel(key, ns)
                pipe.hlen(key)
            pipe.unlink(mine_key)
            replies = await pipe.execute()
        left = replies[1:-1:2]
        orphans = [cid for cid, n in zip(mine, left, strict=True) if int(n) == 0]
        if orphans:
            await self._redis.hdel(self._keys.synonyms(tok), *orphans)


def _candidate(
    tenant: str, cid: str, data: dict[str, Any], observations: list[dict[str, Any]]
) -> SynonymCandidate:
    examples = [example_from_json(e) for o in observations for e in o["examples"]]
    created = from_iso(data["created_at"])
    assert created is not None
    seen = [at for o in observations if (at := from_iso(o.get("updated_at")))]
    return SynonymCandidate(
        id=cid,
        tenant=tenant,
        words=tuple(data["words"]),
        count=sum(int(o["count"]) for o in observations),
        examples=newest(examples, EXAMPLES_LISTED),
        status=data["status"],
        created_at=created,
        updated_at=max(seen, default=created),
        decided_at=from_iso(data.get("decided_at")),
        decided_by=data.get("decided_by"),
    )
