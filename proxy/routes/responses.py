"""``POST /v1/responses`` (OpenAI's Responses API) onto the chat steps: authenticate →
identify → recall/splice → forward → stream back → account → hand the turn to learning.

Two ways through, per route (``model_info.supports_responses_api``, see
:mod:`proxy.models`):

- **native** — the upstream speaks Responses: the body is relayed as sent (``input``,
  ``previous_response_id``, built-in tools…) with the memory block appended to
  ``instructions``; the reply and its events come back unchanged.
- **translated** — the upstream speaks chat completions: the request becomes a chat
  completion (:mod:`proxy.protocols.responses`), runs exactly as on
  ``/v1/chat/completions`` (memory, retry without memory on overflow, usage), and the
  reply becomes a Responses object or its event stream. ``previous_response_id`` is a 400:
  such an upstream keeps no response state.

Identity, memory headers (``x-memory-*``), learning and accounting are those of chat.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import orjson
import structlog
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.auth import Principal
from proxy.errors import ProxyError
from proxy.http import read_body, until_disconnected
from proxy.models import Route
from proxy.protocols import responses as protocol
from proxy.request import ChatRequest, parse_chat_body
from proxy.request.responses import parse_responses_request
from proxy.resources import Resources
from proxy.routes import chat
from proxy.routes.translated import SSE_HEADERS, stream_response
from proxy.transcript import reply_from_completion
from proxy.upstream.base import UpstreamCall

log = structlog.get_logger("proxy.responses")


async def create_response(request: Request) -> Response:
    res: Resources = request.app.state.resources
    started = time.perf_counter()
    principal = res.keyring.authenticate(request.headers)
    body = parse_responses_request(await read_body(request, res.settings.server.max_request_bytes))
    route = res.registry.route(body["model"])
    if route.supports_responses_api:
        return await _native(request, principal, body, route, started)
    chat_body = protocol.chat_body(body)
    if body.get("stream"):
        chat_body["stream_options"] = {"include_usage": True}
    request_chat = parse_chat_body(chat_body)
    call = await chat.begin(request, principal, request_chat, started=started, route=route)
    shell = protocol.ResponseShell(id=protocol.new_id("resp"), model=body["model"],
                                   request=body)

    async def respond(call: chat.Call) -> Response:
        if call.chat.stream:
            return await stream_response(call, protocol.StreamTranslator(shell))
        completion, usage = await chat.complete(call)
        replies, _ = reply_from_completion(completion.data)
        data = protocol.response_from_reply(shell, replies.get(0), usage)
        return Response(orjson.dumps(data), media_type="application/json",
                        headers={**completion.headers, **call.headers()})

    return await chat.serve(call, respond)


# --------------------------------------------------------------------------- native


async def _native(request: Request, principal: Principal, body: dict[str, Any],
                  route: Route, started: float) -> Response:
    view: dict[str, Any] = {k: body[k] for k in ("user", "metadata", "safety_identifier")
                            if k in body}
    if body.get("max_output_tokens") is not None:
        view["max_completion_tokens"] = body["max_output_tokens"]
    messages = protocol.user_view(body) or [{"role": "user", "content": ""}]
    stream = bool(body.get("stream"))
    request_chat = ChatRequest(body=view, model=body["model"], messages=messages,
                               stream=stream, include_usage=False)
    call = await chat.begin(request, principal, request_chat, started=started, route=route)
    sent = dict(body)
    if "user" in view and view.get("user") != body.get("user"):
        # A user-bound key names its user upstream (docs/design.md#identity).
        sent["user"] = view["user"]
    block = call.injection.block
    if block:
        instructions = body.get("instructions")
        sent["instructions"] = f"{instructions}\n\n{block}" \
            if isinstance(instructions, str) and instructions else block
    upstream_call = UpstreamCall(route=route, body=sent, api_key=call.api_key,
                                 path="responses")

    async def respond(call: chat.Call) -> Response:
        if stream:
            return await _native_stream(call, upstream_call)
        res = call.res
        completion = await until_disconnected(request, res.upstream.complete(upstream_call))
        data = completion.data
        text = protocol.output_text(data)
        chat.record(call, protocol.usage_from_response(data), text,
                    learn=text if data.get("status") == "completed" else None)
        res.metrics.requests.labels(call.chat.model, "false", "ok").inc()
        return Response(completion.raw, media_type="application/json",
                        headers={**completion.headers, **call.headers()})

    return await chat.serve(call, respond)


async def _native_stream(call: chat.Call, upstream_call: UpstreamCall) -> Response:
    res = call.res
    upstream = await until_disconnected(call.request, res.upstream.stream(upstream_call))

    async def events() -> Any:
        final: dict[str, Any] | None = None
        deltas: list[str] = []
        status = "aborted"
        try:
            async for payload in upstream:
                event = _event(payload)
                kind = event.get("type") if event is not None else None
                if kind == "response.output_text.delta" and event is not None:
                    deltas.append(str(event.get("delta") or ""))
                elif kind in ("response.completed", "response.incomplete",
                              "response.failed") and event is not None:
                    final = event.get("response") if isinstance(event.get("response"),
                                                                dict) else None
                    status = "ok" if kind == "response.completed" else "error"
                elif kind == "error":
                    status = "error"
                name = b"event: " + str(kind).encode() + b"\n" if kind else b""
                yield name + b"data: " + payload + b"\n\n"
        except ProxyError as exc:
            status = "error"
            yield b"event: error\ndata: " + orjson.dumps({
                "type": "error", "code": exc.code or exc.error_type,
                "message": exc.message, "param": exc.param, "sequence_number": 0}) + b"\n\n"
        finally:
            with anyio.CancelScope(shield=True):
                await upstream.aclose()
            text = protocol.output_text(final) if final is not None else "".join(deltas)
            if final is not None or status == "aborted":
                chat.record(call, protocol.usage_from_response(final), text,
                            learn=text if status == "ok" else None)
            res.metrics.requests.labels(call.chat.model, "true", status).inc()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={**upstream.headers, **call.headers(), **SSE_HEADERS})


def _event(payload: bytes) -> dict[str, Any] | None:
    try:
        event = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None
