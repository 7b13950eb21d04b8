"""``POST /v1/messages`` (Anthropic's Messages API) onto the chat steps: authenticate →
identify → recall/splice → forward → stream back → account → hand the turn to learning;
and ``POST /v1/messages/count_tokens``, the same request measured instead of sent.

- The gateway key comes from ``x-api-key`` (what Anthropic's SDK sends) exactly as from
  ``Authorization: Bearer``; the end user from the identity header or
  ``metadata.user_id``.
- The request becomes a chat completion (:mod:`proxy.protocols.messages`): Anthropic
  models go through litellm (which speaks Anthropic's API upstream, ``cache_control``
  kept), OpenAI-compatible upstreams through the relay.
- Memory is appended to ``system`` whatever ``memory.position`` says — as a last text
  block after blocks, or after a string — so every ``cache_control`` prefix stays intact.
- ``count_tokens`` answers ``{"input_tokens": n}``: the prompt as it would be sent, memory
  block included for that user (the same identity rules), counted with the route's
  tokenizer (the chat format's per-message overhead, plus the tool definitions as JSON
  text). It changes nothing: no upstream call, no usage row, no learning, no access
  counters, no conversation recorded.
- Replies, streams (``message_start`` … ``message_stop``) and errors are Anthropic's:
  ``{"type": "error", "error": {"type", "message"}}`` with the HTTP status, 401 included;
  the app renders every other error under ``/v1/messages`` (404, 405, an unexpected
  failure) the same way (:func:`owns`, :func:`error_response`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.auth import Principal
from proxy.errors import InvalidRequestError, ProxyError, decode_json
from proxy.http import read_body
from proxy.identity import resolve_identity
from proxy.memory.inject import splice
from proxy.memory.service import Injection
from proxy.models import Route
from proxy.protocols import messages as protocol
from proxy.request import ChatRequest, parse_chat_body
from proxy.resources import Resources
from proxy.routes import chat
from proxy.routes.translated import stream_response
from proxy.transcript import reply_from_completion

ANTHROPIC_KEY_HEADER = "x-api-key"
PATH = "/v1/messages"
# count_tokens takes no max_tokens; the translation wants one. One token is reserved for
# the reply when the memory budget is cut to the context window (docs/design.md#injection).
COUNT_RESERVED_TOKENS = 1


def owns(path: str) -> bool:
    """Whether errors on ``path`` are answered in Anthropic's shape: ``/v1/messages`` and
    every path under it, routed or not."""
    return path == PATH or path.startswith(PATH + "/")


def error_response(error: ProxyError) -> Response:
    """``error`` in Anthropic's error shape, with its status and headers."""
    return Response(orjson.dumps(protocol.error_body(error)), status_code=error.status_code,
                    media_type="application/json", headers=error.headers)


async def create_message(request: Request) -> Response:
    """The handler; every :class:`ProxyError` is rendered in Anthropic's error shape."""
    try:
        return await _create(request)
    except ProxyError as exc:
        return error_response(exc)


async def count_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": n}``; errors in Anthropic's
    shape (400 for a bad body, 404 for an unknown model)."""
    try:
        return await _count(request)
    except ProxyError as exc:
        return error_response(exc)


async def _read(request: Request, *, counting: bool = False,
                ) -> tuple[Principal, Route, ChatRequest]:
    """authenticate → parse → route: the caller, the route and the chat request the
    Messages body becomes (``counting``: a count_tokens body, without ``max_tokens``).
    Raises :class:`AuthenticationError`, :class:`InvalidRequestError` (not a JSON object,
    no ``model``, a part that cannot be translated) and :class:`NotFoundError` (unknown
    model)."""
    res: Resources = request.app.state.resources
    headers = dict(request.headers)
    if "authorization" not in headers and headers.get(ANTHROPIC_KEY_HEADER):
        headers["authorization"] = f"Bearer {headers[ANTHROPIC_KEY_HEADER]}"
    principal = res.keyring.authenticate(headers)
    raw = await read_body(request, res.settings.server.max_request_bytes)
    wanted = "'model' and 'messages'" if counting else "'model', 'max_tokens' and 'messages'"
    body = decode_json(raw, f"Send a JSON object with {wanted}.")
    if not isinstance(body, dict):
        raise InvalidRequestError(f"The request body must be a JSON object with {wanted}.",
                                  code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required.", param="model",
                                  code="missing_required_parameter")
    route = res.registry.route(model)
    if counting:
        body = {key: value for key, value in body.items() if key != "stream"}
        body["max_tokens"] = COUNT_RESERVED_TOKENS
    chat_body = protocol.chat_body(body, keep_cache=not route.relay)
    if body.get("stream"):
        chat_body["stream_options"] = {"include_usage": True}
    return principal, route, parse_chat_body(chat_body)


def _in_system(injection: Injection, request_chat: ChatRequest, route: Route,
               position: str) -> Injection:
    """The memory block moved to ``system`` when ``memory.position`` put it elsewhere."""
    if not injection.block or position == "system":
        return injection
    return dataclasses.replace(injection, messages=splice(
        request_chat.messages, injection.block, position="system",
        developer_ok=route.supports_developer_role,
        system_ok=route.supports_system_messages))


async def _create(request: Request) -> Response:
    res: Resources = request.app.state.resources
    started = time.perf_counter()
    principal, route, request_chat = await _read(request)
    model = request_chat.model
    call = await chat.begin(request, principal, request_chat, started=started, route=route)
    call.injection = _in_system(call.injection, request_chat, route,
                                res.settings.memory.position)

    async def respond(call: chat.Call) -> Response:
        if call.chat.stream:
            return await stream_response(call, protocol.StreamTranslator(model))
        completion, usage = await chat.complete(call)
        replies, _ = reply_from_completion(completion.data)
        data = protocol.message_from_reply(model=model, reply=replies.get(0), usage=usage)
        return Response(orjson.dumps(data), media_type="application/json",
                        headers={**completion.headers, **call.headers()})

    return await chat.serve(call, respond)


async def _count(request: Request) -> Response:
    """identify → recall/splice (access not counted) → count; nothing recorded."""
    res: Resources = request.app.state.resources
    principal, route, request_chat = await _read(request, counting=True)
    identity = resolve_identity(principal, request.headers, request_chat.body,
                                request_chat.messages, res.settings.identity)
    injection = await res.memory.prepare(identity, request_chat, route, count_access=False)
    injection = _in_system(injection, request_chat, route, res.settings.memory.position)
    tools = request_chat.body.get("tools")
    texts = [orjson.dumps(tools).decode()] if tools else []

    def measure() -> int:
        counter = res.counter
        return counter.count_messages(injection.messages, route.tokenizer) + \
            sum(counter.count(text, route.tokenizer) for text in texts)

    tokens = await asyncio.to_thread(measure)
    return Response(orjson.dumps({"input_tokens": tokens}), media_type="application/json",
                    headers=injection.headers())


class CountTokensTurn(BaseModel):
    """One turn: ``user`` or ``assistant``, text or Anthropic content blocks."""

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountTokensBody(BaseModel):
    """The body of ``POST /v1/messages/count_tokens`` (Anthropic's shape; other fields of
    a Messages request are accepted and do not change the count)."""

    model: str = Field(description="A model of the gateway's model_list")
    messages: list[CountTokensTurn] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = Field(
        default=None, description="metadata.user_id names the end user")


class InputTokens(BaseModel):
    """Tokens of the prompt as it would reach the model, the user's memory included."""

    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    type: str = Field(description="invalid_request_error, authentication_error, "
                                  "not_found_error, api_error, …")
    message: str


class AnthropicErrorBody(BaseModel):
    """Anthropic's error shape, used for every answer under /v1/messages."""

    type: Literal["error"]
    error: AnthropicErrorDetail


openapi.register(
    openapi.Operation("POST", "/v1/messages/count_tokens",
                      "Count a Messages request's input tokens, memory included "
                      "(Anthropic's shape; records nothing)",
                      body=CountTokensBody, response=InputTokens, errors=(404,),
                      error_model=AnthropicErrorBody, tags=("anthropic",)),
)
