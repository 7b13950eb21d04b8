"""Pydantic models of OpenAI's ``POST /v1/responses`` request, limited to the parts the
gateway reads (:mod:`proxy.routes.responses`, :mod:`proxy.protocols.responses`).

As for the chat request (:mod:`proxy.request.shapes`): ``extra="allow"``, strict types,
only checked — the gateway forwards or translates the client's own JSON object. Two
checks, because a natively relayed request is read less than a translated one:

- every request (:func:`parse_responses_request`): a JSON object whose ``model`` is a
  non-empty string; ``stream`` a boolean; ``user`` and ``safety_identifier`` strings;
  ``metadata`` an object (identity);
- a request translated into a chat completion (:func:`check_responses_input`):
  ``instructions`` a string; ``input`` a string or an array of items (required); an item
  an object; a ``message`` item (the default type) with a ``role`` of user, assistant,
  system or developer and a ``content`` that is a string or an array of part objects; a
  ``function_call_output`` item's ``output`` likewise.

What the translation decides on (part and item types, image sources, tools) stays with it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from proxy.errors import InvalidRequestError, decode_json
from proxy.request.problems import INDEX, Pattern, Rule, checked

_READ_ONLY = ConfigDict(extra="allow", strict=True)


class _Shape(BaseModel):
    model_config = _READ_ONLY


class ResponsesEnvelope(_Shape):
    """What every Responses request must get right, in checking order."""

    model: Annotated[str, Field(pattern=r"\S")]
    stream: bool | None = None
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, Any] | None = None


class Part(_Shape):
    """A content part (any object; its ``type`` is the translation's to judge)."""


def _part_kind(value: Any) -> str | None:
    return "~part" if isinstance(value, dict) else None


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "~string"
    return "~parts" if isinstance(value, list) else None


Content = Annotated[
    Annotated[str, Tag("~string")]
    | Annotated[list[Annotated[Annotated[Part, Tag("~part")], Discriminator(_part_kind)]],
                Tag("~parts")],
    Discriminator(_content_kind)]


class MessageItem(_Shape):
    role: Literal["user", "assistant", "system", "developer"]
    content: Content


class OutputItem(_Shape):
    output: Content


class OtherItem(_Shape):
    """Any other item (``function_call``, ``reasoning``, …): an object."""


def _item_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type", "message")
    return "~message" if kind == "message" else "~output" \
        if kind == "function_call_output" else "~item"


Item = Annotated[Annotated[MessageItem, Tag("~message")] | Annotated[OutputItem, Tag("~output")]
                 | Annotated[OtherItem, Tag("~item")], Discriminator(_item_kind)]


def _input_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "~string"
    return "~items" if isinstance(value, list) else None


class ResponsesInput(_Shape):
    """What a translated Responses request must get right, in checking order."""

    instructions: str | None = None
    input: Annotated[Annotated[str, Tag("~string")] | Annotated[list[Item], Tag("~items")],
                     Discriminator(_input_kind)]


ENVELOPE_RULES: dict[Pattern, Rule] = {
    # Today's code for any bad model, absent or not.
    ("model",): Rule("'model' is required and must be a non-empty string.",
                     code="missing_required_parameter"),
    ("stream",): Rule("'stream' must be a boolean."),
    ("user",): Rule("'user' must be a string."),
    ("safety_identifier",): Rule("'safety_identifier' must be a string."),
    ("metadata",): Rule("'metadata' must be an object."),
}
ITEM = ("input", INDEX)
INPUT_RULES: dict[Pattern, Rule] = {
    ("instructions",): Rule("'instructions' must be a string."),
    ("input",): Rule("'input' is required: a string or an array of items.", required=True),
    ITEM: Rule("{param} must be an object."),
    (*ITEM, "role"): Rule("{param} must be one of user, assistant, system, developer.",
                       code="invalid_value"),
    (*ITEM, "content"): Rule("{param} must be a string or an array of parts."),
    (*ITEM, "output"): Rule("{param} must be a string or an array of parts."),
    (*ITEM, "content", INDEX): Rule("{param} must be an object with a 'type'."),
    (*ITEM, "output", INDEX): Rule("{param} must be an object with a 'type'."),
}


def parse_responses_request(raw: bytes) -> dict[str, Any]:
    """The request body (the client's JSON object), checked as :class:`ResponsesEnvelope`.
    Raises :class:`InvalidRequestError` (400): ``invalid_json`` for a body that is not a
    JSON object, else naming the part."""
    body = decode_json(raw, "Send a JSON object with 'model' and 'input'.")
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object with 'model' and "
                                  "'input'.", code="invalid_json")
    checked(ResponsesEnvelope, body, ENVELOPE_RULES)
    return body


def check_responses_input(body: dict[str, Any]) -> None:
    """``body`` checked as :class:`ResponsesInput`. Raises :class:`InvalidRequestError`
    (400) naming the part, as ``input[2].content``."""
    checked(ResponsesInput, body, INPUT_RULES)
