"""``/metrics`` needs no key, so it names no tenant unless an operator turns tenant labels
on (``metrics.tenant_labels``): the learning-budget gauges keep their names and their
``tenant`` label, ``"*"`` for every tenant together. Both backends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.metrics import ALL_TENANTS, Metrics
from proxy.settings import Settings
from tests.fakes import FakeUpstream, Gateway, backend_overrides, make_settings, running_gateway

PAUSED = "memory_proxy_learning_budget_paused"
SPENT = "memory_proxy_learning_budget_spent_tokens"
Build = Callable[..., Settings]


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def build(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Build:
    for name in ("ACME_APP", "GLOBEX_APP", "ACME_ADMIN"):
        monkeypatch.setenv(name, name.lower())
    extra = backend_overrides(request, tmp_path)

    def settings(**overrides: Any) -> Settings:
        return make_settings(
            tmp_path, learning={"enabled": True, "batch_messages": 1},
            auth={"keys": [{"key": "os.environ/ACME_APP", "tenant": "acme"},
                           {"key": "os.environ/GLOBEX_APP", "tenant": "globex"}],
                  "admin_keys": [{"key": "os.environ/ACME_ADMIN", "tenant": "acme"}]},
            **extra, **overrides)
    return settings


async def say(gw: Gateway, key: str, user: str, text: str) -> None:
    async with gw.client(headers={"Authorization": f"Bearer {key}",
                                  "X-User-Id": user}) as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200


async def scrape_after_acme_spends(gw: Gateway, upstream: FakeUpstream) -> str:
    """acme spends its 1-token day budget (paused), globex chats without a cap; the
    worker reads both budgets; the scrape, without a key."""
    async with gw.client(headers={"Authorization": "Bearer acme_admin"}) as client:
        patched = await client.patch("/v1/admin/settings",
                                     json={"learning.budget": {"tokens_per_day": 1}})
        assert patched.status_code == 200, patched.text
    upstream.extract = lambda _body: {"memories": [
        {"title": "Stamps", "content": "Collects stamps", "subject": "user"}]}
    await say(gw, "acme_app", "u1", "I collect stamps.")
    await gw.settle()
    await say(gw, "acme_app", "u2", "I play chess.")
    await say(gw, "globex_app", "g1", "I keep bees.")
    assert gw.res.worker is not None
    await gw.res.sink.flush()
    await gw.res.worker.drain()
    async with gw.client() as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    return response.text


async def test_metrics_name_no_tenant_by_default(build: Build, upstream: FakeUpstream) -> None:
    """Default: no tenant name anywhere in /metrics; the budget gauges report every
    tenant together under ``tenant="*"`` (paused while any tenant is)."""
    async with running_gateway(build(), upstream) as gw:
        text = await scrape_after_acme_spends(gw, upstream)
    assert "acme" not in text
    assert "globex" not in text
    assert f'{PAUSED}{{tenant="*"}} 1.0' in text
    spent = [line for line in text.splitlines()
             if line.startswith(f'{SPENT}{{period="day",tenant="*"}}')]
    assert len(spent) == 1
    assert float(spent[0].split()[-1]) > 0


async def test_tenant_labels_on_name_each_tenant(build: Build, upstream: FakeUpstream) -> None:
    """``metrics.tenant_labels: true``: one series per tenant, by name, and no ``*``."""
    async with running_gateway(build(metrics={"tenant_labels": True}), upstream) as gw:
        text = await scrape_after_acme_spends(gw, upstream)
    assert f'{PAUSED}{{tenant="acme"}} 1.0' in text
    assert f'{PAUSED}{{tenant="globex"}} 0.0' in text
    assert 'tenant="*"' not in text


def test_all_tenants_series_sums_and_clears() -> None:
    """Without tenant labels: paused is 1 while any tenant is and 0 once none is; spent
    tokens are the sum of each tenant's last reading (a re-reading replaces, never adds)."""
    metrics = Metrics()
    metrics.learning_budget("a", paused=True, spent_today=10, spent_this_month=40)
    metrics.learning_budget("b", paused=False, spent_today=5, spent_this_month=5)
    metrics.learning_budget("a", paused=True, spent_today=12, spent_this_month=42)

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"tenant": ALL_TENANTS, **labels})

    assert value(PAUSED) == 1
    assert value(SPENT, period="day") == 17
    assert value(SPENT, period="month") == 47
    metrics.learning_budget("a", paused=False)
    assert value(PAUSED) == 0
    assert value(SPENT, period="day") == 17
    assert metrics.registry.get_sample_value(PAUSED, {"tenant": "a"}) is None
