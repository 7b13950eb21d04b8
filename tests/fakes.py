"""Test doubles: a scripted OpenAI-compatible upstream and a running gateway.

:class:`FakeUpstream` is an ``httpx`` handler that answers ``POST …/chat/completions`` like
OpenAI: realistic SSE (every stream ends with a ``finish_reason``), usage when
``stream_options.include_usage`` is set, errors with status and headers, slow or endless
streams whose closing it records. Learning calls (recognised by the built-in prompts) are
answered by ``learner`` callbacks, so tests script the learning model's JSON.

The relay (aiohttp) reaches it over real HTTP: :func:`serve_upstream` serves the handler on
127.0.0.1 and :func:`relay_session` resolves every upstream host name to that server. An
``intercept`` raising an ``httpx.TransportError`` drops the connection without a reply (as
a dead or crashed upstream would). litellm routes reach the handler through respx.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import socket
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import respx
import uvicorn
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from proxy.app import create_app
from proxy.learning.answers import CandidateFact
from proxy.learning.prompts import (
    EXTRACTION_EN,
    EXTRACTION_ZH,
    SCORING_EN,
    SCORING_ZH,
    VERDICT_EN,
    VERDICT_ZH,
)
from proxy.learning.queue import Job, LearningQueue
from proxy.memory.embed import CachedEmbedder, Embedder, RawEmbeddings
from proxy.resources import Resources, open_resources
from proxy.settings import Settings
from proxy.upstream.dispatch import Dispatcher
from proxy.upstream.litellm_adapter import LiteLLMUpstream
from proxy.upstream.relay import RelayUpstream

UPSTREAM_ROOT = "http://upstream.test"
UPSTREAM_BASE = f"{UPSTREAM_ROOT}/v1"


def sse(events: list[Any], *, done: bool = True) -> bytes:
    out = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def chunk(choices: list[dict[str, Any]], *, cid: str = "chatcmpl-1", model: str = "up-model",
          usage: Any = ...) -> dict[str, Any]:
    out: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": 1700000000,
                           "model": model, "choices": choices}
    if usage is not ...:
        out["usage"] = usage
    return out


def text_chunks(text: str, *, pieces: int = 3, n: int = 1, finish: str = "stop") -> list[dict]:
    """A realistic stream of ``text`` split in ``pieces``, for each of ``n`` choices."""
    size = max(1, -(-len(text) // pieces))
    parts = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    out = []
    for index in range(n):
        out.append(chunk([{"index": index, "delta": {"role": "assistant", "content": ""},
                           "finish_reason": None}]))
        out.extend(chunk([{"index": index, "delta": {"content": p}, "finish_reason": None}])
                   for p in parts)
        out.append(chunk([{"index": index, "delta": {}, "finish_reason": finish}]))
    return out


def usage_chunk(prompt: int = 12, completion: int = 3) -> dict[str, Any]:
    return chunk([], usage={"prompt_tokens": prompt, "completion_tokens": completion,
                            "total_tokens": prompt + completion})


def completion_body(text: str, *, prompt: int = 12, completion: int = 3,
                    tool_calls: list[dict] | None = None, n: int = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000,
        "model": "up-model",
        "choices": [{"index": i, "message": message,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}
                    for i in range(n)],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }


@dataclass
class Reply:
    """One scripted upstream answer."""

    status: int = 200
    json: Any = None  # non-streaming body (or error body)
    events: list[Any] | None = None  # streaming events (dicts → JSON, bytes → raw data line)
    done: bool = True
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # before the first byte
    gap: float = 0.0  # between events
    hang: bool = False  # never finish after the events


class _Body(httpx.AsyncByteStream):
    def __init__(self, source: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        self._source = source
        self._on_close = on_close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._source:
            yield part

    async def aclose(self) -> None:
        self._on_close()


class FakeUpstream:
    """Scripted OpenAI-compatible upstream; see the module docstring."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []  # the URL path of each request, in order
        self.script: deque[Reply] = deque()
        self.closed_streams = 0
        self.opened_streams = 0
        self.score: Callable[[dict[str, Any]], Any] = lambda body: {
            "score": 0.9, "dimensions": {"density": 0.9, "clarity": 0.9, "depth": 0.9,
                                         "relevance": 0.9, "novelty": 0.9},
            "reason": "useful"}
        self.extract: Callable[[dict[str, Any]], Any] = lambda body: {"memories": [],
                                                                      "profile": None}
        # The near-neighbour verdict (same / different) of two profile wordings.
        self.verdict: Callable[[dict[str, Any]], Any] = lambda body: {"verdict": "different"}
        self.learning_calls: list[tuple[str, dict[str, Any]]] = []
        self.reply_text = "Hello there!"
        # When set, every request goes here instead (e.g. to hang or refuse connections).
        self.intercept: Callable[[httpx.Request], Any] | None = None

    # scripting -----------------------------------------------------------------
    def push(self, *replies: Reply) -> None:
        self.script.extend(replies)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if _learning_kind(r) is None]

    @property
    def last_chat(self) -> dict[str, Any]:
        return self.chat_requests[-1]

    # handler -------------------------------------------------------------------
    async def handler(self, request: httpx.Request) -> httpx.Response:
        if self.intercept is not None:
            result: httpx.Response = await self.intercept(request)
            return result
        return await self.respond(request)

    async def respond(self, request: httpx.Request) -> httpx.Response:
        """The scripted answer (what :meth:`handler` does when nothing intercepts)."""
        body = orjson.loads(request.content)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        self.paths.append(request.url.path)
        kind = _learning_kind(body)
        if kind is not None:
            self.learning_calls.append((kind, body))
            if self.script and self.script[0].status >= 400:
                return self._respond(self.script.popleft(), body)
            answer = {"score": self.score, "extract": self.extract,
                      "verdict": self.verdict}[kind](body)
            if isinstance(answer, Reply):
                return self._respond(answer, body)
            content = answer if isinstance(answer, str) else orjson.dumps(answer).decode()
            return httpx.Response(200, json={
                "id": "learn-1", "object": "chat.completion", "created": 1700000000,
                "model": body.get("model"), "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
            })
        reply = self.script.popleft() if self.script else self._default(body)
        return self._respond(reply, body)

    def _default(self, body: dict[str, Any]) -> Reply:
        if body.get("stream"):
            events: list[Any] = text_chunks(self.reply_text)
            if (body.get("stream_options") or {}).get("include_usage"):
                events.append(usage_chunk())
            return Reply(events=events)
        return Reply(json=completion_body(self.reply_text))

    def _respond(self, reply: Reply, body: dict[str, Any]) -> httpx.Response:
        if reply.events is None:
            async def once() -> AsyncIterator[bytes]:
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                yield orjson.dumps(reply.json) if not isinstance(reply.json, bytes) \
                    else reply.json
            return httpx.Response(reply.status, headers={"content-type": "application/json",
                                                         **reply.headers},
                                  stream=_Body(once(), self._closed))
        self.opened_streams += 1

        async def events() -> AsyncIterator[bytes]:
            if reply.delay:
                await asyncio.sleep(reply.delay)
            for event in reply.events or ():
                yield (b"data: " + event + b"\n\n") if isinstance(event, bytes) else sse(
                    [event], done=False)
                if reply.gap:
                    await asyncio.sleep(reply.gap)
            if reply.hang:
                await asyncio.sleep(3600)
            if reply.done:
                yield b"data: [DONE]\n\n"

        return httpx.Response(reply.status, headers={"content-type": "text/event-stream",
                                                     **reply.headers},
                              stream=_Body(events(), self._closed))

    def _closed(self) -> None:
        self.closed_streams += 1


def _learning_kind(body: dict[str, Any]) -> str | None:
    messages = body.get("messages") or []
    system = messages[0].get("content") if messages else None
    if not isinstance(system, str):
        return None
    if system.startswith((SCORING_EN, SCORING_ZH)):
        return "score"
    if system.startswith((EXTRACTION_EN, EXTRACTION_ZH)):
        return "extract"
    if system.startswith((VERDICT_EN, VERDICT_ZH)):
        return "verdict"
    return None


def cand(content: str, **extra: object) -> CandidateFact:
    """An extracted fact about the user, as the parser would hand it over; ``extra``
    overrides any field."""
    base: dict[str, object] = {"title": content[:30], "content": content,
                               "category": "user_preference", "subcategory": "", "tags": (),
                               "subject": "user", "supersedes": (), "duplicate_of": None,
                               "source_turns": ()}
    base.update(extra)
    return CandidateFact(**base)  # type: ignore[arg-type]


# The recall deadline of test settings (memory.recall_timeout_ms): the shipped 150 ms is
# a production bound a loaded CI machine misses now and then (the first recall of a fresh
# gateway, a test whose neighbour hogs the CPU), turning "the memory is injected" into a
# flake. A test of the deadline itself sets its own.
TEST_RECALL_TIMEOUT_MS = 5_000


def make_settings(tmp_path: Any, **overrides: Any) -> Settings:
    """Test settings: one relayed model ``m`` at the fake upstream, a temp database, the
    recall deadline :data:`TEST_RECALL_TIMEOUT_MS`."""
    from proxy.settings import load_settings

    base: dict[str, Any] = {
        "model_list": [{
            "model_name": "m",
            "litellm_params": {"model": "openai/up-model", "api_base": UPSTREAM_BASE,
                               "api_key": "sk-upstream"},
            "model_info": {"max_input_tokens": 16000},
        }],
        "storage": {"path": str(tmp_path / "memory.db")},
        "memory": {"recall_timeout_ms": TEST_RECALL_TIMEOUT_MS},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return load_settings(use_file=False, **base)


# A factory of test settings: overrides as for make_settings (fixture ``configure``).
Configure = Callable[..., Settings]


def redis_storage(tmp_path: Any, url: str, prefix: str) -> dict[str, object]:
    """``storage`` settings for the Redis backend at ``url``, keys under ``prefix``."""
    return {"backend": "redis", "url": url, "key_prefix": prefix,
            "path": str(tmp_path / "memory.db")}


def backend_overrides(request: Any, tmp_path: Any) -> dict[str, Any]:
    """``make_settings`` overrides for the backend a parametrised fixture's
    ``request.param`` names: ``{}`` for ``"sqlite"``, ``{"storage": …}`` on the test Redis
    (the ``redis_url`` / ``redis_prefix`` fixtures) for ``"redis"``."""
    if request.param != "redis":
        return {}
    return {"storage": redis_storage(tmp_path, request.getfixturevalue("redis_url"),
                                     request.getfixturevalue("redis_prefix"))}


@functools.cache
def client_ssl_context() -> ssl.SSLContext:
    """httpx's default TLS context (the one ``AsyncClient()`` builds), made once: building
    it reads the CA bundle (~25 ms), and the suite opens thousands of clients."""
    return httpx.create_ssl_context()


@dataclass
class Gateway:
    """A gateway served by uvicorn on 127.0.0.1 with a fake upstream behind it."""

    base_url: str
    res: Resources
    upstream: FakeUpstream

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        kwargs.setdefault("verify", client_ssl_context())
        return httpx.AsyncClient(base_url=self.base_url, timeout=10, **kwargs)

    async def settle(self) -> None:
        """Run learning to completion: write pending turns, seal, learn."""
        await self.res.sink.flush()
        worker = self.res.worker
        assert worker is not None, "learning is off in this gateway"
        await worker.drain()

    async def flush_conversations(self) -> None:
        """Seal every conversation's buffer (as the idle flush would) and learn."""
        await self.res.sink.flush()
        assert self.res.worker is not None
        assert self.res.queue is not None
        await self.res.worker.drain()
        for tenant, user, conversation in await self.res.queue.idle_conversations(
            idle_before=float("inf")
        ):
            await self.res.queue.seal(tenant, user, conversation, now=0)
        await self.res.worker.drain()


_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection",
                          "content-encoding"})


@contextlib.asynccontextmanager
async def serve_upstream(handler: Callable[[httpx.Request], Any]) -> AsyncIterator[int]:
    """Serve ``handler`` (httpx request in, httpx response out) over HTTP on 127.0.0.1;
    yields the port. Response bodies are written as the handler's stream yields them, and
    the stream is closed when the client goes away (the handler is cancelled too)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        outgoing = httpx.Request(request.method, f"{UPSTREAM_ROOT}{request.path_qs}",
                                 headers=list(request.headers.items()),
                                 content=await request.read())
        try:
            answer: httpx.Response = await handler(outgoing)
        except httpx.TransportError:
            assert request.transport is not None
            request.transport.abort()  # no reply at all: the connection just drops
            return web.Response()
        reply = web.StreamResponse(status=answer.status_code, headers={
            k: v for k, v in answer.headers.items() if k.lower() not in _HOP_HEADERS})
        try:
            await reply.prepare(request)
            try:
                await reply.write(answer.content)  # a body given whole (json=, content=)
            except httpx.ResponseNotRead:
                async for part in answer.aiter_raw():  # a streamed body, as it comes
                    await reply.write(part)
            await reply.write_eof()
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass  # the client went away mid-body
        finally:
            await answer.aclose()
        return reply

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    try:
        yield sock.getsockname()[1]
    finally:
        await runner.cleanup()


class _ToLocal(AbstractResolver):
    """Resolves every host name to 127.0.0.1:``port`` (the fake upstream)."""

    def __init__(self, port: int) -> None:
        self._port = port

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return [ResolveResult(hostname=host, host="127.0.0.1", port=self._port,
                              family=socket.AF_INET, proto=0, flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        return None


def relay_session(port: int) -> aiohttp.ClientSession:
    """A client session for :class:`RelayUpstream` that sends every upstream call to the
    fake upstream served on ``port`` (whatever ``api_base`` says)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=_ToLocal(port)))


@contextlib.asynccontextmanager
async def relay_to(fake: FakeUpstream, settings: Settings) -> AsyncIterator[RelayUpstream]:
    """A :class:`RelayUpstream` talking HTTP to ``fake`` (served for the block's duration)."""
    async with serve_upstream(fake.handler) as port:
        relay = RelayUpstream(settings.upstream, session=relay_session(port))
        try:
            yield relay
        finally:
            await relay.aclose()


# Bounds on a test gateway's start and stop (seconds), far above what either takes on a
# loaded machine: past one the test fails saying which, instead of hanging until
# pytest-timeout. Requests still open at stop get GATEWAY_REQUESTS_STOP_SECONDS, then
# uvicorn cancels them; the lifespan's own shutdown steps are bounded (proxy.app).
GATEWAY_START_SECONDS = 60.0
GATEWAY_STOP_SECONDS = 60.0
GATEWAY_REQUESTS_STOP_SECONDS = 10


@contextlib.asynccontextmanager
async def _bound(seconds: float, what: str) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise AssertionError(f"the test gateway did not {what} within {seconds} s") from None


@contextlib.asynccontextmanager
async def running_gateway(settings: Settings, upstream: FakeUpstream | None = None,
                          *, resources: Resources | None = None,
                          embedder: Embedder | None = None,
                          run_worker: bool = False,
                          clock: Callable[[], datetime] | None = None,
                          freeze_gc: bool = False,
                          ) -> AsyncIterator[Gateway]:
    """Serve the app on a free port. The relay reaches ``upstream`` over HTTP
    (:func:`relay_to`); litellm routes (``upstream.transport: litellm``) reach it through
    respx; ``embedder`` (a fake) replaces the configured one. The app runs the learning
    worker only with ``run_worker`` (tests otherwise drive it with :meth:`Gateway.settle`);
    ``clock`` stamps every record and budget period (default: the real time).
    ``freeze_gc``: the lifespan's collector freeze (``create_app``), off unless asked for:
    the full collection before it walks the whole test process (0.1–0.6 s a gateway, as
    the process grows; about 40 % of the suite's time when every gateway froze), and it
    changes no answer. tests/test_app.py checks the freeze; the gateways the suite starts
    as processes (``python -m proxy``) freeze as deployed.
    """
    fake = upstream or FakeUpstream()
    async with contextlib.AsyncExitStack() as stack:
        if settings.upstream.transport == "litellm":
            router = stack.enter_context(respx.mock(assert_all_called=False))
            router.post(f"{UPSTREAM_BASE}/chat/completions").mock(side_effect=fake.handler)
            router.post(f"{UPSTREAM_BASE}/responses").mock(side_effect=fake.handler)
            router.route().pass_through()
        relay = await stack.enter_async_context(relay_to(fake, settings))
        dispatcher = Dispatcher(relay, LiteLLMUpstream(settings.upstream))
        res = resources or await stack.enter_async_context(
            open_resources(settings, upstream=dispatcher, embedder=embedder,
                           **({} if clock is None else {"clock": clock}))
        )
        # Tests drive the worker themselves (Gateway.settle) for determinism.
        settings_no_worker = settings.model_copy(update={
            "server": settings.server.model_copy(update={"run_worker": run_worker})})
        res.settings = settings_no_worker
        app = create_app(settings_no_worker, resources=res, freeze_gc=freeze_gc)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(
            app, log_config=None, lifespan="on", access_log=False,
            timeout_graceful_shutdown=GATEWAY_REQUESTS_STOP_SECONDS))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            async with _bound(GATEWAY_START_SECONDS, "start"):
                while not server.started:
                    if task.done():
                        task.result()
                    await asyncio.sleep(0.01)
            yield Gateway(f"http://127.0.0.1:{port}", res, fake)
        finally:
            server.should_exit = True
            try:
                async with _bound(GATEWAY_STOP_SECONDS, "stop"):
                    await task
            finally:
                sock.close()


class FlakyQueue:
    """A learning queue that fails: each ``claim`` raises the next of ``errors`` while any
    are left, then every call goes to ``queue`` (a real one). ``failures`` counts the
    errors raised."""

    def __init__(self, queue: LearningQueue, errors: list[BaseException]) -> None:
        self._queue = queue
        self._errors = deque(errors)
        self.failures = 0

    async def claim(self, worker: str, *, lease_seconds: float) -> Job | None:
        if self._errors:
            self.failures += 1
            raise self._errors.popleft()
        return await self._queue.claim(worker, lease_seconds=lease_seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


async def eventually(condition: Callable[[], Awaitable[bool]], *, within: float = 20.0) -> None:
    """Wait until ``condition()`` holds (checked every 10 ms); AssertionError after
    ``within`` seconds — a bound against hanging, not a timing assertion."""
    deadline = asyncio.get_running_loop().time() + within
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


class ConceptBackend:
    """A fake embedding model (:class:`~proxy.memory.embed.EmbeddingBackend`): words of one
    concept group share an axis, other words land on one of 16 hashed axes with a small
    weight — so "puppy" and "dog" are close while sharing no keyword. ``fail`` raises it on
    every call, ``delay`` sleeps first (a slow provider); ``calls`` records each batch."""

    model = "fake-concepts"

    def __init__(self, concepts: list[list[str]], *, dimension: int | None = None,
                 fail: Exception | None = None, delay: float = 0.0,
                 tokens_per_text: int = 3) -> None:
        self.concepts = [{w.lower() for w in group} for group in concepts]
        self.size = len(concepts) + 16
        self.reported = dimension
        self.fail = fail
        self.delay = delay
        self.tokens_per_text = tokens_per_text
        self.calls: list[list[str]] = []
        self.urgent: list[bool] = []

    async def start(self) -> int | None:
        return self.reported

    async def aclose(self) -> None:
        return None

    def vector(self, text: str) -> list[float]:
        import zlib

        out = [0.0] * self.size
        for word in re.findall(r"\w+", text.lower()):
            axes = [i for i, group in enumerate(self.concepts) if word in group]
            for i in axes:
                out[i] += 1.0
            if not axes:
                out[len(self.concepts) + zlib.crc32(word.encode()) % 16] += 0.3
        return out

    async def embed(self, texts: Any, *, urgent: bool = False) -> RawEmbeddings:
        self.calls.append(list(texts))
        self.urgent.append(urgent)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        return RawEmbeddings(rows=[self.vector(t) for t in texts],
                             tokens=self.tokens_per_text * len(texts))


def concept_embedder(concepts: list[list[str]], **kwargs: Any) -> CachedEmbedder:
    """The real :class:`~proxy.memory.embed.CachedEmbedder` over a :class:`ConceptBackend`."""
    backend = ConceptBackend(concepts, **kwargs)
    return CachedEmbedder(backend, dimension=backend.size)


def tiny_static_model(folder: Path, dimension: int = 8) -> Path:
    """Save a real model2vec model to ``folder``: random ``dimension``-d token vectors over
    the bundled MiniLM word pieces, with the config a distillation writes."""
    import numpy as np
    from model2vec import StaticModel
    from tokenizers import Tokenizer

    from proxy.memory.embed_local import bundled_model_dir

    source = bundled_model_dir()
    assert source is not None
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    vectors = np.random.default_rng(0).standard_normal(
        (tokenizer.get_vocab_size(), dimension)).astype(np.float32)
    config = {"model_type": "model2vec", "architectures": ["StaticModel"],
              "hidden_dim": dimension, "normalize": True}
    StaticModel(vectors, tokenizer, config=config, normalize=True).save_pretrained(str(folder))
    return folder


def hold(seconds: float) -> None:
    """Hold the event loop's thread for ``seconds``, as CPU-bound work would."""
    time.sleep(seconds)


@contextlib.asynccontextmanager
async def busy_loop(seconds: float) -> AsyncIterator[None]:
    """A task that holds the event loop for ``seconds`` at every turn it gets (as many
    ready requests would), until the block ends."""
    stop = False

    async def hog() -> None:
        while not stop:
            hold(seconds)
            await asyncio.sleep(0)

    task = asyncio.create_task(hog())
    try:
        yield
    finally:
        stop = True
        await task
