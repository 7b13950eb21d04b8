"""OpenAI's Responses API ⇄ chat completions (pure; no I/O).

Used by ``POST /v1/responses`` (:mod:`proxy.routes.responses`) for upstreams that only
speak chat completions, and — leniently, as a read-only view — to find the user's turns of
a request that is relayed natively. Shapes follow OpenAI's API reference for
``POST /v1/responses`` and its streaming events (``response.created`` … ``response.completed``,
each with a ``sequence_number``).

Translated: ``input`` (a string, or ``message`` / ``function_call`` /
``function_call_output`` items with ``input_text`` / ``input_image`` / ``input_file`` /
``output_text`` parts), ``instructions`` (a leading system message), function ``tools`` and
``tool_choice``, ``max_output_tokens`` → ``max_completion_tokens``, ``text.format`` →
``response_format``, ``reasoning.effort`` → ``reasoning_effort``, and the sampling fields.
Built-in tools (web search, file search, …) and ``background`` need OpenAI's own Responses
API: a 400 says so.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.errors import InvalidRequestError, ProxyError
from proxy.request import Message, message_text
from proxy.request.responses import check_responses_input
from proxy.transcript import Reply, Usage

# Fields copied unchanged between the two APIs.
_SAME_FIELDS = ("temperature", "top_p", "parallel_tool_calls", "user", "metadata",
                "safety_identifier", "prompt_cache_key", "service_tier", "top_logprobs",
                "stream")
# Responses-only fields that mean nothing to a chat completions upstream; dropped.
_DROPPED_FIELDS = frozenset({"store", "include", "truncation", "stream_options",
                             "conversation", "prompt", "max_tool_calls"})
_ROLES = frozenset({"user", "assistant", "system", "developer"})


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: ``resp_…``, ``msg_…``, ``fc_…`` (32 hex digits)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def _part(part: Any, where: str, *, strict: bool) -> dict[str, Any] | None:
    """A Responses content part as a chat content part (``None``: skipped). Strict: the
    part is an object (:func:`~proxy.request.responses.check_responses_input`)."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "refusal"):
        text = part.get("text") if kind != "refusal" else part.get("refusal")
        return {"type": "text", "text": text if isinstance(text, str) else ""}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            if strict:
                raise InvalidRequestError(
                    f"{where}.image_url must be a URL or data URL (file_id images need "
                    "OpenAI's own Responses API).", param=f"{where}.image_url",
                    code="unsupported_value")
            return None
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        file = {k: part[k] for k in ("file_data", "file_id", "filename") if k in part}
        return {"type": "file", "file": file}
    if strict:
        raise InvalidRequestError(f"{where}.type {kind!r} is not supported here.",
                                  param=f"{where}.type", code="unsupported_value")
    return None


def _content(content: Any, where: str, *, strict: bool) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""  # strict: checked by check_responses_input
    parts = [_part(p, f"{where}[{i}]", strict=strict) for i, p in enumerate(content)]
    kept = [p for p in parts if p is not None]
    if all(p["type"] == "text" for p in kept):
        return "\n".join(p["text"] for p in kept)  # plain text: the form every model takes
    return kept


def input_messages(body: dict[str, Any], *, strict: bool) -> list[Message]:
    """``instructions`` + ``input`` as chat messages. ``strict`` raises
    :class:`InvalidRequestError` (400, ``param`` naming the item) for anything a chat
    completions upstream cannot take (the shapes first:
    :func:`~proxy.request.responses.check_responses_input`); otherwise such items are
    skipped (a view of the conversation for identity and recall only)."""
    if strict:
        check_responses_input(body)
    messages: list[Message] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
        return messages
    if not isinstance(raw, list):
        if raw is not None:  # strict: an absent input was refused above
            raise InvalidRequestError("'input' is required: a string or an array of items.",
                                      param="input", code="invalid_type")
        return messages
    for index, item in enumerate(raw):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{where} must be an object.", param=where,
                                      code="invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise InvalidRequestError(
                    f"{where}.role must be one of user, assistant, system, developer.",
                    param=f"{where}.role", code="invalid_value")
            messages.append({"role": role,
                             "content": _content(item.get("content"), f"{where}.content",
                                                 strict=strict)})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                    "function": {"name": item.get("name") or "",
                                 "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            calls = last.get("tool_calls") if last is not None else None
            if last is not None and last.get("role") == "assistant" and \
                    isinstance(calls, list):
                calls.append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str)
                             else _content(output, f"{where}.output", strict=strict)})
        elif kind == "reasoning":
            continue  # the model's own reasoning summary: nothing a chat model takes back
        elif strict:
            raise InvalidRequestError(
                f"{where}.type {kind!r} needs OpenAI's own Responses API; this model's "
                "upstream speaks chat completions.", param=f"{where}.type",
                code="unsupported_value")
    return messages


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequestError("'tools' must be an array.", param="tools",
                                  code="invalid_type")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidRequestError(
                f"tools[{index}]: only function tools can be sent to this model (got "
                f"{kind!r}); built-in tools need OpenAI's own Responses API.",
                param=f"tools[{index}]", code="unsupported_value")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                    if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt["type"]}


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body for a Responses request (``model`` kept). Raises
    :class:`InvalidRequestError` for what cannot be translated, ``previous_response_id``
    included: a chat completions upstream keeps no response state."""
    if body.get("previous_response_id") is not None:
        raise InvalidRequestError(
            "previous_response_id cannot be honoured: this model's upstream speaks chat "
            "completions and keeps no response state. Send the whole conversation in "
            "'input' instead (or use a model with model_info.supports_responses_api).",
            param="previous_response_id", code="unsupported_parameter")
    if body.get("background"):
        raise InvalidRequestError("background responses need OpenAI's own Responses API.",
                                  param="background", code="unsupported_parameter")
    out: dict[str, Any] = {"model": body.get("model"),
                           "messages": input_messages(body, strict=True)}
    for name in _SAME_FIELDS:
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        out["response_format"] = response_format
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        out["reasoning_effort"] = reasoning["effort"]
    unknown = set(body) - set(out) - set(_SAME_FIELDS) - _DROPPED_FIELDS - {
        "input", "instructions", "max_output_tokens", "tools", "tool_choice", "text",
        "reasoning", "previous_response_id", "background"}
    for name in unknown:  # anything else the chat API may know passes through
        out[name] = body[name]
    return out


def user_view(body: dict[str, Any]) -> list[Message]:
    """The conversation as chat messages, for identity and recall on a natively relayed
    request (unknown items skipped; never raises for them)."""
    return input_messages(body, strict=False)


# --------------------------------------------------------------------------- replies


def usage_object(usage: Usage) -> dict[str, Any]:
    """A Responses ``usage`` object."""
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens}


def usage_from_response(data: Any) -> Usage | None:
    """The usage of a Responses object (``None`` when it has none)."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    try:
        prompt = int(usage.get("input_tokens") or 0)
        completion = int(usage.get("output_tokens") or 0)
        total = int(usage.get("total_tokens") or prompt + completion)
    except (TypeError, ValueError):
        return None
    return Usage(prompt, completion, total)


def output_text(data: Any) -> str:
    """The text of every ``output_text`` part of a Responses object's ``output``."""
    if not isinstance(data, dict):
        return ""
    texts = []
    for item in data.get("output") or ():
        if isinstance(item, dict) and item.get("type") == "message":
            texts.append(message_text({"role": "assistant", "content": [
                {**p, "type": "text"} for p in item.get("content") or ()
                if isinstance(p, dict) and p.get("type") == "output_text"]}))
    return "\n".join(t for t in texts if t)


def _status(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


@dataclass
class ResponseShell:
    """The fields of a Responses object that echo the request."""

    id: str
    model: str
    request: dict[str, Any]
    created_at: int = field(default_factory=lambda: int(time.time()))

    def render(self, *, status: str, output: list[dict[str, Any]],
               usage: Usage | None = None, incomplete: dict[str, Any] | None = None,
               error: dict[str, Any] | None = None) -> dict[str, Any]:
        body = self.request
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "error": error, "incomplete_details": incomplete,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": self.model,
            "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None, "reasoning": body.get("reasoning"),
            "store": False, "temperature": body.get("temperature"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "top_p": body.get("top_p"), "truncation": "disabled",
            "usage": usage_object(usage) if usage is not None else None,
            "user": body.get("user"), "metadata": body.get("metadata") or {},
        }


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": content if status == "completed" or text else []}


def _call_item(item_id: str, call_id: str, name: str, arguments: str,
               status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}


def response_from_reply(shell: ResponseShell, reply: Reply | None,
                        usage: Usage) -> dict[str, Any]:
    """The Responses object for a chat completion's first choice."""
    output: list[dict[str, Any]] = []
    if reply is not None and (reply.content or reply.refusal):
        text = reply.content or reply.refusal
        output.append(_message_item(new_id("msg"), text, "completed"))
    for call in reply.tool_calls if reply is not None else ():
        output.append(_call_item(new_id("fc"), call.id or new_id("call"), call.name,
                                 call.arguments, "completed"))
    status, incomplete = _status(reply.finish_reason if reply is not None else None)
    return shell.render(status=status, output=output, usage=usage, incomplete=incomplete)


class StreamTranslator:
    """Chat completion chunks (choice 0) → Responses streaming events, as SSE bytes.

    :meth:`opening` gives ``response.created`` and ``response.in_progress``; :meth:`feed`
    one chunk's events; :meth:`closing` the events that finish every open item and
    ``response.completed`` (or ``response.incomplete``) with usage; :meth:`failure` an
    ``error`` event and ``response.failed`` for an error after the stream started.
    """

    def __init__(self, shell: ResponseShell) -> None:
        self._shell = shell
        self._sequence = 0
        self._output: list[dict[str, Any]] = []  # finished items, in output order
        self._text: list[str] | None = None  # the open message's text, when one is open
        self._message_id = ""
        self._call: dict[str, Any] | None = None  # the open function call item
        self._call_index: Any = None
        self.finish_reason: str | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def opening(self) -> bytes:
        snapshot = self._shell.render(status="in_progress", output=[])
        return self._event("response.created", response=snapshot) + \
            self._event("response.in_progress", response=snapshot)

    def _index(self) -> int:
        return len(self._output)

    def _open_message(self) -> list[bytes]:
        self._message_id = new_id("msg")
        self._text = []
        index = self._index()
        return [
            self._event("response.output_item.added", output_index=index,
                        item=_message_item(self._message_id, "", "in_progress")),
            self._event("response.content_part.added", item_id=self._message_id,
                        output_index=index, content_index=0,
                        part={"type": "output_text", "text": "", "annotations": [],
                              "logprobs": []}),
        ]

    def _close_message(self) -> list[bytes]:
        if self._text is None:
            return []
        text, self._text = "".join(self._text), None
        index, item_id = self._index(), self._message_id
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item = _message_item(item_id, text, "completed")
        self._output.append(item)
        return [
            self._event("response.output_text.done", item_id=item_id, output_index=index,
                        content_index=0, text=text, logprobs=[]),
            self._event("response.content_part.done", item_id=item_id, output_index=index,
                        content_index=0, part=part),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _close_call(self) -> list[bytes]:
        call, self._call = self._call, None
        if call is None:
            return []
        index = self._index()
        item = {**call, "status": "completed", "arguments": call["arguments"] or "{}"}
        self._output.append(item)
        return [
            self._event("response.function_call_arguments.done", item_id=item["id"],
                        output_index=index, name=item["name"], arguments=item["arguments"]),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                delta = {}
            text = delta.get("content") or delta.get("refusal")
            if isinstance(text, str) and text:
                if self._text is None:
                    out += self._close_call() + self._open_message()
                assert self._text is not None
                self._text.append(text)
                out.append(self._event("response.output_text.delta",
                                       item_id=self._message_id,
                                       output_index=self._index(), content_index=0,
                                       delta=text, logprobs=[]))
            for fragment in delta.get("tool_calls") or ():
                if isinstance(fragment, dict):
                    out += self._tool_fragment(fragment)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return b"".join(out)

    def _tool_fragment(self, fragment: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        index = fragment.get("index", 0)
        function = fragment.get("function") or {}
        call_id = fragment.get("id")
        starts = self._call is None or index != self._call_index or (
            call_id and self._call["call_id"] and call_id != self._call["call_id"])
        if starts:
            out += self._close_message() + self._close_call()
            self._call_index = index
            self._call = _call_item(new_id("fc"), call_id or new_id("call"),
                                    function.get("name") or "", "", "in_progress")
            out.append(self._event("response.output_item.added", output_index=self._index(),
                                   item=dict(self._call)))
        assert self._call is not None
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._call["arguments"] += arguments
            out.append(self._event("response.function_call_arguments.delta",
                                   item_id=self._call["id"], output_index=self._index(),
                                   delta=arguments))
        return out

    def closing(self, usage: Usage) -> bytes:
        out = self._close_message() + self._close_call()
        status, incomplete = _status(self.finish_reason)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self._event(kind, response=self._shell.render(
            status=status, output=list(self._output), usage=usage, incomplete=incomplete)))
        return b"".join(out)

    def failure(self, error: ProxyError) -> bytes:
        code = error.code or error.error_type
        return self._event("error", code=code, message=error.message, param=error.param) + \
            self._event("response.failed", response=self._shell.render(
                status="failed", output=list(self._output),
                error={"code": "server_error" if error.status_code >= 500 else code,
                       "message": error.message}))
