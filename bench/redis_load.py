"""Redis and SQLite under chat load with learning on: memory kept, errors, learning backlog.

Command (from the repository root)::

    .venv/bin/python -m bench.redis_load                 # 60 s per level, ~15 min
    .venv/bin/python -m bench.redis_load --seconds 20    # indicative, ~8 min

What runs (nothing pinned; the machine's cores are shared by everything below):

- a private ``redis-server`` with the Query Engine from the test extra's wheels
  (``tests/redis_server.py``), no persistence;
- the fake upstream of ``bench.gateway`` (``bench/gateway/fake_upstream.py``), which also
  answers the learning worker's scoring and extraction calls with JSON (every batch scores
  0.8 and yields one fact), so learning runs its whole pipeline at no model cost;
- per backend, as the Helm chart deploys it: one gateway, ``memory-proxy serve
  --no-worker``, and one learning worker, ``memory-proxy worker``, on the same storage
  (Redis: the store and its queue; SQLite: one file), learning on, every other setting at
  its default (so ``storage.redis_max_connections`` 64 and ``memory.recall_timeout_ms``);
- this process: the closed-loop load generator of ``bench/gateway/load.py``.

Workload: ``--users`` (40) users, each seeded before the gateway starts with
``--memories`` (100) memories and a profile (``bench/gateway/seed.py``'s vocabulary) through
the store API. Request ``n`` is user ``n mod 40``'s, a conversation of ten turns
(``X-Conversation-Id``), whose last user message is one of the 48 seeded questions with its
own ticket number (so every turn is new to learning). Half of the connections stream, half
do not. Each level (``--concurrency``, 32 and 64) runs ``--seconds`` (60), then the queue is
watched for ``--drain-seconds`` (180) or until it is empty and 60 s have passed.

Printed per backend and level:

- ``requests/s``: good replies ÷ wall time;
- ``with memory``: share of good replies whose ``X-Memory-Status`` was ``injected``;
- ``errors``: failed connections, non-200 answers, streams without ``data: [DONE]``,
  JSON replies without ``choices``, replies later than 30 s;
- ``no memory by reason``: the other replies by ``X-Memory-Status`` / ``X-Memory-Reason``;
- ``pool exhausted``: ``memory_proxy_store_pool_exhausted_total`` gained during the level;
- backlog: jobs ``ready`` + ``delayed`` + ``leased`` by kind from the gateway's
  ``memory_proxy_learning_queue_jobs{kind,state}`` at the end of the load and 60 s after,
  the dead letters beside, and the seconds until the queue held nothing.

Then the targets, met / NOT met: with Redis, at c=64, ≥ 99 % of replies carry memory and
none fails; with each backend and level the backlog is back to zero within 180 s of the
load's end; the same checks are printed for SQLite. Every process runs this checkout's
code (``-m proxy`` from the repository root), or with ``--tree DIR`` the gateway, the worker
and the seeding run the source tree DIR (``git archive <commit> | tar -x -C DIR``), for
figures of another commit from the same bench. Configs, logs and databases go to a temporary
directory (``--keep DIR`` keeps them there).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.gateway import load, procs, seed, targets, workload
from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.records import new_id
from proxy.memory.store import MemoryStore

USERS = 40
MEMORIES = 100  # per user
TURNS_PER_CONVERSATION = 10
MEMORY_TARGET = 0.99  # share of replies with memory at c=64 (the Redis target)
DRAIN_TARGET_SECONDS = 180.0  # the backlog is empty this long after the load at the latest
AFTER_SECONDS = 60.0  # the second backlog reading, this long after the load
POLL_SECONDS = 2.0
COMMAND_KINDS = 10  # the most frequent Redis commands printed per level
FINGERPRINT_KEY = "bench-fingerprint-key-0123456789abcdef0123456789abcdef"
BACKLOG_STATES = ("ready", "delayed", "leased")


@dataclass
class Level:
    """What one concurrency level of one backend measured."""

    concurrency: int
    result: load.LoadResult
    exhausted: float
    at_end: Counter[str]
    after: Counter[str]
    dead: float
    drained_after: float | None  # seconds from the load's end to an empty queue
    cpu: tuple[float, float]  # CPU seconds of the gateway and the worker during the load
    queued: float  # seconds the gateway's event loop was runnable but waited for a CPU
    redis_calls: Counter[str] | None  # Redis commands run during the load by command
    # (every client), or None


@dataclass
class Backend:
    name: str
    levels: list[Level] = field(default_factory=list)


def user_id(index: int) -> str:
    return f"{seed.USER}-{index:02d}"


async def seed_users(store: MemoryStore, users: int, memories: int) -> None:
    """``memories`` memories and a profile for each of ``users`` users in ``store``."""
    template = seed.build_memories(memories)
    profile = seed.build_profile()
    for index in range(users):
        user = user_id(index)
        for memory in template:
            await store.add(memory.with_changes(id=new_id(), user_id=user))
        await store.put_profile(replace(profile, user_id=user))


# Seeding runs in a process of its own whose ``proxy`` package is the tree's (imported
# before this checkout joins ``sys.path`` for ``bench``), so records match its codec.
_SEED = (
    "import sys; sys.path[:0] = [sys.argv[1]]; import proxy; sys.path.insert(0, sys.argv[2]);"
    " from bench.redis_load import seed_main; seed_main(sys.argv[3:])"
)


def seed_in(tree: Path, backend: str, target: str, users: int, memories: int) -> None:
    """Seed ``target`` (a Redis URL or a SQLite path) with the code of ``tree``."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            _SEED,
            str(tree),
            str(targets.ROOT),
            backend,
            target,
            str(users),
            str(memories),
        ],
        check=True,
        env={**os.environ, **targets.BASE_ENV},
    )


def seed_main(argv: list[str]) -> None:
    """``BACKEND TARGET USERS MEMORIES``: the seeding process (:data:`_SEED`)."""
    backend, target, users, memories = argv[0], argv[1], int(argv[2]), int(argv[3])
    if backend == "redis":
        asyncio.run(seed_redis(target, users, memories))
    else:
        asyncio.run(seed_sqlite(Path(target), users, memories))


async def seed_redis(url: str, users: int, memories: int) -> None:
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.store import RedisMemoryStore

    async with connect(url) as client:
        store = RedisMemoryStore(client, key_prefix="mp")
        await store.prepare()
        await seed_users(store, users, memories)


async def seed_sqlite(path: Path, users: int, memories: int) -> None:
    async with SqliteDatabase(path) as db:
        await seed_users(SqliteMemoryStore(db), users, memories)


def config(
    path: Path, *, port: int, upstream_port: int, storage: dict[str, object], tree: Path
) -> Path:
    """The gateway's and worker's config: the fake upstream, ``storage``, learning on (with
    a fingerprint key when ``tree``'s settings know the setting; older trees do not)."""
    base = yaml.safe_load(
        targets.gateway_config(
            path, port=port, upstream_port=upstream_port, db=path.with_suffix(".db")
        ).read_text()
    )
    base["storage"] = storage
    base["learning"] = {"enabled": True}
    if "fingerprint_key" in (tree / "proxy" / "settings" / "learning.py").read_text():
        base["learning"]["fingerprint_key"] = FINGERPRINT_KEY
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


def start(
    name: str, argv: list[str], *, port: int, logs: Path, tree: Path = targets.ROOT
) -> procs.Proc:
    """``argv`` run in ``tree`` (its code on ``PYTHONPATH``), not pinned to a core, output
    to ``logs/NAME.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tree,
            start_new_session=True,
            env={**os.environ, **targets.BASE_ENV, "PYTHONPATH": str(tree)},
        )
    return procs.Proc(name=name, port=port, popen=popen, log=log, started_at=time.perf_counter())


def payloads(port: int, *, first: int, count: int, users: int, stream: bool) -> list[bytes]:
    """Requests ``first`` … ``first + count - 1`` (module docstring: user, conversation,
    question with its ticket number)."""
    questions = seed.questions()
    out = []
    for n in range(first, first + count):
        user = user_id(n % users)
        question = f"{questions[n % len(questions)]} (ticket {n})"
        conversation = f"{user}-{'s' if stream else 'j'}{n // (users * TURNS_PER_CONVERSATION)}"
        body = workload.chat_body(question, stream=stream)
        out.append(
            load.build_request(
                port=port,
                path=workload.PATH,
                body=body,
                headers=[
                    ("authorization", f"Bearer {targets.CLIENT_KEY}"),
                    ("x-user-id", user),
                    ("x-conversation-id", conversation),
                ],
            )
        )
    return out


@dataclass(frozen=True)
class Reading:
    """One read of the gateway's ``/metrics``: learning jobs ``ready`` + ``delayed`` +
    ``leased`` by kind, dead letters, pool exhaustions so far."""

    backlog: Counter[str]
    dead: float
    exhausted: float


def parse_metrics(text: str) -> Reading | None:
    """The :class:`Reading` in a Prometheus text page, ``None`` when the page holds no
    ``memory_proxy_learning_queue_jobs`` sample (a failed or cut scrape: not "empty")."""
    backlog: Counter[str] = Counter()
    dead = exhausted = 0.0
    seen = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "memory_proxy_store_pool_exhausted_total":
                exhausted = sample.value
            elif sample.name == "memory_proxy_learning_queue_jobs":
                seen = True
                state = sample.labels.get("state")
                if state in BACKLOG_STATES:
                    backlog[sample.labels.get("kind", "?")] += int(sample.value)
                elif state == "dead":
                    dead += sample.value
    return Reading(backlog, dead, exhausted) if seen else None


async def scrape(port: int) -> Reading | None:
    """The gateway's :class:`Reading` now (``None`` when ``/metrics`` did not answer)."""
    text = (await load.get(port, "/metrics", reply_timeout=10.0)).decode(errors="replace")
    try:
        return parse_metrics(text)
    except ValueError:  # a page cut short
        return None


async def reading(port: int) -> Reading:
    """:func:`scrape` until the gateway answers (a minute at most)."""
    deadline = time.monotonic() + 60
    while (found := await scrape(port)) is None:
        if time.monotonic() > deadline:
            raise SystemExit("the gateway's /metrics did not answer for a minute")
        await asyncio.sleep(POLL_SECONDS)
    return found


async def ready(port: int, payload: bytes, proc: procs.Proc) -> None:
    deadline = time.monotonic() + 120
    while not await load.one_request(port, payload):
        if not proc.alive() or time.monotonic() > deadline:
            raise SystemExit(f"{proc.name} did not answer:\n{proc.tail()}")
        await asyncio.sleep(0.2)


async def run_level(
    port: int,
    concurrency: int,
    *,
    seconds: float,
    users: int,
    first: int,
    drain_seconds: float,
    after_seconds: float,
    pids: tuple[int, int],
    redis_url: str | None,
) -> Level:
    """Load at ``concurrency`` (half streaming) for ``seconds``, then watch the queue."""
    half = max(1, concurrency // 2)
    count = max(2000, int(seconds * 200))
    exhausted_before = (await reading(port)).exhausted
    cpu_before = [procs.cpu_seconds(pid) for pid in pids]
    queued_before = run_queue_seconds(pids[0])
    calls_before = redis_calls(redis_url)
    json_load, stream_load = await asyncio.gather(
        *(
            load.run_load(
                port=port,
                payloads=payloads(
                    port,
                    first=first + (count if stream else 0),
                    count=count,
                    users=users,
                    stream=stream,
                ),
                stream=stream,
                concurrency=half if stream else concurrency - half,
                requests=10**9,
                seconds=seconds,
            )
            for stream in (False, True)
        )
    )
    result = merge(json_load, stream_load)
    ended = time.monotonic()
    cpu = tuple(procs.cpu_seconds(pid) - was for pid, was in zip(pids, cpu_before, strict=True))
    queued = run_queue_seconds(pids[0]) - queued_before
    calls_after = redis_calls(redis_url)
    calls = None if calls_before is None or calls_after is None else calls_after - calls_before
    end = await reading(port)
    drained = 0.0 if not sum(end.backlog.values()) else None
    after: Counter[str] | None = None
    dead = end.dead
    while after is None or (drained is None and time.monotonic() - ended < drain_seconds):
        await asyncio.sleep(POLL_SECONDS)
        now = await scrape(port)
        if now is None:  # a scrape the loaded gateway did not answer: not a reading
            continue
        waited, dead = time.monotonic() - ended, now.dead
        if drained is None and not sum(now.backlog.values()):
            drained = waited
        if after is None and waited >= after_seconds:
            after = now.backlog
    return Level(
        concurrency=concurrency,
        result=result,
        exhausted=end.exhausted - exhausted_before,
        at_end=end.backlog,
        after=after,
        dead=dead,
        drained_after=drained,
        cpu=(cpu[0], cpu[1]),
        queued=queued,
        redis_calls=calls,
    )


def run_queue_seconds(pid: int) -> float:
    """Seconds the main thread of ``pid`` (the gateway's event loop) has spent runnable but
    waiting for a CPU (the second field of ``/proc/<pid>/schedstat``, ns): how starved of
    CPU it was on a shared machine."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def redis_calls(url: str | None) -> Counter[str] | None:
    """Commands the Redis at ``url`` has run, by command (``INFO commandstats``), ``None``
    without one."""
    if url is None:
        return None
    import redis

    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return Counter({name.removeprefix("cmdstat_"): int(entry["calls"])
                    for name, entry in stats.items()})


def merge(a: load.LoadResult, b: load.LoadResult) -> load.LoadResult:
    out = load.LoadResult(samples=a.samples + b.samples, wall=max(a.wall, b.wall))
    for part in (a, b):
        out.errors.update(part.errors)
        out.memory_status.update(part.memory_status)
        out.memory_reason.update(part.memory_reason)
    return out


@contextlib.asynccontextmanager
async def services(
    name: str, cfg: Path, port: int, logs: Path, tree: Path
) -> AsyncIterator[tuple[int, int]]:
    """The gateway (``serve --no-worker``) and the worker started from ``tree``; yields
    their pids once the gateway answers a chat."""
    proxy = [sys.executable, "-m", "proxy"]
    gateway = start(
        f"{name}-gateway",
        [*proxy, "serve", "--config", str(cfg), "--no-worker"],
        port=port,
        logs=logs,
        tree=tree,
    )
    worker = start(
        f"{name}-worker", [*proxy, "worker", "--config", str(cfg)], port=0, logs=logs, tree=tree
    )
    try:
        await ready(port, payloads(port, first=10**7, count=1, users=1, stream=False)[0], gateway)
        yield gateway.pid, worker.pid
    finally:
        for proc in (gateway, worker):
            proc.stop()
        if not worker.alive() and worker.popen.returncode not in (0, -15, None):
            print(
                f"note: {worker.name} ended with {worker.popen.returncode}:\n{worker.tail(10)}",
                flush=True,
            )


async def run_backend(
    name: str, args: argparse.Namespace, work: Path, upstream: procs.Proc, redis_url: str
) -> Backend:
    port = procs.free_port()
    if name == "redis":
        storage: dict[str, object] = {"backend": "redis", "url": redis_url}
        seed_in(args.tree, "redis", redis_url, args.users, args.memories)
    else:
        db = work / "sqlite.db"
        storage = {"backend": "sqlite", "path": str(db)}
        seed_in(args.tree, "sqlite", str(db), args.users, args.memories)
    cfg = config(
        work / f"{name}.yaml",
        port=port,
        upstream_port=upstream.port,
        storage=storage,
        tree=args.tree,
    )
    backend = Backend(name)
    async with services(name, cfg, port, work / "logs", args.tree) as pids:
        for index, concurrency in enumerate(args.concurrency):
            print(f"{name} c={concurrency}: {args.seconds:g} s of load …", flush=True)
            backend.levels.append(
                await run_level(
                    port,
                    concurrency,
                    seconds=args.seconds,
                    users=args.users,
                    first=index * 10**6,
                    drain_seconds=args.drain_seconds,
                    after_seconds=args.after_seconds,
                    pids=pids,
                    redis_url=redis_url if name == "redis" else None,
                )
            )
    return backend


def kinds(backlog: Counter[str]) -> str:
    total = sum(backlog.values())
    parts = ", ".join(f"{k} {v}" for k, v in sorted(backlog.items()) if v)
    return f"{total}" + (f" ({parts})" if parts else "")


def report(
    backends: list[Backend], *, seconds: float, after: float, load_avg: tuple[str, str]
) -> list[str]:
    lines = [
        f"load average (1 min) at start {load_avg[0]}, at end {load_avg[1]}; "
        f"{seconds:g} s per level",
        "",
    ]
    header = (
        f"{'backend':8} {'c':>3} {'req/s':>7} {'replies':>8} {'with memory':>12} "
        f"{'errors':>7} {'pool exh.':>9}  no memory by reason"
    )
    lines += [header, "-" * len(header)]
    for backend in backends:
        for lv in backend.levels:
            res = lv.result
            share = res.memory_status.get("injected", 0) / max(1, res.count)
            reasons = ", ".join(f"{k} {v}" for k, v in res.memory_reason.most_common()) or "-"
            lines.append(
                f"{backend.name:8} {lv.concurrency:>3} {res.count / res.wall:>7.1f} "
                f"{res.count:>8} {share:>11.1%} {sum(res.errors.values()):>7} "
                f"{lv.exhausted:>9.0f}  {reasons}"
            )
            if res.errors:
                lines.append(f"{'':13}errors: {dict(res.errors)}")
    lines += [
        "",
        f"{'backend':8} {'c':>3}  learning backlog at end of load / "
        f"{after:.0f} s after / dead letters / empty after",
    ]
    for backend in backends:
        for lv in backend.levels:
            empty = "never" if lv.drained_after is None else f"{lv.drained_after:.0f} s"
            lines.append(
                f"{backend.name:8} {lv.concurrency:>3}  {kinds(lv.at_end)} / "
                f"{kinds(lv.after)} / {lv.dead:.0f} / {empty}"
            )
    lines += [
        "",
        f"{'backend':8} {'c':>3}  gateway CPU ms/reply, event loop waiting for a CPU "
        "(share of the load's time), worker CPU s, Redis commands/reply (every client)",
    ]
    for backend in backends:
        for lv in backend.levels:
            calls = (
                "-" if lv.redis_calls is None
                else f"{lv.redis_calls.total() / max(1, lv.result.count):.1f}"
            )
            lines.append(
                f"{backend.name:8} {lv.concurrency:>3}  "
                f"{1000 * lv.cpu[0] / max(1, lv.result.count):.2f}, "
                f"{lv.queued / max(lv.result.wall, 1e-9):.0%}, {lv.cpu[1]:.1f}, {calls}"
            )
            if lv.redis_calls:
                top = ", ".join(f"{name} {n / max(1, lv.result.count):.1f}"
                                for name, n in lv.redis_calls.most_common(COMMAND_KINDS))
                lines.append(f"{'':13}Redis commands/reply by kind: {top}")
    return [*lines, "", "targets:", *verdicts(backends)]


def verdicts(backends: list[Backend]) -> list[str]:
    out = []
    for backend in backends:
        for lv in backend.levels:
            res = lv.result
            share = res.memory_status.get("injected", 0) / max(1, res.count)
            failed = sum(res.errors.values())
            if lv.concurrency == 64:
                met = share >= MEMORY_TARGET and failed == 0
                out.append(
                    f"  {backend.name} c=64: >= {MEMORY_TARGET:.0%} replies with memory "
                    f"and none failed ({share:.1%}, {failed} failed): "
                    f"{'met' if met else 'NOT met'}"
                )
            met = lv.drained_after is not None and lv.drained_after <= DRAIN_TARGET_SECONDS
            out.append(
                f"  {backend.name} c={lv.concurrency}: backlog back to zero within "
                f"{DRAIN_TARGET_SECONDS:.0f} s: {'met' if met else 'NOT met'}"
            )
    return out


async def main_async(args: argparse.Namespace) -> int:
    from tests.redis_server import RedisServer

    load_start = f"{os.getloadavg()[0]:.2f}"
    with contextlib.ExitStack() as stack:
        work = (
            Path(args.keep)
            if args.keep
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mp-redis-load-")))
        )
        work.mkdir(parents=True, exist_ok=True)
        server = RedisServer().start()
        stack.callback(server.stop)
        port = procs.free_port()
        upstream = start(
            "upstream",
            targets.upstream_argv(
                port=port, chunks=20, usage="auto", interval_ms=0.0, paced_ms=10.0
            ),
            port=port,
            logs=work / "logs",
        )
        stack.callback(upstream.stop)
        backends = [
            await run_backend(name, args, work, upstream, server.url) for name in args.backends
        ]
    lines = report(
        backends,
        seconds=args.seconds,
        after=args.after_seconds,
        load_avg=(load_start, f"{os.getloadavg()[0]:.2f}"),
    )
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="load per level")
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(v) for v in s.split(",")],
        default=[32, 64],
        help="levels, comma-separated",
    )
    parser.add_argument("--backends", type=lambda s: s.split(","), default=["redis", "sqlite"])
    parser.add_argument("--users", type=int, default=USERS)
    parser.add_argument("--memories", type=int, default=MEMORIES, help="per user")
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=DRAIN_TARGET_SECONDS,
        help="how long the queue is watched after each level at most",
    )
    parser.add_argument(
        "--after-seconds",
        type=float,
        default=AFTER_SECONDS,
        help="the second backlog reading, this long after each level",
    )
    parser.add_argument(
        "--tree",
        type=Path,
        default=targets.ROOT,
        help="run the gateway, worker and seeding from this source tree",
    )
    parser.add_argument("--keep", help="write configs, logs and databases here")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
