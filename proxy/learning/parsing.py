"""Robust parsing of LLM output that should contain JSON.

Two prompts feed this module:

* **scoring** - the model rates a conversation and answers with
  ``{"score": 0.75, "dimensions": {"density": .., "clarity": .., "depth": ..,
  "relevance": .., "novelty": ..}, "reason": "..."}``; see :func:`parse_scoring`.
* **extraction** - the model lists long-term facts about the user and answers with
  ``{"memories": [{...}, ...], "profile": {...}}``, a bare array of memory objects (older
  prompt shape), or ``{"facts": ["...", ...]}``; see :func:`parse_extraction`.

Ground rules, each one learnt from a public bug report against a similar tool:

* A failure is always a :class:`ParseError`, never ``None``/``[]``: "the model said nothing
  usable" must not be confused with "the model found no facts".
* A successful parse is final: nothing here splits lines or otherwise guesses facts out of
  text once JSON was found (a fallback line-splitter once stored the JSON text as a fact).
* ``reasoning_content`` is never mined for answers; an empty answer is an error that says
  whether the output was truncated, so the caller can retry with more tokens.
* Strict parsing comes before repair (:func:`extract_json` documents the order), so a valid
  document is never replaced by a "repaired" guess built from some other part of the text.

Error messages never quote the model output (it is about end users); they give sizes and
what was tried.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import orjson
from json_repair import repair_json

from proxy.errors import MemoryProxyError

__all__ = [
    "CATEGORIES",
    "SCORE_WEIGHTS",
    "CandidateFact",
    "ExtractionResult",
    "ModelOutput",
    "ParseError",
    "ProfileUpdate",
    "ScoreResult",
    "extract_json",
    "parse_extraction",
    "parse_model_json",
    "parse_scoring",
    "strip_reasoning",
]

Validator: TypeAlias = Callable[[Any], bool]
"""A predicate over a decoded JSON value; ``True`` means "this is the value I asked for"."""

Expect: TypeAlias = type[dict[str, Any]] | type[list[Any]] | tuple[type[Any], ...]
"""The JSON container type(s) a caller accepts, as for :func:`isinstance`."""


# --------------------------------------------------------------------------------------
# Public types
# --------------------------------------------------------------------------------------


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


SCORE_WEIGHTS: Final[dict[str, float]] = {
    "density": 0.30,  # 信息密度 - information density
    "clarity": 0.20,  # 意图明确性 - clarity of the user's intent
    "depth": 0.20,  # 对话深度 - depth of the conversation
    "relevance": 0.20,  # 业务相关性 - business relevance
    "novelty": 0.10,  # 新颖性 - novelty
}
"""Weights of the five scoring dimensions (from the seed design doc); they sum to 1."""


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """A parsed scoring answer.

    ``dimensions`` has exactly the keys of :data:`SCORE_WEIGHTS`, each in ``[0, 1]``.
    ``model_score`` is the overall score the model claimed (normalised to ``[0, 1]``, or
    ``None`` when absent or unusable); it is kept for audit only - use :attr:`weighted`.
    """

    dimensions: dict[str, float]
    model_score: float | None
    reason: str

    @property
    def weighted(self) -> float:
        """The overall score recomputed from the dimensions with :data:`SCORE_WEIGHTS`."""
        total = sum(weight * self.dimensions[name] for name, weight in SCORE_WEIGHTS.items())
        return round(total, 4)


@dataclass(frozen=True, slots=True)
class CandidateFact:
    """One fact the extraction model proposed, normalised (see :func:`parse_extraction`)."""

    title: str
    content: str
    category: str
    subcategory: str
    tags: tuple[str, ...]
    subject: str
    supersedes: tuple[str, ...]
    duplicate_of: str | None
    source_turns: tuple[int, ...]
    # Group chats: the participant who stated the fact, as named in the transcript.
    speaker: str | None = None


@dataclass(frozen=True, slots=True)
class ProfileUpdate:
    """The optional ``profile`` object of an extraction answer."""

    style: str | None
    impression: str | None
    traits: tuple[str, ...]
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ImageVerdict:
    """How an image the user shared is remembered (seed 001 §5.6): ``person`` (stable
    information about the person), ``long`` (worth keeping), ``short`` (only for now) or
    ``skip``; ``memory`` is the statement learned from it, if any."""

    image: int
    tier: str
    memory: str | None


IMAGE_TIERS = ("person", "long", "short", "skip")


@dataclass(frozen=True, slots=True)
class ExtractionResult:
    """A parsed extraction answer.

    ``facts`` may be empty: that is a successful "nothing worth remembering".
    ``dropped`` counts items that were present but unusable (not an object or string, no
    content, JSON-looking content, or an item cut off by truncation).
    ``truncated`` is ``True`` when the facts were salvaged from a document that was cut off;
    the complete items before the cut are kept and the partial last item is not.
    """

    facts: tuple[CandidateFact, ...]
    profile: ProfileUpdate | None
    dropped: int
    truncated: bool = False
    images: tuple[ImageVerdict, ...] = ()
    # group chats: (speaker name as written, its profile update) per participant
    profiles: tuple[tuple[str, ProfileUpdate], ...] = ()
    summary: str | None = None  # what the new messages were about (medium-term memory)


# --------------------------------------------------------------------------------------
# Reasoning blocks
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Generic JSON extraction
# --------------------------------------------------------------------------------------

_DECODER: Final = json.JSONDecoder(strict=False)  # strict=False: raw newlines in strings
_MISSING: Final = object()

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
_PARTIAL_TAIL = re.compile(
    r"-?\d*\.?\d*(?:[eE][-+]?\d*)?|t(?:r(?:ue?)?)?|f(?:a(?:l(?:se?)?)?)?|n(?:u(?:ll?)?)?"
)
_PARTIAL_UNICODE_ESCAPE = re.compile(r"u[0-9a-fA-F]{0,3}")


@dataclass(frozen=True, slots=True)
class _Found:
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


def _loads(text: str) -> Any:
    """Strictly decode a whole document: orjson first, then the stdlib (lenient on
    control characters, lone surrogate escapes and big numbers). ``_MISSING`` on failure."""
    try:
        return orjson.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):
        return _MISSING


def _repair(text: str) -> Any:
    """json_repair with ``return_objects=True``; ``_MISSING`` when it fails or finds nothing."""
    if len(text) > _MAX_REPAIR_CHARS:
        return _MISSING
    try:
        value: Any = repair_json(text, return_objects=True, skip_json_loads=True)
    except Exception:  # a third-party repairer on hostile input: any failure is "no value"
        return _MISSING
    if value == "":
        return _MISSING  # json_repair's "nothing found" (candidates start at an opener)
    return value


def _cut_off(error: json.JSONDecodeError) -> bool:
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
class _Prefix:
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


def _scan_prefix(text: str, start: int = 0) -> _Prefix | None:
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
                return _Prefix(i + 1, i + 1, "", max_depth)
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
    return _Prefix(None, safe_cut, _closers(safe_stack), max_depth)


@dataclass(frozen=True, slots=True)
class _Checks:
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


_Accept: TypeAlias = Callable[[Any, Validator | None, str, bool], _Found | None]
"""Checks a decoded value: ``(value, validator, stage, truncated)`` -> found or None."""


def _extract(text: str, *, expect: Expect, checks: _Checks) -> _Found:
    """The parse pipeline behind :func:`extract_json` (see there), reporting the stage."""
    types = _as_tuple(expect)
    openers = "{[" if any(issubclass(kind, list) for kind in types) else "{"
    deferred: list[_Found] = []

    def accept(value: Any, check: Validator | None, stage: str, truncated: bool) -> _Found | None:
        if value is _MISSING:
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
        found = _Found(candidate, stage, truncated)
        if checks.weak is not None and checks.weak(candidate):
            deferred.append(found)
            return None
        return found

    text = _fix_surrogates(text.lstrip("\ufeff")).strip()
    if not text:
        raise ParseError("no JSON value in the model output: it is empty")

    # 1. The whole text (an empty answer here is the answer: nothing else is in the text).
    whole = accept(_loads(text), checks.strict, "strict", False)
    if whole is not None or deferred:
        return whole or deferred[0]

    # 2. Fenced code blocks, ```json first.
    bodies = _fences(text)
    for body in bodies:
        fenced = accept(_loads(body.strip()), checks.strict, "fence", False)
        if fenced is not None:
            return fenced

    # 3. A value embedded in prose: raw_decode at each opener.
    embedded = _embedded(text, openers, accept, checks.embedded)
    if embedded.found is not None:
        return embedded.found

    # 4. Repair: fenced blocks, the cut-off document, the first opener, other failed starts.
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
    seen: set[str] = set()
    saw_cut = embedded.cut_at is not None
    for candidate in candidates:
        if candidate in seen:
            continue
        seen.add(candidate)
        if len(seen) > _MAX_REPAIR_CANDIDATES:
            break
        found = _repair_candidate(candidate, accept, checks)
        if isinstance(found, _Found):
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


@dataclass(slots=True)
class _Embedded:
    found: _Found | None = None
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
            if _cut_off(error):
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
        prefix = _scan_prefix(text, start)
        if prefix is None:
            continue
        end = len(text) if prefix.end is None else prefix.end
        spans.append((start, end))
        inside_until = end
    longest = sorted(spans, key=lambda span: span[0] - span[1])  # stable: ties keep order
    return [start for start, _ in longest[:_MAX_REPAIR_CANDIDATES]]


def _repair_candidate(candidate: str, accept: _Accept, checks: _Checks) -> _Found | bool:
    """Try one candidate starting at an opener. Returns the found value, or whether the
    candidate was a cut-off document (for the error message)."""
    try:
        decoded, _ = _DECODER.raw_decode(candidate, 0)
    except json.JSONDecodeError as error:
        if _cut_off(error):
            # Valid JSON up to the end of the text: keep complete values only. A partial last
            # value is dropped rather than completed by guessing (no json_repair fallback:
            # its completion of a cut number or string would look genuine).
            prefix = _scan_prefix(candidate)
            if prefix is None:
                return True
            closed = candidate[: prefix.safe_cut] + prefix.closers
            salvaged = _loads(closed)
            if salvaged is _MISSING and prefix.depth <= _MAX_REPAIR_DEPTH:
                salvaged = _repair(closed)
            return accept(salvaged, checks.repaired, "salvage", True) or True
    except (ValueError, RecursionError):
        pass
    else:
        return accept(decoded, checks.embedded, "embedded", False) or False

    # Malformed (single quotes, trailing commas, Python literals, comments ...).
    prefix = _scan_prefix(candidate)
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


def _generic_checks(validate: Validator | None) -> _Checks:
    return _Checks(strict=validate, embedded=validate, repaired=validate, weak=_is_empty)


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


def _parse_output(output: ModelOutput, *, expect: Expect, checks: _Checks) -> _Found:
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
    return _parse_output(output, expect=expect, checks=_generic_checks(validate)).value


# --------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------


def _norm_key(key: str) -> str:
    return re.sub(r"[\s\-]+", "_", key.strip().lower())


_DIMENSION_ALIASES: Final[dict[str, str]] = {
    alias: name
    for name, aliases in {
        "density": ("density", "information_density", "info_density", "信息密度"),
        "clarity": (
            "clarity",
            "intent_clarity",
            "clarity_of_intent",
            "user_intent_clarity",
            "意图明确性",
            "用户意图明确性",
        ),
        "depth": ("depth", "conversation_depth", "dialogue_depth", "对话深度"),
        "relevance": ("relevance", "business_relevance", "业务相关性"),
        "novelty": ("novelty", "新颖性"),
    }.items()
    for alias in aliases
}
_DIMENSIONS_KEYS: Final = ("dimensions", "scores", "dimension_scores", "维度")
_SCORE_KEYS: Final = ("score", "overall_score", "overall", "total_score", "总分")
_REASON_KEYS: Final = ("reason", "rationale", "explanation", "reasoning", "理由", "原因")

_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_PERCENT_TEXT = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*[%\uff05]")
_FRACTION_TEXT = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*/\s*(\d+(?:\.\d*)?)")


class _ScoreError(ValueError):
    pass


def _score_number(raw: Any) -> tuple[float, bool]:
    """``(value, explicit)``: explicit values ("80%", "8/10") are already in [0, 1]; bare
    numbers are scaled per document by the caller."""
    if isinstance(raw, Mapping):  # {"density": {"score": 0.8, "reason": ...}}
        for key in ("score", "value"):
            if key in raw:
                return _score_number(raw[key])
        raise _ScoreError("a dimension object without a score")
    if isinstance(raw, bool):
        raise _ScoreError("a boolean is not a score")
    if isinstance(raw, int | float):
        value, explicit = float(raw), False
    elif isinstance(raw, str):
        text = raw.strip()
        if _NUMBER_TEXT.fullmatch(text):
            value, explicit = float(text), False
        elif match := _PERCENT_TEXT.fullmatch(text):
            value, explicit = float(match.group(1)), True
            if value > 100:
                raise _ScoreError(f"percentage out of range: {value}")
            value /= 100
        elif match := _FRACTION_TEXT.fullmatch(text):
            numerator, denominator = float(match.group(1)), float(match.group(2))
            if denominator <= 0 or numerator > denominator:
                raise _ScoreError("fraction out of range")
            value, explicit = numerator / denominator, True
        else:
            raise _ScoreError("a score must be a number")
    else:
        raise _ScoreError("a score must be a number")
    if not math.isfinite(value):
        raise _ScoreError("a score must be finite")
    if value < 0:
        raise _ScoreError(f"negative score: {value}")
    return value, explicit


def _scale(values: Sequence[float]) -> float:
    """1, 10 or 100: the smallest of those scales that holds every bare number."""
    top = max(values, default=0.0)
    for scale in (1.0, 10.0, 100.0):
        if top <= scale:
            return scale
    raise _ScoreError(f"score out of range: {top} (above 100)")


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))


def _score_parts(value: Any) -> tuple[dict[str, float], float | None, str]:
    """Normalise a scoring object; raises :class:`_ScoreError` saying what is wrong."""
    if not isinstance(value, dict):
        raise _ScoreError("the scoring answer is not a JSON object")
    source: Any = value
    for key in _DIMENSIONS_KEYS:
        if isinstance(value.get(key), dict):
            source = value[key]
            break
    raw: dict[str, Any] = {}
    for key, item in source.items():
        name = _DIMENSION_ALIASES.get(_norm_key(key)) if isinstance(key, str) else None
        if name is not None and name not in raw:
            raw[name] = item
    missing = [name for name in SCORE_WEIGHTS if name not in raw]
    if missing:
        raise _ScoreError(f"missing dimension(s): {', '.join(missing)}")
    parsed = {name: _score_number(raw[name]) for name in SCORE_WEIGHTS}
    scale = _scale([number for number, explicit in parsed.values() if not explicit])
    dimensions = {
        name: _clamp(number if explicit else number / scale)
        for name, (number, explicit) in parsed.items()
    }

    model_score: float | None = None
    for key in _SCORE_KEYS:
        if key in value:
            try:
                number, explicit = _score_number(value[key])
                model_score = _clamp(number if explicit else number / _scale([number]))
            except _ScoreError:
                model_score = None
            break

    reason = ""
    for key in _REASON_KEYS:
        item = value.get(key)
        if isinstance(item, str):
            reason = item.strip()
            break
        if isinstance(item, list) and all(isinstance(part, str) for part in item):
            reason = "; ".join(part.strip() for part in item if part.strip())
            break
    return dimensions, model_score, reason


def _is_scoring(value: Any) -> bool:
    try:
        _score_parts(value)
    except _ScoreError:
        return False
    return True


def _looks_like_scoring(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    keys = {_norm_key(key) for key in value if isinstance(key, str)}
    return bool(keys & ({*_DIMENSIONS_KEYS, *_SCORE_KEYS} | _DIMENSION_ALIASES.keys()))


def _checks(validate: Validator) -> _Checks:
    return _Checks(strict=validate, embedded=validate, repaired=validate, weak=None)


def _scoring_problem(output: ModelOutput) -> str | None:
    """Why the first scoring-looking object was rejected, for the error message."""
    try:
        near = _parse_output(output, expect=dict, checks=_checks(_looks_like_scoring))
        _score_parts(near.value)
    except ParseError:
        return None
    except _ScoreError as problem:
        return str(problem)
    return None


def parse_scoring(output: ModelOutput) -> ScoreResult:
    """Parse the scoring prompt's answer.

    Accepted: ``{"score": .., "dimensions": {..five..}, "reason": ".."}``; the dimensions
    may also sit at the top level, under ``"scores"``, or be objects with a ``"score"``.
    Dimension keys are matched case-insensitively and accept the Chinese names
    (信息密度, 意图明确性/用户意图明确性, 对话深度, 业务相关性, 新颖性) and a few English
    variants (``information_density``, ``intent_clarity``, ...).

    Value rules:

    * numbers or numeric strings (``0.8``, ``"0.8"``) are "bare"; if every bare dimension is
      <= 1 they are taken as is, else if all are <= 10 they are divided by 10, else if all are
      <= 100 by 100 (so a document mixing ``0.9`` and ``8`` reads as a 0-10 scale);
    * ``"80%"`` is 0.8 and ``"8/10"`` is 0.8 whatever the other values are;
    * negative, non-finite, boolean, non-numeric values, a bare number above 100, a
      percentage above 100 or a fraction above 1 are errors;
    * results are clamped to [0, 1] (a guard; the rules above already land there).

    ``model_score`` follows the same rules on its own scale and is ``None`` when missing or
    unusable (it is only kept for audit). ``reason`` is ``""`` when missing.

    An answer cut off after all five dimensions (e.g. inside ``reason``) is accepted without
    the cut part; a value at the cut is never completed (``0.7`` may have been ``0.75``),
    so a cut inside the dimensions is a missing dimension. Of several scoring objects in
    the text, the first complete one wins.

    Raises:
        ParseError: no scoring object, a missing dimension (the weighted score could not be
            computed) or an unusable value; the message names the problem.
    """
    try:
        found = _parse_output(output, expect=dict, checks=_checks(_is_scoring))
    except ParseError as error:
        problem = None if str(error).startswith("empty content") else _scoring_problem(output)
        if problem is None:
            raise
        raise ParseError(
            f"unusable scoring answer: {problem}"
            + ("; the output was truncated, retry with more max_tokens" if error.truncated else ""),
            truncated=error.truncated,
        ) from error
    dimensions, model_score, reason = _score_parts(found.value)
    return ScoreResult(dimensions=dimensions, model_score=model_score, reason=reason)


# --------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------

CATEGORIES: Final = ("user_preference", "business", "technical", "organizational", "domain")
"""The normalised fact categories."""

_CATEGORY_ALIASES: Final[dict[str, str]] = {
    alias: name
    for name, aliases in {
        "user_preference": (
            "user_preference",
            "user_preferences",
            "preference",
            "preferences",
            "pref",
            "personal",
            "personal_info",
            "user",
            "用户偏好",
            "偏好",
            "个人",
        ),
        "business": ("business", "biz", "commercial", "业务", "商业"),
        "technical": (
            "technical",
            "tech",
            "technology",
            "technical_detail",
            "skill",
            "skills",
            "技术",
        ),
        "organizational": (
            "organizational",
            "organisational",
            "organization",
            "organisation",
            "org",
            "relationship",
            "relationships",
            "team",
            "组织",
            "组织关系",
            "人际关系",
        ),
        "domain": ("domain", "domain_knowledge", "knowledge", "领域", "领域知识"),
    }.items()
    for alias in aliases
}
_USER_SUBJECTS: Final = frozenset(
    {
        "",
        "user",
        "the user",
        "the_user",
        "me",
        "myself",
        "i",
        "self",
        "用户",
        "我",
        "该用户",
        "本人",
    }
)
_LIST_KEYS: Final = ("memories", "facts", "items")
_CONTENT_KEYS: Final = ("content", "fact", "text", "memory")
_NULL_IDS: Final = frozenset({"none", "null", "n/a", "na", "-", "无"})
_SCHEMA_KEY_TEXT = re.compile(
    r"[\"']\s*(?:title|content|category|subcategory|facts|memories|tags|supersedes)\s*[\"']\s*:",
    re.IGNORECASE,
)
_TITLE_MAX: Final = 30
_TAG_MAX: Final = 40
_TAGS_MAX: Final = 10
_PROFILE_LIST_MAX: Final = 20


def _fact_list(value: Any) -> list[Any] | None:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        for key in _LIST_KEYS:
            if isinstance(value.get(key), list):
                return list(value[key])
    return None


def _has_content(item: Any) -> bool:
    return isinstance(item, str) or (
        isinstance(item, dict) and any(key in item for key in _CONTENT_KEYS)
    )


def _is_extraction(value: Any) -> bool:
    """Strict stages: a keyed list, or a bare list of objects/strings that looks like facts."""
    items = _fact_list(value)
    if items is None:
        return False
    if isinstance(value, dict) or not items:
        return True
    return all(isinstance(item, dict | str) for item in items) and any(map(_has_content, items))


def _is_embedded_extraction(value: Any) -> bool:
    """Values found in prose: a bare list must hold a memory object, since a list of strings
    there is as likely a nested ``"tags"`` list of a broken answer as the answer."""
    if not _is_extraction(value):
        return False
    if isinstance(value, dict) or not value:
        return True
    return any(isinstance(item, dict) and _has_content(item) for item in value)


def _no_items(value: Any) -> bool:
    return not _fact_list(value)


def _is_repaired_extraction(value: Any) -> bool:
    """Repaired values: json_repair turns prose like ``[no facts]`` into ``["no facts"]``, so
    a repaired bare list must be non-empty and hold memory objects only."""
    if not _is_extraction(value):
        return False
    if isinstance(value, dict):
        return True
    return (
        bool(value)
        and all(isinstance(item, dict) for item in value)
        and any(map(_has_content, value))
    )


_EXTRACTION_CHECKS: Final = _Checks(
    strict=_is_extraction,
    embedded=_is_embedded_extraction,
    repaired=_is_repaired_extraction,
    weak=_no_items,
)


def _clean_text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _looks_like_json(text: str) -> bool:
    if _SCHEMA_KEY_TEXT.search(text):
        return True
    if text[:1] in ("{", "["):
        return _loads(text) is not _MISSING
    return False


def _strings(value: Any, *, max_items: int, max_len: int | None = None) -> tuple[str, ...]:
    """A list of strings (or one comma-separated string): stripped, non-empty, deduplicated
    case-insensitively (first spelling kept), too-long ones dropped, at most ``max_items``."""
    if isinstance(value, str):
        value = re.split("[,\uff0c\u3001]", value)  # also full-width comma and 、
    if not isinstance(value, list):
        return ()
    out: list[str] = []
    seen: set[str] = set()
    for item in value:
        text = _clean_text(item)
        if not text or (max_len is not None and len(text) > max_len):
            continue
        if text.casefold() not in seen:
            seen.add(text.casefold())
            out.append(text)
        if len(out) == max_items:
            break
    return tuple(out)


def _ids(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        number = isinstance(item, int) and not isinstance(item, bool)
        text = str(item) if number else _clean_text(item)
        if text and text.lower() not in _NULL_IDS and text not in out:
            out.append(text)
    return tuple(out)


def _turns(value: Any) -> tuple[int, ...]:
    items = value if isinstance(value, list) else [value]
    out: list[int] = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0 and item not in out:
            out.append(item)
    return tuple(out)


def _subject(value: Any) -> str:
    text = _clean_text(value)
    return "user" if text.lower() in _USER_SUBJECTS else text


def _category(value: Any, subject: str) -> str:
    key = _norm_key(value) if isinstance(value, str) else ""
    return _CATEGORY_ALIASES.get(key, "user_preference" if subject == "user" else "domain")


def _first_present(item: dict[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if key in item:
            return item[key]
    return None


def _fact(item: Any) -> CandidateFact | None:
    """Normalise one item; ``None`` when it is unusable."""
    if isinstance(item, str):
        item = {"content": item}
    if not isinstance(item, dict):
        return None
    content = ""
    for key in _CONTENT_KEYS:
        content = _clean_text(item.get(key))
        if content:
            break
    raw_title = _clean_text(item.get("title"))
    if not content or _looks_like_json(content) or (raw_title and _looks_like_json(raw_title)):
        return None
    title = (raw_title or content)[:_TITLE_MAX].rstrip()
    subject = _subject(item.get("subject"))
    supersedes: list[str] = []
    for key in ("supersedes", "contradicts", "replaces"):
        supersedes.extend(i for i in _ids(item.get(key)) if i not in supersedes)
    duplicates = _ids(_first_present(item, ("duplicate_of", "duplicates", "same_as")))
    return CandidateFact(
        title=title,
        content=content,
        category=_category(item.get("category"), subject),
        subcategory=_clean_text(item.get("subcategory")),
        tags=_strings(item.get("tags"), max_items=_TAGS_MAX, max_len=_TAG_MAX),
        subject=subject,
        supersedes=tuple(supersedes),
        duplicate_of=duplicates[0] if duplicates else None,
        source_turns=_turns(_first_present(item, ("source_turns", "evidence"))),
        speaker=_clean_text(_first_present(item, ("speaker", "stated_by", "said_by"))) or None,
    )


def _profile(value: Any) -> ProfileUpdate | None:
    if not isinstance(value, dict):
        return None
    profile = ProfileUpdate(
        style=_clean_text(value.get("style")) or None,
        impression=_clean_text(value.get("impression")) or None,
        traits=_strings(value.get("traits"), max_items=_PROFILE_LIST_MAX),
        topics=_strings(value.get("topics"), max_items=_PROFILE_LIST_MAX),
    )
    if profile == ProfileUpdate(None, None, (), ()):
        return None
    return profile


def _profiles(value: Any) -> tuple[tuple[str, ProfileUpdate], ...]:
    """The group answer's ``profiles`` list: ``{"speaker": name, style/impression/traits/
    topics}`` items with a speaker name and something to update; others are ignored."""
    if not isinstance(value, list):
        return ()
    out = []
    for item in value:
        if not isinstance(item, dict):
            continue
        speaker = _clean_text(item.get("speaker"))
        update = _profile(item)
        if speaker and update is not None:
            out.append((speaker, update))
    return tuple(out)


def _facts_from(items: Sequence[Any]) -> tuple[tuple[CandidateFact, ...], int]:
    facts: list[CandidateFact] = []
    dropped = 0
    for item in items:
        fact = _fact(item)
        if fact is None:
            dropped += 1
        else:
            facts.append(fact)
    return tuple(facts), dropped


def parse_extraction(output: ModelOutput) -> ExtractionResult:
    """Parse the extraction prompt's answer.

    Accepted shapes: ``{"memories": [...], "profile": {...}}``, ``{"facts": [...]}``,
    ``{"items": [...]}`` (first of those keys holding a list wins; such an object nested up
    to 4 levels in a wrapper like ``{"result": ...}`` is found too) and a bare list. Items
    are memory objects or plain strings. A bare list of strings only counts as the whole
    text or a whole fenced block; found in prose a bare list must hold a memory object, and
    after json_repair it must hold memory objects only (json_repair turns ``[no facts]``
    into ``["no facts"]``). A JSON value of any other shape is skipped in favour of a later
    one that matches (e.g. a fenced example before the answer).

    An empty list in any of these shapes, fenced or not, is a successful empty extraction
    - unless a non-empty answer is found elsewhere in the text (``"I would return []
    if ..."`` must not hide the answer that follows). Nothing else is tried after a
    successful parse.

    Item rules:

    * ``content`` (aliases ``fact``, ``text``, ``memory``): a non-empty string, else the item
      is dropped. A plain string item is the content, about the user.
    * ``title``: stripped, cut to 30 characters; missing -> the content's first 30.
    * ``subject``: ``"user"`` for missing/empty/``"user"``/``"the user"``/``"me"``/``"用户"``/
      ``"我"`` (and similar), else the stripped name.
    * ``category``: one of :data:`CATEGORIES`; aliases such as ``"preference"``,
      ``"tech"``, ``"relationship"`` are mapped; missing or unknown -> ``"user_preference"``
      when the subject is the user, else ``"domain"``.
    * ``tags``: strings (or one comma-separated string), stripped, deduplicated
      case-insensitively, tags over 40 characters dropped, at most 10.
    * ``supersedes`` (also ``contradicts``, ``replaces``) and ``duplicate_of`` (also
      ``duplicates``, ``same_as``): ids as strings or ints; ``"none"``/``"null"`` ignored.
    * ``source_turns`` (also ``evidence``): non-negative ints only, others ignored.
    * An item whose content or title looks like JSON (starts with ``{``/``[`` and parses, or
      contains a quoted schema key like ``"title":``) is dropped: that is a parser leak,
      not a fact.

    Truncated output: when the JSON document runs into the end of the text, it is cut back
    to its last complete value and closed, so the complete items before the cut are kept
    and ``truncated`` is set. A partial item is kept only if its content string was
    complete (the cut fields after it are missing); otherwise it is dropped and counted in
    ``dropped``. If no fact survives, that is a :class:`ParseError` with ``truncated=True``
    - a cut answer is never "no facts". This also holds for a cut single-quoted answer, as
    long as its quotes can be followed (an apostrophe inside a single-quoted string can
    mislead the scan; json_repair then completes the cut string). A complete document with
    ``finish_reason == "length"`` is a normal result with ``truncated=False``.

    Raises:
        ParseError: no JSON value of an accepted shape, empty content, or a truncated answer
            with no complete fact.
    """
    found = _parse_output(output, expect=(dict, list), checks=_EXTRACTION_CHECKS)
    items = _fact_list(found.value) or []
    facts, dropped = _facts_from(items)
    truncated = found.truncated
    if truncated and not facts:
        raise ParseError(
            "the extraction answer was truncated before its first complete fact; "
            "retry with more max_tokens",
            truncated=True,
        )
    profile = None
    images: tuple[ImageVerdict, ...] = ()
    summary: str | None = None
    profiles: tuple[tuple[str, ProfileUpdate], ...] = ()
    if isinstance(found.value, dict):
        profile = _profile(found.value.get("profile"))
        profiles = _profiles(found.value.get("profiles"))
        images = _images(found.value.get("images"))
        summary = _clean_text(found.value.get("summary"))[:_SUMMARY_MAX] or None
        if summary is not None and _looks_like_json(summary):
            summary = None
    return ExtractionResult(facts=facts, profile=profile, dropped=dropped, truncated=truncated,
                            images=images, summary=summary, profiles=profiles)


_SUMMARY_MAX = 600  # characters of a conversation summary kept


def _images(value: Any) -> tuple[ImageVerdict, ...]:
    """The optional ``images`` list: ``{"image": n, "tier": …, "memory": …}`` items with a
    known tier and a non-negative image number; anything else is ignored."""
    if not isinstance(value, list):
        return ()
    out: list[ImageVerdict] = []
    for item in value:
        if not isinstance(item, dict):
            continue
        number, tier = item.get("image"), _clean_text(item.get("tier")).lower()
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            continue
        if tier not in IMAGE_TIERS:
            continue
        memory = _clean_text(item.get("memory")) or None
        if memory is not None and _looks_like_json(memory):
            memory = None
        out.append(ImageVerdict(image=number, tier=tier, memory=memory))
    return tuple(out)
