"""Tests for proxy.learning.answers.json_text and .reasoning: the JSON value in model text."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from proxy.learning.answers import (
    ExtractionResult,
    ModelOutput,
    ParseError,
    extract_json,
    parse_extraction,
    parse_model_json,
    strip_reasoning,
)


def contents(text: str, **kwargs: Any) -> list[str]:
    """Fact contents parsed from an extraction answer."""
    return [fact.content for fact in parse_extraction(ModelOutput(text, **kwargs)).facts]



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
    (a reasoning model that leaves content empty is retried, never read as an empty
    extraction)."""
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
