"""Query parameters and body text fields the gateway itself reads, checked in one place.

Every route reads its query parameters through these helpers, so a wrong type, a value out
of range, an integer too large for any store (SQLite and Redis hold signed 64-bit integers)
or a control character is a 400 in OpenAI's error envelope naming the parameter
(:class:`~proxy.errors.InvalidRequestError`, ``code`` ``invalid_value``), never an
exception deeper down. Fields the gateway does not read are never looked at.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated

from pydantic import AfterValidator, Field
from starlette.datastructures import QueryParams

from proxy.errors import InvalidRequestError

# Control characters refused in text the gateway reads: C0 (except tab, line feed and
# carriage return in body text), DEL and C1. Query values refuse tab and line breaks too.
_CONTROL_BODY = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_CONTROL_QUERY = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# An integer as a query value: optional sign, at most 19 digits (so it always fits in a
# signed 64-bit integer once the range below is checked).
_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")
MAX_QUERY_CHARS = 1000  # a text query value (search text, category, user) at most
# A memory id as :func:`proxy.memory.records.new_id` makes it: a ULID, 26 characters of
# Crockford's base 32 in capitals, the first at most 7 (48 bits of time).
_MEMORY_ID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
_TRUE, _FALSE = frozenset({"1", "true", "yes"}), frozenset({"", "0", "false", "no"})


def check_query(query: QueryParams) -> None:
    """Refuse a query parameter given more than once (no parameter of ours takes a list, and
    which of two values counts — ``confirm=maybe&confirm=true`` — must not be a guess) and a
    control character in any value (no parameter of ours takes one). ``query`` is the
    request's query string; its ``multi_items`` keeps every value (``items`` holds the
    last one per name). Raises :class:`InvalidRequestError` naming the first such
    parameter."""
    pairs = query.multi_items()
    seen: set[str] = set()
    for name, raw in pairs:
        if name in seen:
            given = sum(1 for other, _ in pairs if other == name)
            raise InvalidRequestError(
                f"'{name}' is given {given} times; give each query parameter once.",
                param=name, code="invalid_value")
        seen.add(name)
        if _CONTROL_QUERY.search(raw):
            raise InvalidRequestError(f"'{name}' must not contain control characters.",
                                      param=name, code="invalid_value")


def int_param(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """``name`` as an integer in ``[low, high]``; ``default`` when absent or empty. Raises
    :class:`InvalidRequestError` for anything else (``1.5``, ``1e3``, ``2**64``)."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if not _INTEGER.fullmatch(raw.strip()):
        raise InvalidRequestError(f"'{name}' must be an integer between {low} and {high}.",
                                  param=name, code="invalid_value")
    value = int(raw)
    if not low <= value <= high:
        raise InvalidRequestError(f"'{name}' must be between {low} and {high}.", param=name,
                                  code="invalid_value")
    return value


def optional_int_param(query: Mapping[str, str], name: str, low: int,
                       high: int) -> int | None:
    """As :func:`int_param`, ``None`` when absent or empty."""
    if not query.get(name):
        return None
    return int_param(query, name, low, low, high)


def flag_param(query: Mapping[str, str], name: str) -> bool:
    """A boolean (absent = false): 1/0, true/false, yes/no, any case. Raises
    :class:`InvalidRequestError` for anything else."""
    raw = query.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise InvalidRequestError(f"'{name}' must be true or false (got {raw[:40]!r}).",
                              param=name, code="invalid_value")


def text_param(query: Mapping[str, str], name: str, *,
               max_chars: int = MAX_QUERY_CHARS) -> str | None:
    """A text value (``None`` when absent or blank), at most ``max_chars`` characters and
    free of control characters. Raises :class:`InvalidRequestError`."""
    raw = query.get(name)
    if raw is None or not raw.strip():
        return None
    if len(raw) > max_chars or _CONTROL_QUERY.search(raw):
        raise InvalidRequestError(
            f"'{name}' must be at most {max_chars} characters without control characters.",
            param=name, code="invalid_value")
    return raw.strip()


def check_text(value: str, param: str) -> str:
    """``value`` unchanged when it holds no control character other than tab and line
    breaks. Raises :class:`InvalidRequestError` naming ``param``."""
    if _CONTROL_BODY.search(value):
        raise InvalidRequestError(f"'{param}' must not contain control characters.",
                                  param=param, code="invalid_value")
    return value


def _memory_cursor(value: str) -> str:
    if not _MEMORY_ID.fullmatch(value):
        raise ValueError("not a memory id: pass the last_id of the previous page")
    return value


def check_memory_cursor(value: str | None, *, param: str = "after") -> None:
    """``after=`` of a newest-first memory list: ``None`` or a memory id (the ``last_id``
    of the previous page). Raises :class:`InvalidRequestError` (``invalid_value``)."""
    if value is not None and not _MEMORY_ID.fullmatch(value):
        raise InvalidRequestError(f"{param}: not a memory id: pass the last_id of the "
                                  "previous page.", param=param, code="invalid_value")


# ``after=`` of the memory lists: the ``last_id`` of the previous page. Anything else is a
# 400 — a store compares ids as text, so "zzz" would silently answer the first page.
MemoryCursor = Annotated[str, AfterValidator(_memory_cursor),
                         Field(description="Cursor: the last_id of the previous page")]
