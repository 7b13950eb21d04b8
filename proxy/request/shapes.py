"""Pydantic models of the chat completion request, limited to the parts the gateway reads.

Every shape is ``extra="allow"`` and strict (a number is not a string, ``1`` is not
``true``): a field the gateway reads must have the type it is read as, and every other
field — known today or added by OpenAI tomorrow — is accepted as it is. The shapes only
check: the gateway forwards the client's own JSON object, never a re-serialised one. They
are ``TypedDict`` s validated by one :data:`CHAT_BODY` adapter built at import: on the
request path a validated dict costs about half of a model instance per message.

Where a value may take one of several JSON types (``content``: a string or an array of
parts), the member is chosen by a callable discriminator whose tags start with ``~``, so a
pydantic error location can drop them (:mod:`proxy.request.problems`).

The rules and why the gateway reads each part:

- ``model``: a non-empty string (routing);
- ``messages``: a non-empty array of message objects (memory, identity, token counting);
- a message's ``role``: a non-empty string; ``name``: a speaker's display name of at most
  :data:`MAX_NAME_CHARS` printable characters (group identity, as ``settings.MAX_ID_LENGTH``
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

from typing import Annotated, Any, NotRequired

from pydantic import ConfigDict, Discriminator, Field, Tag, TypeAdapter, with_config
from typing_extensions import TypedDict  # pydantic needs it before Python 3.12

MAX_NAME_CHARS = 256
# Printable: no C0 control character, no DEL and no C1 control character.
PRINTABLE_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"
TEXT_PART_TYPES = ("text", "input_text")

_READ_ONLY = ConfigDict(extra="allow", strict=True)


@with_config(_READ_ONLY)
class ContentPart(TypedDict):
    """A content part of any type: an object with a string ``type``."""

    type: str


@with_config(_READ_ONLY)
class TextPart(TypedDict):
    """A ``text`` or ``input_text`` part: its ``text`` is read as the message's text."""

    type: str
    text: NotRequired[str | None]


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


@with_config(_READ_ONLY)
class ToolCall(TypedDict):
    """One of an assistant turn's ``tool_calls``: its ``function`` an object (whose
    ``name`` and ``arguments`` are counted as text, whatever their type)."""

    function: NotRequired[dict[str, Any] | None]


@with_config(_READ_ONLY)
class ChatMessage(TypedDict):
    """A message of ``messages``, as the gateway reads it."""

    role: Annotated[str, Field(min_length=1)]
    name: NotRequired[Annotated[str, Field(max_length=MAX_NAME_CHARS,
                                           pattern=PRINTABLE_PATTERN)] | None]
    content: NotRequired[Content | None]
    tool_calls: NotRequired[list[ToolCall] | None]


@with_config(_READ_ONLY)
class StreamOptions(TypedDict):
    include_usage: NotRequired[bool | None]


@with_config(_READ_ONLY)
class ChatBody(TypedDict):
    """A ``POST /v1/chat/completions`` body. Fields are declared in the order they are
    checked, so the first error pydantic reports is the first one a reader would find."""

    model: Annotated[str, Field(pattern=r"\S")]
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    stream: NotRequired[bool | None]
    stream_options: NotRequired[StreamOptions | None]
    user: NotRequired[str | None]
    safety_identifier: NotRequired[str | None]
    metadata: NotRequired[dict[str, Any] | None]
    n: NotRequired[Annotated[int, Field(ge=1)] | None]


CHAT_BODY: TypeAdapter[ChatBody] = TypeAdapter(ChatBody)
