"""Finding the JSON value in model text: :func:`extract_json` and :func:`parse_model_json`.

Ground rules, each one learnt from a public bug report against a similar tool:

* A failure is always a :class:`.ParseError`, never ``None``/``[]``: "the model said
  nothing usable" must not be confused with "the model found no facts".
* A successful parse is final: nothing here splits lines or otherwise guesses facts out of
  text once JSON was found (a fallback line-splitter once stored the JSON text as a fact).
* ``reasoning_content`` is never mined for answers; an empty answer is an error that says
  whether the output was truncated, so the caller can retry with more tokens.
* Strict parsing comes before repair (:func:`extract_json` documents the order), so a valid
  document is never replaced by a "repaired" guess built from some other part of the text.

The answer modules (:mod:`.scoring`, :mod:`.extraction`) pass their own :class:`Checks` to
:func:`parse_output`; other callers use the two public functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import orjson
from json_repair import repair_json

from proxy.learning.answers.json_scan import cut_off, scan_prefix
from proxy.learning.answers.output import ModelOutput, ParseError
from proxy.learning.answers.reasoning import strip_reasoning

__all__ = [
    "MISSING",
    "Checks",
    "Expect",
    "Found",
    "Validator",
    "extract_json",
    "loads",
    "parse_model_json",
    "parse_output",
]

Validator: TypeAlias = Callable[[Any], bool]
"""A predicate over a decoded JSON value; ``True`` means "this is the value I asked for"."""

Expect: TypeAlias = type[dict[str, Any]] | type[list[Any]] | tuple[type[Any], ...]
"""The JSON container type(s) a caller accepts, as for :func:`isinstance`."""

_DECODER: Final = json.JSONDecoder(strict=False)  # strict=False: raw newlines in strings
MISSING: Final = object()

_MAX_EMBEDDED_STARTS: Final = 1024
"""Stage 3 tries at most this many start positions (bounds the work on hostile input)."""
_MAX_REPAIR_CANDIDATES: Final = 8
"""Stage 4 repairs at most this many candidates."""
_MAX_REPAIR_CHARS: Final = 200_000
_MAX_REPAIR_DEPTH: Final = 32
"""json_repair is pure Python; longer or deeper candidates are not handed to it."""
_UNWRAP_DEPTH: Final = 4
_UNWRAP_NODES: Final = 10_000
"""Limits of the search for a qualifying object nested in a value that does not qualify."""

_FENCE = re.compile(
    r"(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[A-Za-z0-9_+.\-]*)[^\n{\[]*\n?"
    r"(?P<body>.*?)(?:(?P=fence)|\Z)",
    re.DOTALL,
)
_SURROGATE_CHAR = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Found:
    value: Any
    stage: str  # "strict" | "fence" | "embedded" | "repair" | "salvage"
    truncated: bool  # salvaged from a document that ran into the end of the text


def _as_tuple(expect: Expect) -> tuple[type[Any], ...]:
    return expect if isinstance(expect, tuple) else (expect,)


def _fix_surrogates(text: str) -> str:
    """Pair up surrogate halves and replace lone ones with U+FFFD."""
    if _SURROGATE_CHAR.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _clean_value(value: Any) -> Any:
    """Apply :func:`_fix_surrogates` to every string (keys too) of a decoded value."""
    if isinstance(value, str):
        return _fix_surrogates(value)
    if isinstance(value, list):
        return [_clean_value(item) for item in value]
    if isinstance(value, dict):
        return {
            (_fix_surrogates(key) if isinstance(key, str) else key): _clean_value(item)
            for key, item in value.items()
        }
    return value


def _unwrap(value: Any, objects: bool) -> Iterator[Any]:
    """``value``, then (when ``objects``) the objects nested in it, breadth-first, at most
    :data:`_UNWRAP_DEPTH` levels down: ``{"result": {"facts": [...]}}`` holds the answer.
    Nested *lists* are never offered - a nested ``"tags": []`` is not an answer."""
    yield value
    if not objects:
        return
    level = [value]
    budget = _UNWRAP_NODES
    for _ in range(_UNWRAP_DEPTH):
        children: list[Any] = []
        for node in level:
            items = node.values() if isinstance(node, dict) else node
            for child in items if isinstance(node, dict | list) else ():
                budget -= 1
                if budget < 0:
                    return
                if isinstance(child, dict):
                    yield child
                if isinstance(child, dict | list):
                    children.append(child)
        level = children


def loads(text: str) -> Any:
    """Strictly decode a whole document: orjson first, then the stdlib (lenient on
    control characters, lone surrogate escapes and big numbers). ``MISSING`` on failure."""
    try:
        return orjson.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):
        return MISSING


def _repair(text: str) -> Any:
    """json_repair with ``return_objects=True``; ``MISSING`` when it fails or finds nothing."""
    if len(text) > _MAX_REPAIR_CHARS:
        return MISSING
    try:
        value: Any = repair_json(text, return_objects=True, skip_json_loads=True)
    except Exception:  # a third-party repairer on hostile input: any failure is "no value"
        return MISSING
    if value == "":
        return MISSING  # json_repair's "nothing found" (candidates start at an opener)
    return value



@dataclass(frozen=True, slots=True)
class Checks:
    """What qualifies, per stage. ``strict`` for the whole text and fenced blocks,
    ``embedded`` for values found in prose (stage 3), ``repaired`` for json_repair output
    and salvaged cut-off documents. A qualifying value for which ``weak`` is true (an empty
    answer) is held back and returned only when nothing else qualifies in any stage."""

    strict: Validator | None
    embedded: Validator | None
    repaired: Validator | None
    weak: Validator | None


def _fences(text: str) -> list[str]:
    """Bodies of fenced code blocks: ``json``-tagged ones first, then the others, each group
    in document order. A fence still open at the end of the text counts (truncation)."""
    tagged: list[str] = []
    other: list[str] = []
    for match in _FENCE.finditer(text):
        body = match.group("body")
        (tagged if match.group("lang").lower().startswith("json") else other).append(body)
    return tagged + other


def _first_opener(text: str, openers: str) -> int:
    positions = [pos for pos in (text.find(char) for char in openers) if pos >= 0]
    return min(positions) if positions else -1


_Accept: TypeAlias = Callable[[Any, Validator | None, str, bool], Found | None]
"""Checks a decoded value: ``(value, validator, stage, truncated)`` -> found or None."""


def _extract(text: str, *, expect: Expect, checks: Checks) -> Found:
    """The parse pipeline behind :func:`extract_json` (see there), reporting the stage."""
    types = _as_tuple(expect)
    openers = "{[" if any(issubclass(kind, list) for kind in types) else "{"
    deferred: list[Found] = []

    def accept(value: Any, check: Validator | None, stage: str, truncated: bool) -> Found | None:
        if value is MISSING:
            return None
        try:
            value = _clean_value(value)
            for candidate in _unwrap(value, dict in types):
                if isinstance(candidate, types) and (check is None or check(candidate)):
                    break
            else:
                return None
        except RecursionError:
            return None
        found = Found(candidate, stage, truncated)
        if checks.weak is not None and checks.weak(candidate):
            deferred.append(found)
            return None
        return found

    text = _fix_surrogates(text.lstrip("\ufeff")).strip()
    if not text:
        raise ParseError("no JSON value in the model output: it is empty")

    # 1. The whole text (an empty answer here is the answer: nothing else is in the text).
    whole = accept(loads(text), checks.strict, "strict", False)
    if whole is not None or deferred:
        return whole or deferred[0]

    # 2. Fenced code blocks, ```json first.
    bodies = _fences(text)
    for body in bodies:
        fenced = accept(loads(body.strip()), checks.strict, "fence", False)
        if fenced is not None:
            return fenced

    # 3. A value embedded in prose: raw_decode at each opener.
    embedded = _embedded(text, openers, accept, checks.embedded)
    if embedded.found is not None:
        return embedded.found

    # 4. Repair: fenced blocks, the cut-off document, other failed starts, the first opener.
    seen: set[str] = set()
    saw_cut = embedded.cut_at is not None
    for candidate in _repair_candidates(text, bodies, embedded, openers):
        if candidate in seen:
            continue
        seen.add(candidate)
        if len(seen) > _MAX_REPAIR_CANDIDATES:
            break
        found = _repair_candidate(candidate, accept, checks)
        if isinstance(found, Found):
            return found
        saw_cut = saw_cut or found
    if deferred:
        return deferred[0]

    stages = f"strict parse, {len(bodies)} fenced block(s), {embedded.tried} embedded start(s)"
    raise ParseError(
        f"no JSON value of the expected shape ({_type_names(types)}) in the model output "
        f"({len(text)} chars; tried {stages} and {len(seen)} repair(s))"
        + ("; the JSON document is cut off (output truncated)" if saw_cut else ""),
        truncated=saw_cut,
    )


def _repair_candidates(text: str, bodies: list[str], embedded: _Embedded, openers: str
                       ) -> list[str]:
    """Stage 4's candidates, in order: each fenced block from its first opener, the cut-off
    document, the outermost failed starts of stage 3, the text from its first opener."""
    candidates: list[str] = []
    for body in bodies:
        at = _first_opener(body, openers)
        if at >= 0:
            candidates.append(body[at:].strip())
    if embedded.cut_at is not None:
        candidates.append(text[embedded.cut_at :])
    candidates.extend(text[start:] for start in _repair_starts(text, embedded.malformed))
    first = _first_opener(text, openers)
    if first >= 0:
        candidates.append(text[first:])
    return candidates


@dataclass(slots=True)
class _Embedded:
    found: Found | None = None
    cut_at: int | None = None  # start of a document that runs into the end of the text
    malformed: list[int] = field(default_factory=list)  # starts that did not decode
    tried: int = 0


def _embedded(text: str, openers: str, accept: _Accept, check: Validator | None) -> _Embedded:
    """Stage 3 of :func:`extract_json`: raw_decode at each opener, in order."""
    result = _Embedded()
    resume = 0
    for match in re.finditer("[{[]" if "[" in openers else "{", text):
        start = match.start()
        if start < resume:
            continue  # inside a value that decoded: its parts are not separate answers
        result.tried += 1
        if result.tried > _MAX_EMBEDDED_STARTS:
            break
        try:
            decoded, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError as error:
            if cut_off(error):
                result.cut_at = start  # every later opener is nested in this document
                break
            result.malformed.append(start)
            continue
        except (ValueError, RecursionError):
            result.malformed.append(start)
            continue
        result.found = accept(decoded, check, "embedded", False)
        if result.found is not None:
            break
        resume = end
    return result


def _repair_starts(text: str, starts: list[int]) -> list[int]:
    """Of the starts that failed to decode, the outermost ones (not inside an earlier one's
    bracketed span), longest first: the answer is the big malformed object, not a
    ``{see above}`` in the prose before it. Ties keep document order."""
    spans: list[tuple[int, int]] = []
    inside_until = -1
    for start in starts:
        if start < inside_until:
            continue
        prefix = scan_prefix(text, start)
        if prefix is None:
            continue
        end = len(text) if prefix.end is None else prefix.end
        spans.append((start, end))
        inside_until = end
    longest = sorted(spans, key=lambda span: span[0] - span[1])  # stable: ties keep order
    return [start for start, _ in longest[:_MAX_REPAIR_CANDIDATES]]


def _repair_candidate(candidate: str, accept: _Accept, checks: Checks) -> Found | bool:
    """Try one candidate starting at an opener. Returns the found value, or whether the
    candidate was a cut-off document (for the error message)."""
    try:
        decoded, _ = _DECODER.raw_decode(candidate, 0)
    except json.JSONDecodeError as error:
        if cut_off(error):
            # Valid JSON up to the end of the text: keep complete values only. A partial last
            # value is dropped rather than completed by guessing (no json_repair fallback:
            # its completion of a cut number or string would look genuine).
            prefix = scan_prefix(candidate)
            if prefix is None:
                return True
            closed = candidate[: prefix.safe_cut] + prefix.closers
            salvaged = loads(closed)
            if salvaged is MISSING and prefix.depth <= _MAX_REPAIR_DEPTH:
                salvaged = _repair(closed)
            return accept(salvaged, checks.repaired, "salvage", True) or True
    except (ValueError, RecursionError):
        pass
    else:
        return accept(decoded, checks.embedded, "embedded", False) or False

    # Malformed (single quotes, trailing commas, Python literals, comments ...).
    prefix = scan_prefix(candidate)
    if prefix is None or prefix.depth > _MAX_REPAIR_DEPTH:
        return False  # json_repair is slow on deep nesting; no answer of ours is deep
    truncated = prefix.end is None
    if prefix.end is not None:
        segment = candidate[: prefix.end]  # leave trailing prose out of the repair
    else:
        segment = candidate[: prefix.safe_cut] + prefix.closers
    stage = "salvage" if truncated else "repair"
    # Only a decoder-confirmed cut marks the error as truncated, hence ``or False``.
    return accept(_repair(segment), checks.repaired, stage, truncated) or False


def _is_empty(value: Any) -> bool:
    return isinstance(value, dict | list) and not value


def _type_names(types: Sequence[type[Any]]) -> str:
    return " or ".join(kind.__name__ for kind in types)


def _generic_checks(validate: Validator | None) -> Checks:
    return Checks(strict=validate, embedded=validate, repaired=validate, weak=_is_empty)


def extract_json(
    text: str,
    *,
    expect: Expect = (dict, list),
    validate: Validator | None = None,
) -> Any:
    """Find the JSON value of the expected shape in ``text`` and return it.

    A value qualifies when it is an instance of ``expect`` and ``validate(value)`` is true
    (when given). Candidates are tried in this order, and the first qualifying one wins:

    1. the whole (whitespace-stripped) text, with orjson, then the stdlib decoder;
    2. fenced code blocks - ````` ```json ````` ones first, then other ````` ``` ````` and
       ``~~~`` blocks (a fence left open at the end of the text counts);
    3. ``json.JSONDecoder.raw_decode`` at each ``{`` (and ``[`` when a list is expected) in
       order. Positions inside a value that decoded but did not qualify are skipped (a
       nested ``"tags": []`` is not an answer). When a decode runs into the end of the text
       (a cut-off document) the scan stops: every later position is nested in it;
    4. repair, only then: json_repair (``return_objects=True``) on each fenced block, the
       cut-off document, the outermost failed starts of stage 3 (longest span first) and
       the text from the first opener. It
       handles trailing commas, single quotes, unquoted keys, Python ``True``/``False``/
       ``None`` and comments. A document that is valid JSON up to the end of the text is
       instead cut back to its last complete element and closed, so a partial last item
       (a cut string or number) is dropped rather than completed by a guess.

    Refinements: when a decoded value does not qualify, the objects nested in it (up to 4
    levels, objects only, never lists) are tried, so ``{"result": {...}}`` wrappers work.
    An empty container (``[]``, ``{}``) that qualifies is held back and returned only if
    no non-empty value qualifies in any stage - a ``[]`` mentioned in prose must not hide
    the answer after it. At most 1024 start positions are tried in stage 3 and 8
    candidates in stage 4; json_repair gets no candidate over 200,000 characters or
    nested deeper than 32 levels.

    Lone UTF-16 surrogates (``"\\ud83d"`` escapes, or surrogate characters in ``text``) are
    replaced with U+FFFD in every string of the result, so one bad emoji does not lose the
    document. ``NaN``/``Infinity`` literals are accepted by the stdlib decoder; callers
    that need finite numbers check for themselves.

    This does not strip reasoning blocks; use :func:`parse_model_json` for model output.
    Exceptions raised by ``validate`` propagate.

    Raises:
        ParseError: nothing qualifies (never returns ``None`` to mean failure);
            ``truncated`` is set when a cut-off document was seen.
    """
    return _extract(text, expect=expect, checks=_generic_checks(validate)).value


def parse_output(output: ModelOutput, *, expect: Expect, checks: Checks) -> Found:
    length = output.finish_reason == "length"
    text = strip_reasoning(output.content or "")
    if not text:
        reasoning = f"; {len(output.reasoning or '')} chars of reasoning_content were not parsed"
        raise ParseError(
            "empty content: the model gave no answer outside reasoning"
            + (reasoning if output.reasoning else "")
            + (
                "; the output was truncated (finish_reason=length), retry with more max_tokens"
                if length
                else ""
            ),
            truncated=length,
        )
    try:
        return _extract(text, expect=expect, checks=checks)
    except ParseError as error:
        if length and not error.truncated:
            raise ParseError(
                f"{error}; the output was truncated (finish_reason=length), "
                "retry with more max_tokens",
                truncated=True,
            ) from error
        raise


def parse_model_json(
    output: ModelOutput,
    *,
    validate: Validator | None = None,
    expect: Expect = (dict, list),
) -> Any:
    """:func:`extract_json` on ``output.content`` after :func:`strip_reasoning`.

    ``output.reasoning`` is never parsed, even when content is empty.

    Raises:
        ParseError: content is empty, whitespace or only reasoning (message starts with
            ``"empty content"``), or :func:`extract_json` finds nothing. ``truncated`` is
            ``True`` (and the message says so) when ``finish_reason == "length"`` or the
            JSON document is cut off.
    """
    return parse_output(output, expect=expect, checks=_generic_checks(validate)).value
