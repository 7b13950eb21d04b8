""""Forget me" (``DELETE /v1/me``): erasure time on SQLite and Redis side by side.

What it does
    1. On each backend, builds one user's full footprint: ``--memories`` (500, the per-user
       quota) memories with 384-dimension vectors, a retired tenth of them,
       evidence for each, ten deletion tombstones, a profile, conversation records with
       summaries, display-name bindings, usage and learning rows — beside
       ``--others`` other users of the same tenant with as many memories each.
    2. Fills a large audit log: ``--audit`` events (100 000) spread over the tenant's
       other users plus ``--own-audit`` (2 000) events of the erased user, interleaved,
       so that the tenant-wide log (Redis: the tenant stream) must be searched through.
    3. Baseline: times ``clear()`` (``DELETE /v1/memories?confirm=true``, memories and
       profile only) on that footprint; refills; then times what ``DELETE /v1/me`` does
       in the store and ledgers: ``MemoryStore.erase_user`` + ``Ledger.erase_user``.
       ``--runs`` (3) rounds; prints each time and the median beside the target.
    4. Checks the erasure is complete (nothing listed, no profile, one audit event left,
       usage zero) and that the other users kept every memory.

Target (docs/design.md#deletion): 500 memories erased in < 1 s on both backends, also with a large
audit log. The Redis store runs on a private server started from the test extra's wheels
(tests/redis_server.py) unless ``--redis-url`` names one (keys under a fresh prefix,
removed afterwards).

    .venv/bin/python bench/erasure.py [--memories 500] [--audit 100000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.store_latency import sentence, unit  # noqa: E402
from proxy.backends.sqlite.database import SqliteDatabase  # noqa: E402
from proxy.backends.sqlite.ledger import SqliteLedger  # noqa: E402
from proxy.backends.sqlite.store import SqliteMemoryStore  # noqa: E402
from proxy.ledger import LearningUsage, Ledger, UsageRecord  # noqa: E402
from proxy.memory.records import ConversationRecord, Memory, Profile, ScoredTag  # noqa: E402
from proxy.memory.store import AuditEvent, ChangeSet, ListQuery, MemoryStore  # noqa: E402

TENANT = "bench"
VICTIM = "user-erased"
T0 = datetime(2025, 1, 1, tzinfo=UTC)
TARGET_SECONDS = 1.0


def memories_of(user: str, n: int, dim: int, seed: int) -> list[Memory]:
    rng = random.Random(f"{seed}:{user}")
    vectors = np.random.default_rng(abs(hash((seed, user))) % 2**32)
    out = []
    for i in range(n):
        at = T0 + timedelta(minutes=i)
        retired = i % 10 == 9
        out.append(Memory(
            id=f"{uuid.uuid4().hex[:6]}{i:020d}", tenant=TENANT, user_id=user,
            content=sentence(rng), title=sentence(rng)[:30], hits=rng.randint(1, 6),
            score=rng.random(), created_at=at, updated_at=at, last_seen_at=at,
            embedding=unit(vectors, dim), enabled=not retired,
            superseded_at=at if retired else None,
            superseded_by=None, supersede_reason="contradicted" if retired else None,
        ))
    return out


async def footprint(store: MemoryStore, ledger: Ledger, user: str, n: int, *, dim: int,
                    seed: int) -> None:
    """Everything a long-time user leaves behind (see the module docstring)."""
    memories = memories_of(user, n, dim, seed)
    for start in range(0, n, 250):
        chunk = memories[start:start + 250]
        await store.apply(ChangeSet(
            tenant=TENANT, user_id=user, batch_key=f"fill-{user}-{start}-{uuid.uuid4()}",
            upserts=tuple(chunk), evidence=tuple((m.id, f"ev-{m.id}") for m in chunk),
            conversation=ConversationRecord(tenant=TENANT, user_id=user,
                                            conversation_id=f"conv-{start}",
                                            learned_messages=5, summary="talked a lot"),
            profile=Profile(tenant=TENANT, user_id=user, names=("Ana",), style="terse",
                            traits=(ScoredTag("curious", 0.8, 3, T0),))))
    extra = memories_of(user, 10, dim, seed + 1)
    for memory in extra:  # ten deleted memories leave tombstones
        await store.add(memory)
        await store.delete(TENANT, user, memory.id)
    await store.bind_names(TENANT, user, ["Ana", "Ana B."])
    await ledger.record_usage([UsageRecord(at=T0, tenant=TENANT, user_id=user, model="m",
                                           prompt_tokens=100, completion_tokens=20,
                                           memory_tokens=30, memories_injected=3)] * 50)
    await ledger.record_learning([LearningUsage(at=T0, tenant=TENANT, user_id=user,
                                                model="m", purpose="extract",
                                                prompt_tokens=500,
                                                completion_tokens=80)] * 20)


async def audit_log(store: MemoryStore, others: list[str], total: int, own: int) -> float:
    started = time.perf_counter()
    every = max(1, total // max(own, 1))
    batch: list[AuditEvent] = []
    written_own = 0
    for i in range(total + own):
        mine = written_own < own and (total == 0 or i % (every + 1) == 0)
        written_own += mine
        batch.append(AuditEvent(
            tenant=TENANT, user_id=VICTIM if mine else others[i % len(others)],
            action="extracted", actor="auto", at=T0 + timedelta(seconds=i),
            memory_id=f"m{i}", reason="learned from a conversation",
            detail={"batch": f"b{i // 20}"}))
        if len(batch) == 5_000:
            await store.audit(batch)
            batch = []
    await store.audit(batch)
    return time.perf_counter() - started


async def timed(action: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await action()
    return time.perf_counter() - started


async def run_backend(name: str, store: MemoryStore, ledger: Ledger,
                      args: argparse.Namespace) -> dict[str, list[float]]:
    others = [f"user-{i}" for i in range(args.others)]
    started = time.perf_counter()
    for other in others:
        await footprint(store, ledger, other, args.memories, dim=args.dim, seed=args.seed)
    seconds = await audit_log(store, others, args.audit, args.own_audit)
    print(f"{name}: {len(others)} other users filled in "
          f"{time.perf_counter() - started - seconds:.1f} s, audit log of "
          f"{args.audit + args.own_audit:,} events in {seconds:.1f} s", flush=True)
    out: dict[str, list[float]] = {"clear() baseline": [], "erase_user": []}
    for run in range(args.runs):
        await footprint(store, ledger, VICTIM, args.memories, dim=args.dim,
                        seed=args.seed + run)
        out["clear() baseline"].append(await timed(lambda: store.clear(TENANT, VICTIM)))
        await footprint(store, ledger, VICTIM, args.memories, dim=args.dim,
                        seed=args.seed + run)
        await audit_log(store, others, 0, args.own_audit)

        async def erase() -> None:
            await ledger.erase_user(TENANT, VICTIM)
            await store.erase_user(TENANT, VICTIM, audit=AuditEvent(
                tenant=TENANT, user_id=VICTIM, action="erased", actor="user",
                at=datetime.now(UTC)))

        out["erase_user"].append(await timed(erase))
        left = await store.list_memories(ListQuery(tenant=TENANT, user=VICTIM,
                                                   include_retired=True))
        events = await store.audit_log(TENANT, VICTIM, limit=10)
        tenant_events = [e for _, e in await store.audit_log(TENANT, None, limit=50_000)
                         if e.user_id == VICTIM]
        assert not left, f"{name}: {len(left)} memories left"
        assert await store.get_profile(TENANT, VICTIM) is None
        assert [e.action for _, e in events] == ["erased"], events
        assert [e.action for e in tenant_events] == ["erased"], len(tenant_events)
        assert (await ledger.usage_totals(TENANT, VICTIM)).requests == 0
        kept = await store.list_memories(ListQuery(tenant=TENANT, user=others[0],
                                                   include_retired=True, limit=10_000))
        assert len(kept) == args.memories, f"{name}: another user lost memories"
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=500)
    parser.add_argument("--others", type=int, default=10)
    parser.add_argument("--audit", type=int, default=100_000)
    parser.add_argument("--own-audit", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    args = parser.parse_args()

    from proxy.backends.redis.client import connect
    from proxy.backends.redis.ledger import RedisLedger
    from proxy.backends.redis.store import RedisMemoryStore
    from tests.redis_server import RedisServer, purge_prefix

    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or (server.url if server else "")
    prefix = "bench" + uuid.uuid4().hex[:6]
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with SqliteDatabase(Path(tmp) / "bench.db") as db:
                results["sqlite"] = await run_backend(
                    "sqlite", SqliteMemoryStore(db), SqliteLedger(db), args)
            async with connect(url) as client:
                store = RedisMemoryStore(client, key_prefix=prefix, vector_dim=args.dim)
                await store.prepare()
                results["redis"] = await run_backend(
                    "redis", store, RedisLedger(client, key_prefix=prefix), args)
    finally:
        if args.redis_url:
            purge_prefix(url, prefix)
        if server is not None:
            server.stop()

    print(f"\nerasure of one user: {args.memories} memories (+vectors dim {args.dim}, "
          f"evidence, tombstones, profile, conversations, names, usage), audit log of "
          f"{args.audit + args.own_audit:,} tenant events ({args.own_audit:,} the user's); "
          f"seconds per run, median; target < {TARGET_SECONDS:.1f} s")
    for operation in ("clear() baseline", "erase_user"):
        for name, by_op in results.items():
            runs = by_op[operation]
            print(f"{name:7} {operation:18} "
                  f"{' '.join(f'{s:6.3f}' for s in runs)}   median {statistics.median(runs):6.3f}"
                  + ("" if operation != "erase_user" else
                     ("   OK" if statistics.median(runs) < TARGET_SECONDS else "   OVER")))


if __name__ == "__main__":
    asyncio.run(main())
