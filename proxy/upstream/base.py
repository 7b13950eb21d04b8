"""The upstream interface: one non-streaming call, one streaming call.

Both raise :class:`~proxy.errors.ProxyError` subclasses (translated at the adapter
boundary) when the upstream fails before a reply exists. A :class:`ChunkStream` yields the
JSON payload of each SSE ``data:`` event as bytes, exactly as the upstream sent it, without
the terminating ``[DONE]``; errors after the stream opened are raised from iteration.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.models import Route

# Upstream response headers worth passing to the client (request ids, rate limits).
FORWARDED_HEADER_PREFIXES = ("x-request-id", "openai-", "x-ratelimit-", "retry-after")


def forwardable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The subset of upstream response headers the client gets back."""
    return {
        k: v for k, v in headers.items() if k.lower().startswith(FORWARDED_HEADER_PREFIXES)
    }


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """One call: the route, the body to send (``model`` is set by the adapter) and an
    optional caller-supplied key (bring your own key). ``path``: the endpoint under the
    upstream's ``api_base`` — ``chat/completions``, or ``responses`` for OpenAI's Responses
    API relayed natively (the body and the reply are then Responses objects)."""

    route: Route
    body: dict[str, Any]
    api_key: str | None = None
    path: str = "chat/completions"


@dataclass(frozen=True, slots=True)
class Completion:
    """A non-streaming reply: the bytes to return, parsed, and forwardable headers."""

    raw: bytes
    data: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class ChunkStream(Protocol):
    """An open streaming reply; always ``aclose()`` it (the chat route does, in finally)."""

    headers: dict[str, str]
    # True once the stream ended the way the protocol says ([DONE], or the provider's own
    # end of stream through litellm); False while running or after an abrupt end.
    ended_cleanly: bool

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    async def complete(self, call: UpstreamCall) -> Completion: ...

    async def stream(self, call: UpstreamCall) -> ChunkStream: ...

    async def aclose(self) -> None: ...
