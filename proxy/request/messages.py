"""Pydantic models of Anthropic's ``POST /v1/messages`` request, limited to the parts the
gateway reads to translate it into a chat completion (:mod:`proxy.protocols.messages`).

As for the chat request (:mod:`proxy.request.shapes`): ``extra="allow"``, strict types,
only checked — the translation reads the client's own JSON object. The rules:

- ``max_tokens``: an integer >= 1 (required); ``messages``: a non-empty array;
- a turn: an object whose ``role`` is ``user`` or ``assistant``, whose ``content`` is a
  string or an array of blocks; a ``text`` block's ``text``, when present, a string; a
  ``tool_result`` block's ``content``, when an array, holds objects whose ``text`` (on a
  ``text`` block) is a string;
- ``system``: a string or an array of ``text`` blocks (their ``text`` a string);
- ``metadata``: an object.

What the translation decides on (block types per role, image sources, tools, ``tool_choice``)
stays with it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from proxy.request.problems import INDEX, Pattern, Rule, checked

_READ_ONLY = ConfigDict(extra="allow", strict=True)


class _Shape(BaseModel):
    model_config = _READ_ONLY


class TextBlock(_Shape):
    text: str | None = None


class AnyBlock(_Shape):
    """A block the translation reads by its ``type`` (any object)."""


def _block_kind(value: Any) -> str:
    if not isinstance(value, dict):
        return "~other"
    kind = value.get("type")
    return "~text" if kind == "text" else "~result" if kind == "tool_result" else "~block"


ResultBlock = Annotated[Annotated[TextBlock, Tag("~text")] | Annotated[AnyBlock, Tag("~block")]
                        | Annotated[Any, Tag("~result")] | Annotated[Any, Tag("~other")],
                        Discriminator(_block_kind)]


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "~string"
    return "~blocks" if isinstance(value, list) else "~other"


class ToolResultBlock(_Shape):
    content: Annotated[Annotated[list[ResultBlock], Tag("~blocks")]
                       | Annotated[Any, Tag("~string")] | Annotated[Any, Tag("~other")],
                       Discriminator(_content_kind)] = None


Block = Annotated[Annotated[TextBlock, Tag("~text")]
                  | Annotated[ToolResultBlock, Tag("~result")]
                  | Annotated[AnyBlock, Tag("~block")] | Annotated[Any, Tag("~other")],
                  Discriminator(_block_kind)]


class Turn(_Shape):
    role: Literal["user", "assistant"]
    content: Annotated[Annotated[str, Tag("~string")] | Annotated[list[Block], Tag("~blocks")],
                       Discriminator(lambda v: "~string" if isinstance(v, str) else "~blocks")]


class SystemBlock(_Shape):
    type: Literal["text"]
    text: str | None = None


class MessagesBody(_Shape):
    """The parts of a Messages request the translation reads, in checking order."""

    max_tokens: Annotated[int, Field(ge=1)]
    messages: Annotated[list[Turn], Field(min_length=1)]
    system: Annotated[Annotated[str, Tag("~string")]
                      | Annotated[list[SystemBlock], Tag("~blocks")],
                      Discriminator(_content_kind)] | None = None
    metadata: dict[str, Any] | None = None


TURN = ("messages", INDEX)
RULES: dict[Pattern, Rule] = {
    ("max_tokens",): Rule("'max_tokens' is required and must be a positive integer.",
                          required=True),
    ("messages",): Rule("'messages' is required and must be a non-empty array.",
                        required=True),
    TURN: Rule("{param} must be 'user' or 'assistant'.", code="invalid_value", suffix=".role"),
    (*TURN, "role"): Rule("{param} must be 'user' or 'assistant'.", code="invalid_value"),
    (*TURN, "content"): Rule("{param} must be a string or an array of blocks."),
    (*TURN, "content", INDEX, "text"): Rule("{param} must be a string."),
    (*TURN, "content", INDEX, "content", INDEX, "text"): Rule("{param} must be a string."),
    ("system",): Rule("'system' must be a string or an array of text blocks."),
    ("system", INDEX): Rule("{param} must be a text block.", code="invalid_value"),
    ("system", INDEX, "type"): Rule("{param} must be a text block.", code="invalid_value",
                                    keep=2),
    ("system", INDEX, "text"): Rule("{param} must be a string."),
    ("metadata",): Rule("'metadata' must be an object."),
}


def check_messages_body(body: dict[str, Any]) -> MessagesBody:
    """``body`` checked as :class:`MessagesBody`. Raises
    :class:`~proxy.errors.InvalidRequestError` (400) naming the part, as
    ``messages[0].content[1].text``."""
    return checked(MessagesBody, body, RULES)
