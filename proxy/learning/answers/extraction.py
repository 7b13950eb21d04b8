"""The extraction answer: the facts a model found in a batch, a profile update, a summary.

:func:`parse_extraction` finds the answer in the model text (which JSON values qualify at
which stage of :func:`.json_text.extract_json` is decided here) and validates it with the
models of :mod:`.models`; :data:`EXTRACTION_SCHEMA`, the schema sent to the model, is
generated from :class:`.models.ExtractionAnswer`.
"""

from __future__ import annotations

from typing import Any, Final

from proxy.learning.answers.json_text import Checks, parse_output
from proxy.learning.answers.models import CONTENT_KEYS, ExtractionAnswer, fact_list
from proxy.learning.answers.output import ModelOutput, ParseError
from proxy.learning.answers.results import ExtractionResult
from proxy.learning.answers.schema import answer_schema

__all__ = ["EXTRACTION_SCHEMA", "parse_extraction"]

EXTRACTION_SCHEMA: Final[dict[str, object]] = answer_schema(ExtractionAnswer)
"""The JSON schema of the extraction answer sent to the learning model."""


def _has_content(item: Any) -> bool:
    return isinstance(item, str) or (
        isinstance(item, dict) and any(key in item for key in CONTENT_KEYS)
    )


def _is_extraction(value: Any) -> bool:
    """Strict stages: a keyed list, or a bare list of objects/strings that looks like facts."""
    items = fact_list(value)
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
    return not fact_list(value)


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


_EXTRACTION_CHECKS: Final = Checks(
    strict=_is_extraction,
    embedded=_is_embedded_extraction,
    repaired=_is_repaired_extraction,
    weak=_no_items,
)



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
    * ``title``: stripped (missing -> the content), cut to 30 characters at a word boundary
      with an ellipsis (:func:`proxy.memory.titles.short_title`).
    * ``subject``: ``"user"`` for missing/empty/``"user"``/``"the user"``/``"me"``/``"用户"``/
      ``"我"`` (and similar), else the stripped name.
    * ``category``: one of :data:`proxy.memory.categories.CATEGORIES`; aliases such as
      ``"preference"``, ``"tech"``, ``"relationship"`` are mapped; missing or unknown ->
      ``"user_preference"`` when the subject is the user, else ``"domain"``.
    * ``tags``: strings (or one comma-separated string), stripped, deduplicated
      case-insensitively, tags over 40 characters dropped, at most 10.
    * ``supersedes`` (also ``replaces``), ``contradicts`` (the model unsure: an open
      conflict, docs/design.md#conflicts; an id also superseded counts as superseded) and
      ``duplicate_of`` (also ``duplicates``, ``same_as``): ids as strings or ints;
      ``"none"``/``"null"`` ignored.
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
    found = parse_output(output, expect=(dict, list), checks=_EXTRACTION_CHECKS)
    answer = ExtractionAnswer.model_validate(found.value)
    if found.truncated and not answer.memories:
        raise ParseError(
            "the extraction answer was truncated before its first complete fact; "
            "retry with more max_tokens",
            truncated=True,
        )
    return answer.result(truncated=found.truncated)
