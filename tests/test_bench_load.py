"""The load bench's fakes and readings: the fake upstream answers the learning worker's calls
in shapes the real answer parsers accept, and the bench reads the learning backlog from the
gateway's metrics page the way the gateway writes it."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from bench.gateway.fake_upstream import Responder, learning_answer
from bench.redis_load import parse_metrics
from proxy.learning.answers import parse_extraction, parse_scoring
from proxy.learning.answers.output import ModelOutput, ParseError
from proxy.learning.prompts import EXTRACTION_SCHEMA, SCORING_EN, SCORING_SCHEMA


def _formats(purpose: str) -> list[dict[str, object]]:
    """The ``response_format`` values the learning model sends, strongest first."""
    schema = SCORING_SCHEMA if purpose == "scoring" else EXTRACTION_SCHEMA
    return [
        {
            "type": "json_schema",
            "json_schema": {"name": purpose, "schema": schema, "strict": False},
        },
        {"type": "json_object", "schema": schema},
    ]


def _output(text: str | None) -> ModelOutput:
    return ModelOutput(content=text, reasoning=None, finish_reason="stop")


@pytest.mark.parametrize("form", _formats("scoring"))
def test_a_scoring_call_gets_a_score_the_parser_accepts(form: dict[str, object]) -> None:
    answer = learning_answer({"messages": [], "response_format": form})
    assert parse_scoring(_output(answer)).weighted == pytest.approx(0.8)


@pytest.mark.parametrize("form", _formats("extraction"))
def test_an_extraction_call_gets_one_fact_the_parser_accepts(form: dict[str, object]) -> None:
    answer = learning_answer({"messages": [], "response_format": form})
    facts = parse_extraction(_output(answer)).facts
    assert [f.content for f in facts] == ["User is load testing a gateway."]


def test_a_bare_json_request_is_told_apart_by_the_scoring_prompt() -> None:
    scoring = {
        "messages": [{"role": "system", "content": SCORING_EN}],
        "response_format": {"type": "json_object"},
    }
    other = {
        "messages": [{"role": "user", "content": "extract"}],
        "response_format": {"type": "json_object"},
    }
    assert parse_scoring(_output(learning_answer(scoring))).weighted == pytest.approx(0.8)
    assert parse_extraction(_output(learning_answer(other))).facts


def test_the_extraction_answer_is_not_a_score() -> None:
    answer = learning_answer({"messages": [], "response_format": _formats("extraction")[0]})
    with pytest.raises(ParseError):
        parse_scoring(_output(answer))


def test_a_chat_without_response_format_gets_the_canned_reply() -> None:
    responder = Responder(chunks=20, usage="auto", interval_ms=0.0)
    assert learning_answer({"messages": [{"role": "user", "content": "hi"}]}) is None
    raw = responder.completion("gpt-4o-mini", 10, None)
    body = orjson.loads(raw.partition(b"\r\n\r\n")[2])
    assert body["choices"][0]["message"]["content"] == responder.reply


def _page(jobs: dict[tuple[str, str], float], exhausted: float) -> str:
    """A metrics page with the gateway's metric names and labels."""
    registry = CollectorRegistry()
    gauge = Gauge(
        "memory_proxy_learning_queue_jobs",
        "Learning jobs by kind and state.",
        ["kind", "state"],
        registry=registry,
    )
    for (kind, state), value in jobs.items():
        gauge.labels(kind, state).set(value)
    counter = Counter(
        "memory_proxy_store_pool_exhausted", "Pool waits that ran out.", registry=registry
    )
    counter.inc(exhausted)
    return generate_latest(registry).decode()


def test_the_backlog_is_ready_delayed_and_leased_jobs_by_kind() -> None:
    page = _page(
        {
            ("exchange", "ready"): 5,
            ("exchange", "leased"): 1,
            ("learn", "delayed"): 2,
            ("learn", "dead"): 3,
            ("flush", "ready"): 0,
        },
        exhausted=7,
    )
    reading = parse_metrics(page)
    assert reading is not None
    assert dict(reading.backlog) == {"exchange": 6, "learn": 2, "flush": 0}
    assert (reading.dead, reading.exhausted) == (3, 7)


def test_a_page_without_queue_jobs_is_no_reading_not_an_empty_queue() -> None:
    assert parse_metrics("") is None
    assert parse_metrics(_page({}, exhausted=0)) is None
