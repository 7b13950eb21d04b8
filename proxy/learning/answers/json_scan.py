"""Scanning a JSON-ish document that may be cut off: where it ends, where it can be cut.

:func:`scan_prefix` follows strings and brackets of a document starting at ``{`` or ``[``
and reports the last point where everything before it is complete, with the closers that
finish it there; :func:`cut_off` tells a decode error caused by the end of the text from one
caused by malformed JSON. Both serve the repair stage of :func:`.json_text.extract_json`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["Prefix", "cut_off", "scan_prefix"]

_PARTIAL_TAIL = re.compile(
    r"-?\d*\.?\d*(?:[eE][-+]?\d*)?|t(?:r(?:ue?)?)?|f(?:a(?:l(?:se?)?)?)?|n(?:u(?:ll?)?)?"
)
_PARTIAL_UNICODE_ESCAPE = re.compile(r"u[0-9a-fA-F]{0,3}")


def cut_off(error: json.JSONDecodeError) -> bool:
    """Whether a decode error means "valid JSON so far, but the text ended"."""
    if error.msg.startswith("Unterminated string"):
        return True
    rest = error.doc[error.pos :].strip()
    if error.msg.startswith("Invalid \\uXXXX escape"):
        return _PARTIAL_UNICODE_ESCAPE.fullmatch(rest) is not None
    return not rest or _PARTIAL_TAIL.fullmatch(rest) is not None


class _Cons:
    """An immutable stack cell, so scan snapshots cost O(1)."""

    __slots__ = ("closer", "parent")

    def __init__(self, closer: str, parent: _Cons | None) -> None:
        self.closer = closer
        self.parent = parent


def _closers(stack: _Cons | None) -> str:
    out: list[str] = []
    while stack is not None:
        out.append(stack.closer)
        stack = stack.parent
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Prefix:
    end: int | None  # index just after the top-level value, or None when it never closes
    safe_cut: int  # text[:safe_cut] ends with complete values only ...
    closers: str  # ... and this closes what is open there
    depth: int  # deepest nesting seen


def _string_end(text: str, start: int) -> int | None:
    """Index just after the string opening at ``start`` (its quote char closes it)."""
    quote = text[start]
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == quote:
            return i + 1
        else:
            i += 1
    return None


def scan_prefix(text: str, start: int = 0) -> Prefix | None:
    """Scan a JSON-ish value starting at ``text[start]`` (``{`` or ``[``); indexes returned
    are into ``text``.

    Tracks strings (double-quoted; single-quoted when the quote starts a token) and open
    containers, and remembers the last point where everything before is a complete element
    or member: after an opening bracket, before a comma, after a closing bracket, or after a
    string that is a value (not a key). A partial number or literal at the very end is not
    a safe point (``0.7`` may have been ``0.75``).
    """
    if start >= len(text) or text[start] not in "{[":
        return None
    stack: _Cons | None = None
    expecting_key: list[bool] = []
    safe_cut, safe_stack = start, stack
    token_start = True
    depth = max_depth = 0
    i = start
    while i < len(text):
        char = text[i]
        if char == '"' or (char == "'" and token_start):
            end = _string_end(text, i)
            if end is None:
                break  # the text ends inside this string
            in_object = stack is not None and stack.closer == "}"
            if not in_object or not expecting_key[-1]:  # a value, not a key
                safe_cut, safe_stack = end, stack
            token_start = False
            i = end
            continue
        if char in "{[":
            stack = _Cons("}" if char == "{" else "]", stack)
            expecting_key.append(char == "{")
            safe_cut, safe_stack = i + 1, stack
            depth += 1
            max_depth = max(depth, max_depth)
            token_start = True
        elif char in "}]":
            stack = stack.parent if stack is not None else None
            expecting_key.pop()
            depth -= 1
            if stack is None:
                return Prefix(i + 1, i + 1, "", max_depth)
            safe_cut, safe_stack = i + 1, stack
            token_start = False
        elif char == ",":
            if stack is not None:
                safe_cut, safe_stack = i, stack
                if stack.closer == "}":
                    expecting_key[-1] = True
            token_start = True
        elif char == ":":
            if stack is not None and stack.closer == "}":
                expecting_key[-1] = False
            token_start = True
        elif not char.isspace():
            token_start = False
        i += 1
    return Prefix(None, safe_cut, _closers(safe_stack), max_depth)
