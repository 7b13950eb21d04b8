"""What parsing reads and how it fails: :class:`ModelOutput` and :class:`ParseError`.

Error messages never quote the model output (it is about end users); they give sizes and
what was tried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.errors import MemoryProxyError

__all__ = ["ModelOutput", "ParseError"]


class ParseError(MemoryProxyError):
    """The model output holds no JSON value of the expected shape.

    Never to be treated as "no facts": an empty extraction is a *successful* parse that
    returns no facts. ``truncated`` is ``True`` when the output was cut off (the provider
    reported ``finish_reason == "length"`` or the JSON document ran into the end of the
    text), in which case retrying with a larger ``max_tokens`` is likely to help.
    """

    def __init__(self, message: str, *, truncated: bool = False) -> None:
        super().__init__(message)
        self.truncated: bool = truncated

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the keyword-only flag across pickling (multiprocessing, task queues).
        return (_rebuild_parse_error, (str(self), self.truncated))


def _rebuild_parse_error(message: str, truncated: bool) -> ParseError:
    return ParseError(message, truncated=truncated)


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """The parts of one chat-completion choice that parsing needs.

    ``content`` is ``message.content``; ``reasoning`` is ``message.reasoning_content`` of
    reasoning models (kept for diagnostics only - it is never parsed); ``finish_reason`` is
    the choice's finish reason (``"length"`` means the output was truncated).
    """

    content: str | None
    reasoning: str | None = None
    finish_reason: str | None = None
