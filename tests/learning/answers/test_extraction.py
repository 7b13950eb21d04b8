"""Tests for proxy.learning.answers.extraction: the extraction answer and its schema."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.learning.answers import (
    CATEGORIES,
    EXTRACTION_SCHEMA,
    CandidateFact,
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
        title="Works night shifts at the…",  # cut between words, with an ellipsis
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
        "supersedes": "m1",
        "replaces": ["m2", "none", 3, "m1"],
        "contradicts": ["m7", "m2", "none"],
        "same_as": ["m9"],
        "evidence": [2, "3", True, -1, 2, 5],
    }
    (fact,) = parse_extraction(ModelOutput(json.dumps({"memories": [item]}))).facts
    assert fact.title == "A very long title that goes…"  # cut between words
    assert len(fact.title) <= 30
    assert fact.content == "Manages the Berlin office"
    assert fact.category == "organizational"
    assert fact.subcategory == "team"
    assert fact.tags == ("work", "office", "t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7")
    assert fact.subject == "user"
    assert fact.supersedes == ("m1", "m2", "3")
    assert fact.contradicts == ("m7",)  # m2 is superseded already
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


# The extraction schema as it was written by hand before it was generated from the models,
# plus the optional "contradicts" list of memory ids (open conflicts).
EXPECTED_EXTRACTION_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        "memories": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "content": {"type": "string"},
                "category": {"type": "string", "enum": [
                    "user_preference", "business", "technical", "organizational", "domain"]},
                "subcategory": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "subject": {"type": "string"},
                "duplicate_of": {"type": ["string", "null"]},
                "supersedes": {"type": "array", "items": {"type": "string"}},
                # Added deliberately: the model names a fact it is unsure it contradicts.
                "contradicts": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["title", "content", "category", "subject"],
        }},
        "images": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "image": {"type": "integer"},
                "tier": {"type": "string", "enum": ["person", "long", "short", "skip"]},
                "memory": {"type": ["string", "null"]},
            },
            "required": ["image", "tier"],
        }},
        "summary": {"type": ["string", "null"]},
        "profile": {"type": ["object", "null"], "properties": {
            "style": {"type": ["string", "null"]},
            "impression": {"type": ["string", "null"]},
            "traits": {"type": "array", "items": {"type": "string"}},
            "topics": {"type": "array", "items": {"type": "string"}},
        }},
        "profiles": {"type": "array", "items": {"type": "object", "properties": {
            "speaker": {"type": "string"},
            "style": {"type": ["string", "null"]},
            "impression": {"type": ["string", "null"]},
            "traits": {"type": "array", "items": {"type": "string"}},
            "topics": {"type": "array", "items": {"type": "string"}},
        }, "required": ["speaker"]}},
    },
    "required": ["memories"],
}


def test_extraction_schema_is_generated_unchanged() -> None:
    """The schema generated from the extraction models is the hand-written one (with the
    optional ``contradicts`` list added on purpose), key order too."""
    assert EXTRACTION_SCHEMA == EXPECTED_EXTRACTION_SCHEMA
    assert json.dumps(EXTRACTION_SCHEMA) == json.dumps(EXPECTED_EXTRACTION_SCHEMA)
