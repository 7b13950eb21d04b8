"""A lifted learning budget resumes postponed jobs within the settings refresh in every
process, not only in the one that postponed them: a worker that never postponed anything
(``memory-proxy worker`` beside the gateway) and a worker restarted since both take up
the postponed tenants from the queue, on both backends. While the budget is still spent
they leave the jobs waiting. Time is driven through each worker's settings clock (no
sleeps; the 5-minute re-check stays far away)."""

from __future__ import annotations

from typing import Any

from proxy.learning.worker import Worker
from proxy.tenants import REFRESH_SECONDS, TenantSettings
from tests.fakes import FakeUpstream, Gateway, running_gateway
from tests.routes.test_budget_resume import Monotonic, held_back, learned, noon, patch_budget
from tests.routes.test_governance import Build, Clock, build  # noqa: F401


class CountingQueue:
    """The gateway's queue, counting the worker's reads of the postponed tenants."""

    def __init__(self, queue: Any) -> None:
        self._queue = queue
        self.reads = 0

    async def postponed_tenants(self) -> list[str]:
        self.reads += 1
        tenants: list[str] = await self._queue.postponed_tenants()
        return tenants

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


def separate_worker(gw: Gateway, monotonic: Monotonic, clock: Clock) -> Worker:
    """A worker on the gateway's storage with its own settings cache on ``monotonic`` (as
    a ``memory-proxy worker`` process) and the gateway's ``clock``, reading the queue
    through a :class:`CountingQueue`."""
    res = gw.res
    assert res.worker is not None
    assert res.queue is not None
    worker = Worker(queue=res.queue, store=res.store, model=res.worker.model,
                    scrubbers=res.scrubbers, settings=res.settings.learning,
                    metrics=res.metrics, clock=clock, ledger=res.ledger,
                    tenants=TenantSettings(res.settings, res.store, clock=monotonic))
    worker.queue = CountingQueue(res.queue)  # type: ignore[assignment]
    return worker


async def delayed(gw: Gateway) -> int:
    assert gw.res.queue is not None
    return (await gw.res.queue.depth()).delayed


async def test_a_worker_that_postponed_nothing_resumes_within_its_settings_refresh(
    build: Build,  # noqa: F811
    upstream: FakeUpstream,
) -> None:
    """The gateway's worker postpones the job; the separate worker reads the postponed
    tenants at most once per refresh interval, keeps the job waiting while the budget is
    spent, and learns it by its next refresh after the admin lifts the cap."""
    clock = noon()
    async with running_gateway(build(), upstream, clock=clock) as gw:
        monotonic = Monotonic()
        other = separate_worker(gw, monotonic, clock)
        reads = other.queue
        assert isinstance(reads, CountingQueue)
        await other.drain()  # nothing postponed yet
        assert reads.reads == 1
        await held_back(gw, upstream)
        assert gw.res.worker is not None
        await gw.res.worker.drain()  # the gateway's worker postpones it
        assert await delayed(gw) == 1
        await other.drain()
        assert reads.reads == 1  # within the interval: the queue is not read again
        monotonic.now += REFRESH_SECONDS
        await other.drain()  # reads acme, whose budget is spent: it waits
        await other.drain()
        assert reads.reads == 2
        assert await delayed(gw) == 1
        assert await learned(gw) == []
        await patch_budget(gw, None)
        monotonic.now += REFRESH_SECONDS
        await other.drain()
        assert await learned(gw) == ["Plays chess"]
        assert await delayed(gw) == 0


async def test_a_worker_that_first_looks_after_the_lift_resumes_at_once(
    build: Build,  # noqa: F811
    upstream: FakeUpstream,
) -> None:
    """A worker that starts while the budget is spent leaves the job waiting; one that
    starts after the cap was lifted learns it at its first pass."""
    clock = noon()
    async with running_gateway(build(), upstream, clock=clock) as gw:
        await held_back(gw, upstream)
        assert gw.res.worker is not None
        await gw.res.worker.drain()
        early = separate_worker(gw, Monotonic(), clock)
        await early.drain()
        assert await delayed(gw) == 1
        await patch_budget(gw, None)
        late = separate_worker(gw, Monotonic(), clock)
        await late.drain()
        assert await learned(gw) == ["Plays chess"]


async def test_a_restarted_worker_resumes_what_it_postponed_before_the_restart(
    build: Build,  # noqa: F811
    upstream: FakeUpstream,
) -> None:
    """A worker postpones the job and stops; its fresh instance keeps the job waiting
    while the budget is spent (a raise still below the spending included), and learns it
    by its next settings refresh once the cap is raised above it."""
    clock = noon()
    async with running_gateway(build(), upstream, clock=clock) as gw:
        await held_back(gw, upstream)
        before = separate_worker(gw, Monotonic(), clock)
        await before.drain()  # postpones the job
        assert await delayed(gw) == 1
        monotonic = Monotonic()
        after = separate_worker(gw, monotonic, clock)
        await after.drain()
        await patch_budget(gw, {"tokens_per_day": 2})  # still spent
        monotonic.now += REFRESH_SECONDS
        await after.drain()
        assert await delayed(gw) == 1
        await patch_budget(gw, {"tokens_per_day": 10_000_000})
        await after.drain()  # its settings a refresh old only later
        assert await delayed(gw) == 1
        monotonic.now += REFRESH_SECONDS
        await after.drain()
        assert await learned(gw) == ["Plays chess"]
