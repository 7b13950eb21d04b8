"""A fact the learning model marks as superseding the memory it only restates counts as
evidence for it, end to end on both backends (docs/design.md#evidence)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from proxy.memory.store import ListQuery
from tests.fakes import FakeUpstream, Gateway, backend_overrides, make_settings, running_gateway
from tests.learning.test_learning_e2e import extraction, fact, known_ids, say


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path,
             upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1},
                             **backend_overrides(request, tmp_path))
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


async def test_an_identical_fact_marked_superseding_adds_a_hit(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """Said twice, the second time answered with ``supersedes`` of the stored memory: one
    active memory, the same id, hits 2, nothing retired."""
    upstream.extract = lambda body: extraction(fact("Loves spicy food"))
    await say(gw, "I love spicy food.")
    await gw.settle()
    (first,) = await gw.res.store.list_memories(ListQuery(tenant="default", user="u1"))

    def restate(body: dict[str, Any]) -> dict[str, Any]:
        return extraction(fact("Loves spicy food",
                               supersedes=[known_ids(body)["Loves spicy food"]]))

    upstream.extract = restate
    await say(gw, "Did I mention I love spicy food?")
    await gw.settle()
    every = await gw.res.store.list_memories(ListQuery(tenant="default", user="u1",
                                                       include_retired=True))
    assert [(m.id, m.content, m.hits, m.active) for m in every] == \
        [(first.id, "Loves spicy food", 2, True)]
