"""The drain after SIGTERM (proxy/shutdown.py), in process: readiness, stream endings and
the worker's stop signal. (Real processes and signals: tests/test_server.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from proxy.shutdown import Drain
from tests.fakes import FakeUpstream, Reply, make_settings, running_gateway, text_chunks


async def test_draining_makes_readyz_503_and_ends_a_silent_stream_after_the_grace(
    tmp_path: Path,
) -> None:
    """Once draining, /readyz answers 503 "draining" (liveness stays 200); a stream whose
    upstream has gone quiet is ended after the grace with an SSE error event carrying
    server_shutting_down, then ``[DONE]`` — while a stream that ends within the grace is
    untouched."""
    settings = make_settings(tmp_path, server={"shutdown_grace_seconds": 0.3})
    upstream = FakeUpstream()
    upstream.push(Reply(events=text_chunks("first", pieces=1)[:2], done=False, hang=True))
    async with running_gateway(settings, upstream) as gateway, gateway.client() as client:
        assert (await client.get("/readyz")).status_code == 200
        body = b""
        async with client.stream("POST", "/v1/chat/completions", json={
                "model": "m", "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as response:
            async for part in response.aiter_bytes():
                if not body:
                    gateway.res.drain.begin()
                    ready = await client.get("/readyz")
                    assert ready.status_code == 503
                    assert ready.json()["status"] == "draining"
                    assert (await client.get("/healthz")).status_code == 200
                body += part
        # A stream opened now (the grace has run out) is refused at its first wait.
        late = await client.post("/v1/chat/completions", json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    frames = [f.removeprefix(b"data: ") for f in body.split(b"\n\n") if f]
    assert orjson.loads(frames[-2])["error"]["code"] == "server_shutting_down"
    assert frames[-1] == b"[DONE]"  # a client waiting for [DONE] does not hang
    assert orjson.loads(frames[0])["choices"][0]["delta"]["role"] == "assistant"
    assert b"server_shutting_down" in late.content
    assert upstream.closed_streams == upstream.opened_streams == 2


async def test_begin_runs_callbacks_once_and_at_once_after_the_fact() -> None:
    """on_begin callbacks run when draining begins (once, however often begin is called);
    one registered after that runs immediately."""
    drain = Drain(3600)
    calls: list[str] = []
    drain.on_begin(lambda: calls.append("worker"))
    assert calls == []
    drain.begin()
    drain.begin()
    assert calls == ["worker"]
    drain.on_begin(lambda: calls.append("late"))
    assert calls == ["worker", "late"]
    assert drain.draining
    assert not drain.expired


async def test_expire_interrupts_only_streams_waiting_for_the_upstream() -> None:
    """expire cancels a watched task that waits for its upstream, not one that is busy
    elsewhere (that one sees ``expired`` before its next wait)."""
    drain = Drain(3600)
    started = asyncio.Event()

    async def stream(waiting: bool) -> str:
        watch = drain.watch()
        watch.waiting = waiting
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "interrupted" if watch.interrupted else "cancelled"
        finally:
            drain.unwatch(watch)
        return "done"

    waiting = asyncio.create_task(stream(True))
    busy = asyncio.create_task(stream(False))
    await started.wait()
    await asyncio.sleep(0)
    drain.expire()
    assert await waiting == "interrupted"
    assert not busy.done()
    busy.cancel()
    assert await busy == "cancelled"
    assert drain.expired
