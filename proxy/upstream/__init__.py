"""The upstream model API behind one narrow interface.

:class:`~proxy.upstream.base.Upstream` is all the rest of the gateway knows: OpenAI-
compatible upstreams are relayed with aiohttp (:mod:`proxy.upstream.relay`), every other
provider goes through litellm (:mod:`proxy.upstream.litellm_adapter`, the only module that
imports litellm), and :class:`~proxy.upstream.dispatch.Dispatcher` picks per route.
"""
