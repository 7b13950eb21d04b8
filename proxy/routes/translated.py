"""The streaming step shared by protocols translated to chat completions (Responses and
Messages on a chat upstream): chat chunks from the forwarder → the protocol's own events.

The chat path's :class:`~proxy.streaming.StreamForwarder` still does the work — holding
back until the first content so that an early upstream error is an HTTP error, detecting
truncated streams, asking for usage — and :func:`proxy.routes.chat.stream_finished` still
accounts and learns; only the bytes the client sees are the protocol's.
"""

from __future__ import annotations

from typing import Any, Protocol

import anyio
import orjson
from starlette.responses import Response, StreamingResponse

from proxy.errors import ProxyError
from proxy.routes import chat
from proxy.transcript import Usage, usage_from

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class Translator(Protocol):
    """Chat chunks → one protocol's SSE bytes (see :mod:`proxy.protocols`)."""

    def opening(self) -> bytes: ...

    def feed(self, chunk: dict[str, Any]) -> bytes: ...

    def closing(self, usage: Usage) -> bytes: ...

    def failure(self, error: ProxyError) -> bytes: ...


def chat_chunks(frames: bytes) -> list[dict[str, Any]]:
    """The chat chunks in SSE bytes the forwarder wrote (``[DONE]`` and error events
    left out: the forwarder reports errors itself)."""
    out = []
    for frame in frames.split(b"\n\n"):
        if not frame.startswith(b"data: ") or frame == b"data: [DONE]":
            continue
        try:
            chunk = orjson.loads(frame[6:])
        except orjson.JSONDecodeError:
            continue
        if isinstance(chunk, dict) and "error" not in chunk:
            out.append(chunk)
    return out


async def stream_response(call: chat.Call, translator: Translator) -> Response:
    """forward (streaming) → the translated event stream → account → learn. Raises the
    upstream's :class:`ProxyError` when it fails before the first content. ``call.chat``
    must ask for usage (``stream_options.include_usage``): the closing event carries it."""
    forwarder = await chat.open_stream(call)

    async def events() -> Any:
        usage: Usage | None = None
        try:
            yield translator.opening()
            async for frames in forwarder.body():
                out = []
                for chunk in chat_chunks(frames):
                    usage = usage_from(chunk.get("usage")) or usage
                    out.append(translator.feed(chunk))
                if any(out):
                    yield b"".join(out)
            if forwarder.error is not None:
                yield translator.failure(forwarder.error)
            else:
                yield translator.closing(usage or forwarder.usage or Usage(0, 0, 0))
        finally:
            with anyio.CancelScope(shield=True):
                await forwarder.aclose()
            chat.stream_finished(call, forwarder)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={**forwarder.headers, **call.headers(), **SSE_HEADERS})
