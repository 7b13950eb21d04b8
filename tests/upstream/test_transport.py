"""The relay's HTTP/1.1 transport against a real local server: reuse, streaming, closing,
timeouts and the connection limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest

from proxy.upstream.transport import PooledTransport


@dataclass
class Server:
    """A tiny scripted HTTP/1.1 server on 127.0.0.1 (one handler per test)."""

    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


@pytest.fixture
async def serve() -> AsyncIterator[object]:
    servers: list[asyncio.Server] = []

    async def start(respond: object) -> Server:
        state = Server()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            state.connections += 1
            try:
                while True:
                    try:
                        request = await _read_request(reader)
                    except (asyncio.IncompleteReadError, ConnectionError):
                        return
                    state.requests.append(request or b"")
                    keep = await respond(request, writer)  # type: ignore[operator]
                    await writer.drain()
                    if not keep:
                        return
            finally:
                writer.close()

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        servers.append(server)
        state.port = server.sockets[0].getsockname()[1]
        return state

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " + \
        str(len(body)).encode() + b"\r\n\r\n" + body


async def test_keeps_the_connection_alive_between_requests(serve: object) -> None:
    """Sequential requests to one origin reuse one connection and get their own bodies."""
    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(request.rsplit(b"\r\n\r\n", 1)[1] or b"{}"))
        return True

    server = await serve(respond)  # type: ignore[operator]
    async with httpx.AsyncClient(transport=PooledTransport()) as client:
        for index in range(3):
            reply = await client.post(f"http://127.0.0.1:{server.port}/v1/x",
                                      content=f'{{"n": {index}}}'.encode())
            assert reply.status_code == 200
            assert reply.json() == {"n": index}
    assert server.connections == 1
    assert b"content-length: 8" in server.requests[0].lower()


async def test_streams_a_chunked_body_as_it_arrives(serve: object) -> None:
    """A chunked response is readable part by part before the server finishes it."""
    release = asyncio.Event()

    async def respond(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n6\r\nfirst\n\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
        return True

    server = await serve(respond)  # type: ignore[operator]
    async with httpx.AsyncClient(transport=PooledTransport()) as client:
        request = client.build_request("POST", f"http://127.0.0.1:{server.port}/", content=b"{}")
        response = await client.send(request, stream=True)
        parts = response.aiter_bytes()
        assert await anext(parts) == b"first\n"
        release.set()
        assert b"".join([part async for part in parts]) == b"second\n"
        await response.aclose()


async def test_a_body_delimited_by_the_connection_end_is_complete(serve: object) -> None:
    """No length and no chunking: the body ends when the server closes the connection."""
    async def respond(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"a\": 1}")
        return False

    server = await serve(respond)  # type: ignore[operator]
    async with httpx.AsyncClient(transport=PooledTransport()) as client:
        reply = await client.post(f"http://127.0.0.1:{server.port}/", content=b"{}")
    assert reply.json() == {"a": 1}


async def test_a_connection_the_server_closed_is_not_reused(serve: object) -> None:
    """After the server drops an idle connection, the next request opens a new one."""
    async def respond(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(b"{}"))
        return False  # close after each reply, though it said keep-alive

    server = await serve(respond)  # type: ignore[operator]
    async with httpx.AsyncClient(transport=PooledTransport()) as client:
        for _ in range(3):
            reply = await client.post(f"http://127.0.0.1:{server.port}/", content=b"{}")
            assert reply.status_code == 200
            await asyncio.sleep(0.05)  # the close reaches the client
    assert server.connections == 3


async def test_a_response_closed_early_closes_its_connection(serve: object) -> None:
    """A stream abandoned before its end is never handed to the next request."""
    async def respond(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(b"0\r\n\r\n")
        return True

    server = await serve(respond)  # type: ignore[operator]
    async with httpx.AsyncClient(transport=PooledTransport()) as client:
        url = f"http://127.0.0.1:{server.port}/"
        response = await client.send(client.build_request("POST", url, content=b"{}"),
                                     stream=True)
        assert await anext(response.aiter_bytes()) == b"abc"
        await response.aclose()
        second = await client.post(url, content=b"{}")
        assert second.content == b"abc"
    assert server.connections == 2


async def test_a_silent_server_raises_read_timeout(serve: object) -> None:
    """No response head within the read timeout: ``httpx.ReadTimeout``."""
    async def respond(_request: bytes, _writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(5)
        return False

    server = await serve(respond)  # type: ignore[operator]
    async with httpx.AsyncClient(transport=PooledTransport(),
                                 timeout=httpx.Timeout(5, read=0.1)) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(f"http://127.0.0.1:{server.port}/", content=b"{}")


async def test_a_refused_connection_raises_connect_error() -> None:
    """Nothing listening: ``httpx.ConnectError`` (the relay maps it to 502)."""
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    async with httpx.AsyncClient(transport=PooledTransport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.post(f"http://127.0.0.1:{port}/", content=b"{}")


async def test_a_malformed_response_raises_a_protocol_error(serve: object) -> None:
    """Bytes that are not HTTP: ``httpx.RemoteProtocolError``."""
    async def respond(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        return False

    server = await serve(respond)  # type: ignore[operator]
    async with httpx.AsyncClient(transport=PooledTransport()) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(f"http://127.0.0.1:{server.port}/", content=b"{}")


async def test_the_connection_limit_queues_then_times_out(serve: object) -> None:
    """With ``max_connections=1`` a second request waits for the first; past the pool
    timeout it fails with ``httpx.PoolTimeout``."""
    gate = asyncio.Event()

    async def respond(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        await gate.wait()
        writer.write(ok(b"{}"))
        return True

    server = await serve(respond)  # type: ignore[operator]
    transport = PooledTransport(limits=httpx.Limits(max_connections=1))
    async with httpx.AsyncClient(transport=transport,
                                 timeout=httpx.Timeout(5, pool=0.1)) as client:
        url = f"http://127.0.0.1:{server.port}/"
        first = asyncio.ensure_future(client.post(url, content=b"{}"))
        await asyncio.sleep(0.05)
        with pytest.raises(httpx.PoolTimeout):
            await client.post(url, content=b"{}")
        waiting = asyncio.ensure_future(client.post(url, content=b"{}"))
        await asyncio.sleep(0.05)
        gate.set()
        assert (await first).status_code == 200
        assert (await waiting).status_code == 200
    assert server.connections == 1
