"""The requests the gateway receives, checked where the gateway reads them.

- :mod:`proxy.request.shapes` — pydantic models of the parts of a chat completion request
  the gateway reads (``extra="allow"``: every other field passes through untouched);
- :mod:`proxy.request.problems` — a pydantic error turned into today's 400: ``param`` in
  bracket form (``messages[0].content[1].text``) and an OpenAI error ``code``;
- :mod:`proxy.request.chat` — :func:`parse_chat_request`, :class:`ChatRequest` and the
  text of a message.
"""

from proxy.request.chat import (
    MAX_NAME_CHARS,
    ChatRequest,
    Message,
    message_text,
    parse_chat_body,
    parse_chat_request,
)
from proxy.request.shapes import ChatMessage

__all__ = [
    "MAX_NAME_CHARS",
    "ChatMessage",
    "ChatRequest",
    "Message",
    "message_text",
    "parse_chat_body",
    "parse_chat_request",
]
