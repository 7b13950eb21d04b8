"""Upstream through litellm, for providers that need request/response translation, and
embeddings through ``litellm.aembedding`` (:class:`LiteLLMEmbeddings`).

This is the only module that imports litellm. The import costs ~3.5 s and ~150 MB, so it
happens once, off the event loop, when a route first needs it (or at startup when the
configured model list has such routes: see :meth:`LiteLLMUpstream.warm_up`).
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import orjson

from proxy.errors import (
    ProxyError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    is_context_overflow,
    upstream_error_from_body,
)
from proxy.memory.embed import EmbedderError, RawEmbeddings
from proxy.settings import UpstreamSettings
from proxy.upstream.base import Completion, UpstreamCall

_CALL_PARAMS_FROM_DEPLOYMENT = ("api_base", "api_version", "organization")
_SKIPPED_DEPLOYMENT_PARAMS = frozenset({
    "model", "api_key", "api_base", "api_version", "organization", "timeout",
    "extra_headers", "missing_api_key_env",
})


def _import_litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


MAX_MESSAGE_CHARS = 1000
_PREFIX = re.compile(r"^(?:litellm\.\w+:\s*)+(?:\w+Error:\s*)*(?:\w+Exception\s*-\s*)?")


def _upstream_body(exc: Exception) -> Any:
    """The upstream's own error body when litellm kept its HTTP response."""
    response = getattr(exc, "response", None)
    content = getattr(response, "content", None)
    if isinstance(content, bytes) and content:
        try:
            return orjson.loads(content)
        except orjson.JSONDecodeError:
            return None
    return None


# Failures of the connection itself (refused, reset, dropped before a reply), found among
# the exceptions litellm wraps: the same cases the relay reports as upstream_unavailable.
_CONNECTION_FAILURES = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError,
                        httpx.WriteError, ConnectionError)


def _connection_failure(exc: BaseException) -> BaseException | None:
    """The connection failure that ``exc`` wraps (litellm re-raises httpx's error as an
    openai ``APIConnectionError`` inside its own 500 ``InternalServerError``), or ``None``.
    Follows ``original_exception``, ``__cause__`` and ``__context__``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _CONNECTION_FAILURES):
            return current
        wrapped = getattr(current, "original_exception", None)
        current = (wrapped if isinstance(wrapped, BaseException) else None) or \
            current.__cause__ or current.__context__
    return None


def translate_litellm_error(exc: Exception, *, where: str = "before the reply") -> ProxyError:
    """Map a litellm / openai SDK exception to the error tree, keeping the upstream's status,
    message and code (litellm's "litellm.XError: …Exception - " prefixes are removed) and its
    Retry-After header. A mid-stream fallback error raised before the first chunk is
    translated from the exception it wraps. A connection that could not be opened or was
    dropped is 502 ``upstream_unavailable`` with the relay's message, "Could not reach the
    upstream ({where}: {exception class})." — naming what failed, never the address."""
    if isinstance(exc, ProxyError):
        return exc
    if not isinstance(getattr(exc, "body", None), dict) and _upstream_body(exc) is None:
        failure = _connection_failure(exc)
        if failure is not None:
            return UpstreamUnavailableError(
                f"Could not reach the upstream ({where}: {type(failure).__name__}).")
    original = getattr(exc, "original_exception", None)
    if isinstance(original, Exception) and original is not exc:
        inner = translate_litellm_error(original)
        if getattr(exc, "is_pre_first_chunk", False) or is_context_overflow(inner.message,
                                                                           inner.code):
            return inner
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if isinstance(status, str) and status.isdigit():
        status = int(status)
    raw = str(getattr(exc, "message", None) or exc)
    # litellm folds tracebacks and bug-report links into some messages: keep the clients'
    # error to the upstream's own words.
    raw = raw.split("Traceback (most recent call last)", maxsplit=1)[0]
    raw = raw.split("This looks like a bug in LiteLLM")[0]
    message = _PREFIX.sub("", raw).strip()[:MAX_MESSAGE_CHARS] or name
    headers: dict[str, str] = {}
    raw_headers = getattr(exc, "litellm_response_headers", None)
    if raw_headers is None and getattr(exc, "response", None) is not None:
        raw_headers = getattr(exc.response, "headers", None)  # type: ignore[attr-defined]
    if raw_headers is not None:
        retry = raw_headers.get("retry-after")
        if retry is not None:
            headers["Retry-After"] = str(retry)
    body = getattr(exc, "body", None)
    if not isinstance(body, dict):
        body = _upstream_body(exc)
    answered = isinstance(body, dict)  # the upstream itself sent an error response
    if "Timeout" in name and not answered:
        return UpstreamTimeoutError(message)
    if "APIConnectionError" in name and not answered:
        return UpstreamUnavailableError(message)
    if isinstance(status, int) and 400 <= status <= 599:
        envelope = body if isinstance(body, dict) else {"error": {"message": message}}
        if isinstance(envelope.get("error"), dict) and not envelope["error"].get("message"):
            envelope["error"]["message"] = message
        if "error" not in envelope:
            envelope = {"error": {**envelope, "message": envelope.get("message", message)}}
        return upstream_error_from_body(status, envelope, headers=headers)
    return UpstreamError(message)


class _LiteLLMStream:
    def __init__(self, response: Any) -> None:
        self._response = response
        self._iterator = response.__aiter__()
        self.headers: dict[str, str] = {}
        self.ended_cleanly = False

    def __aiter__(self) -> _LiteLLMStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._iterator.__anext__()
        except StopAsyncIteration:
            self.ended_cleanly = True  # litellm itself rejects streams cut short
            raise
        except Exception as exc:
            raise translate_litellm_error(exc, where="while streaming") from exc
        return chunk.model_dump_json(exclude_none=True).encode()  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        closer = getattr(self._response, "aclose", None)
        if closer is not None:
            await closer()
        else:
            stream = getattr(self._response, "completion_stream", None)
            close = getattr(stream, "aclose", None) or getattr(stream, "close", None)
            if close is not None:
                result = close()
                if asyncio.iscoroutine(result):
                    await result


class _Lazy:
    """litellm, imported once, in a thread, on first use (shared by the adapters below)."""

    def __init__(self) -> None:
        self.module: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self.module is None:
                self.module = _import_litellm()
        return self.module

    async def get(self) -> Any:
        """The module; the first call imports it off the event loop."""
        return self.module or await asyncio.to_thread(self._load)


class LiteLLMUpstream:
    """:class:`~proxy.upstream.base.Upstream` over ``litellm.acompletion``."""

    def __init__(self, settings: UpstreamSettings) -> None:
        self._settings = settings
        self._litellm = _Lazy()

    async def warm_up(self) -> None:
        """Import litellm in a thread so that no request pays for it on the event loop."""
        await self._litellm.get()

    async def aclose(self) -> None:
        return None

    def _kwargs(self, call: UpstreamCall, *, stream: bool) -> dict[str, Any]:
        route = call.route
        params = route.deployment.litellm_params
        kwargs: dict[str, Any] = {
            k: v for k, v in (params.model_extra or {}).items()
            if k not in _SKIPPED_DEPLOYMENT_PARAMS
        }
        kwargs.update({k: v for k, v in call.body.items() if k not in ("model", "stream")})
        kwargs["model"] = route.litellm_model
        kwargs["stream"] = stream
        key = call.api_key or (params.api_key.get_secret_value() if params.api_key else None)
        if key:
            kwargs["api_key"] = key
        elif params.missing_api_key_env:
            raise UpstreamError(
                f"The gateway has no API key for model '{route.model_name}': set the "
                f"environment variable {params.missing_api_key_env}.",
                status_code=500, error_type="server_error", code="upstream_key_missing",
            )
        for name in _CALL_PARAMS_FROM_DEPLOYMENT:
            value = getattr(params, name)
            if value:
                kwargs[name] = value
        if params.extra_headers:
            kwargs["extra_headers"] = dict(params.extra_headers)
        user = call.body.get("user")
        if isinstance(user, str) and user:
            # litellm drops ``user`` for some providers' request bodies; the client's field
            # reaches the upstream as it does through the relay.
            kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), "user": user}
        kwargs["timeout"] = route.timeout or self._settings.timeout_seconds
        kwargs["num_retries"] = 0
        kwargs["max_retries"] = 0
        return kwargs

    @staticmethod
    def _entry(litellm: Any, call: UpstreamCall) -> Any:
        """``litellm.aresponses`` for a natively relayed Responses call (Azure, OpenAI),
        ``litellm.acompletion`` otherwise."""
        return litellm.aresponses if call.path == "responses" else litellm.acompletion

    async def complete(self, call: UpstreamCall) -> Completion:
        litellm = await self._litellm.get()
        kwargs = self._kwargs(call, stream=False)
        try:
            response = await self._entry(litellm, call)(**kwargs)
        except Exception as exc:
            raise translate_litellm_error(exc) from exc
        raw = response.model_dump_json(exclude_none=True).encode()
        return Completion(raw=raw, data=orjson.loads(raw))

    async def stream(self, call: UpstreamCall) -> _LiteLLMStream:
        litellm = await self._litellm.get()
        kwargs = self._kwargs(call, stream=True)
        try:
            response = await self._entry(litellm, call)(**kwargs)
        except Exception as exc:
            raise translate_litellm_error(exc, where="before the first byte") from exc
        return _LiteLLMStream(response)


class LiteLLMEmbeddings:
    """:class:`~proxy.memory.embed.EmbeddingBackend` over ``litellm.aembedding``: OpenAI
    (``text-embedding-3-small``), Azure (``azure/<deployment>``), Ollama
    (``ollama/nomic-embed-text``), a TEI or any OpenAI-compatible server (``openai/<name>``
    with ``api_base``), and every other provider litellm knows. The dimension is learned
    from a probe call at startup (:func:`proxy.memory.embed.probe_dimension`)."""

    def __init__(self, *, model: str, api_base: str | None = None, api_key: str | None = None,
                 api_version: str | None = None, timeout: float = 30.0) -> None:
        self.model = model
        self._params: dict[str, Any] = {
            k: v for k, v in {"api_base": api_base, "api_key": api_key,
                              "api_version": api_version}.items() if v
        }
        self._timeout = timeout
        self._litellm = _Lazy()

    async def start(self) -> None:
        """Import litellm off the event loop; the dimension is not known without a call."""
        await self._litellm.get()

    async def aclose(self) -> None:
        return None

    async def embed(self, texts: Sequence[str], *, urgent: bool = False) -> RawEmbeddings:
        """One ``aembedding`` call (``urgent`` changes nothing: calls run concurrently)."""
        del urgent
        litellm = await self._litellm.get()
        try:
            response = await litellm.aembedding(
                model=self.model, input=list(texts), timeout=self._timeout, num_retries=0,
                **self._params,
            )
        except Exception as exc:
            raise EmbedderError(str(translate_litellm_error(exc))) from exc
        data = _field(response, "data") or []
        rows: list[tuple[int, list[float]]] = []
        for position, item in enumerate(data):
            index = _field(item, "index")
            rows.append((index if isinstance(index, int) else position,
                         list(_field(item, "embedding") or [])))
        rows.sort(key=lambda row: row[0])
        usage = _field(response, "usage")
        tokens = _field(usage, "prompt_tokens") if usage is not None else None
        return RawEmbeddings(rows=[r for _, r in rows],
                             tokens=tokens if isinstance(tokens, int) else 0)


def _field(obj: Any, name: str) -> Any:
    """``obj[name]`` or ``obj.name`` — litellm returns dicts or pydantic objects."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)
