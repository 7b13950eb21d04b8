"""The aiohttp relay against a real local HTTP upstream: SSE decoding at any chunk
boundary, and every transport failure translated into the gateway's error tree."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.errors import (
    RateLimitError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from proxy.models import ModelRegistry
from proxy.settings import Settings
from proxy.upstream.base import UpstreamCall
from proxy.upstream.relay import RelayUpstream
from tests.fakes import make_settings, relay_session, serve_upstream

BODY = {"messages": [{"role": "user", "content": "hi"}], "stream": True}


class _Chunks(httpx.AsyncByteStream):
    """A response body sent as exactly these network writes, with a pause between them."""

    def __init__(self, parts: list[bytes], *, pause: float = 0.0, hang: bool = False) -> None:
        self._parts = parts
        self._pause = pause
        self._hang = hang

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            yield part
            if self._pause:
                await asyncio.sleep(self._pause)
        if self._hang:
            await asyncio.sleep(3600)


def _sse(parts: list[bytes], **kwargs: Any) -> Callable[[httpx.Request], Any]:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=_Chunks(parts, **kwargs))
    return handler


def _settings(tmp_path: Path, **upstream: Any) -> Settings:
    return make_settings(tmp_path, upstream=upstream) if upstream else make_settings(tmp_path)


async def _stream(settings: Settings, handler: Callable[[httpx.Request], Any]) -> tuple[
        list[bytes], bool]:
    route = ModelRegistry(settings).route("m")
    async with serve_upstream(handler) as port:
        relay = RelayUpstream(settings.upstream, session=relay_session(port))
        try:
            stream = await relay.stream(UpstreamCall(route, dict(BODY)))
            try:
                payloads = [p async for p in stream]
            finally:
                await stream.aclose()
            return payloads, stream.ended_cleanly
        finally:
            await relay.aclose()


async def test_events_decode_the_same_at_every_chunk_boundary(tmp_path: Path) -> None:
    """CRLF line ends, a comment, multi-line data, an id field, and a multi-byte character:
    sent whole or one byte per network write, the payloads are the same, complete ones."""
    first = orjson.dumps({"choices": [{"delta": {"content": "Grüße 你好"}}]})
    wire = (b": keep-alive\r\n\r\n" + b"id: 7\r\ndata: " + first + b"\r\n\r\n"
            + b"data: line one\ndata: line two\n\n" + b"data: [DONE]\n\n")
    settings = _settings(tmp_path)
    whole = await _stream(settings, _sse([wire]))
    bytewise = await _stream(settings, _sse([wire[i:i + 1] for i in range(len(wire))]))
    assert whole == bytewise == ([first, b"line one\nline two"], True)


async def test_a_stream_without_done_ends_uncleanly_and_drops_a_torn_event(
        tmp_path: Path) -> None:
    """The connection closing after an event without its blank line: that event is not
    delivered (SSE spec) and the stream did not end the way the protocol says."""
    payloads, clean = await _stream(_settings(tmp_path),
                                    _sse([b'data: {"a": 1}\n\n', b'data: {"b": 2}']))
    assert payloads == [b'{"a": 1}']
    assert clean is False


async def test_an_error_event_is_handed_on_and_ends_the_stream(tmp_path: Path) -> None:
    payloads, clean = await _stream(_settings(tmp_path), _sse(
        [b'event: error\ndata: {"error": {"message": "overloaded"}}\n\n',
         b'data: {"never": true}\n\n']))
    assert payloads == [b'{"error": {"message": "overloaded"}}']
    assert clean is False


async def test_a_connection_dropped_mid_stream_raises_an_upstream_error(
        tmp_path: Path) -> None:
    """A chunked body cut off mid-way is a transport failure of the stream, reported in the
    error tree (the chat route turns it into a final SSE error event)."""
    async def handler(request: httpx.Request) -> httpx.Response:
        async def cut() -> AsyncIterator[bytes]:
            yield b'data: {"a": 1}\n\n'
            raise httpx.ReadError("upstream crashed")
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=_Gen(cut()))

    with pytest.raises(UpstreamError) as caught:
        await _stream(_settings(tmp_path), handler)
    assert not isinstance(caught.value, UpstreamTimeoutError)


class _Gen(httpx.AsyncByteStream):
    def __init__(self, source: AsyncIterator[bytes]) -> None:
        self._source = source

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._source:
            yield part


async def test_silence_past_the_timeout_is_a_timeout(tmp_path: Path) -> None:
    """No bytes for longer than the deployment's timeout: 504 ``timeout``, before the first
    byte and while streaming."""
    settings = _settings(tmp_path, timeout_seconds=0.3)

    async def silent(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        raise AssertionError("not cancelled")

    with pytest.raises(UpstreamTimeoutError):
        await _stream(settings, silent)
    with pytest.raises(UpstreamTimeoutError):
        await _stream(settings, _sse([b'data: {"a": 1}\n\n'], hang=True))


async def test_a_slow_but_steady_stream_outlives_the_timeout(tmp_path: Path) -> None:
    """The timeout bounds silence, not the length of a reply."""
    settings = _settings(tmp_path, timeout_seconds=0.3)
    parts = [b'data: {"n": %d}\n\n' % i for i in range(6)] + [b"data: [DONE]\n\n"]
    payloads, clean = await _stream(settings, _sse(parts, pause=0.1))
    assert len(payloads) == 6
    assert clean is True


async def test_an_unreachable_upstream_is_unavailable(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    route = ModelRegistry(settings).route("m")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    relay = RelayUpstream(settings.upstream, session=relay_session(port))
    try:
        with pytest.raises(UpstreamUnavailableError):
            await relay.complete(UpstreamCall(route, {"messages": BODY["messages"]}))
    finally:
        await relay.aclose()


async def test_error_statuses_keep_the_upstream_status_and_retry_after(
        tmp_path: Path) -> None:
    async def limited(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"retry-after": "7"},
                              json={"error": {"message": "slow down", "type": "rate_limit"}})

    with pytest.raises(RateLimitError) as caught:
        await _stream(_settings(tmp_path), limited)
    assert {k.lower(): v for k, v in caught.value.headers.items()} == {"retry-after": "7"}
    assert caught.value.message == "slow down"


async def test_a_stream_answered_with_json_is_an_upstream_error(tmp_path: Path) -> None:
    async def plain(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": []})

    with pytest.raises(UpstreamError, match="instead of an event stream"):
        await _stream(_settings(tmp_path), plain)


async def test_transport_errors_do_not_tell_the_client_where_the_upstream_is(
        tmp_path: Path) -> None:
    """The error a client sees names what failed, not the upstream's host and port."""
    settings = _settings(tmp_path)
    route = ModelRegistry(settings).route("m")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    relay = RelayUpstream(settings.upstream, session=relay_session(port))
    try:
        with pytest.raises(UpstreamUnavailableError) as caught:
            await relay.complete(UpstreamCall(route, {"messages": BODY["messages"]}))
    finally:
        await relay.aclose()
    assert "127.0.0.1" not in caught.value.message
    assert str(port) not in caught.value.message
    assert "upstream.test" not in caught.value.message
