"""Anthropic's Messages API ⇄ chat completions (pure; no I/O).

Used by ``POST /v1/messages`` (:mod:`proxy.routes.messages`). Shapes follow Anthropic's API
reference for ``POST /v1/messages``, its streaming events (``message_start``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``) and
its error envelope ``{"type": "error", "error": {"type", "message"}}``.

Translated: ``system`` (a string or text blocks, ``cache_control`` kept on each block),
``messages`` with ``text``, ``image`` (base64 or URL), ``tool_use`` and ``tool_result``
blocks, ``tools`` (``input_schema`` → ``parameters``) and ``tool_choice``, ``max_tokens``,
``stop_sequences``, ``temperature``, ``top_p``, ``metadata.user_id`` (the end user).
``thinking`` blocks sent back by a client are dropped (a chat upstream cannot check their
signatures); other block types are a 400.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from proxy.errors import InvalidRequestError, ProxyError
from proxy.request import Message
from proxy.request.messages import check_messages_body
from proxy.transcript import Reply, Usage

# finish_reason → stop_reason
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                 "function_call": "tool_use", "content_filter": "refusal"}
# HTTP status → Anthropic error type (their API reference, "Errors").
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}


def new_id(prefix: str) -> str:
    """An id in Anthropic's style: ``msg_…``, ``toolu_…``."""
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status (``api_error`` for other 5xx)."""
    return _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(error: ProxyError) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}`` for a gateway error."""
    return {"type": "error", "error": {"type": error_type(error.status_code),
                                       "message": error.message}}


def _bad(message: str, param: str, code: str = "invalid_value") -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def _text_part(block: dict[str, Any], *, keep_cache: bool) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "text", "text": block.get("text") or ""}
    if keep_cache and isinstance(block.get("cache_control"), dict):
        part["cache_control"] = block["cache_control"]
    return part


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif isinstance(source, dict) and source.get("type") == "url":
        url = str(source.get("url"))
    else:
        raise _bad(f"{where}.source must be a base64 or url image source.", f"{where}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def _system(system: Any, *, keep_cache: bool) -> Message | None:
    if system is None or system == "":
        return None
    if isinstance(system, str):
        return {"role": "system", "content": system}
    parts = [_text_part(block, keep_cache=keep_cache) for block in system]
    if not keep_cache or not any("cache_control" in p for p in parts):
        return {"role": "system", "content": "\n\n".join(p["text"] for p in parts)}
    return {"role": "system", "content": parts}


def _tool_result(block: dict[str, Any], where: str) -> Message:
    content = block.get("content")
    if isinstance(content, list):
        texts = [b.get("text") or "" for b in content
                 if isinstance(b, dict) and b.get("type") == "text"]
        content = "\n".join(texts)
    text = content if isinstance(content, str) else ""
    if block.get("is_error"):
        text = f"Error: {text}"
    if not isinstance(block.get("tool_use_id"), str):
        raise _bad(f"{where}.tool_use_id is required.", f"{where}.tool_use_id")
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _turn(message: Any, index: int, *, keep_cache: bool) -> list[Message]:
    where = f"messages[{index}]"
    role = message["role"]
    content = message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    out: list[Message] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for position, block in enumerate(content):
        at = f"{where}.content[{position}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(_text_part(block, keep_cache=keep_cache))
        elif kind == "image" and role == "user":
            parts.append(_image_part(block, at))
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": block.get("id") or new_id("toolu"), "type": "function",
                          "function": {"name": block.get("name") or "",
                                       "arguments": orjson.dumps(block.get("input") or {})
                                       .decode()}})
        elif kind == "tool_result" and role == "user":
            out.append(_tool_result(block, at))  # tool answers come first, as chat wants
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise _bad(f"{at}.type {kind!r} is not supported in a {role} turn here.",
                       f"{at}.type")
    if role == "assistant":
        text = "".join(p["text"] for p in parts if p["type"] == "text")
        turn: Message = {"role": "assistant", "content": text or None}
        if calls:
            turn["tool_calls"] = calls
        if text or calls:
            out.append(turn)
        return out
    if parts:
        simple = all(p["type"] == "text" and "cache_control" not in p for p in parts)
        out.append({"role": "user",
                    "content": "\n".join(p["text"] for p in parts) if simple else parts})
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("'tools' must be an array.", "tools", "invalid_type")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or \
                tool.get("type") not in (None, "custom"):
            raise _bad(f"tools[{index}]: only custom tools (name, input_schema) can be sent "
                       "to this model; Anthropic's server tools need an Anthropic model.",
                       f"tools[{index}]", "unsupported_value")
        function = {"name": tool["name"],
                    "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """(chat ``tool_choice``, ``parallel_tool_calls``) for Anthropic's ``tool_choice``."""
    if not isinstance(choice, dict):
        raise _bad("'tool_choice' must be an object with a 'type'.", "tool_choice",
                   "invalid_type")
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    raise _bad("tool_choice.type must be auto, any, tool or none.", "tool_choice.type")


def chat_body(body: dict[str, Any], *, keep_cache: bool) -> dict[str, Any]:
    """The chat completions body for a Messages request (``model`` kept; the end user from
    ``metadata.user_id`` as ``user``). ``keep_cache``: keep ``cache_control`` on content
    parts (litellm passes it on to Anthropic; OpenAI-compatible upstreams do not take it).
    Raises :class:`InvalidRequestError` naming the parameter for a part of the wrong type
    (:func:`~proxy.request.messages.check_messages_body`) and for what cannot be sent."""
    check_messages_body(body)
    max_tokens, raw = body["max_tokens"], body["messages"]
    messages: list[Message] = []
    system = _system(body.get("system"), keep_cache=keep_cache)
    if system is not None:
        messages.append(system)
    for index, message in enumerate(raw):
        messages += _turn(message, index, keep_cache=keep_cache)
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages,
                           "max_completion_tokens": max_tokens}
    for name in ("temperature", "top_p", "stream"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        choice, parallel = _tool_choice(body["tool_choice"])
        out["tool_choice"] = choice
        if parallel is not None and body.get("tools"):
            out["parallel_tool_calls"] = parallel
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("user_id") is not None:
        if not isinstance(metadata["user_id"], str):  # never silently ignored
            raise InvalidRequestError("metadata.user_id must be a string.",
                                      param="metadata.user_id", code="invalid_type")
        out["user"] = metadata["user_id"]
    return out


# --------------------------------------------------------------------------- replies


def _input(arguments: str) -> Any:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def usage_object(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def message_from_reply(*, model: str, reply: Reply | None, usage: Usage) -> dict[str, Any]:
    """The Messages API reply for a chat completion's first choice."""
    content: list[dict[str, Any]] = []
    if reply is not None and (reply.content or reply.refusal):
        content.append({"type": "text", "text": reply.content or reply.refusal})
    for call in reply.tool_calls if reply is not None else ():
        content.append({"type": "tool_use", "id": call.id or new_id("toolu"),
                        "name": call.name, "input": _input(call.arguments)})
    finish = reply.finish_reason if reply is not None else None
    return {"id": new_id("msg"), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": _STOP_REASONS.get(finish or "", "end_turn"),
            "stop_sequence": None, "usage": usage_object(usage)}


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + \
        orjson.dumps({"type": kind, **payload}) + b"\n\n"


class StreamTranslator:
    """Chat completion chunks (choice 0) → Anthropic's streaming events, as SSE bytes:
    :meth:`opening` (``message_start``), :meth:`feed` per chunk (content blocks),
    :meth:`closing` (``message_delta`` with the stop reason and usage, ``message_stop``),
    :meth:`failure` (an ``error`` event, for an error after the stream started)."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._index = -1  # the open content block, -1 when none is open
        self._open: str | None = None  # "text" | "tool_use"
        self._tool_key: Any = None
        self.finish_reason: str | None = None

    def opening(self) -> bytes:
        return _event("message_start", {"message": {
            "id": new_id("msg"), "type": "message", "role": "assistant", "model": self._model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}})

    def _start(self, block: dict[str, Any], kind: str) -> bytes:
        out = self._stop()
        self._index += 1
        self._open = kind
        return out + _event("content_block_start", {"index": self._index,
                                                    "content_block": block})

    def _stop(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event("content_block_stop", {"index": self._index})

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            assert isinstance(delta, dict)
            text = delta.get("content") or delta.get("refusal")
            if isinstance(text, str) and text:
                if self._open != "text":
                    out.append(self._start({"type": "text", "text": ""}, "text"))
                out.append(_event("content_block_delta", {
                    "index": self._index, "delta": {"type": "text_delta", "text": text}}))
            for fragment in delta.get("tool_calls") or ():
                if isinstance(fragment, dict):
                    out.append(self._tool(fragment))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return b"".join(out)

    def _tool(self, fragment: dict[str, Any]) -> bytes:
        out = b""
        function = fragment.get("function") if isinstance(fragment.get("function"),
                                                          dict) else {}
        assert isinstance(function, dict)
        key = (fragment.get("index", 0), fragment.get("id") or self._tool_key_id())
        if self._open != "tool_use" or key != self._tool_key:
            self._tool_key = key
            out += self._start({"type": "tool_use", "id": fragment.get("id") or new_id("toolu"),
                                "name": function.get("name") or "", "input": {}}, "tool_use")
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out += _event("content_block_delta", {
                "index": self._index,
                "delta": {"type": "input_json_delta", "partial_json": arguments}})
        return out

    def _tool_key_id(self) -> Any:
        """A fragment without an id continues the open call."""
        return self._tool_key[1] if isinstance(self._tool_key, tuple) else None

    def closing(self, usage: Usage) -> bytes:
        return self._stop() + _event("message_delta", {
            "delta": {"stop_reason": _STOP_REASONS.get(self.finish_reason or "", "end_turn"),
                      "stop_sequence": None},
            "usage": usage_object(usage)}) + _event("message_stop", {})

    def failure(self, error: ProxyError) -> bytes:
        return self._stop() + _event("error", {"error": error_body(error)["error"]})
