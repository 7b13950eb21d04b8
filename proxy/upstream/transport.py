"""A lean HTTP/1.1 keep-alive transport for the relay's ``httpx.AsyncClient``.

httpx's default transport (httpcore over anyio) costs more CPU per request than the rest
of the gateway together, and its pool rescans every connection — with a readability syscall
each — on every request, so the cost grows with concurrency (bench/gateway: the relay was
~78 % of the gateway's Python time at 32 concurrent requests). This transport keeps httpx's
client API (headers, timeouts, cookies, redirects, decoding stay httpx's) and replaces only
the wire: one asyncio protocol per connection, responses parsed by httptools (C), idle
connections kept per origin (LIFO) and dropped as soon as the server closes them.

Semantics follow httpcore where the relay can see them: ``timeout`` extension (``connect``,
``read`` between received bytes, ``pool`` for a free connection), ``httpx.Limits``
(``max_connections``, ``max_keepalive_connections``, ``keepalive_expiry``), exceptions
``ConnectError`` / ``ConnectTimeout`` / ``ReadError`` / ``ReadTimeout`` /
``RemoteProtocolError`` / ``PoolTimeout``, no retry of a request that was sent. A response
closed before its end closes its connection; a finished one returns it to the pool.
Flow control: reading pauses while more than 256 KiB of body waits for the consumer.

:func:`relay_transport` gives ``None`` (use httpx's default) when httptools is missing or
proxies are configured in the environment (httpx would route through them).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from typing import Any, cast

import httpx

try:  # uvicorn[standard] brings httptools on CPython
    import httptools
except ImportError:  # pragma: no cover - exercised only where httptools is absent
    HAVE_HTTPTOOLS = False
else:
    HAVE_HTTPTOOLS = True

HIGH_WATER = 256 * 1024
Origin = tuple[bytes, bytes, int]  # scheme, host, port


def relay_transport(limits: httpx.Limits) -> httpx.AsyncBaseTransport | None:
    """The fast transport, or ``None`` where httpx's default must be kept."""
    if not HAVE_HTTPTOOLS or httpx._utils.get_environment_proxies():
        return None
    return PooledTransport(limits=limits)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; one request/response at a time."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reusable = False
        self._parser: Any = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._status = 0
        self._reason = b""
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._error: Exception | None = None
        self._headers_done: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._parser is None:  # bytes while idle: the server broke the protocol
            self._fail(httpx.RemoteProtocolError("Received data while idle."))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("Upgrades are not supported."))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"Invalid HTTP response: {exc}."))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._parser is None:
            return
        if self._status and not self._complete and self._reads_until_close():
            self.on_message_complete()  # body delimited by the connection's end
            return
        if not self._complete:
            message = "Server disconnected without sending a complete response."
            self._fail(httpx.ReadError(str(exc)) if exc else
                       httpx.RemoteProtocolError(message))

    # httptools callbacks ------------------------------------------------------------
    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # interim response: wait for the real one
            self._headers, self._reason = [], b""
            return
        self._status = status
        _wake(self._headers_done)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        _wake(self._waiter)

    def on_message_complete(self) -> None:
        if not self._status:
            return
        self._complete = True
        self.reusable = bool(self._parser.should_keep_alive()) and not self.closed
        _wake(self._headers_done)
        _wake(self._waiter)

    # request side -------------------------------------------------------------------
    def _reads_until_close(self) -> bool:
        names = {name.lower() for name, _ in self._headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        _wake(self._headers_done)
        _wake(self._waiter)
        self.close()

    def close(self) -> None:
        self.closed = True
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    async def send(self, head: bytes, body: bytes, read_timeout: float | None) -> None:
        """Write the request and wait for the response head."""
        assert self.transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._headers, self._reason, self._status = [], b"", 0
        self._chunks.clear()
        self._buffered, self._complete, self._error = 0, False, None
        self.reusable = False
        loop = asyncio.get_running_loop()
        self._headers_done = loop.create_future()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        try:
            async with asyncio.timeout(read_timeout):
                await self._headers_done
        except TimeoutError:
            self.close()
            raise httpx.ReadTimeout("Timed out waiting for the response headers.") from None
        except BaseException:
            self.close()
            raise
        if self._error is not None:
            raise self._error

    def response_head(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        return self._status, self._headers, self._reason

    async def next_chunk(self, read_timeout: float | None) -> bytes | None:
        """The body bytes received so far (waiting for some), or ``None`` at its end.

        A plain coroutine, not an async generator: an abandoned generator is finalised
        later, when this connection may already serve another request."""
        while True:
            if self._chunks:
                data = b"".join(self._chunks)
                self._chunks.clear()
                self._buffered = 0
                if self._paused and self.transport is not None and not self.closed:
                    self._paused = False
                    self.transport.resume_reading()
                return data
            if self._error is not None:
                raise self._error
            if self._complete:
                return None
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(read_timeout):
                    await waiter
            except TimeoutError:
                self.close()
                raise httpx.ReadTimeout("Timed out reading the response body.") from None
            finally:
                if self._waiter is waiter:
                    self._waiter = None

    def finished(self) -> None:
        """The exchange is over; afterwards only a complete, keep-alive one is reused."""
        self._parser = None
        self._headers_done = None
        if not (self._complete and self.reusable) or self._chunks:
            self.close()


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class _Body(httpx.AsyncByteStream):
    """The response body; closing it before its end closes the connection."""

    def __init__(self, pool: PooledTransport, conn: _Connection,
                 read_timeout: float | None) -> None:
        self._pool = pool
        self._conn = conn
        self._timeout = read_timeout
        self._released = False

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        if self._released:
            raise StopAsyncIteration
        try:
            chunk = await self._conn.next_chunk(self._timeout)
        except BaseException:
            if not self._released:
                self._conn.close()
            raise
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._conn.finished()
            self._pool.release(self._conn)


class PooledTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncBaseTransport`` over :class:`_Connection` (see the module docstring)."""

    def __init__(self, *, limits: httpx.Limits | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        limits = limits or httpx.Limits()
        self._max = limits.max_connections if limits.max_connections is not None else 1 << 30
        self._max_idle = limits.max_keepalive_connections \
            if limits.max_keepalive_connections is not None else self._max
        self._expiry = limits.keepalive_expiry
        self._ssl = ssl_context
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._fallback: httpx.AsyncHTTPTransport | None = None
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        return self._ssl

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "HEAD" or request.url.scheme not in ("http", "https"):
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        scheme = url.scheme.encode()
        port = url.port or (443 if scheme == b"https" else 80)
        origin: Origin = (scheme, url.raw_host, port)
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = await request.aread()
        head = _head(request, len(body))
        conn = await self._acquire(origin, timeouts)
        try:
            await conn.send(head, body, timeouts.get("read"))
        except BaseException:
            conn.finished()
            self.release(conn)
            raise
        status, headers, reason = conn.response_head()
        return httpx.Response(
            status, headers=headers,
            stream=_Body(self, conn, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )

    async def _acquire(self, origin: Origin, timeouts: dict[str, float | None]) -> _Connection:
        if self._closed:
            raise RuntimeError("The transport is closed.")
        deadline = None if timeouts.get("pool") is None else \
            time.monotonic() + cast(float, timeouts["pool"])
        while True:
            conn = self._take_idle(origin)
            if conn is not None:
                self._active += 1
                return conn
            if self._active + self._idle_count < self._max:
                self._active += 1
                try:
                    return await self._connect(origin, connect_timeout=timeouts.get("connect"))
                except BaseException:
                    self._active -= 1
                    self._notify()
                    raise
            if self._idle_count:  # room is held by idle connections to other origins
                self._evict_one()
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                async with asyncio.timeout(remaining):
                    await waiter
            except TimeoutError:
                raise httpx.PoolTimeout("No free upstream connection in time.") from None
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            if conn.closed or (self._expiry is not None and now - conn.idle_since > self._expiry):
                conn.close()
                continue
            return conn
        return None

    def _evict_one(self) -> None:
        for idle in self._idle.values():
            if idle:
                idle.pop(0).close()
                self._idle_count -= 1
                return

    async def _connect(self, origin: Origin, *, connect_timeout: float | None) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        hostname = host.decode("ascii")
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(origin), hostname, port,
                    ssl=self._ssl_context() if scheme == b"https" else None,
                    server_hostname=hostname if scheme == b"https" else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"Timed out connecting to {hostname}:{port}.") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        return conn

    def release(self, conn: _Connection) -> None:
        """Give a connection back: to the idle list when reusable, else closed."""
        self._active -= 1
        if conn.reusable and not conn.closed and not self._closed and \
                self._idle_count < self._max_idle:
            conn.idle_since = time.monotonic()
            self._idle.setdefault(conn.origin, []).append(conn)
            self._idle_count += 1
        else:
            conn.close()
        self._notify()

    def _notify(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        self._idle_count = 0
        if self._fallback is not None:
            await self._fallback.aclose()


def _head(request: httpx.Request, length: int) -> bytes:
    """Request line and headers; ``Content-Length`` is set from the body actually sent."""
    url = request.url
    target = url.raw_path or b"/"
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
    for name, value in request.headers.raw:
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            continue
        lines.append(name + b": " + value)
    if length or request.method in ("POST", "PUT", "PATCH"):
        lines.append(b"Content-Length: " + str(length).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"
