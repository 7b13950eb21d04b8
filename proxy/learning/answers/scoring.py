"""The scoring answer: five dimensions in [0, 1], the model's own total and a reason.

The scoring prompt asks for ``{"score": 0.75, "dimensions": {"density": .., "clarity": ..,
"depth": .., "relevance": .., "novelty": ..}, "reason": "..."}``. :class:`ScoringAnswer`
is that shape as a pydantic model; its ``before`` validator reads the variants models
write (see :func:`parse_scoring`), and :data:`SCORING_SCHEMA`, the schema sent to the
model, is generated from it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from proxy.learning.answers.json_text import Checks, Validator, parse_output
from proxy.learning.answers.output import ModelOutput, ParseError
from proxy.learning.answers.schema import answer_schema, not_null_in_schema

__all__ = [
    "SCORE_WEIGHTS",
    "SCORING_SCHEMA",
    "ScoreResult",
    "ScoringAnswer",
    "parse_scoring",
]

SCORE_WEIGHTS: Final[dict[str, float]] = {
    "density": 0.30,  # 信息密度 - information density
    "clarity": 0.20,  # 意图明确性 - clarity of the user's intent
    "depth": 0.20,  # 对话深度 - depth of the conversation
    "relevance": 0.20,  # 业务相关性 - business relevance
    "novelty": 0.10,  # 新颖性 - novelty
}
"""Weights of the five scoring dimensions: how much each counts towards the score a batch
must reach to be learned. Information density counts most, novelty least; they sum to 1."""


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


def _score_text(text: str) -> tuple[float, bool]:
    """A score written as text: a bare number, a percentage or a fraction."""
    if _NUMBER_TEXT.fullmatch(text):
        return float(text), False
    if match := _PERCENT_TEXT.fullmatch(text):
        value = float(match.group(1))
        if value > 100:
            raise _ScoreError(f"percentage out of range: {value}")
        return value / 100, True
    if match := _FRACTION_TEXT.fullmatch(text):
        numerator, denominator = float(match.group(1)), float(match.group(2))
        if denominator <= 0 or numerator > denominator:
            raise _ScoreError("fraction out of range")
        return numerator / denominator, True
    raise _ScoreError("a score must be a number")


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
        value, explicit = _score_text(raw.strip())
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


def _dimensions(value: dict[Any, Any]) -> dict[str, float]:
    """The five dimensions of a scoring object, each normalised to [0, 1]."""
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
    return {
        name: _clamp(number if explicit else number / scale)
        for name, (number, explicit) in parsed.items()
    }


def _model_score(value: dict[Any, Any]) -> float | None:
    """The first total-score key present, normalised on its own scale; None if unusable."""
    for key in _SCORE_KEYS:
        if key in value:
            try:
                number, explicit = _score_number(value[key])
                return _clamp(number if explicit else number / _scale([number]))
            except _ScoreError:
                return None
    return None


def _reason(value: dict[Any, Any]) -> str:
    """The first reason key holding a string (or a list of strings, joined with "; ")."""
    for key in _REASON_KEYS:
        item = value.get(key)
        if isinstance(item, str):
            return item.strip()
        if isinstance(item, list) and all(isinstance(part, str) for part in item):
            return "; ".join(part.strip() for part in item if part.strip())
    return ""


Unit = Annotated[float, Field(ge=0, le=1)]
"""A score in [0, 1]."""


class Dimensions(BaseModel):
    """The five scored dimensions, each in [0, 1] (weights in :data:`SCORE_WEIGHTS`)."""

    model_config = ConfigDict(frozen=True)

    density: Unit
    clarity: Unit
    depth: Unit
    relevance: Unit
    novelty: Unit


class ScoringAnswer(BaseModel):
    """The scoring prompt's answer, validated from any variant :func:`parse_scoring` reads.

    Raises ``ValidationError`` whose only error carries the :class:`_ScoreError` saying
    what is wrong (a missing dimension, an unusable value, not an object)."""

    model_config = ConfigDict(frozen=True)

    score: Annotated[Unit | None, Field(json_schema_extra=not_null_in_schema)]
    dimensions: Dimensions
    reason: str

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, value: Any) -> Any:
        if isinstance(value, ScoringAnswer):
            return value
        if not isinstance(value, dict):
            raise _ScoreError("the scoring answer is not a JSON object")
        return {"score": _model_score(value), "dimensions": _dimensions(value),
                "reason": _reason(value)}

    def result(self) -> ScoreResult:
        """This answer as the worker's :class:`ScoreResult`."""
        dimensions = {name: float(getattr(self.dimensions, name)) for name in SCORE_WEIGHTS}
        return ScoreResult(dimensions=dimensions, model_score=self.score, reason=self.reason)


SCORING_SCHEMA: Final[dict[str, object]] = answer_schema(ScoringAnswer)
"""The JSON schema of the scoring answer sent to the learning model."""


def _problem(error: ValidationError) -> str:
    """The message of the :class:`_ScoreError` behind a validation error."""
    for detail in error.errors(include_url=False):
        cause = (detail.get("ctx") or {}).get("error")
        if isinstance(cause, _ScoreError):
            return str(cause)
    return str(error.errors(include_url=False)[0]["msg"])


def _validate(value: Any) -> ScoringAnswer:
    """:class:`ScoringAnswer` of ``value``; raises :class:`_ScoreError` when unusable."""
    try:
        return ScoringAnswer.model_validate(value)
    except ValidationError as error:
        raise _ScoreError(_problem(error)) from None


def _is_scoring(value: Any) -> bool:
    try:
        _validate(value)
    except _ScoreError:
        return False
    return True


def _looks_like_scoring(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    keys = {_norm_key(key) for key in value if isinstance(key, str)}
    return bool(keys & ({*_DIMENSIONS_KEYS, *_SCORE_KEYS} | _DIMENSION_ALIASES.keys()))


def _checks(validate: Validator) -> Checks:
    return Checks(strict=validate, embedded=validate, repaired=validate, weak=None)


def _scoring_problem(output: ModelOutput) -> str | None:
    """Why the first scoring-looking object was rejected, for the error message."""
    try:
        near = parse_output(output, expect=dict, checks=_checks(_looks_like_scoring))
        _validate(near.value)
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
        found = parse_output(output, expect=dict, checks=_checks(_is_scoring))
    except ParseError as error:
        problem = None if str(error).startswith("empty content") else _scoring_problem(output)
        if problem is None:
            raise
        raise ParseError(
            f"unusable scoring answer: {problem}"
            + ("; the output was truncated, retry with more max_tokens" if error.truncated else ""),
            truncated=error.truncated,
        ) from error
    return _validate(found.value).result()
