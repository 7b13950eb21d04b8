"""Tests for proxy.learning.answers.scoring: the scoring answer and its schema."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from proxy.learning.answers import (
    SCORE_WEIGHTS,
    SCORING_SCHEMA,
    ModelOutput,
    ParseError,
    parse_scoring,
)


def dims(density: Any, clarity: Any, depth: Any, relevance: Any, novelty: Any) -> dict[str, Any]:
    return {
        "density": density,
        "clarity": clarity,
        "depth": depth,
        "relevance": relevance,
        "novelty": novelty,
    }


def scoring_json(dimensions: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"score": 0.5, "dimensions": dimensions, "reason": "r", **extra})


# --------------------------------------------------------------------------------------
# parse_scoring
# --------------------------------------------------------------------------------------


def test_score_weights_follow_the_design_doc() -> None:
    """The weights are 30/20/20/20/10 percent and sum to one."""
    assert SCORE_WEIGHTS == {
        "density": 0.30,
        "clarity": 0.20,
        "depth": 0.20,
        "relevance": 0.20,
        "novelty": 0.10,
    }
    assert math.isclose(sum(SCORE_WEIGHTS.values()), 1.0)


def test_weighted_score_is_recomputed() -> None:
    """weighted ignores the model's own score and is rounded to 4 decimals."""
    text = json.dumps(
        {"score": 0.99, "dimensions": dims(0.8, 0.7, 0.6, 0.9, 0.5), "reason": " fine "}
    )
    result = parse_scoring(ModelOutput(text))
    assert result.weighted == 0.73
    assert result.model_score == 0.99
    assert result.reason == "fine"
    assert parse_scoring(
        ModelOutput(scoring_json(dims(1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3)))
    ).weighted == round(1 / 3, 4)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (scoring_json(dims(0.8, 0.7, 0.6, 0.9, 0.5)), dims(0.8, 0.7, 0.6, 0.9, 0.5)),
        (scoring_json(dims(8, 7, 6, 9, 5)), dims(0.8, 0.7, 0.6, 0.9, 0.5)),
        (scoring_json(dims(80, 70, 60, 90, 50)), dims(0.8, 0.7, 0.6, 0.9, 0.5)),
        (scoring_json(dims("0.8", "0.7", "0.6", "0.9", "0.5")), dims(0.8, 0.7, 0.6, 0.9, 0.5)),
        (scoring_json(dims("80%", "70 %", "60%", "90%", "50%")), dims(0.8, 0.7, 0.6, 0.9, 0.5)),
        (scoring_json(dims("8/10", 0.7, "3/5", 0.9, 0.5)), dims(0.8, 0.7, 0.6, 0.9, 0.5)),
        (scoring_json(dims(1, 0, 1, 0, 1)), dims(1.0, 0.0, 1.0, 0.0, 1.0)),
        (scoring_json(dims(10, 0, 5, 10, 0)), dims(1.0, 0.0, 0.5, 1.0, 0.0)),
        (
            json.dumps(
                {
                    "dimensions": {
                        "信息密度": 0.8,
                        "意图明确性": 0.7,
                        "对话深度": 0.6,
                        "业务相关性": 0.9,
                        "新颖性": 0.5,
                    }
                },
                ensure_ascii=False,
            ),
            dims(0.8, 0.7, 0.6, 0.9, 0.5),
        ),
        (
            '{"dimensions": {"信息密度": 0.8, "用户意图明确性": 0.7, "对话深度": 0.6, '
            '"业务相关性": 0.9, "新颖性": 0.5}}',
            dims(0.8, 0.7, 0.6, 0.9, 0.5),
        ),
        (
            '{"Density": 0.8, "Intent Clarity": 0.7, "depth": 0.6, "relevance": 0.9, '
            '"novelty": 0.5, "score": 0.7}',
            dims(0.8, 0.7, 0.6, 0.9, 0.5),
        ),
        (
            json.dumps(
                {
                    "dimensions": {
                        k: {"score": v, "reason": "x"}
                        for k, v in dims(0.8, 0.7, 0.6, 0.9, 0.5).items()
                    }
                }
            ),
            dims(0.8, 0.7, 0.6, 0.9, 0.5),
        ),
        (
            "<think>hmm</think>\nMy rating:\n```json\n"
            + scoring_json(dims(0.8, 0.7, 0.6, 0.9, 0.5))
            + "\n```\nHope that helps.",
            dims(0.8, 0.7, 0.6, 0.9, 0.5),
        ),
        (
            "{'score': 0.5, 'dimensions': {'density': 0.8, 'clarity': 0.7, 'depth': 0.6, "
            "'relevance': 0.9, 'novelty': 0.5,},}",
            dims(0.8, 0.7, 0.6, 0.9, 0.5),
        ),
        (
            scoring_json(dims(0.8, 0.7, 0.6, 0.9, 0.5))[:-12],  # cut inside "reason"
            dims(0.8, 0.7, 0.6, 0.9, 0.5),
        ),
    ],
)
def test_scoring_variants(text: str, expected: dict[str, float]) -> None:
    """Scoring answers in many spellings normalise to the five dimensions in [0, 1]."""
    result = parse_scoring(ModelOutput(text))
    assert result.dimensions.keys() == SCORE_WEIGHTS.keys()
    for name, value in expected.items():
        assert math.isclose(result.dimensions[name], value), name
        assert 0.0 <= result.dimensions[name] <= 1.0


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (scoring_json({"density": 0.8, "clarity": 0.7, "depth": 0.6, "relevance": 0.9}), "novelty"),
        (json.dumps({"score": 0.8, "reason": "only a total"}), "missing dimension"),
        (scoring_json(dims(-0.1, 0.7, 0.6, 0.9, 0.5)), "negative"),
        (scoring_json(dims(101, 70, 60, 90, 50)), "out of range"),
        (scoring_json(dims("120%", 0.7, 0.6, 0.9, 0.5)), "out of range"),
        (scoring_json(dims("11/10", 0.7, 0.6, 0.9, 0.5)), "out of range"),
        (scoring_json(dims(True, 0.7, 0.6, 0.9, 0.5)), "boolean"),
        (scoring_json(dims("high", 0.7, 0.6, 0.9, 0.5)), "number"),
        (scoring_json(dims(None, 0.7, 0.6, 0.9, 0.5)), "number"),
        (
            '{"score": 0.5, "dimensions": {"density": NaN, "clarity": 0.7, "depth": 0.6, '
            '"relevance": 0.9, "novelty": 0.5}}',
            "finite",
        ),
        ('{"name": "Alice", "age": 30}', "expected shape"),
        ("[0.8, 0.7, 0.6, 0.9, 0.5]", "expected shape"),
        ("The conversation was quite informative, I'd give it 8/10.", "expected shape"),
        ("", "empty content"),
    ],
)
def test_scoring_rejects(text: str, match: str) -> None:
    """Unusable scoring answers raise ParseError saying what is wrong."""
    with pytest.raises(ParseError, match=match):
        parse_scoring(ModelOutput(text))


def test_scoring_prefers_a_complete_object_over_a_partial_one() -> None:
    """A scoring object missing a dimension is skipped when a complete one follows."""
    partial = scoring_json({"density": 0.1})
    complete = scoring_json(dims(0.8, 0.7, 0.6, 0.9, 0.5))
    result = parse_scoring(ModelOutput(f"First try: {partial}\nCorrected: {complete}"))
    assert result.dimensions["density"] == 0.8


def test_truncated_scoring_missing_a_dimension_is_a_truncated_error() -> None:
    """A scoring answer cut inside the last dimension is a ParseError with truncated set."""
    text = scoring_json(dims(0.8, 0.7, 0.6, 0.9, 0.55)).split('"novelty"')[0] + '"novelty": 0.5'
    with pytest.raises(ParseError, match="novelty") as caught:
        parse_scoring(ModelOutput(text, finish_reason="length"))
    assert caught.value.truncated is True


@pytest.mark.parametrize(
    ("score", "expected"),
    [(0.75, 0.75), (7.5, 0.75), (75, 0.75), ("75%", 0.75), ("x", None), (-1, None), (500, None)],
)
def test_model_score_is_kept_for_audit_only(score: Any, expected: float | None) -> None:
    """The model's own score is normalised or None, and never makes the parse fail."""
    text = json.dumps({"score": score, "dimensions": dims(0.5, 0.5, 0.5, 0.5, 0.5)})
    result = parse_scoring(ModelOutput(text))
    assert result.model_score == expected
    assert result.weighted == 0.5


def test_missing_model_score_and_reason() -> None:
    """Without score and reason the result has model_score None and an empty reason."""
    result = parse_scoring(ModelOutput(json.dumps({"dimensions": dims(1, 1, 1, 1, 1)})))
    assert (result.model_score, result.reason, result.weighted) == (None, "", 1.0)


# The scoring schema as it was written by hand before it was generated from the answer model.
_UNIT = {"type": "number", "minimum": 0, "maximum": 1}
EXPECTED_SCORING_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        "score": _UNIT,
        "dimensions": {
            "type": "object",
            "properties": {
                "density": _UNIT,
                "clarity": _UNIT,
                "depth": _UNIT,
                "relevance": _UNIT,
                "novelty": _UNIT,
            },
            "required": ["density", "clarity", "depth", "relevance", "novelty"],
        },
        "reason": {"type": "string"},
    },
    "required": ["score", "dimensions", "reason"],
}


def test_scoring_schema_is_generated_unchanged() -> None:
    """The schema generated from the scoring model is the hand-written one, key order too."""
    assert SCORING_SCHEMA == EXPECTED_SCORING_SCHEMA
    assert json.dumps(SCORING_SCHEMA) == json.dumps(EXPECTED_SCORING_SCHEMA)
