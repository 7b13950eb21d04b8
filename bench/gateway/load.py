"""A bounded closed-loop load generator over raw keep-alive HTTP/1.1 connections.

``concurrency`` connections each send one request, read the whole response, and send the
next, until ``requests`` were sent or ``seconds`` passed (whichever comes first). Responses
are parsed with httptools; timestamps are taken when the bytes reach the protocol:

- **TTFT** — request written → first response body byte; for a stream, → the first body
  piece holding an SSE ``data:`` line (the gateway's first forwarded event);
- **total** — request written → end of the response message.

An **error** is a connection failure, a status other than 200, a stream that does not end
with ``data: [DONE]``, a JSON reply without ``choices``, or no reply within ``timeout``.
The ``x-memory-status`` response header is tallied so a run can show memory was on, and
``x-memory-reason`` beside it for every reply that was not ``injected`` (why memory was
left out: ``degraded/store_busy``, ``degraded/timeout``, …).
Only 127.0.0.1 is ever targeted (the benchmark starts every server itself).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import httptools

LOOPBACK = "127.0.0.1"


@dataclass(slots=True)
class Sample:
    ttft: float
    total: float


@dataclass
class LoadResult:
    """What one bounded run measured (seconds)."""

    samples: list[Sample] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    memory_status: Counter[str] = field(default_factory=Counter)
    # "status/reason" of the replies that were not "injected" ("degraded/store_busy")
    memory_reason: Counter[str] = field(default_factory=Counter)
    aborted: int = 0
    wall: float = 0.0

    @property
    def count(self) -> int:
        return len(self.samples)


def build_request(*, port: int, path: str, body: bytes,
                  headers: Sequence[tuple[str, str]] = ()) -> bytes:
    """The bytes of one ``POST`` with a JSON body."""
    lines = [f"POST {path} HTTP/1.1", f"host: {LOOPBACK}:{port}",
             "content-type: application/json", "accept: */*", f"content-length: {len(body)}"]
    lines.extend(f"{k}: {v}" for k, v in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Exchange:
    """Parser callbacks and timing for one request/response on a connection."""

    __slots__ = (
        "_header",
        "abort_after_first",
        "body",
        "done",
        "error",
        "first",
        "memory_reason",
        "memory_status",
        "parser",
        "sent",
        "status",
        "stream",
        "tail",
    )

    def __init__(self, *, stream: bool, abort_after_first: bool) -> None:
        self.stream = stream
        self.abort_after_first = abort_after_first
        self.parser = httptools.HttpResponseParser(self)
        self.sent = 0.0
        self.first = 0.0
        self.status = 0
        self.tail = b""
        self.body: list[bytes] = []
        self.memory_status = ""
        self.memory_reason = ""
        self.error = ""
        self._header = b""
        self.done: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"x-memory-status":
            self.memory_status = value.decode()
        elif name.lower() == b"x-memory-reason":
            self.memory_reason = value.decode()

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self.first and (not self.stream or b"data:" in body):
            self.first = time.perf_counter()
        if self.stream:
            self.tail = (self.tail + body)[-64:]
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if not self.done.done():
            self.done.set_result(time.perf_counter())


class Connection(asyncio.Protocol):
    """One keep-alive client connection; :meth:`request` sends and awaits one exchange."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._exchange: _Exchange | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        exchange = self._exchange
        if exchange is None:
            return
        try:
            exchange.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            exchange.error = f"parse: {exc}"
            if not exchange.done.done():
                exchange.done.set_result(time.perf_counter())
            return
        if exchange.abort_after_first and exchange.first and not exchange.done.done():
            exchange.done.set_result(time.perf_counter())

    def connection_lost(self, _exc: Exception | None) -> None:
        self.closed = True
        exchange = self._exchange
        if exchange is not None and not exchange.done.done():
            exchange.error = "connection closed"
            exchange.done.set_result(time.perf_counter())

    async def request(self, payload: bytes, *, stream: bool, reply_timeout: float,
                      abort_after_first: bool = False) -> _Exchange:
        assert self.transport is not None
        exchange = _Exchange(stream=stream, abort_after_first=abort_after_first)
        self._exchange = exchange
        exchange.sent = time.perf_counter()
        self.transport.write(payload)
        try:
            await asyncio.wait_for(asyncio.shield(exchange.done), reply_timeout)
        except TimeoutError:
            exchange.error = "timeout"
        self._exchange = None
        return exchange

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True


async def connect(port: int) -> Connection:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(Connection, LOOPBACK, port)
    return protocol


def check(exchange: _Exchange) -> str:
    """The error class of a finished exchange, or "" when it is a good reply."""
    if exchange.error:
        return exchange.error
    if exchange.status != 200:
        return f"http {exchange.status}"
    if exchange.abort_after_first:
        return ""
    if exchange.stream:
        return "" if exchange.tail.endswith(b"data: [DONE]\n\n") else "stream without [DONE]"
    return "" if b'"choices"' in b"".join(exchange.body) else "reply without choices"


async def run_load(
    *,
    port: int,
    payloads: Sequence[bytes],
    stream: bool,
    concurrency: int,
    requests: int,
    seconds: float,
    reply_timeout: float = 30.0,
    abort_every: int = 0,
) -> LoadResult:
    """Send up to ``requests`` requests (cycling ``payloads``) on ``concurrency``
    connections for at most ``seconds``. ``abort_every`` > 0 closes every n-th streamed
    request's connection after its first event (a client that goes away mid-stream)."""
    result = LoadResult()
    sent = 0
    connections = [await connect(port) for _ in range(concurrency)]
    started = time.perf_counter()
    deadline = started + seconds

    async def worker(slot: int) -> None:
        nonlocal sent
        conn = connections[slot]
        while sent < requests and time.perf_counter() < deadline:
            index = sent
            sent += 1
            if conn.closed:
                try:
                    conn = await connect(port)
                except OSError as exc:
                    result.errors[f"connect: {type(exc).__name__}"] += 1
                    await asyncio.sleep(0.01)
                    continue
            abort = bool(stream and abort_every and index % abort_every == abort_every - 1)
            exchange = await conn.request(payloads[index % len(payloads)], stream=stream,
                                          reply_timeout=reply_timeout,
                                          abort_after_first=abort)
            error = check(exchange)
            if error:
                result.errors[error] += 1
                conn.close()
                continue
            if abort:
                conn.close()
                result.aborted += 1
                continue
            end = exchange.done.result()
            result.samples.append(Sample(exchange.first - exchange.sent, end - exchange.sent))
            result.memory_status[exchange.memory_status or "-"] += 1
            if exchange.memory_status != "injected":
                status = exchange.memory_status or "-"
                result.memory_reason[f"{status}/{exchange.memory_reason or '-'}"] += 1
            if not exchange.parser.should_keep_alive():
                conn.close()
        connections[slot] = conn

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    result.wall = time.perf_counter() - started
    for conn in connections:
        conn.close()
    return result


async def one_request(port: int, payload: bytes, *, reply_timeout: float = 5.0) -> bool:
    """One non-streaming request on a fresh connection: True for a good reply."""
    try:
        conn = await asyncio.wait_for(connect(port), reply_timeout)
    except (OSError, TimeoutError):
        return False
    try:
        exchange = await conn.request(payload, stream=False, reply_timeout=reply_timeout)
        return check(exchange) == ""
    finally:
        conn.close()


async def get(port: int, path: str, *, reply_timeout: float = 5.0) -> bytes:
    """The body of ``GET path`` on a fresh connection (``b""`` on any failure)."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(LOOPBACK, port), reply_timeout)
    except (OSError, TimeoutError):
        return b""
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nhost: {LOOPBACK}:{port}\r\n"
                     "connection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(-1), reply_timeout)
    except (OSError, TimeoutError):
        return b""
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        out, rest = [], body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out.append(rest[:size])
            rest = rest[size + 2:]
        return b"".join(out)
    return body
