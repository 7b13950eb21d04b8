"""The chat completion request as the client sent it: parsed, checked, never reshaped.

The raw body is kept as a dict so that every field — known today or added by OpenAI
tomorrow — passes through to the upstream untouched; only ``messages`` is replaced by the
spliced copy (see :mod:`proxy.memory.inject`). Checks are limited to what the gateway itself
reads (:mod:`proxy.request.shapes`), so anything the upstream would accept is still accepted
here — ``content: null`` on an assistant tool-call turn, say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Required, TypedDict

from pydantic import ValidationError

from proxy.errors import InvalidRequestError, decode_json
from proxy.request.problems import INDEX, Pattern, Rule, invalid_request
from proxy.request.shapes import CHAT_BODY, MAX_NAME_CHARS

__all__ = ["MAX_NAME_CHARS", "ChatRequest", "Message", "message_text", "parse_chat_body",
           "parse_chat_request"]

class Message(TypedDict, total=False):
    """A message as the client sent it (a JSON object), typed by the keys the gateway reads
    or writes: forwarded and spliced as is, other keys kept. The keys' types on the way in
    are checked by :class:`proxy.request.shapes.ChatMessage` (a wrong type is a 400)."""

    role: Required[str]
    name: str | None
    content: str | list[dict[str, Any]] | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body.

    ``body`` is the client's JSON object (forwarded as is, with ``messages`` and ``model``
    replaced for the upstream); ``messages`` is the client's list (never mutated).
    """

    body: dict[str, Any]
    model: str
    messages: list[Message]
    stream: bool
    include_usage: bool

    @property
    def metadata(self) -> dict[str, Any]:
        value = self.body.get("metadata")
        return value if isinstance(value, dict) else {}


# How each checked location is told (see proxy.request.shapes for the rules themselves).
MESSAGE = ("messages", INDEX)
PART = (*MESSAGE, "content", INDEX)
CHAT_RULES: dict[Pattern, Rule] = {
    ("model",): Rule("'model' is required and must be a non-empty string.", required=True),
    ("messages",): Rule("'messages' is required and must be a non-empty array of message "
                        "objects.", required=True),
    MESSAGE: Rule("{param} must be an object with 'role' and 'content'."),
    (*MESSAGE, "role"): Rule("{param} is required and must be a string."),
    (*MESSAGE, "name"): Rule(f"{{param}} must be a string of at most {MAX_NAME_CHARS} "
                             "printable characters.", code="invalid_value"),
    (*MESSAGE, "content"): Rule("{param} must be a string, an array of content parts, or null."),
    PART: Rule("{param} must be an object with a 'type'."),
    (*PART, "type"): Rule("{param} must be an object with a 'type'.", keep=4),
    (*PART, "text"): Rule("{param} must be a string."),
    (*MESSAGE, "tool_calls"): Rule("{param} must be an array of tool call objects."),
    (*MESSAGE, "tool_calls", INDEX): Rule("{param} must be an object."),
    (*MESSAGE, "tool_calls", INDEX, "function"): Rule("{param} must be an object."),
    ("stream",): Rule("'stream' must be a boolean."),
    ("stream_options",): Rule("'stream_options' must be an object."),
    ("stream_options", "include_usage"): Rule("'stream_options.include_usage' must be a "
                                              "boolean."),
    ("user",): Rule("'user' must be a string."),
    ("safety_identifier",): Rule("'safety_identifier' must be a string."),
    ("metadata",): Rule("'metadata' must be an object."),
    ("n",): Rule("'n' must be an integer >= 1."),
}


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Parse and check a request body (JSON bytes); see :func:`parse_chat_body`.

    Raises :class:`InvalidRequestError` (HTTP 400, ``code="invalid_json"``) for a body that
    is not a JSON object.
    """
    return parse_chat_body(decode_json(raw, "Send a JSON object with 'model' and 'messages'."))


def parse_chat_body(body: Any) -> ChatRequest:
    """Check a decoded request body against :class:`~proxy.request.shapes.ChatBody`
    (through :data:`~proxy.request.shapes.CHAT_BODY`).

    Raises :class:`InvalidRequestError` (HTTP 400) for a body that is not an object
    (``invalid_json``), or naming the offending ``param`` for a part the gateway reads that
    is missing or of the wrong type: a missing/empty ``model`` or ``messages``, a message
    that is not an object with a string ``role``, ``content`` that is not a string, list of
    parts or null, ``tool_calls`` that are not an array of objects, or a ``stream`` /
    ``stream_options`` of the wrong type. An absent or null ``stream`` means non-streaming.
    """
    if not isinstance(body, dict):
        raise InvalidRequestError(
            "The request body must be a JSON object with 'model' and 'messages'.",
            code="invalid_json",
        )
    try:
        shape = CHAT_BODY.validate_python(body)
    except ValidationError as exc:
        raise invalid_request(exc, CHAT_RULES) from None
    stream = bool(shape.get("stream"))
    options = shape.get("stream_options")
    return ChatRequest(
        body=body,
        model=shape["model"],
        messages=body["messages"],
        stream=stream,
        include_usage=bool(options and options.get("include_usage")) and stream,
    )


def message_text(message: Message) -> str:
    """The text of a message: a string content, or its text parts joined by newlines.

    Null content (assistant tool-call turns) and non-text parts give ``""``.
    """
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") in ("text", "input_text")
            and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts)
    return ""
