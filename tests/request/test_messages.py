"""A Messages request is checked where the translation reads it: a part of the wrong type
is a 400 naming it in bracket form; what the translation decides on is left to it."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequestError
from proxy.request.messages import check_messages_body

TURNS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"messages": TURNS}, "max_tokens", "missing_required_parameter"),
    ({"max_tokens": True, "messages": TURNS}, "max_tokens", "invalid_type"),
    ({"max_tokens": 0, "messages": TURNS}, "max_tokens", "invalid_type"),
    ({"max_tokens": 8}, "messages", "missing_required_parameter"),
    ({"max_tokens": 8, "messages": []}, "messages", "invalid_type"),
    ({"max_tokens": 8, "messages": ["hi"]}, "messages[0].role", "invalid_value"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role",
     "invalid_value"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": 5}]}, "messages[0].content",
     "invalid_type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": 5}]}]},
     "messages[0].content[1].text", "invalid_type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": []}]}
    ]}]}, "messages[0].content[0].content[0].text", "invalid_type"),
    ({"max_tokens": 8, "messages": TURNS, "system": 5}, "system", "invalid_type"),
    ({"max_tokens": 8, "messages": TURNS, "system": [{"type": "image"}]}, "system[0]",
     "invalid_value"),
    ({"max_tokens": 8, "messages": TURNS, "system": [{"type": "text", "text": 1}]},
     "system[0].text", "invalid_type"),
    ({"max_tokens": 8, "messages": TURNS, "metadata": []}, "metadata", "invalid_type"),
])
def test_a_part_of_the_wrong_type_is_400(body: dict[str, Any], param: str, code: str) -> None:
    """Each part the translation reads, missing or of the wrong type, is named."""
    with pytest.raises(InvalidRequestError) as caught:
        check_messages_body(body)
    assert (caught.value.param, caught.value.code) == (param, code)


def test_blocks_the_translation_judges_pass() -> None:
    """Unknown block types, non-object blocks, any tool_result content and unknown fields
    are left to the translation."""
    check_messages_body({"max_tokens": 8, "x_vendor": 1, "messages": [
        {"role": "user", "content": [{"type": "document"}, 5,
                                     {"type": "tool_result", "content": 7}]}]})
