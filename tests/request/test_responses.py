"""A Responses request is checked where the gateway reads it: every request's envelope,
and a translated request's ``instructions`` and ``input`` items."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.errors import InvalidRequestError
from proxy.request.responses import check_responses_input, parse_responses_request


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"input": "x"}, "model", "missing_required_parameter"),
    ({"model": " ", "input": "x"}, "model", "missing_required_parameter"),
    ({"model": "m", "stream": "yes"}, "stream", "invalid_type"),
    ({"model": "m", "user": 5}, "user", "invalid_type"),
    ({"model": "m", "metadata": "x"}, "metadata", "invalid_type"),
])
def test_a_bad_envelope_is_400(body: dict[str, Any], param: str, code: str) -> None:
    """``model``, ``stream`` and the identity fields are checked on every request."""
    with pytest.raises(InvalidRequestError) as caught:
        parse_responses_request(orjson.dumps(body))
    assert (caught.value.param, caught.value.code) == (param, code)


@pytest.mark.parametrize("raw", [b"", b"[]", b"{"])
def test_a_body_that_is_not_an_object_is_invalid_json(raw: bytes) -> None:
    """No body, an array and broken JSON are ``invalid_json``."""
    with pytest.raises(InvalidRequestError) as caught:
        parse_responses_request(raw)
    assert caught.value.code == "invalid_json"


@pytest.mark.parametrize(("body", "param", "code"), [
    ({}, "input", "missing_required_parameter"),
    ({"input": 5}, "input", "invalid_type"),
    ({"input": "x", "instructions": 5}, "instructions", "invalid_type"),
    ({"input": ["text"]}, "input[0]", "invalid_type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "invalid_value"),
    ({"input": [{"role": "user"}]}, "input[0].content", "invalid_type"),
    ({"input": [{"role": "user", "content": "a"}, {"role": "user", "content": 5}]},
     "input[1].content", "invalid_type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}, 5]}]},
     "input[0].content[1]", "invalid_type"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]},
     "input[0].output", "invalid_type"),
])
def test_a_bad_translated_input_is_400(body: dict[str, Any], param: str, code: str) -> None:
    """A translated request's ``input`` items are named in bracket form."""
    with pytest.raises(InvalidRequestError) as caught:
        check_responses_input(body)
    assert (caught.value.param, caught.value.code) == (param, code)


def test_items_the_translation_judges_pass() -> None:
    """Other item types and any part object are left to the translation."""
    check_responses_input({"input": [{"type": "item_reference", "id": "x"},
                                     {"role": "user", "content": [{"type": "input_audio"}]}]})
