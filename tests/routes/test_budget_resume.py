"""A learning budget lifted or raised resumes the jobs it held back within the settings
refresh — not at the next re-check minutes later — on both backends; a budget that is
unchanged, or raised but still spent, keeps them waiting."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from proxy.learning.worker import Worker
from proxy.tenants import REFRESH_SECONDS, TenantSettings
from tests.fakes import FakeUpstream, Gateway, running_gateway
from tests.routes.test_governance import (  # noqa: F401
    ACME_ADMIN,
    ACME_APP,
    Build,
    Clock,
    build,
    fact,
    say,
)


async def patch_budget(gw: Gateway, budget: Any) -> None:
    async with gw.client(headers=ACME_ADMIN) as client:
        response = await client.patch("/v1/admin/settings", json={"learning.budget": budget})
        assert response.status_code == 200, response.text


async def held_back(gw: Gateway, upstream: FakeUpstream) -> None:
    """Spend acme's daily budget of 1 token, then seal a batch of u2 ("Plays chess") that
    the worker postpones for it (its re-check 5 minutes away: noon, the day not over)."""
    await patch_budget(gw, {"tokens_per_day": 1})
    upstream.extract = fact("Collects stamps")
    await say(gw, "I collect stamps.")
    await gw.settle()  # spends the budget
    upstream.extract = fact("Plays chess")
    await say(gw, "I play chess.", user="u2")
    await gw.settle()  # buffered only while the budget is spent
    assert gw.res.queue is not None
    [conversation] = await gw.res.queue.buffered_conversations("acme", "u2")
    assert await gw.res.queue.seal("acme", "u2", conversation, now=0) is not None


async def learned(gw: Gateway, user: str = "u2") -> list[str]:
    async with gw.client(headers={**ACME_APP, "X-User-Id": user}) as client:
        return [m["content"] for m in (await client.get("/v1/memories")).json()["data"]]


def noon() -> Clock:
    return Clock(datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0))


async def test_lifting_the_budget_resumes_the_postponed_job_at_once(
    build: Build,  # noqa: F811
    upstream: FakeUpstream,
) -> None:
    """Postponed, the job waits while the budget is unchanged; once the admin removes the
    cap, the worker's next pass learns it (no sleep, the 5-minute re-check far away)."""
    async with running_gateway(build(), upstream, clock=noon()) as gw:
        await held_back(gw, upstream)
        assert gw.res.worker is not None
        assert gw.res.queue is not None
        await gw.res.worker.drain()
        await gw.res.worker.drain()  # the budget unchanged: still waiting
        assert (await gw.res.queue.depth()).delayed == 1
        assert await learned(gw) == []
        await patch_budget(gw, None)
        await gw.res.worker.drain()
        assert await learned(gw) == ["Plays chess"]
        assert (await gw.res.queue.depth()).delayed == 0


async def test_a_raise_still_below_the_spending_keeps_waiting_a_real_one_resumes(
    build: Build,  # noqa: F811
    upstream: FakeUpstream,
) -> None:
    """Raising the cap to 2 tokens (already passed) changes nothing; raising it well above
    what was spent resumes the job."""
    async with running_gateway(build(), upstream, clock=noon()) as gw:
        await held_back(gw, upstream)
        assert gw.res.worker is not None
        assert gw.res.queue is not None
        await gw.res.worker.drain()
        await patch_budget(gw, {"tokens_per_day": 2})
        await gw.res.worker.drain()
        assert (await gw.res.queue.depth()).delayed == 1
        await patch_budget(gw, {"tokens_per_day": 10_000_000})
        await gw.res.worker.drain()
        assert await learned(gw) == ["Plays chess"]


class Monotonic:
    """A settable monotonic clock (seconds) for a worker's tenant-settings cache."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_worker_process_sees_the_lift_at_its_next_settings_refresh(
    build: Build,  # noqa: F811
    upstream: FakeUpstream,
) -> None:
    """A worker with its own settings cache (as ``memory-proxy worker`` beside the
    gateway) postpones the job; the gateway lifts the budget; the worker keeps waiting
    until its cached settings are a refresh old (≤ 4 s, the clock moved on, no sleep),
    then learns the job."""
    clock = noon()
    async with running_gateway(build(), upstream, clock=clock) as gw:
        res = gw.res
        assert res.worker is not None
        assert res.queue is not None
        monotonic = Monotonic()
        other = Worker(
            queue=res.queue,
            store=res.store,
            model=res.worker.model,
            scrubbers=res.scrubbers,
            settings=res.settings.learning,
            metrics=res.metrics,
            clock=clock,
            ledger=res.ledger,
            tenants=TenantSettings(res.settings, res.store, clock=monotonic),
        )
        await held_back(gw, upstream)
        await other.drain()
        assert (await res.queue.depth()).delayed == 1
        await patch_budget(gw, None)
        await other.drain()  # its cache still has the old budget
        assert (await res.queue.depth()).delayed == 1
        monotonic.now += REFRESH_SECONDS
        await other.drain()
        assert await learned(gw) == ["Plays chess"]
