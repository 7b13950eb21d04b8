"""Recall latency of ``MemoryStore.search()``: SQLite and Redis side by side.

What it does
    1. Builds the same synthetic memories for both backends: ``--users`` users with
       ``--per-user`` memories each (defaults 200 × 500 = 100k, the per-user quota,
       docs/design.md#quotas), sentences of mixed English and Chinese words from a fixed
       vocabulary, each with a random unit vector of ``--dim`` (384) dimensions.
    2. Phase "500/user": only the first user's memories are stored; phase "100k": all
       of them. After each fill the store runs ``maintain()``, as the gateway does at
       start and every ``storage.index_maintenance_seconds`` (SQLite: FTS5 segments merged;
       the time is printed). In each phase it times ``--queries`` (300) calls of
       ``search()`` for random users: keyword-only (3–6 query terms), and keyword +
       vector (the query's vector is precomputed: embedding time is excluded). Also the
       whole hot-path recall (search + resident + get_profile, concurrently, as
       MemoryService does).
    3. Checks that both backends rank alike: for each keyword query, the share of SQLite's
       top 5 (by BM25) that Redis also has in its top 5.
    4. Prints p50 / p99 / max in milliseconds per backend — twice: as the process is, and
       after ``gc.freeze()``. The p99 of a process that holds jieba's dictionary is set by
       CPython's full garbage collections (~5-10 ms each, every few hundred queries);
       freezing the startup objects out of the collector removes most of that pause.

The Redis store runs on a private server started from the test extra's wheels
(tests/redis_server.py) unless ``--redis-url`` names one (its keys go under a fresh
prefix and are removed afterwards). Each store is used from one asyncio task, queries one
at a time, as one gateway request would. Target: p99 ≤ 10 ms.

    .venv/bin/python bench/store_latency.py [--users 200] [--per-user 500] [--queries 300]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.backends.sqlite.database import SqliteDatabase  # noqa: E402
from proxy.backends.sqlite.store import SqliteMemoryStore  # noqa: E402
from proxy.memory.records import Memory  # noqa: E402
from proxy.memory.store import ChangeSet, MemoryStore, SearchQuery  # noqa: E402
from proxy.memory.text import query_terms, warm_up  # noqa: E402

TENANT = "bench"
T0 = datetime(2025, 1, 1, tzinfo=UTC)
WORDS_EN = (  # noqa: SIM905 - a vocabulary reads better as text
    "coffee tea morning running marathon mountain river city garden bees chess piano "
    "guitar python rust kubernetes database redis sqlite cache latency deploy cluster "
    "invoice customer contract meeting project deadline team manager engineer design "
    "review budget travel lisbon kyoto porto berlin hiking cycling swimming yoga dog cat "
    "allergy peanut vegetarian sushi pasta wine beer birthday daughter son wife husband "
    "school exam physics history novel movie jazz concert museum photography camera "
    "weekend holiday flight hotel train bicycle car apartment rent mortgage salary bonus "
    "release incident outage migration schema index vector search keyword ranking memory"
).split()
WORDS_ZH = (  # noqa: SIM905 - same
    "咖啡 绿茶 早上 跑步 马拉松 爬山 河边 城市 花园 蜜蜂 象棋 钢琴 吉他 数据库 缓存 部署 集群 "
    "客户 合同 会议 项目 截止 团队 经理 工程师 设计 预算 旅行 上海 北京 深圳 杭州 徒步 骑行 游泳 "
    "瑜伽 小狗 小猫 过敏 花生 素食 寿司 面条 生日 女儿 儿子 学校 考试 物理 历史 小说 电影 音乐会 "
    "博物馆 摄影 周末 假期 航班 酒店 火车 公寓 房租 工资 奖金 发布 故障 迁移 索引 向量 检索 排序"
).split()


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS_ZH if rng.random() < 0.3 else WORDS_EN)
             for _ in range(rng.randint(6, 14))]
    return " ".join(words).capitalize()


def unit(rng: np.random.Generator, dim: int) -> tuple[float, ...]:
    v = rng.standard_normal(dim).astype(np.float32)
    return tuple((v / np.linalg.norm(v)).tolist())


def user_memories(user: int, per_user: int, dim: int, seed: int) -> list[Memory]:
    rng = random.Random(seed * 1_000_003 + user)
    vectors = np.random.default_rng(seed * 7 + user)
    out = []
    for i in range(per_user):
        at = T0 + timedelta(minutes=i)
        out.append(Memory(
            id=f"{user:06d}{i:020d}", tenant=TENANT, user_id=f"user-{user}",
            content=sentence(rng), title=sentence(rng)[:30], hits=rng.randint(1, 6),
            score=rng.random(), created_at=at, updated_at=at, last_seen_at=at,
            embedding=unit(vectors, dim),
        ))
    return out


async def fill(store: MemoryStore, users: range, per_user: int, dim: int, seed: int) -> float:
    started = time.perf_counter()
    for user in users:
        memories = user_memories(user, per_user, dim, seed)
        for start in range(0, per_user, 250):  # one apply (one transaction) per 250
            await store.apply(ChangeSet(tenant=TENANT, user_id=f"user-{user}",
                                        batch_key=f"fill-{user}-{start}",
                                        upserts=tuple(memories[start:start + 250])))
    return time.perf_counter() - started


@dataclass(frozen=True)
class Probe:
    user: str
    terms: tuple[str, ...]
    vector: tuple[float, ...]


def probes(n: int, users: int, dim: int, seed: int) -> list[Probe]:
    rng = random.Random(seed)
    vectors = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        text = " ".join(rng.choice(WORDS_ZH if rng.random() < 0.3 else WORDS_EN)
                        for _ in range(rng.randint(3, 6)))
        out.append(Probe(f"user-{rng.randrange(users)}", tuple(query_terms(text)),
                         unit(vectors, dim)))
    return out


async def timed(calls: Sequence[Callable[[], Awaitable[object]]]) -> list[float]:
    for call in calls[:20]:  # warm-up: connections, caches, jieba
        await call()
    out = []
    for call in calls:
        started = time.perf_counter()
        await call()
        out.append((time.perf_counter() - started) * 1000)
    return out


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{statistics.median(ordered):7.2f} {p99:7.2f} {ordered[-1]:7.2f}"


async def measure(store: MemoryStore, found: list[Probe]) -> dict[str, list[float]]:
    def search(p: Probe, vector: bool) -> Callable[[], Awaitable[object]]:
        return lambda: store.search(SearchQuery(
            tenant=TENANT, user=p.user, terms=p.terms, limit=30,
            embedding=p.vector if vector else None))

    def recall(p: Probe) -> Callable[[], Awaitable[object]]:
        async def run() -> object:
            return await asyncio.gather(
                store.search(SearchQuery(tenant=TENANT, user=p.user, terms=p.terms,
                                         limit=30, embedding=p.vector)),
                store.resident(TENANT, p.user, limit=6, channels=None),
                store.get_profile(TENANT, p.user))
        return run

    return {
        "search, keyword": await timed([search(p, False) for p in found]),
        "search, keyword+vector": await timed([search(p, True) for p in found]),
        "recall (search+resident+profile)": await timed([recall(p) for p in found]),
    }


async def top5_agreement(stores: dict[str, MemoryStore], found: list[Probe]) -> float:
    """Mean share of SQLite's keyword top 5 that Redis also ranks in its top 5."""
    shares = []
    for p in found:
        tops = []
        for store in (stores["sqlite"], stores["redis"]):
            hits = await store.search(SearchQuery(tenant=TENANT, user=p.user, terms=p.terms,
                                                  limit=5))
            tops.append({c.memory.id for c in hits if c.keyword_rank is not None})
        if tops[0]:
            shares.append(len(tops[0] & tops[1]) / len(tops[0]))
    return statistics.mean(shares) if shares else 1.0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--per-user", type=int, default=500)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    args = parser.parse_args()
    warm_up()

    from proxy.backends.redis.client import connect
    from proxy.backends.redis.store import RedisMemoryStore
    from tests.redis_server import RedisServer, purge_prefix

    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or (server.url if server else "")
    prefix = "bench" + uuid.uuid4().hex[:6]
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with SqliteDatabase(Path(tmp) / "bench.db") as db, connect(url) as client:
                redis_store = RedisMemoryStore(client, key_prefix=prefix, vector_dim=args.dim)
                await redis_store.prepare()
                stores: dict[str, MemoryStore] = {"sqlite": SqliteMemoryStore(db),
                                                  "redis": redis_store}
                total = args.users * args.per_user
                phases = [(f"{args.per_user}/user, 1 user", range(1), 1),
                          (f"{total:,} in store", range(1, args.users), args.users)]
                agreement: dict[str, float] = {}
                for phase, fill_users, query_users in phases:
                    for name, store in stores.items():
                        seconds = await fill(store, fill_users, args.per_user, args.dim,
                                             args.seed)
                        started = time.perf_counter()
                        await store.maintain()  # as the gateway does at start, then hourly
                        print(f"filled {name:6} for '{phase}' in {seconds:6.1f} s, index "
                              f"maintenance {time.perf_counter() - started:5.2f} s",
                              flush=True)
                        found = probes(args.queries, query_users, args.dim, args.seed)
                        results.setdefault(phase, {})[name] = await measure(store, found)
                        gc.collect()
                        gc.freeze()
                        frozen = await measure(store, found)
                        gc.unfreeze()
                        results.setdefault(phase + ", gc frozen", {})[name] = frozen
                    agreement[phase] = await top5_agreement(
                        stores, probes(args.queries, query_users, args.dim, args.seed))
    finally:
        if args.redis_url:
            purge_prefix(url, prefix)
        if server is not None:
            server.stop()

    for phase, share in agreement.items():
        print(f"keyword top-5 agreement, redis vs sqlite, {phase}: {share:.1%}")
    print(f"\nsearch() latency, ms (p50 / p99 / max over {args.queries} sequential "
          f"queries; limit 30; vectors dim {args.dim}; embedding time excluded)")
    print(f"{'store size':34} {'operation':34} {'sqlite':>23}   {'redis':>23}")
    for phase, by_store in results.items():
        for operation in by_store["sqlite"]:
            print(f"{phase:34} {operation:34} {summary(by_store['sqlite'][operation])}   "
                  f"{summary(by_store['redis'][operation])}")


if __name__ == "__main__":
    asyncio.run(main())
