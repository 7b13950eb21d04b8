"""Graceful shutdown of real ``memory-proxy`` processes (proxy/server.py, proxy/shutdown.py).

Each test starts ``python -m proxy`` against a fake upstream served over HTTP in the test,
then sends SIGTERM while a stream or a learning job is in flight.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.learning.exchange import Exchange, TranscriptMessage
from tests.fakes import FakeUpstream, Reply, serve_upstream, text_chunks

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(tmp_path: Path, upstream_port: int, extra: str = "") -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: m\n"
        "    litellm_params: {model: openai/up-model, "
        f"api_base: 'http://127.0.0.1:{upstream_port}/v1', api_key: sk-test}}\n"
        "    model_info: {max_input_tokens: 16000}\n"
        f"storage: {{path: '{tmp_path / 'db.sqlite'}'}}\n" + extra)
    return config


@asynccontextmanager
async def _process(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "DISABLE_AIOHTTP_TRANSPORT": "True"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _started(process: asyncio.subprocess.Process, base: str) -> None:
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient() as client:
        while True:
            try:
                if (await client.get(base + "/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert process.returncode is None, "the gateway exited during startup"
            assert time.monotonic() < deadline, "the gateway did not start"
            await asyncio.sleep(0.1)


async def _events(process: asyncio.subprocess.Process) -> list[dict[str, object]]:
    assert process.stderr is not None
    err = (await process.stderr.read()).decode()
    return [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]


def _frames(body: bytes) -> list[bytes]:
    return [part.removeprefix(b"data: ") for part in body.split(b"\n\n") if part]


async def _stream_through_sigterm(tmp_path: Path, fake: FakeUpstream, *,
                                  grace_seconds: int) -> tuple[bytes, list[dict[str, object]]]:
    """Serve a gateway (``server.shutdown_grace_seconds``) in front of ``fake``, stream one
    chat reply and send the process SIGTERM at its first byte: the whole body received and
    the process's log events once it has exited (within 20 s)."""
    async with serve_upstream(fake.handler) as upstream_port:
        config = _config(tmp_path, upstream_port,
                         f"server: {{shutdown_grace_seconds: {grace_seconds}}}\n")
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        async with _process("serve", "--config", str(config), "--port", str(port)) as proc:
            await _started(proc, base)
            body = b""
            async with httpx.AsyncClient(timeout=30) as client, client.stream(
                    "POST", base + "/v1/chat/completions", json={
                        "model": "m", "stream": True,
                        "messages": [{"role": "user", "content": "talk"}]}) as response:
                assert response.status_code == 200
                async for part in response.aiter_bytes():
                    if not body:
                        proc.send_signal(signal.SIGTERM)
                    body += part
            await asyncio.wait_for(proc.wait(), 20)
            return body, await _events(proc)


async def test_sigterm_lets_an_open_stream_finish_within_the_grace(tmp_path: Path) -> None:
    """A stream that is still running when SIGTERM arrives is finished in full (finish
    reason and [DONE]) when it ends within server.shutdown_grace_seconds; then the process
    exits."""
    fake = FakeUpstream()
    fake.push(Reply(events=text_chunks("one two three four five six", pieces=6), gap=0.3))
    body, events = await _stream_through_sigterm(tmp_path, fake, grace_seconds=20)
    frames = _frames(body)
    assert frames[-1] == b"[DONE]"
    chunks = [orjson.loads(f) for f in frames[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "one two three four five six"
    names = [e.get("event") for e in events]
    assert "shutdown_draining" in names
    assert "shutdown_grace_expired" not in names
    access = [e for e in events if e.get("event") == "http_request"
              and e.get("route") == "/v1/chat/completions"]
    assert access[0]["outcome"] == "ok"


async def test_sigterm_past_the_grace_ends_the_stream_with_an_error_event(
    tmp_path: Path,
) -> None:
    """A stream still open when the grace runs out ends with an SSE error event (code
    server_shutting_down) and one ``[DONE]`` after it, rather than a cut connection, and
    the process exits."""
    fake = FakeUpstream()
    fake.push(Reply(events=text_chunks("first words", pieces=2)[:2], done=False, hang=True))
    body, events = await _stream_through_sigterm(tmp_path, fake, grace_seconds=1)
    frames = _frames(body)
    assert frames[-1] == b"[DONE]"
    assert body.count(b"[DONE]") == 1
    last = orjson.loads(frames[-2])
    assert last["error"]["code"] == "server_shutting_down"
    assert "shutdown_grace_expired" in [e.get("event") for e in events]


@pytest.mark.parametrize("command", ["worker", "serve"])
async def test_sigterm_releases_the_learning_job_at_once(tmp_path: Path, command: str) -> None:
    """A worker stopped in the middle of a learning job hands it back at once: the job is
    ready again (not leased for learning.lease_seconds) with no attempt counted — both the
    `worker` command and the gateway's in-process worker."""
    from proxy.backends.sqlite.database import SqliteDatabase
    from proxy.backends.sqlite.queue import SqliteLearningQueue

    fake = FakeUpstream()
    called = asyncio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        called.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    fake.intercept = hang
    db_path = tmp_path / "db.sqlite"
    async with SqliteDatabase(db_path) as db:
        queue = SqliteLearningQueue(db)
        lines = ["I moved to Lisbon last spring for a new job at a bank.",
                 "My daughter Ana starts school there in September.",
                 "I prefer answers in Portuguese when we talk about the city.",
                 "I am allergic to peanuts, so restaurant tips should avoid them.",
                 "On weekends I usually go surfing in Ericeira with friends."]
        messages = tuple(TranscriptMessage(role="user", text=t, fingerprint=f"fp{i}")
                         for i, t in enumerate(lines))
        key = await queue.buffer(Exchange(
            id="x1", tenant="default", user="u1", conversation="c1", channel="private",
            group=None, model="m", messages=messages, at=time.time()), batch_size=5,
            now=time.time())
        assert key is not None
    async with serve_upstream(fake.handler) as upstream_port:
        config = _config(tmp_path, upstream_port,
                         "learning: {enabled: true, lease_seconds: 300}\n")
        port = _free_port()
        args = ["--port" if command == "serve" else "--metrics-port", str(port)]
        async with _process(command, "--config", str(config), *args) as proc:
            await asyncio.wait_for(called.wait(), 60)  # the job is claimed, the model called
            async with httpx.AsyncClient() as client:  # both serve their metrics
                scrape = await client.get(f"http://127.0.0.1:{port}/metrics")
            assert "memory_proxy_learning_events_total" in scrape.text
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 15)
            events = await _events(proc)
    assert "learning_job_released" in [e.get("event") for e in events]
    async with SqliteDatabase(db_path) as db:
        queue = SqliteLearningQueue(db)
        depth = await queue.depth()
        assert (depth.ready, depth.leased) == (1, 0)
        job = await queue.claim("next", lease_seconds=30)
    assert job is not None
    assert (job.kind, job.attempts) == ("learn", 1)


async def test_processes_share_one_port_with_one_worker_and_merged_metrics(
    tmp_path: Path,
) -> None:
    """serve --processes 2: two gateway processes answer on one port, only the first runs
    the learning worker, /metrics (answered by either) counts every process's requests,
    and SIGTERM stops them all."""
    fake = FakeUpstream()
    async with serve_upstream(fake.handler) as upstream_port:
        config = _config(tmp_path, upstream_port, "learning: {enabled: true}\n")
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        async with _process("serve", "--config", str(config), "--port", str(port),
                            "--processes", "2") as proc:
            await _started(proc, base)
            for _ in range(40):  # a fresh connection each: both processes accept
                async with httpx.AsyncClient() as client:
                    assert (await client.get(base + "/healthz")).status_code == 200
            async with httpx.AsyncClient() as client:
                text = (await client.get(base + "/metrics")).text
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
            events = await _events(proc)
    from prometheus_client.parser import text_string_to_metric_families

    healthz = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                  if s.name == "memory_proxy_http_requests_total"
                  and s.labels["route"] == "/healthz")
    # _started's probes count too: at least the 40 sent here, from both processes' files.
    assert healthz >= 40
    started = [e for e in events if e.get("event") == "gateway_process_started"]
    assert sorted(e["index"] for e in started) == [0, 1]
    workers = [e for e in events if e.get("event") == "learning_worker_started"]
    assert len(workers) == 1
    assert workers[0]["process"] == 0
    assert len([e for e in events if e.get("event") == "gateway_stopped"]) == 2
    # One "listening" line for the whole server, from the parent, once both children are up.
    names = [e.get("event") for e in events]
    [listening] = [e for e in events if e.get("event") == "gateway_listening"]
    assert names.index("gateway_listening") > max(
        i for i, name in enumerate(names) if name == "gateway_started")
    assert (listening["port"], listening["processes"], listening["backend"]) == (
        port, 2, "sqlite")
    assert "process" not in listening
    answered = {e.get("process") for e in events if e.get("event") == "http_request"}
    assert answered <= {0, 1}


async def _probe_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app with only a lifespan, whose startup fails when PROBE_FAIL_STARTUP=1."""
    assert scope["type"] == "lifespan"
    await receive()
    if os.environ.get("PROBE_FAIL_STARTUP") == "1":
        await send({"type": "lifespan.startup.failed", "message": "boom"})
        return
    await send({"type": "lifespan.startup.complete"})
    await receive()
    await send({"type": "lifespan.shutdown.complete"})


@pytest.mark.parametrize("fails", [False, True])
async def test_ready_is_announced_only_once_the_app_started(
    fails: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GatewayServer calls on_ready once when the app started and the socket accepts
    connections, and never when the app's startup failed (uvicorn exits with status 3)."""
    import uvicorn

    from proxy.server import STARTUP_FAILURE, GatewayServer
    from proxy.shutdown import Drain

    monkeypatch.setenv("PROBE_FAIL_STARTUP", "1" if fails else "0")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    calls: list[int] = []

    def ready() -> None:
        calls.append(1)
        server.should_exit = True  # announced: stop at once

    server = GatewayServer(uvicorn.Config(_probe_app, log_config=None, lifespan="on"),
                           Drain(), ready)
    try:
        if fails:
            with pytest.raises(SystemExit) as exited:
                await server.serve(sockets=[sock])
            assert exited.value.code == STARTUP_FAILURE
        else:
            await server.serve(sockets=[sock])
    finally:
        sock.close()
    assert calls == ([] if fails else [1])
    assert server.started is not fails
