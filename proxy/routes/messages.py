"""``POST /v1/messages`` (Anthropic's Messages API) onto the chat steps: authenticate →
identify → recall/splice → forward → stream back → account → hand the turn to learning.

- The gateway key comes from ``x-api-key`` (what Anthropic's SDK sends) exactly as from
  ``Authorization: Bearer``; the end user from the identity header or
  ``metadata.user_id``.
- The request becomes a chat completion (:mod:`proxy.protocols.messages`): Anthropic
  models go through litellm (which speaks Anthropic's API upstream, ``cache_control``
  kept), OpenAI-compatible upstreams through the relay.
- Memory is appended to ``system`` whatever ``memory.position`` says — as a last text
  block after blocks, or after a string — so every ``cache_control`` prefix stays intact.
- Replies, streams (``message_start`` … ``message_stop``) and errors are Anthropic's:
  ``{"type": "error", "error": {"type", "message"}}`` with the HTTP status, 401 included.
"""

from __future__ import annotations

import dataclasses
import time

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import InvalidRequestError, ProxyError
from proxy.http import read_body
from proxy.memory.inject import splice
from proxy.protocols import messages as protocol
from proxy.request import parse_chat_body
from proxy.resources import Resources
from proxy.routes import chat
from proxy.routes.translated import stream_response
from proxy.transcript import reply_from_completion

ANTHROPIC_KEY_HEADER = "x-api-key"


def _error(error: ProxyError) -> Response:
    return Response(orjson.dumps(protocol.error_body(error)), status_code=error.status_code,
                    media_type="application/json", headers=error.headers)


async def create_message(request: Request) -> Response:
    """The handler; every :class:`ProxyError` is rendered in Anthropic's error shape."""
    try:
        return await _create(request)
    except ProxyError as exc:
        return _error(exc)


async def _create(request: Request) -> Response:
    res: Resources = request.app.state.resources
    started = time.perf_counter()
    headers = dict(request.headers)
    if "authorization" not in headers and headers.get(ANTHROPIC_KEY_HEADER):
        headers["authorization"] = f"Bearer {headers[ANTHROPIC_KEY_HEADER]}"
    principal = res.keyring.authenticate(headers)
    raw = await read_body(request, res.settings.server.max_request_bytes)
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object with 'model', "
                                  "'max_tokens' and 'messages'.", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required.", param="model",
                                  code="missing_required_parameter")
    route = res.registry.route(model)
    chat_body = protocol.chat_body(body, keep_cache=not route.relay)
    if body.get("stream"):
        chat_body["stream_options"] = {"include_usage": True}
    request_chat = parse_chat_body(chat_body)
    call = await chat.begin(request, principal, request_chat, started=started, route=route)
    injection = call.injection
    if injection.block and res.settings.memory.position != "system":
        call.injection = dataclasses.replace(injection, messages=splice(
            request_chat.messages, injection.block, position="system",
            developer_ok=route.supports_developer_role,
            system_ok=route.supports_system_messages))

    async def respond(call: chat.Call) -> Response:
        if call.chat.stream:
            return await stream_response(call, protocol.StreamTranslator(model))
        completion, usage = await chat.complete(call)
        replies, _ = reply_from_completion(completion.data)
        data = protocol.message_from_reply(model=model, reply=replies.get(0), usage=usage)
        return Response(orjson.dumps(data), media_type="application/json",
                        headers={**completion.headers, **call.headers()})

    return await chat.serve(call, respond)
