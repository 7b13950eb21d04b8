"""Counting storage failures by operation, around any backend object.

:func:`count_store_errors` wraps a store, queue or ledger so that every coroutine method
that raises :class:`~proxy.memory.store.StoreUnavailableError` adds one to
``memory_proxy_store_errors_total{operation="<component>.<method>"}`` (``store.search``,
``queue.claim``, ``ledger.record_usage``) before the error goes on unchanged. The wrapper
is transparent otherwise (attributes pass through, wrapped methods are cached, and
``isinstance`` sees the object's class), so it satisfies the same Protocol as the object.
:func:`proxy.resources.open_resources` wraps the opened backends; the alert monitor
(:mod:`proxy.alerts`) reads the counter.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from proxy.memory.store import StoreUnavailableError
from proxy.metrics import Metrics

T = TypeVar("T")


class _Counted:
    def __init__(self, target: object, metrics: Metrics, component: str) -> None:
        self._target = target
        self._metrics = metrics
        self._component = component

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        """The wrapped object's class, so ``isinstance(wrapper, Backend)`` holds as for the
        object itself (the technique of ``unittest.mock``'s ``spec``)."""
        return type(self._target)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not inspect.iscoroutinefunction(value):
            return value
        counter = self._metrics.store_errors.labels(f"{self._component}.{name}")
        method: Callable[..., Any] = value

        @functools.wraps(method)
        async def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                return await method(*args, **kwargs)
            except StoreUnavailableError:
                counter.inc()
                raise

        self.__dict__[name] = counted  # later lookups skip __getattr__
        return counted


def count_store_errors(target: T, metrics: Metrics, component: str) -> T:
    """``target`` with its storage failures counted under ``component`` (``store``,
    ``queue``, ``ledger``)."""
    return cast(T, _Counted(target, metrics, component))
