"""Tests for proxy.learning.parsing: JSON out of LLM output, scoring and extraction answers."""

from __future__ import annotations

import contextlib
import json
import math
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.learning.parsing import (
    CATEGORIES,
    SCORE_WEIGHTS,
    CandidateFact,
    ExtractionResult,
    ModelOutput,
    ParseError,
    ProfileUpdate,
    extract_json,
    parse_extraction,
    parse_model_json,
    parse_scoring,
    strip_reasoning,
)

HYPOTHESIS = settings(
    max_examples=200,
    deadline=None,
    database=None,  # no .hypothesis directory in the tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def contents(text: str, **kwargs: Any) -> list[str]:
    """Fact contents parsed from an extraction answer."""
    return [fact.content for fact in parse_extraction(ModelOutput(text, **kwargs)).facts]


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
# Published failure inputs
# --------------------------------------------------------------------------------------


def test_fenced_answer_followed_by_prose() -> None:
    """(a) A ```json fence followed by chatter yields the fenced fact."""
    text = (
        '```json\n{"facts": ["Prefers tea over coffee"]}\n```\n\n'
        "I found one fact in the conversation."
    )
    assert contents(text) == ["Prefers tea over coffee"]


def test_lone_surrogate_escape_does_not_lose_the_document() -> None:
    """(b) A lone high-surrogate escape is replaced with U+FFFD and the other facts survive."""
    result = parse_extraction(ModelOutput('{"facts": ["Nickname is \\ud83d", "Lives in City B"]}'))
    assert [f.content for f in result.facts] == ["Nickname is \ufffd", "Lives in City B"]
    for fact in result.facts:
        fact.content.encode("utf-8")  # storable: no lone surrogate left


def test_empty_content_is_never_filled_from_reasoning() -> None:
    """(c) Empty content with facts only in reasoning_content is a truncated ParseError
    (case B16: retried, never an empty extraction)."""
    output = ModelOutput(
        content="",
        reasoning='...so output {"facts":["Lives in City B"]}',
        finish_reason="length",
    )
    with pytest.raises(ParseError, match="empty content") as caught:
        parse_extraction(output)
    assert caught.value.truncated is True
    assert "truncated" in str(caught.value)
    assert "City B" not in str(caught.value)


def test_think_block_before_the_answer_is_skipped() -> None:
    """(d) A closed <think> block before the JSON is removed."""
    assert contents('<think>weighing options…</think>\n{"facts":["Lives in City B"]}') == [
        "Lives in City B"
    ]


@pytest.mark.parametrize(
    "text",
    [
        '{"facts": []}',
        '```json\n{"facts": []}\n```',
        '{"memories": []}',
        '{"memories": [], "profile": {}}',
        "[]",
        "```json\n[]\n```",
        "No facts this time.\n```json\n[]\n```",
        '{"items": []}',
        "{'facts': []}",
    ],
)
def test_empty_extraction_is_a_success(text: str) -> None:
    """(e) An empty fact list in any accepted shape is a successful empty extraction."""
    result = parse_extraction(ModelOutput(text))
    assert result == ExtractionResult(facts=(), profile=None, dropped=0)


@pytest.mark.parametrize(
    "text",
    [
        "I could not find anything worth remembering.",
        "No facts.",
        "[no facts]",
        "I {think} there is nothing here.",
        "```\nNone found.\n```",
        "",
        "   \n\t ",
    ],
)
def test_prose_without_json_is_a_parse_error(text: str) -> None:
    """(f) Prose with no JSON value is a ParseError, not an empty extraction."""
    with pytest.raises(ParseError):
        parse_extraction(ModelOutput(text))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"facts": ["a", "b",],}', ["a", "b"]),
        ("{'facts': ['Likes tea', 'Lives in Paris']}", ["Likes tea", "Lives in Paris"]),
        ("{facts: ['unquoted key']}", ["unquoted key"]),
        ('{"memories": [{"title": "A", "content": "x", "tags": ["t",],},],}', ["x"]),
        ('{"facts": ["a", /* comment */ "b"]}', ["a", "b"]),
        ("[{'title': 'A', 'content': 'Likes tea', 'duplicate_of': None}]", ["Likes tea"]),
    ],
)
def test_repairable_json(text: str, expected: list[str]) -> None:
    """(g) Trailing commas, single quotes, unquoted keys, comments, Python literals are repaired."""
    assert contents(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        '{"memories": [{"title": "A", "content": "Likes tea"}, {"title": "B", "content": "Lives',
        "{'memories': [{'title': 'A', 'content': 'Likes tea'}, {'title': 'B', 'content': 'Lives",
        '[{"title": "A", "content": "Likes tea"}, {"title": "B", "content": "Lives in Par',
        '{"memories": [{"title": "A", "content": "Likes tea"}, {"title": "B", "cont',
    ],
)
def test_truncated_answer_keeps_complete_items_only(text: str) -> None:
    """(g) A cut-off answer keeps the complete first item, drops the one whose content was cut."""
    result = parse_extraction(ModelOutput(text))
    assert [f.content for f in result.facts] == ["Likes tea"]
    assert result.dropped == 1
    assert result.truncated is True


def test_truncated_item_with_complete_content_is_kept() -> None:
    """(g) A partial last item whose content string is complete is kept without the cut field."""
    text = '{"memories": [{"title": "A", "content": "Likes tea", "tags": ["drinks", "gre'
    result = parse_extraction(ModelOutput(text, finish_reason="length"))
    assert [(f.content, f.tags) for f in result.facts] == [("Likes tea", ("drinks",))]
    assert result.truncated is True


def test_chinese_content_is_kept_verbatim() -> None:
    """(h) Chinese titles and contents come through unescaped and unchanged."""
    text = (
        '{"memories":[{"title":"工作单位","content":"在示例科技工作",'
        '"category":"organizational","subject":"user"}]}'
    )
    (fact,) = parse_extraction(ModelOutput(text)).facts
    assert (fact.title, fact.content, fact.category, fact.subject) == (
        "工作单位",
        "在示例科技工作",
        "organizational",
        "user",
    )


# --------------------------------------------------------------------------------------
# strip_reasoning
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>x</think>\nanswer", "answer"),
        ("<THINK>x</Think> answer", "answer"),
        ("<thinking>x</thinking>answer", "answer"),
        ("<reasoning>x</reasoning>answer", "answer"),
        ('<think type="r">x</think>answer', "answer"),
        ("<think>a</think>\n<think>b</think>\nanswer", "answer"),
        ("<think>a <think> b </think> c </think> answer", "answer"),
        ("reasoning without an opening tag</think>\nanswer", "answer"),
        ('<think>cut off while thinking {"facts": ["draft"]}', ""),
        ("answer first\n<think>never closed", "answer first"),
        ("  plain answer  ", "plain answer"),
        ("\ufeff<think>x</think>answer", "answer"),
        ('{"facts": ["writes <think> tags inline"]}', '{"facts": ["writes <think> tags inline"]}'),
    ],
)
def test_strip_reasoning(text: str, expected: str) -> None:
    """strip_reasoning removes closed, unclosed and orphan-closed reasoning blocks only."""
    assert strip_reasoning(text) == expected


def test_inline_think_tag_inside_json_string_is_kept() -> None:
    """A <think> tag inside a JSON string (not at a line start) is part of the fact."""
    assert contents('{"facts": ["Asked what <think> means"]}') == ["Asked what <think> means"]


# --------------------------------------------------------------------------------------
# extract_json: order of stages
# --------------------------------------------------------------------------------------


def has_facts(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("facts"), list)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"facts": ["whole"]}', {"facts": ["whole"]}),
        ('  \n{"facts": ["whitespace"]}\n ', {"facts": ["whitespace"]}),
        ('```\n{"facts": ["plain"]}\n```\n```json\n{"facts": ["json"]}\n```', {"facts": ["json"]}),
        ('~~~\n{"facts": ["tilde"]}\n~~~', {"facts": ["tilde"]}),
        ('```json{"facts": ["same line"]}```', {"facts": ["same line"]}),
        ('```json\n{"other": 1}\n```\n```json\n{"facts": ["second"]}\n```', {"facts": ["second"]}),
        ('Example: {"name": "x"}. Answer: {"facts": ["embedded"]} - done', {"facts": ["embedded"]}),
        ('Set {a, b} then {"facts": ["after braces"]}', {"facts": ["after braces"]}),
        ('Use { to open. {"facts": ["after stray brace"]}', {"facts": ["after stray brace"]}),
        ("{'facts': ['malformed']} then {\"facts\": [\"valid\"]}", {"facts": ["valid"]}),
        ('```json\n{"facts": ["open fence"]}', {"facts": ["open fence"]}),
    ],
)
def test_extract_json_stage_order(text: str, expected: Any) -> None:
    """The first qualifying value wins, strict stages before repair, json fences first."""
    assert extract_json(text, validate=has_facts) == expected


def test_valid_json_later_beats_repair_of_earlier_text() -> None:
    """A strictly valid value anywhere is preferred over repairing an earlier malformed one."""
    text = "Draft: {'facts': ['draft',]}\nFinal: {\"facts\": [\"final\"]}"
    assert extract_json(text, validate=has_facts) == {"facts": ["final"]}


def test_fenced_value_failing_validation_is_skipped() -> None:
    """A fenced example of another schema is skipped in favour of the matching answer."""
    text = 'Schema:\n```json\n{"type": "object"}\n```\nAnswer:\n```json\n{"facts": ["x"]}\n```'
    assert extract_json(text, validate=has_facts) == {"facts": ["x"]}
    assert contents(text) == ["x"]


@pytest.mark.parametrize(
    ("text", "expect", "expected"),
    [
        ('[1, 2] {"a": 1}', dict, {"a": 1}),
        ('{"a": 1} [1, 2]', list, [1, 2]),
        ('[{"a": 1}]', dict, {"a": 1}),
        ('{"a": [1]}', (dict, list), {"a": [1]}),
    ],
)
def test_extract_json_expect(text: str, expect: Any, expected: Any) -> None:
    """Only values of the expected type qualify."""
    assert extract_json(text, expect=expect) == expected


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("no json", (dict, list)),
        ("", (dict, list)),
        ("42", (dict, list)),
        ('"a string"', (dict, list)),
        ("[1, 2]", dict),
        ('{"a": 1}', list),
    ],
)
def test_extract_json_raises_when_nothing_qualifies(text: str, expect: Any) -> None:
    """extract_json raises ParseError instead of returning None or an empty value."""
    with pytest.raises(ParseError):
        extract_json(text, expect=expect)


def test_nested_empty_list_of_a_cut_document_is_not_the_answer() -> None:
    """A nested "supersedes": [] inside a cut-off document is never taken as an empty answer."""
    text = '[{"title": "A", "content": "x", "supersedes": [], "tags": ["a'
    result = parse_extraction(ModelOutput(text))
    assert [(f.content, f.tags) for f in result.facts] == [("x", ())]
    assert result.truncated is True


def test_nested_tag_list_of_a_cut_document_is_not_the_answer() -> None:
    """A nested tags list inside a cut-off document is not read as a bare list of facts."""
    text = '{"memories": [{"title": "A", "tags": ["food", "drink"], "content": "Lives in Par'
    with pytest.raises(ParseError) as caught:
        parse_extraction(ModelOutput(text))
    assert caught.value.truncated is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('If there were none I would answer []. Result: {"facts": ["a"]}', ["a"]),
        ('```json\n{"facts": []}\n```\nActually I found one: {"facts": ["a"]}', ["a"]),
        ('Empty looks like {"memories": []}; mine is [{"content": "a"}]', ["a"]),
        ("Return [] for none. {'facts': ['a',]}", ["a"]),
        ('Return [] for none. {"facts": ["a", "b"', ["a", "b"]),
    ],
)
def test_empty_value_in_prose_does_not_hide_the_answer(text: str, expected: list[str]) -> None:
    """An empty list mentioned before the answer is used only if nothing else qualifies."""
    assert contents(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[] and {}", []),
        ('[] {"a": 1}', {"a": 1}),
        ("{} then [1]", [1]),
        ("```json\n{}\n```", {}),
    ],
)
def test_extract_json_prefers_non_empty_values(text: str, expected: Any) -> None:
    """extract_json returns an empty container only when no non-empty value qualifies."""
    assert extract_json(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        '{"memories": [{"title": "A", "content": "x", "tags": ["food", "drink"],}]}',
        "{'memories': [{'title': 'A', 'content': 'x', 'tags': [\"food\", \"drink\"]}]}",
        '{"memories": [{"title": "A", "content": "x", "tags": ["food", "drink"], }], }',
    ],
)
def test_nested_tags_of_a_malformed_answer_are_not_facts(text: str) -> None:
    """A strictly valid tags list inside a malformed answer is not read as a list of facts."""
    (fact,) = parse_extraction(ModelOutput(text)).facts
    assert (fact.content, fact.tags) == ("x", ("food", "drink"))


def test_malformed_answer_after_many_bracketed_asides_is_repaired() -> None:
    """Repair goes to the big malformed object, not to the first bracketed aside in the prose."""
    text = "see [1] and {this} " * 50 + "{'facts': ['a', 'b',]} [end]"
    assert contents(text) == ["a", "b"]


def test_bare_string_list_in_prose_is_rejected() -> None:
    """A bare list of strings counts as an answer only as the whole text or a whole fence."""
    with pytest.raises(ParseError):
        parse_extraction(ModelOutput('The tags were ["food", "drink"] in that message.'))
    assert contents('["food", "drink"]') == ["food", "drink"]


def test_cut_off_json_sets_truncated_on_the_error() -> None:
    """A cut-off document that yields nothing qualifying marks the ParseError as truncated."""
    with pytest.raises(ParseError) as caught:
        extract_json('{"score": 0.5, "dimensions": {"density": 0.', validate=lambda v: "x" in v)
    assert caught.value.truncated is True


def test_surrogate_pair_escape_becomes_one_character() -> None:
    """A valid surrogate-pair escape decodes to the astral character."""
    assert extract_json('{"facts": ["smile \\ud83d\\ude00"]}') == {"facts": ["smile \U0001f600"]}


@pytest.mark.parametrize(
    "text",
    [
        '{"facts": ["lone low \\udc00", "ok"]}',
        "{'facts': ['lone in repaired \\ud83d', 'ok',]}",
        '{"facts": ["raw \ud83d char", "ok"]}',
    ],
)
def test_lone_surrogates_are_replaced_everywhere(text: str) -> None:
    """Lone surrogates from escapes, repair or the text itself become U+FFFD."""
    value = extract_json(text)
    assert value["facts"][1] == "ok"
    assert "\ufffd" in value["facts"][0]
    json.dumps(value, ensure_ascii=False).encode("utf-8")


def test_parse_error_pickles_with_its_flag() -> None:
    """ParseError keeps message and truncated flag across pickling."""
    error = pickle.loads(pickle.dumps(ParseError("cut", truncated=True)))  # noqa: S301
    assert (str(error), error.truncated) == ("cut", True)
    assert ParseError("x").truncated is False


# --------------------------------------------------------------------------------------
# parse_model_json
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "finish_reason", "truncated"),
    [
        (None, "stop", False),
        ("", None, False),
        ("   \n", "stop", False),
        ("<think>only reasoning</think>", "stop", False),
        ("<think>reasoning cut off", "length", True),
        (None, "length", True),
    ],
)
def test_empty_content_is_an_error(
    content: str | None, finish_reason: str | None, truncated: bool
) -> None:
    """Empty, blank or reasoning-only content is a ParseError; truncated follows finish_reason."""
    output = ModelOutput(content, reasoning='{"facts": ["hidden"]}', finish_reason=finish_reason)
    with pytest.raises(ParseError, match=r"^empty content") as caught:
        parse_model_json(output)
    assert caught.value.truncated is truncated


def test_failure_with_length_finish_reason_says_truncated() -> None:
    """When parsing fails and finish_reason is length, the error says the output was truncated."""
    with pytest.raises(ParseError, match="truncated") as caught:
        parse_model_json(ModelOutput("Here are the facts I found", finish_reason="length"))
    assert caught.value.truncated is True


def test_failure_without_length_is_not_truncated() -> None:
    """Prose with finish_reason stop is not reported as truncated."""
    with pytest.raises(ParseError) as caught:
        parse_model_json(ModelOutput("Nothing here", finish_reason="stop"))
    assert caught.value.truncated is False


def test_complete_json_with_length_finish_reason_is_accepted() -> None:
    """A complete document is accepted even when the provider reports finish_reason length."""
    assert parse_model_json(ModelOutput('{"a": 1}', finish_reason="length")) == {"a": 1}


def test_parse_model_json_validate_and_expect() -> None:
    """parse_model_json passes validate and expect through to extract_json."""
    output = ModelOutput('<think>x</think>[1] {"a": 0} {"a": 2}')
    assert parse_model_json(output, expect=dict, validate=lambda v: v["a"] > 0) == {"a": 2}


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


# --------------------------------------------------------------------------------------
# parse_extraction: shapes and item rules
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"memories": [{"title": "Tea", "content": "Likes tea"}]}',
        '[{"title": "Tea", "content": "Likes tea"}]',
        '{"facts": ["Likes tea"]}',
        '{"items": ["Likes tea"]}',
        '{"facts": [{"fact": "Likes tea"}]}',
        '{"memories": null, "facts": ["Likes tea"]}',
        '["Likes tea"]',
        '```json\n["Likes tea"]\n```',
        '{"result": {"facts": ["Likes tea"]}}',
        '{"output": {"data": {"memories": [{"content": "Likes tea"}]}}}',
        'Here: [{"content": "Likes tea"}] done',
        'Sure! Here is the JSON:\n{"memories": [{"content": "Likes tea"}]}\nLet me know.',
    ],
)
def test_extraction_shapes(text: str) -> None:
    """Every accepted answer shape yields the same single fact."""
    assert contents(text) == ["Likes tea"]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "Alice", "age": 30}',
        '{"facts": "Likes tea"}',
        '{"memories": null}',
        "[1, 2, 3]",
        '[{"name": "x"}]',
        '{"profile": {"style": "terse"}}',
        "42",
    ],
)
def test_extraction_rejects_other_shapes(text: str) -> None:
    """JSON of another shape or schema is a ParseError, not an empty extraction."""
    with pytest.raises(ParseError):
        parse_extraction(ModelOutput(text))


def test_plain_string_fact_defaults() -> None:
    """A plain string becomes a fact about the user with a 30-char title and default category."""
    text = json.dumps({"facts": ["  Works night shifts at the central hospital downtown  "]})
    (fact,) = parse_extraction(ModelOutput(text)).facts
    assert fact == CandidateFact(
        title="Works night shifts at the cent",
        content="Works night shifts at the central hospital downtown",
        category="user_preference",
        subcategory="",
        tags=(),
        subject="user",
        supersedes=(),
        duplicate_of=None,
        source_turns=(),
    )


def test_full_memory_object_is_normalised() -> None:
    """Every field of a memory object is cleaned and its aliases are accepted."""
    item = {
        "title": "  A very long title that goes past thirty characters  ",
        "content": "  Manages the Berlin office  ",
        "category": "Relationship",
        "subcategory": " team ",
        "tags": ["work", "Work", " ", "office", 7, "x" * 41, *[f"t{i}" for i in range(12)]],
        "subject": "The User",
        "contradicts": "m1",
        "replaces": ["m2", "none", 3, "m1"],
        "same_as": ["m9"],
        "evidence": [2, "3", True, -1, 2, 5],
    }
    (fact,) = parse_extraction(ModelOutput(json.dumps({"memories": [item]}))).facts
    assert fact.title == "A very long title that goes pa"
    assert len(fact.title) <= 30
    assert fact.content == "Manages the Berlin office"
    assert fact.category == "organizational"
    assert fact.subcategory == "team"
    assert fact.tags == ("work", "office", "t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7")
    assert fact.subject == "user"
    assert fact.supersedes == ("m1", "m2", "3")
    assert fact.duplicate_of == "m9"
    assert fact.source_turns == (2, 5)


@pytest.mark.parametrize(
    ("category", "subject", "expected"),
    [
        ("user_preference", "user", "user_preference"),
        ("preference", "user", "user_preference"),
        ("Preferences", "user", "user_preference"),
        ("tech", "user", "technical"),
        ("Technical", "user", "technical"),
        ("relationship", "user", "organizational"),
        ("organisation", "user", "organizational"),
        ("business", "user", "business"),
        ("domain", "user", "domain"),
        ("技术", "user", "technical"),
        (None, "user", "user_preference"),
        ("weird", "user", "user_preference"),
        (None, "Alice", "domain"),
        ("weird", "Alice", "domain"),
        (42, "Alice", "domain"),
    ],
)
def test_category_normalisation(category: Any, subject: str, expected: str) -> None:
    """Categories map through aliases; missing or unknown ones default by subject."""
    item = {"content": "c", "category": category, "subject": subject}
    (fact,) = parse_extraction(ModelOutput(json.dumps([item]))).facts
    assert fact.category == expected
    assert fact.category in CATEGORIES


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        (None, "user"),
        ("", "user"),
        ("user", "user"),
        ("the user", "user"),
        ("Me", "user"),
        ("用户", "user"),
        ("我", "user"),
        ("  Alice  ", "Alice"),
        ("王经理", "王经理"),
        (7, "user"),
    ],
)
def test_subject_normalisation(subject: Any, expected: str) -> None:
    """User aliases become "user"; other subjects are the stripped name."""
    (fact,) = parse_extraction(
        ModelOutput(json.dumps([{"content": "c", "subject": subject}]))
    ).facts
    assert fact.subject == expected


def test_tags_as_comma_separated_string() -> None:
    """A tags string is split on ASCII and full-width commas."""
    text = json.dumps({"facts": [{"content": "c", "tags": "a, b，c、a"}]}, ensure_ascii=False)
    assert parse_extraction(ModelOutput(text)).facts[0].tags == ("a", "b", "c")


@pytest.mark.parametrize(
    ("items", "kept", "dropped"),
    [
        (["ok", "", "   ", 5, None, ["x"], {"title": "no content"}], ["ok"], 6),
        ([{"content": "  "}, {"content": 3}, {"content": "ok"}], ["ok"], 2),
        (['{"title": "x", "content": "y"}', "ok"], ["ok"], 1),
        (['["a", "b"]', "ok"], ["ok"], 1),
        (['The answer is "content": "x"', "ok"], ["ok"], 1),
        (['I wrote "facts": [] by mistake', "ok"], ["ok"], 1),
        ([{"title": '{"title": "t"}', "content": "ok"}], [], 1),
        (
            ["{curly but not json}", "[bracketed note]"],
            ["{curly but not json}", "[bracketed note]"],
            0,
        ),
    ],
)
def test_unusable_items_are_dropped_and_counted(
    items: list[Any], kept: list[str], dropped: int
) -> None:
    """Items without usable content, or that look like leaked JSON, are counted in dropped."""
    result = parse_extraction(ModelOutput(json.dumps({"facts": items})))
    assert [f.content for f in result.facts] == kept
    assert result.dropped == dropped


def test_profile_is_parsed() -> None:
    """The profile object becomes a ProfileUpdate with cleaned lists."""
    text = json.dumps(
        {
            "memories": [],
            "profile": {
                "style": " terse ",
                "impression": "",
                "traits": ["curious", "Curious", ""],
                "topics": "tea, travel",
            },
        }
    )
    result = parse_extraction(ModelOutput(text))
    assert result.profile == ProfileUpdate(
        style="terse", impression=None, traits=("curious",), topics=("tea", "travel")
    )


@pytest.mark.parametrize(
    "profile", [None, {}, "friendly", {"style": "", "traits": []}, [{"style": "x"}]]
)
def test_empty_or_invalid_profile_is_none(profile: Any) -> None:
    """A missing, empty or non-object profile is None and does not fail the parse."""
    text = json.dumps({"memories": ["x"], "profile": profile})
    assert parse_extraction(ModelOutput(text)).profile is None


def test_truncated_before_any_fact_is_an_error() -> None:
    """A cut-off answer with no complete fact is a truncated ParseError, never "no facts"."""
    with pytest.raises(ParseError, match="truncated") as caught:
        parse_extraction(ModelOutput('{"memories": [{"title": "A", "content": "Likes t'))
    assert caught.value.truncated is True


def test_successful_parse_runs_no_fallback() -> None:
    """A successful empty parse with trailing prose stores nothing from the prose."""
    text = '```json\n{"facts": []}\n```\n- The user likes tea\n- The user lives in Paris'
    assert parse_extraction(ModelOutput(text)).facts == ()


# --------------------------------------------------------------------------------------
# Property tests
# --------------------------------------------------------------------------------------

JSONISH = st.text(
    alphabet=st.sampled_from(list("{}[]\",:'`~ \n\\0123456789.-eE<>/thinkruefalsnfacts%ud8")),
    max_size=120,
)


@HYPOTHESIS
@given(st.one_of(st.text(max_size=300), JSONISH))
def test_parsers_raise_only_parse_error(text: str) -> None:
    """On arbitrary text the parsers return a result or raise ParseError, nothing else."""
    for call in (
        lambda: parse_extraction(ModelOutput(text, finish_reason="length")),
        lambda: parse_scoring(ModelOutput(text)),
        lambda: extract_json(text),
        lambda: parse_model_json(ModelOutput(text)),
    ):
        with contextlib.suppress(ParseError):
            call()
    assert isinstance(strip_reasoning(text), str)


def plausible_fact(text: str) -> bool:
    stripped = text.strip()
    return bool(stripped) and not stripped.startswith(("{", "[")) and '":' not in stripped


FACT = st.text(min_size=1, max_size=60).filter(plausible_fact).filter(lambda s: "<" not in s)
PROSE = st.text(
    alphabet=st.characters(exclude_characters="{}[]`~<>\"'", codec="utf-8"),
    max_size=40,
)


@st.composite
def wrapped_answer(draw: st.DrawFn) -> tuple[str, list[str]]:
    """An extraction answer holding generated facts, in a random shape and wrapping."""
    facts = draw(st.lists(FACT, max_size=8))
    shape = draw(st.sampled_from(["facts", "memories", "bare"] if facts else ["facts", "memories"]))
    payload: Any
    if shape == "facts":
        payload = {"facts": facts}
    elif shape == "memories":
        payload = {"memories": [{"title": f[:10], "content": f} for f in facts]}
    else:
        payload = facts
    body = json.dumps(
        payload, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 2]))
    )
    before, after = draw(PROSE), draw(PROSE)
    wrappers = ["none", "json_fence", "plain_fence", "tilde_fence"]
    # A bare list of strings is only accepted as the whole text or a whole fenced block.
    wrapper = draw(st.sampled_from([*wrappers, "prose"] if shape != "bare" else wrappers))
    if wrapper == "json_fence":
        body = f"{before}\n```json\n{body}\n```\n{after}"
    elif wrapper == "plain_fence":
        body = f"{before}\n```\n{body}\n```\n{after}"
    elif wrapper == "tilde_fence":
        body = f"~~~\n{body}\n~~~"
    elif wrapper == "prose":
        body = f"{before} {body} {after}"
    if draw(st.booleans()):
        body = f'<think>\ndraft: {{"facts": ["draft"]}} {before}\n</think>\n{body}'
    return body, [f.strip() for f in facts]


@HYPOTHESIS
@given(wrapped_answer())
def test_generated_facts_round_trip(answer: tuple[str, list[str]]) -> None:
    """Facts dumped as JSON inside prose, fences and think blocks parse back unchanged."""
    text, expected = answer
    result = parse_extraction(ModelOutput(text))
    assert [fact.content for fact in result.facts] == expected
    assert result.dropped == 0
    assert result.truncated is False
