"""``POST /v1/chat/completions``: authenticate → identify → recall/splice → forward →
stream back → account → hand the turn to learning. Orchestration only; each step lives in
its own module.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
import structlog
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.access import access_record
from proxy.auth import Principal
from proxy.errors import (
    AuthenticationError,
    ContextLengthExceededError,
    PermissionDeniedError,
    UpstreamError,
)
from proxy.http import (
    CLIENT_CLOSED_REQUEST,
    ClientDisconnectedError,
    read_body,
    until_disconnected,
)
from proxy.identity import Identity, resolve_identity
from proxy.learning.policy import Switches
from proxy.learning.sink import Turn
from proxy.ledger import UsageRecord
from proxy.memory.service import Injection
from proxy.memory.store import StoreUnavailableError, UserSettings
from proxy.models import Route
from proxy.request import ChatRequest, parse_chat_request
from proxy.resources import Resources
from proxy.streaming import StreamForwarder
from proxy.transcript import ReplyAssembler, Usage, generated_text, reply_from_completion
from proxy.upstream.base import Completion, UpstreamCall

log = structlog.get_logger("proxy.chat")


@dataclass(slots=True)
class _Call:
    """One request's state, passed between the steps below."""

    res: Resources
    request: Request
    chat: ChatRequest
    identity: Identity
    route: Route
    injection: Injection
    started: float
    api_key: str | None
    # the user's switches said no learning (X-Memory-Learning: off)
    learning: str | None = None
    # False for a user-bound key: it speaks only for its own user (learning.exchange).
    names_trusted: bool = True

    def body(self) -> dict[str, Any]:
        body = {**self.chat.body, "messages": self.injection.messages}
        if self.chat.stream:
            # Ask for usage for our own accounting; StreamForwarder strips it when the
            # client did not ask (docs/design.md#streaming).
            options = self.chat.body.get("stream_options")
            body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                      "include_usage": True}
        return body

    def upstream_call(self) -> UpstreamCall:
        return UpstreamCall(route=self.route, body=self.body(), api_key=self.api_key)

    def headers(self) -> dict[str, str]:
        extra = {"x-memory-learning": self.learning} if self.learning else {}
        return {**self.injection.headers(), "x-memory-conversation-id": self.identity.conversation,
                **extra}


async def chat_completions(request: Request) -> Response:
    res: Resources = request.app.state.resources
    started = time.perf_counter()
    principal = res.keyring.authenticate(request.headers)
    chat = parse_chat_request(await read_body(request, res.settings.server.max_request_bytes))
    call = await begin(request, principal, chat, started=started)
    return await serve(call, _stream if chat.stream else _complete)


# The steps below are shared with the other protocols' adapters (routes/responses.py,
# routes/messages.py), which translate their request to a ChatRequest and back.
Call = _Call


async def begin(request: Request, principal: Principal, chat: ChatRequest, *,
                started: float, route: Route | None = None) -> _Call:
    """identify → route (unless given) → recall/splice: the request's state for the steps
    below. Raises :class:`InvalidRequestError` (bad identity headers) and
    :class:`NotFoundError` (unknown model)."""
    res: Resources = request.app.state.resources
    identity = resolve_identity(principal, request.headers, chat.body, chat.messages,
                                res.settings.identity)
    if identity.derived:  # chats that share an opening stay apart (proxy/conversations.py)
        identity = replace(identity, conversation=res.chains.resolve(identity, chat.messages))
    route = route or res.registry.route(chat.model)
    injection = await res.memory.prepare(identity, chat, route)
    learning = await _learning_state(res, identity)
    res.metrics.memory_outcomes.labels(injection.status, injection.reason or "").inc()
    if injection.refused:
        res.metrics.memory_lines_refused.inc(injection.refused)
    if injection.injected:
        res.metrics.recall_seconds.observe(injection.recall_ms / 1000)
        res.metrics.injected_tokens.observe(injection.tokens)
    if principal.bound_user is not None and chat.body.get("user") not in (None, identity.user):
        # A user-bound key names its user upstream too, not whoever the body claimed
        # (docs/design.md#identity).
        chat.body["user"] = identity.user
    call = _Call(res, request, chat, identity, route, injection, started, principal.client_key,
                 learning, names_trusted=principal.bound_user is None)
    record = access_record(request)
    if record is not None:  # the access log line (proxy/access.py); never text
        record.tenant, record.user, record.model = identity.tenant, identity.user, chat.model
        record.stream, record.memory, record.injected = chat.stream, injection.status, \
            injection.count
    return call


async def serve(call: _Call, respond: Callable[[_Call], Awaitable[Response]]) -> Response:
    """``respond(call)`` with the upstream's refusal of the gateway's own credentials
    reported as a 502 ``upstream_auth_failed``, and a client that went away as 499."""
    res, chat = call.res, call.chat
    try:
        return await respond(call)
    except (AuthenticationError, PermissionDeniedError) as exc:
        if call.api_key is not None:
            raise  # the client's own key (bring your own key) was refused: its problem
        res.metrics.requests.labels(chat.model, str(chat.stream).lower(),
                                    "upstream_error").inc()
        raise UpstreamError(
            f"The upstream refused the gateway's credentials for model '{call.chat.model}' "
            f"({exc.status_code}: {exc.message}). Check litellm_params.api_key.",
            code="upstream_auth_failed",
        ) from exc
    except UpstreamError:  # counted for the upstream_failing alert (proxy/alerts.py)
        res.metrics.requests.labels(chat.model, str(chat.stream).lower(),
                                    "upstream_error").inc()
        raise
    except ClientDisconnectedError:
        log.info("client_disconnected", model=call.chat.model, stream=call.chat.stream)
        res = call.res
        res.metrics.requests.labels(call.chat.model, str(call.chat.stream).lower(),
                                    "disconnected").inc()
        return Response(status_code=CLIENT_CLOSED_REQUEST)


def _without_memory(call: _Call) -> bool:
    """After an overflow the memory caused: drop the block, retry once
    (docs/design.md#streaming)."""
    if not call.injection.injected or \
            not call.res.settings.upstream.retry_without_memory_on_overflow:
        return False
    if call.injection.injection_id is not None:
        call.res.memory.injections.discard(call.injection.injection_id)
    call.injection = call.res.memory.passthrough(call.chat, call.route, "degraded",
                                                 "context_overflow")
    # Counted again as what it became: the block was counted injected at begin(), and an
    # operator alerting on ``degraded`` must see these requests too.
    call.res.metrics.memory_outcomes.labels("degraded", "context_overflow").inc()
    return True


async def complete(call: _Call) -> tuple[Completion, Usage]:
    """forward → account → learn, without streaming: the upstream's completion and its
    usage (the gateway's estimate when it sent none). Raises the upstream's
    :class:`ProxyError`; retries once without memory after an overflow it caused."""
    res = call.res
    try:
        completion = await until_disconnected(call.request, res.upstream.complete(
            call.upstream_call()))
    except ContextLengthExceededError:
        if not _without_memory(call):
            raise
        completion = await until_disconnected(call.request, res.upstream.complete(
            call.upstream_call()))
    elapsed = time.perf_counter() - call.started
    res.metrics.upstream_ttft_seconds.labels(call.chat.model).observe(elapsed)
    _note_ttft(call, elapsed)
    res.metrics.request_seconds.labels("false").observe(elapsed)
    replies, usage = reply_from_completion(completion.data)
    first = replies.get(0)
    estimated = usage is None
    if usage is None:
        usage = _estimate(call, generated_text(replies))
    _account(call, usage, estimated=estimated)
    if first is not None and first.finish_reason is not None:
        _learn(call, first.content)
    res.metrics.requests.labels(call.chat.model, "false", "ok").inc()
    return completion, usage


async def _complete(call: _Call) -> Response:
    completion, _ = await complete(call)
    return Response(completion.raw, media_type="application/json",
                    headers={**completion.headers, **call.headers()})


async def open_stream(call: _Call) -> StreamForwarder:
    """forward, streaming: a started :class:`StreamForwarder` (its held frames not yet
    sent). Raises the upstream's error before the first content; retries once without
    memory after an overflow it caused. Call :func:`stream_finished` when it ends."""
    res = call.res

    async def opened() -> StreamForwarder:
        upstream = await res.upstream.stream(call.upstream_call())
        forwarder = StreamForwarder(
            upstream, include_usage=call.chat.include_usage,
            estimate_usage=lambda assembler: _estimate_stream(call, assembler),
            model=call.chat.model, drain=res.drain,
        )
        try:
            await forwarder.start()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await forwarder.aclose()
            raise
        return forwarder

    try:
        forwarder = await until_disconnected(call.request, opened())
    except ContextLengthExceededError:
        if not _without_memory(call):
            raise
        forwarder = await until_disconnected(call.request, opened())
    ttft = time.perf_counter() - call.started
    res.metrics.upstream_ttft_seconds.labels(call.chat.model).observe(ttft)
    res.metrics.request_seconds.labels("true").observe(ttft)
    _note_ttft(call, ttft)
    return forwarder


async def _stream(call: _Call) -> Response:
    forwarder = await open_stream(call)

    async def body() -> Any:
        try:
            async for frame in forwarder.body():
                yield frame
        finally:
            with anyio.CancelScope(shield=True):
                await forwarder.aclose()
            stream_finished(call, forwarder)

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={**forwarder.headers, **call.headers(),
                                      "cache-control": "no-cache", "x-accel-buffering": "no"})


def stream_finished(call: _Call, forwarder: StreamForwarder) -> None:
    """account → learn, after a stream ended (or was cut): call in the body's ``finally``."""
    res = call.res
    status = "ok" if forwarder.completed else ("error" if forwarder.error else "aborted")
    res.metrics.requests.labels(call.chat.model, "true", status).inc()
    record = access_record(call.request)
    if record is not None:
        record.outcome = status
    if forwarder.error is None and forwarder.assembler.last_chunk is not None:
        usage = forwarder.usage
        estimated = usage is None
        if usage is None:
            usage = _estimate_stream(call, forwarder.assembler)
        _account(call, usage, estimated=estimated)
    if forwarder.completed:
        first = forwarder.assembler.replies().get(0)
        if first is not None:
            _learn(call, first.content)


def record(call: _Call, usage: Usage | None, generated: str, *, learn: str | None) -> None:
    """account (``usage``, else an estimate from the ``generated`` text) → learn from the
    reply ``learn`` (``None``: the reply was not complete), for replies that did not pass
    through :func:`complete` or :func:`open_stream` (natively relayed protocols)."""
    estimated = usage is None
    _account(call, usage or _estimate(call, generated), estimated=estimated)
    if learn is not None:
        _learn(call, learn)


def _note_ttft(call: _Call, seconds: float) -> None:
    record = access_record(call.request)
    if record is not None:
        record.ttft_ms = round(seconds * 1000, 2)


def _estimate(call: _Call, reply: str) -> Usage:
    counter, tokenizer = call.res.counter, call.route.tokenizer
    prompt = counter.count_messages(call.injection.messages, tokenizer)
    completion = counter.count(reply, tokenizer)
    return Usage(prompt, completion, prompt + completion)


def _estimate_stream(call: _Call, assembler: ReplyAssembler) -> Usage:
    return _estimate(call, generated_text(assembler.replies()))


def _account(call: _Call, usage: Usage, *, estimated: bool) -> None:
    res, identity = call.res, call.identity
    res.usage.add(UsageRecord(
        at=res.clock(), tenant=identity.tenant, user_id=identity.user, model=call.chat.model,
        prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
        memory_tokens=call.injection.tokens, memories_injected=call.injection.count,
        estimated=estimated, recall_tokens=call.injection.recall_tokens,
    ))
    res.metrics.tokens.labels("user", "prompt").inc(usage.prompt_tokens)
    res.metrics.tokens.labels("user", "completion").inc(usage.completion_tokens)
    res.metrics.tokens.labels("memory", "injected").inc(call.injection.tokens)
    if call.injection.recall_tokens:
        res.metrics.tokens.labels("memory", "recall").inc(call.injection.recall_tokens)


async def _learning_state(res: Resources, identity: Identity) -> str | None:
    """``X-Memory-Learning`` (docs/design.md#learning-switches): ``off`` when this user's
    turns are not learned from (learning.enabled off, ``X-Memory`` read-only/off, or the
    user's personal switch off); ``pending`` when they are and the user's learning
    indicator is on (the turn is handed to learning once the reply completes); ``None``
    otherwise or without a user. An unreadable store counts as the defaults (the worker
    checks the switch again)."""
    if identity.user is None:
        return None
    switches = Switches(config=res.learning_enabled, request=identity.can_write)
    if not switches.learns():
        return "off"
    switches = replace(switches,
                       tenant=(await res.tenants.get(identity.tenant)).learning.enabled)
    if not switches.learns():
        return "off"
    try:
        prefs = await res.store.get_user_settings(identity.tenant, identity.user)
    except StoreUnavailableError:
        prefs = UserSettings()
    if not switches.with_user(prefs).learns():
        return "off"
    return "pending" if prefs.show_learning_indicator else None


def _learn(call: _Call, reply: str) -> None:
    identity = call.identity
    if identity.user is None:  # nobody to learn for (memory off): no switches to read
        return
    switches = Switches(config=call.res.learning_enabled, request=identity.can_write)
    if not switches.learns():
        return
    call.res.sink.submit(Turn(
        tenant=identity.tenant, user=identity.user, conversation=identity.conversation,
        channel=identity.channel, group=identity.group, model=call.chat.model,
        messages=call.chat.messages, reply=reply, at=time.time(),
        learn=call.learning != "off",
        names_trusted=call.names_trusted,
    ))
