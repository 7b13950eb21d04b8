"""``POST /v1/chat/completions``: authenticate → identify → recall/splice → forward →
stream back → account → hand the turn to learning. Orchestration only; each step lives in
its own module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

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
from proxy.learning.sink import Turn
from proxy.ledger import UsageRecord
from proxy.memory.service import Injection
from proxy.memory.store import StoreUnavailableError, UserSettings
from proxy.models import Route
from proxy.request import ChatRequest, parse_chat_request
from proxy.resources import Resources
from proxy.streaming import StreamForwarder
from proxy.transcript import ReplyAssembler, Usage, generated_text, reply_from_completion
from proxy.upstream.base import UpstreamCall

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
    # issue 12: the user's switches said no learning (X-Memory-Learning: off)
    learning: str | None = None

    def body(self) -> dict[str, Any]:
        body = {**self.chat.body, "messages": self.injection.messages}
        if self.chat.stream:
            # Ask for usage for our own accounting; StreamForwarder strips it when the
            # client did not ask (case B01).
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
    identity = resolve_identity(principal, request.headers, chat.body, chat.messages,
                                res.settings.identity)
    route = res.registry.route(chat.model)
    injection = await res.memory.prepare(identity, chat, route)
    learning = await _learning_state(res, identity)
    res.metrics.memory_outcomes.labels(injection.status, injection.reason or "").inc()
    if injection.injected:
        res.metrics.recall_seconds.observe(injection.recall_ms / 1000)
        res.metrics.injected_tokens.observe(injection.tokens)
    if principal.bound_user is not None and chat.body.get("user") not in (None, identity.user):
        # A user-bound key names its user upstream too, not whoever the body claimed (B26).
        chat.body["user"] = identity.user
    call = _Call(res, request, chat, identity, route, injection, started, principal.client_key,
                 learning)
    try:
        if chat.stream:
            return await _stream(call)
        return await _complete(call)
    except (AuthenticationError, PermissionDeniedError) as exc:
        if call.api_key is not None:
            raise  # the client's own key (bring your own key) was refused: its problem
        raise UpstreamError(
            f"The upstream refused the gateway's credentials for model '{chat.model}' "
            f"({exc.status_code}: {exc.message}). Check litellm_params.api_key.",
            code="upstream_auth_failed",
        ) from exc
    except ClientDisconnectedError:
        log.info("client_disconnected", model=chat.model, stream=chat.stream)
        res.metrics.requests.labels(chat.model, str(chat.stream).lower(), "disconnected").inc()
        return Response(status_code=CLIENT_CLOSED_REQUEST)


def _without_memory(call: _Call) -> bool:
    """After an overflow the memory caused (case B04): drop the block, retry once."""
    if not call.injection.injected or \
            not call.res.settings.upstream.retry_without_memory_on_overflow:
        return False
    call.injection = call.res.memory.passthrough(call.chat, call.route, "degraded",
                                                 "context_overflow")
    return True


async def _complete(call: _Call) -> Response:
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
    return Response(completion.raw, media_type="application/json",
                    headers={**completion.headers, **call.headers()})


async def _stream(call: _Call) -> Response:
    res = call.res

    async def open_stream() -> StreamForwarder:
        upstream = await res.upstream.stream(call.upstream_call())
        forwarder = StreamForwarder(
            upstream, include_usage=call.chat.include_usage,
            estimate_usage=lambda assembler: _estimate_stream(call, assembler),
            model=call.chat.model,
        )
        try:
            await forwarder.start()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await forwarder.aclose()
            raise
        return forwarder

    try:
        forwarder = await until_disconnected(call.request, open_stream())
    except ContextLengthExceededError:
        if not _without_memory(call):
            raise
        forwarder = await until_disconnected(call.request, open_stream())
    ttft = time.perf_counter() - call.started
    res.metrics.upstream_ttft_seconds.labels(call.chat.model).observe(ttft)
    res.metrics.request_seconds.labels("true").observe(ttft)

    async def body() -> Any:
        try:
            async for frame in forwarder.body():
                yield frame
        finally:
            with anyio.CancelScope(shield=True):
                await forwarder.aclose()
            _stream_finished(call, forwarder)

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={**forwarder.headers, **call.headers(),
                                      "cache-control": "no-cache", "x-accel-buffering": "no"})


def _stream_finished(call: _Call, forwarder: StreamForwarder) -> None:
    res = call.res
    status = "ok" if forwarder.completed else ("error" if forwarder.error else "aborted")
    res.metrics.requests.labels(call.chat.model, "true", status).inc()
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
        estimated=estimated,
    ))
    res.metrics.tokens.labels("user", "prompt").inc(usage.prompt_tokens)
    res.metrics.tokens.labels("user", "completion").inc(usage.completion_tokens)
    res.metrics.tokens.labels("memory", "injected").inc(call.injection.tokens)


async def _learning_state(res: Resources, identity: Identity) -> str | None:
    """``X-Memory-Learning`` (issue 12): ``off`` when this user's turns are not learned
    from (learning.enabled off, ``X-Memory`` read-only/off, or the user's personal switch
    off); ``pending`` when they are and the user's learning indicator is on (the turn is
    handed to learning once the reply completes); ``None`` otherwise or without a user.
    An unreadable store counts as the defaults (the worker checks the switch again)."""
    if identity.user is None:
        return None
    if not res.learning_enabled or not identity.can_write:
        return "off"
    try:
        prefs = await res.store.get_user_settings(identity.tenant, identity.user)
    except StoreUnavailableError:
        prefs = UserSettings()
    if not prefs.enable_personal_learning:
        return "off"
    return "pending" if prefs.show_learning_indicator else None


def _learn(call: _Call, reply: str) -> None:
    identity = call.identity
    if not call.res.learning_enabled or not identity.can_write or identity.user is None:
        return
    call.res.sink.submit(Turn(
        tenant=identity.tenant, user=identity.user, conversation=identity.conversation,
        channel=identity.channel, group=identity.group, model=call.chat.model,
        messages=call.chat.messages, reply=reply, at=time.time(),
        learn=call.learning != "off",
    ))
