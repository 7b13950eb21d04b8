"""Reasoning blocks (``<think>`` ...) cut out of model output before its JSON is looked for."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["strip_reasoning"]

_REASONING_TAGS: Final = "think|thinking|reasoning"
# An opening tag counts only at the start of a line: JSON strings cannot hold a raw newline,
# so a tag there is never inside a JSON value of the answer.
_OPEN_TAG = re.compile(
    rf"^[ \t]*<\s*({_REASONING_TAGS})(?:\s[^<>]*)?>", re.IGNORECASE | re.MULTILINE
)
_ANY_CLOSE_TAG = re.compile(rf"<\s*/\s*(?:{_REASONING_TAGS})\s*>", re.IGNORECASE)


def strip_reasoning(text: str) -> str:
    """Remove reasoning blocks from model output and return the rest, whitespace-stripped.

    * ``<think>...</think>``, ``<thinking>...</thinking>`` and ``<reasoning>...</reasoning>``
      blocks (case-insensitive, attributes allowed) whose opening tag starts a line are
      removed; the closing tag may be anywhere.
    * An opening tag that is never closed (the model was cut off while thinking, or forgot
      to close) drops everything from the tag to the end of the text. Decision: nothing
      inside unfinished reasoning is treated as the answer, not even a JSON value after it -
      a JSON value there is a draft, and mining drafts silently stores wrong facts. The
      caller then sees empty content and a :class:`ParseError`.
    * A closing tag left without an opening one (chat templates that put ``<think>`` in the
      prompt) drops everything up to and including the last such closing tag.

    Text without reasoning tags is returned unchanged apart from stripping.
    """
    text = text.lstrip("\ufeff")
    kept: list[str] = []
    pos = 0
    while True:
        opening = _OPEN_TAG.search(text, pos)
        if opening is None:
            kept.append(text[pos:])
            break
        kept.append(text[pos : opening.start()])
        closing = re.compile(rf"<\s*/\s*{opening.group(1)}\s*>", re.IGNORECASE).search(
            text, opening.end()
        )
        if closing is None:
            break  # unclosed: the rest is unfinished reasoning
        pos = closing.end()
    rest = "".join(kept)
    orphans = list(_ANY_CLOSE_TAG.finditer(rest))
    if orphans:
        rest = rest[orphans[-1].end() :]
    return rest.strip()
