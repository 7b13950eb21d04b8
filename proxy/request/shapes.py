"""Pydantic models of the chat completion request, limited to the parts the gateway reads.

Every model is ``extra="allow"`` and strict (a number is not a string, ``1`` is not
``true``): a field the gateway reads must have the type it is read as, and every other
field — known today or added by OpenAI tomorrow — is accepted as it is. The models only
check: the gateway forwards the client's own JSON object, never a re-serialised model.

Where a value may take one of several JSON types (``content``: a string or an array of
parts), the member is chosen by a callable discriminator whose tags start with ``~``, so a
pydantic error location can drop them (:mod:`proxy.request.problems`).

The rules and why the gateway reads each part:

- ``model``: a non-empty string (routing);
- ``messages``: a non-empty array of message objects (memory, identity, token counting);
- a message's ``role``: a non-empty string; ``name``: a speaker's display name of at most
  :data:`MAX_NAME_CHARS` printable characters (group identity, as ``identity.MAX_ID_LENGTH``
  for user ids); ``content``: a string, an array of content parts or null (null on an
  assistant tool-call turn); ``tool_calls``: an array of objects whose ``function``, when
  present, is an object (token counting);
- a content part: an object with a string ``type``; a ``text`` / ``input_text`` part's
  ``text``, when present, a string (the text of a message);
- ``stream`` and ``stream_options.include_usage``: booleans (null means absent);
  ``stream_options`` and ``metadata``: objects; ``user`` and ``safety_identifier``: strings
  (identity); ``n``: an integer >= 1 (the number of replies recorded).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

MAX_NAME_CHARS = 256
# Printable: no C0 control character, no DEL and no C1 control character.
PRINTABLE_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"
TEXT_PART_TYPES = ("text", "input_text")

_READ_ONLY = ConfigDict(extra="allow", strict=True)


class _Shape(BaseModel):
    model_config = _READ_ONLY


class ContentPart(_Shape):
    """A content part of any type: an object with a string ``type``."""

    type: str


class TextPart(ContentPart):
    """A ``text`` or ``input_text`` part: its ``text`` is read as the message's text."""

    text: str | None = None


def _part_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    return "~text" if value.get("type") in TEXT_PART_TYPES else "~part"


Part = Annotated[Annotated[TextPart, Tag("~text")] | Annotated[ContentPart, Tag("~part")],
                 Discriminator(_part_kind)]


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "~string"
    return "~parts" if isinstance(value, list) else None


Content = Annotated[Annotated[str, Tag("~string")] | Annotated[list[Part], Tag("~parts")],
                    Discriminator(_content_kind)]


class FunctionCall(_Shape):
    """A tool call's ``function``: an object (its ``name`` and ``arguments`` are counted as
    text, whatever their type)."""


class ToolCall(_Shape):
    """One of an assistant turn's ``tool_calls``."""

    function: FunctionCall | None = None


class ChatMessage(_Shape):
    """A message of ``messages``, as the gateway reads it."""

    role: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(max_length=MAX_NAME_CHARS, pattern=PRINTABLE_PATTERN)] | None \
        = None
    content: Content | None = None
    tool_calls: list[ToolCall] | None = None


class StreamOptions(_Shape):
    include_usage: bool | None = None


class ChatBody(_Shape):
    """A ``POST /v1/chat/completions`` body. Fields are declared in the order they are
    checked, so the first error pydantic reports is the first one a reader would find."""

    model: Annotated[str, Field(pattern=r"\S")]
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, Any] | None = None
    n: Annotated[int, Field(ge=1)] | None = None

