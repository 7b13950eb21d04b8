"""Storage failures counted by operation (proxy/observed.py)."""

from __future__ import annotations

import pytest

from proxy.memory.store import StoreUnavailableError
from proxy.metrics import Metrics
from proxy.observed import count_store_errors


class Backend:
    name = "fake"

    def __init__(self) -> None:
        self.calls = 0

    async def search(self, fail: bool) -> str:
        self.calls += 1
        if fail:
            raise StoreUnavailableError("down")
        return "hit"

    async def broken(self) -> None:
        raise ValueError("a bug, not an outage")

    def sync(self) -> int:
        return 7


def errors(metrics: Metrics, operation: str) -> float | None:
    return metrics.registry.get_sample_value("memory_proxy_store_errors_total",
                                             {"operation": operation})


async def test_unavailable_errors_are_counted_by_operation_and_reraised() -> None:
    """StoreUnavailableError adds one to store_errors_total{operation=component.method}
    and still reaches the caller; results and other attributes pass through."""
    metrics = Metrics()
    backend = Backend()
    counted = count_store_errors(backend, metrics, "store")
    assert await counted.search(False) == "hit"
    with pytest.raises(StoreUnavailableError):
        await counted.search(True)
    with pytest.raises(StoreUnavailableError):
        await counted.search(True)
    assert errors(metrics, "store.search") == 2
    assert backend.calls == 3
    assert counted.sync() == 7
    assert counted.name == "fake"
    assert isinstance(counted, Backend)


async def test_other_exceptions_are_not_store_errors() -> None:
    """A bug (any other exception) propagates without being counted as an outage."""
    metrics = Metrics()
    counted = count_store_errors(Backend(), metrics, "queue")
    with pytest.raises(ValueError, match="a bug"):
        await counted.broken()
    assert errors(metrics, "queue.broken") == 0
