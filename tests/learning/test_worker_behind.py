"""A learning worker far behind maintenance (docs/design.md#batching): the queue holds at
most one idle flush per conversation whatever the backlog, exchange and learn jobs are
claimed before the flushes, the by-kind gauge shows the counts, and the backlog drains.

Maintenance runs many idle periods in a row while nobody claims: the runner's clock is
moved on by one ``idle_flush_seconds`` per run (the queue keeps the real clock).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from proxy.learning import runner as runner_module
from proxy.learning.sink import Turn
from proxy.routes.health import metrics
from tests.fakes import FakeUpstream, backend_overrides, make_settings
from tests.learning.test_worker_scaling import node, one_fact_per_user_line, queue_of, worker_of

USERS, CONVERSATIONS, PERIODS = 5, 6, 8  # 30 idle conversations, 8 idle periods


def turn(user: str, conversation: str, text: str, *, at: float) -> Turn:
    return Turn(tenant="t", user=user, conversation=conversation, channel="private",
                group=None, model="m", messages=[{"role": "user", "content": text}],
                reply="Noted.", at=at)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, object]:
    return backend_overrides(request, tmp_path)


async def test_a_worker_far_behind_holds_one_flush_per_conversation_and_catches_up(
    tmp_path: Path, backend: dict[str, object], monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_settings(tmp_path, **backend, learning={
        "enabled": True, "batch_messages": 5, "idle_flush_seconds": 1})
    upstream = FakeUpstream()
    upstream.extract = one_fact_per_user_line
    async with node(settings, upstream) as res:
        queue, worker = queue_of(res), worker_of(res)
        quiet = time.time() - 60
        for u in range(USERS):
            for c in range(CONVERSATIONS):
                res.sink.submit(turn(f"u{u}", f"c{c}", f"I keep a bee hive number {u}-{c}.",
                                     at=quiet))
        await res.sink.flush()
        assert await worker.drain() == USERS * CONVERSATIONS  # buffered, none sealed
        clock = [time.time()]
        monkeypatch.setattr(runner_module, "time", SimpleNamespace(time=lambda: clock[0]))
        for _ in range(PERIODS):  # the worker claims nothing meanwhile
            await worker.maintenance()
            clock[0] += 1
        counts = await queue.depth_by_kind()
        assert counts[("flush", "ready")] == USERS * CONVERSATIONS
        assert sum(counts.values()) == USERS * CONVERSATIONS

        # a full batch said now: its exchange, then its learn job, go before every flush
        res.sink.submit(dataclasses.replace(
            turn("late", "c", "", at=time.time()),
            messages=[{"role": "user", "content": f"My late fact number {n} is true."}
                      for n in range(5)]))
        await res.sink.flush()
        kinds = []
        for _ in range(2):
            job = await queue.claim("probe", lease_seconds=30)
            assert job is not None
            kinds.append(job.kind)
            await worker.process(job)
        assert kinds == ["exchange", "learn"]

        request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(resources=res)))
        scrape = (await metrics(request)).body.decode()  # type: ignore[arg-type]
        assert (f'memory_proxy_learning_queue_jobs{{kind="flush",state="ready"}} '
                f'{float(USERS * CONVERSATIONS)}') in scrape
        assert 'memory_proxy_learning_queue_jobs{kind="learn",state="ready"} 0.0' in scrape
        assert 'memory_proxy_learning_queue_depth{state="ready"}' in scrape

        assert await worker.drain() == 2 * USERS * CONVERSATIONS  # each flush, its learn job
        assert set((await queue.depth_by_kind()).values()) == {0}
        depth = await queue.depth()
        assert (depth.ready, depth.delayed, depth.leased, depth.dead,
                depth.buffered_messages) == (0, 0, 0, 0, 0)

        # the flush that ran does not block the next idle period's
        res.sink.submit(turn("u0", "c0", "I also keep a wasp trap.", at=time.time() - 60))
        await res.sink.flush()
        assert await worker.drain() == 1
        await worker.maintenance()
        await worker.maintenance()
        assert (await queue.depth_by_kind())[("flush", "ready")] == 1
        assert await worker.drain() == 2
        assert (await queue.depth()).buffered_messages == 0
