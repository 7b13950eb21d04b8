"""Relay to an OpenAI-compatible upstream with httpx: the body goes out as the client sent it
(spliced messages, the deployment's model id) and SSE events come back unchanged.

Measured on this machine (DEVELOPERS.md): a plain httpx relay costs ~2 ms CPU per call,
litellm's completion path ~8 ms (16 ms streamed), so OpenAI-compatible upstreams take this
path and litellm is kept for providers that need translation. The client's wire is
:mod:`proxy.upstream.transport` (httpcore's pool cost more than the rest of the gateway)
and SSE is decoded from bytes (:mod:`proxy.upstream.sse`); bench/gateway has the figures.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import httpx
import orjson

from proxy.errors import (
    ProxyError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    upstream_error_from_body,
)
from proxy.settings import UpstreamSettings
from proxy.upstream.base import Completion, UpstreamCall, forwardable_headers
from proxy.upstream.sse import Event, SSEDecoder
from proxy.upstream.transport import relay_transport

MAX_ERROR_BODY_BYTES = 64 * 1024


def translate_transport_error(exc: httpx.HTTPError, *, where: str) -> ProxyError:
    """Map an httpx failure to the error tree (timeouts → 408, connection → 502)."""
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeoutError(f"The upstream did not answer in time ({where}).")
    if isinstance(exc, httpx.ConnectError | httpx.NetworkError):
        return UpstreamUnavailableError(f"Could not reach the upstream ({where}): {exc}.")
    return UpstreamError(f"The upstream connection failed ({where}): {exc}.")


class _RelayStream:
    """Async iterator over the JSON payloads of an upstream SSE response.

    Events are decoded from the response bytes (:mod:`proxy.upstream.sse`); all payloads
    completed by one network read are queued, and :attr:`ready` tells how many steps can
    be taken without waiting, so the forwarder writes them to the client together.
    """

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.headers = forwardable_headers(response.headers)
        self._chunks = response.aiter_bytes()
        self._decoder = SSEDecoder()
        self._ready: deque[bytes] = deque()
        self._ended = False  # [DONE], an error event, or the end of the body was seen
        self._finished = False

    @property
    def ready(self) -> int:
        """Payloads available now without reading from the network, plus one for the end
        of the stream once it is known ([DONE] came in the same read)."""
        return len(self._ready) + (1 if self._ended and not self._finished else 0)

    def __aiter__(self) -> _RelayStream:
        return self

    async def __anext__(self) -> bytes:
        while not self._ready:
            if self._ended:
                self._finished = True
                raise StopAsyncIteration
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                self._queue(self._decoder.flush())
                self._ended = True
                continue
            except httpx.HTTPError as exc:
                self._ended = self._finished = True
                raise translate_transport_error(exc, where="while streaming") from exc
            self._queue(self._decoder.feed(chunk))
        return self._ready.popleft()

    def _queue(self, events: list[Event]) -> None:
        for event in events:
            if self._ended:
                return
            data = event.data
            if data == b"[DONE]":
                self._ended = True
            elif event.event == "error":
                self._ended = True
                self._ready.append(data or b'{"error": {"message": "upstream stream error"}}')
            elif data:
                self._ready.append(data)

    async def aclose(self) -> None:
        self._finished = self._ended = True
        self._ready.clear()
        await self._chunks.aclose()  # type: ignore[attr-defined]
        await self._response.aclose()


class RelayUpstream:
    """:class:`~proxy.upstream.base.Upstream` over one pooled ``httpx.AsyncClient``."""

    def __init__(self, settings: UpstreamSettings, client: httpx.AsyncClient | None = None):
        self._settings = settings
        limits = httpx.Limits(max_connections=settings.max_connections,
                              max_keepalive_connections=settings.max_connections)
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(settings.timeout_seconds,
                                  connect=settings.connect_timeout_seconds),
            limits=limits, transport=relay_transport(limits),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _request(self, call: UpstreamCall, *, stream: bool) -> httpx.Request:
        route = call.route
        params = route.deployment.litellm_params
        headers = {"content-type": "application/json", **params.extra_headers}
        key = call.api_key or (params.api_key.get_secret_value() if params.api_key else None)
        if key:
            headers["authorization"] = f"Bearer {key}"
        elif params.missing_api_key_env:
            raise UpstreamError(
                f"The gateway has no API key for model '{route.model_name}': set the "
                f"environment variable {params.missing_api_key_env}.",
                status_code=500, error_type="server_error", code="upstream_key_missing",
            )
        if params.organization:
            headers["openai-organization"] = params.organization
        if stream:
            headers["accept"] = "text/event-stream"
        body: dict[str, Any] = {**call.body, "model": route.upstream_model}
        timeout = httpx.Timeout(route.timeout or self._settings.timeout_seconds,
                                connect=self._settings.connect_timeout_seconds)
        return self._client.build_request(
            "POST", f"{route.api_base}/chat/completions", headers=headers,
            content=orjson.dumps(body), timeout=timeout,
        )

    async def complete(self, call: UpstreamCall) -> Completion:
        request = self._request(call, stream=False)
        try:
            response = await self._client.send(request)
        except httpx.HTTPError as exc:
            raise translate_transport_error(exc, where="before the reply") from exc
        raw = response.content
        if response.status_code >= 400:
            raise upstream_error_from_body(response.status_code, _loads(raw),
                                           headers=response.headers)
        data = _loads(raw)
        if not isinstance(data, dict):
            raise UpstreamError("The upstream returned a body that is not a JSON object.")
        if "error" in data and "choices" not in data:
            raise upstream_error_from_body(502, data)
        return Completion(raw=raw, data=data, headers=forwardable_headers(response.headers))

    async def stream(self, call: UpstreamCall) -> _RelayStream:
        request = self._request(call, stream=True)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise translate_transport_error(exc, where="before the first byte") from exc
        try:
            error = await _stream_error(response)
        except BaseException:
            await response.aclose()
            raise
        if error is not None:
            await response.aclose()
            raise error
        return _RelayStream(response)


async def _stream_error(response: httpx.Response) -> ProxyError | None:
    """The error a streaming response stands for, or ``None`` when it is an event stream."""
    if response.status_code >= 400:
        raw = await _read_limited(response)
        return upstream_error_from_body(response.status_code, _loads(raw),
                                        headers=response.headers)
    content_type = response.headers.get("content-type", "")
    if "text/event-stream" in content_type:
        return None
    body = _loads(await _read_limited(response))
    if isinstance(body, dict) and "error" in body:
        return upstream_error_from_body(502, body)
    return UpstreamError(f"The upstream answered a streaming request with '{content_type}' "
                         "instead of an event stream.")


async def _read_limited(response: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= MAX_ERROR_BODY_BYTES:
                break
    except httpx.HTTPError:
        pass
    return b"".join(chunks)


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")

