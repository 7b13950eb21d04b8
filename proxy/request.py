"""The chat completion request as the client sent it: parsed, checked, never reshaped.

The raw body is kept as a dict so that every field — known today or added by OpenAI
tomorrow — passes through to the upstream untouched; only ``messages`` is replaced by the
spliced copy (see :mod:`proxy.memory.inject`). Checks are limited to what the gateway itself
relies on, so anything the upstream would accept is still accepted here (case B08:
``content: null`` on assistant tool-call turns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import InvalidRequestError

Message = dict[str, Any]
MAX_NAME_CHARS = 256  # a message's ``name`` (as identity.MAX_ID_LENGTH for user ids)


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


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Parse and check a request body.

    Raises :class:`InvalidRequestError` (HTTP 400) naming the offending ``param`` for a body
    that is not a JSON object, a missing/empty ``model`` or ``messages``, a message that is
    not an object with a string ``role``, ``content`` that is not a string, list of parts or
    null, or a ``stream`` / ``stream_options`` of the wrong type. An absent or null
    ``stream`` means non-streaming (case B11).
    """
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(
            f"The request body is not valid JSON ({exc.msg} at position {exc.pos}). "
            "Send a JSON object with 'model' and 'messages'.",
            code="invalid_json",
        ) from exc
    if not isinstance(body, dict):
        raise InvalidRequestError(
            "The request body must be a JSON object with 'model' and 'messages'.",
            code="invalid_json",
        )
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequestError(
            "'model' is required and must be a non-empty string.", param="model",
            code="missing_required_parameter" if model is None else "invalid_type",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError(
            "'messages' is required and must be a non-empty array of message objects.",
            param="messages",
            code="missing_required_parameter" if messages is None else "invalid_type",
        )
    for index, message in enumerate(messages):
        _check_message(index, message)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequestError("'stream' must be a boolean.", param="stream",
                                  code="invalid_type")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidRequestError("'stream_options' must be an object.",
                                      param="stream_options", code="invalid_type")
        usage_flag = options.get("include_usage")
        if usage_flag is not None and not isinstance(usage_flag, bool):
            raise InvalidRequestError("'stream_options.include_usage' must be a boolean.",
                                      param="stream_options.include_usage",
                                      code="invalid_type")
        include_usage = bool(usage_flag)
    for name in ("user", "safety_identifier"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidRequestError(f"'{name}' must be a string.", param=name,
                                      code="invalid_type")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidRequestError("'metadata' must be an object.", param="metadata",
                                  code="invalid_type")
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise InvalidRequestError("'n' must be an integer >= 1.", param="n",
                                  code="invalid_type")
    return ChatRequest(
        body=body,
        model=model,
        messages=messages,
        stream=bool(stream),
        include_usage=include_usage and bool(stream),
    )


def _check_message(index: int, message: Any) -> None:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise InvalidRequestError(f"{param} must be an object with 'role' and 'content'.",
                                  param=param, code="invalid_type")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidRequestError(f"{param}.role is required and must be a string.",
                                  param=f"{param}.role", code="invalid_type")
    name = message.get("name")
    # The gateway reads ``name`` as a group speaker's display name (identity): a string of
    # at most MAX_NAME_CHARS printable characters.
    if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME_CHARS
                             or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name)):
        raise InvalidRequestError(
            f"{param}.name must be a string of at most {MAX_NAME_CHARS} printable characters.",
            param=f"{param}.name", code="invalid_value")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidRequestError(
            f"{param}.content must be a string, an array of content parts, or null.",
            param=f"{param}.content", code="invalid_type",
        )
    for part_index, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequestError(
                f"{param}.content[{part_index}] must be an object with a 'type'.",
                param=f"{param}.content[{part_index}]", code="invalid_type",
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
