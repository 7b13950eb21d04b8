"""Forward an upstream chunk stream to the client as OpenAI frames it.

``data: {chunk}\\n\\n`` per upstream event, byte for byte, then ``data: [DONE]\\n\\n``
— always, also after an error event, so that a client waiting for ``[DONE]`` never hangs.
The only rewrites concern ``usage`` (docs/design.md#streaming):

- when the client asked (``stream_options.include_usage``), exactly one usage chunk is sent,
  with ``"choices": []``, after the chunk carrying ``finish_reason`` and before ``[DONE]``;
  a usage object riding on a content chunk is moved there; when the upstream sent none, one
  is made from the gateway's own token counts;
- when the client did not ask, usage that the gateway requested for its own accounting is
  stripped: no usage-only chunk reaches the client.

Events are held back only until the first substantive chunk (content, tool call or finish),
so that an error the upstream reports inside the stream before any content becomes a proper
HTTP error with the upstream's status, never a 200 stream carrying an error; after that, an
error ends the stream with an error event followed by ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from proxy.errors import ProxyError, UpstreamError, error_event, upstream_error_from_body
from proxy.errors import status_for_stream_error as _status
from proxy.shutdown import Drain, ShuttingDownError
from proxy.transcript import ReplyAssembler, Usage
from proxy.upstream.base import ChunkStream

DONE = b"data: [DONE]\n\n"
_SHUTDOWN_MESSAGE = ("The gateway is shutting down and its grace period for open streams is "
                     "over; retry the request.")


def frame(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def _substantive(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason"):
            return True
        delta = choice.get("delta") or {}
        if isinstance(delta, dict) and any(
            delta.get(key) for key in ("content", "tool_calls", "refusal", "function_call",
                                       "reasoning_content", "audio")
        ):
            return True
    return False


def _usage_only(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    return not choices or not _substantive(chunk)


def _in_stream_error(chunk: Any) -> ProxyError | None:
    if isinstance(chunk, dict) and chunk.get("error") and not chunk.get("choices"):
        return upstream_error_from_body(_status(chunk), chunk)
    return None


class StreamForwarder:
    """Turns a :class:`~proxy.upstream.base.ChunkStream` into client SSE bytes.

    Call :meth:`start` before sending response headers (it raises :class:`ProxyError` for an
    error before the first content), then iterate :meth:`body`. ``estimate_usage`` gives the
    gateway's own count when the client asked for usage and the upstream sent none.
    """

    def __init__(
        self,
        upstream: ChunkStream,
        *,
        include_usage: bool,
        estimate_usage: Callable[[ReplyAssembler], Usage],
        model: str = "",
        drain: Drain | None = None,
    ) -> None:
        self._upstream = upstream
        # Graceful shutdown: past the grace the stream ends with an error event.
        self._drain = drain
        self._include_usage = include_usage
        self._estimate = estimate_usage
        self._model = model  # for a usage chunk the gateway makes when the stream named none
        self.assembler = ReplyAssembler()
        self._held: list[bytes] = []
        self._usage_chunk: dict[str, Any] | None = None
        self._usage_raw: bytes | None = None
        self.completed = False
        self.error: ProxyError | None = None
        self.usage_estimated = False
        self._last_substantive = False

    async def start(self) -> None:
        """Read up to the first substantive chunk. Raises the upstream's error if it comes
        first (nothing has been sent to the client yet)."""
        async for payload in self._upstream:
            out = self._process(payload)
            if self.error is not None:
                raise self.error
            if out is not None:
                self._held.append(out)
                if self._last_substantive:
                    return
        # Stream ended before any content: still a valid (empty) reply, forwarded as is.

    def _process(self, payload: bytes) -> bytes | None:
        """Returns the frame to forward (or None to hold/drop) and records the chunk."""
        self._last_substantive = False
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return frame(payload)
        error = _in_stream_error(chunk)
        if error is not None:
            self.error = error
            return None
        if not isinstance(chunk, dict):
            return frame(payload)
        self.assembler.feed(chunk)
        if chunk.get("usage"):
            if _usage_only(chunk):
                self._usage_chunk, self._usage_raw = chunk, payload
                return None
            stripped = {k: v for k, v in chunk.items() if k != "usage"}
            self._last_substantive = _substantive(chunk)
            return frame(orjson.dumps(stripped))
        self._last_substantive = _substantive(chunk)
        return frame(payload)

    async def body(self) -> AsyncIterator[bytes]:
        """The client's SSE body. Ends with the usage chunk (when asked) and ``[DONE]``, or
        — when the upstream fails mid-stream, or the gateway ends the stream itself (its
        read timeout, the shutdown grace) — with an error event and ``[DONE]``."""
        held, self._held = self._held, []
        if held:  # the frames held before the first content go out in one write
            yield b"".join(held)
        batch: list[bytes] = []  # the closing frames, written together
        try:
            if self._drain is None:
                async for payload in self._upstream:
                    out = self._process(payload)
                    if self.error is not None:
                        break
                    if out is not None:
                        yield out
            else:
                async for out in self._until_shutdown(self._drain):
                    yield out
        except ProxyError as exc:
            self.error = exc
        if self.error is None and not self.assembler.finished and \
                not self._upstream.ended_cleanly:
            self.error = UpstreamError("The upstream stream ended abruptly: no finish_reason "
                                       "and no [DONE].", code="stream_truncated")
        if self.error is not None:
            batch += (error_event(self.error), DONE)
            yield b"".join(batch)
            return
        if self._include_usage:
            batch.append(frame(self._usage_payload()))
        # A reply without finish_reason is forwarded, but not learned from (not complete).
        self.completed = self.assembler.finished
        batch.append(DONE)
        yield b"".join(batch)

    async def _until_shutdown(self, drain: Drain) -> AsyncIterator[bytes]:
        """The frames to forward, as :meth:`body`'s loop, until the upstream ends or the
        shutdown grace expires (then :class:`ShuttingDownError` is raised): a wait for the
        next upstream chunk that is under way then is cancelled by ``drain``, and no new
        one starts. Frames are yielded outside the waits."""
        chunks = aiter(self._upstream)
        stream = drain.watch()
        try:
            while True:
                if drain.expired:
                    raise ShuttingDownError(_SHUTDOWN_MESSAGE)
                stream.waiting = True
                try:
                    payload = await anext(chunks)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if not stream.interrupted:
                        raise
                    task = asyncio.current_task()
                    if task is not None:
                        task.uncancel()
                    raise ShuttingDownError(_SHUTDOWN_MESSAGE) from None
                finally:
                    stream.waiting = False
                out = self._process(payload)
                if self.error is not None:
                    return
                if out is not None:
                    yield out
        finally:
            drain.unwatch(stream)

    def _usage_payload(self) -> bytes:
        chunk, raw = self._usage_chunk, self._usage_raw
        if chunk is not None and raw is not None:
            if chunk.get("choices") == []:
                return raw
            return orjson.dumps({**chunk, "choices": []})
        usage = self.assembler.usage
        if usage is None:
            usage = self._estimate(self.assembler)
            self.usage_estimated = True
        meta = self.assembler.meta
        return orjson.dumps({
            "id": meta.get("id") or f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": meta.get("created") or int(time.time()),
            "model": meta.get("model") or self._model,
            "choices": [],
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
            },
        })

    @property
    def headers(self) -> dict[str, str]:
        """Forwardable upstream response headers."""
        return self._upstream.headers

    @property
    def usage(self) -> Usage | None:
        return self.assembler.usage

    async def aclose(self) -> None:
        await self._upstream.aclose()
