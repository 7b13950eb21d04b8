"""``until_disconnected``: the work's result, or its cancellation when the client leaves."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from proxy.http import ClientDisconnectedError, until_disconnected


def request_with(disconnect: asyncio.Event) -> Request:
    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "headers": []}, receive)


async def test_returns_the_result_and_stops_watching() -> None:
    """Work that finishes first gives its result; no watcher task is left behind."""
    before = len(asyncio.all_tasks())

    async def work() -> str:
        await asyncio.sleep(0)
        return "done"

    assert await until_disconnected(request_with(asyncio.Event()), work()) == "done"
    assert len(asyncio.all_tasks()) == before


async def test_a_disconnect_cancels_the_work() -> None:
    """The client leaving cancels the work and raises ClientDisconnectedError."""
    gone = asyncio.Event()
    cancelled = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    asyncio.get_running_loop().call_later(0.01, gone.set)
    with pytest.raises(ClientDisconnectedError):
        await until_disconnected(request_with(gone), work())
    assert cancelled.is_set()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_cancelling_the_caller_is_not_a_disconnect() -> None:
    """A cancellation from outside propagates as CancelledError and cancels the work."""
    cancelled = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.ensure_future(until_disconnected(request_with(asyncio.Event()), work()))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


async def test_errors_of_the_work_propagate() -> None:
    async def work() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await until_disconnected(request_with(asyncio.Event()), work())
