"""Pick the transport per route: the aiohttp relay for OpenAI-compatible upstreams, litellm for
the rest (see :attr:`proxy.models.Route.relay`)."""

from __future__ import annotations

from proxy.upstream.base import ChunkStream, Completion, Upstream, UpstreamCall


class Dispatcher:
    """:class:`~proxy.upstream.base.Upstream` that delegates to ``relay`` or ``translated``."""

    def __init__(self, relay: Upstream, translated: Upstream) -> None:
        self._relay = relay
        self._translated = translated

    def _pick(self, call: UpstreamCall) -> Upstream:
        return self._relay if call.route.relay else self._translated

    async def complete(self, call: UpstreamCall) -> Completion:
        return await self._pick(call).complete(call)

    async def stream(self, call: UpstreamCall) -> ChunkStream:
        return await self._pick(call).stream(call)

    async def aclose(self) -> None:
        try:
            await self._relay.aclose()
        finally:
            await self._translated.aclose()
