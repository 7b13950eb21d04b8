"""A pydantic validation error as OpenAI's 400: ``param`` is where the bad value lies in
the request, whatever pydantic adds to its ``loc``."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.errors import InvalidRequestError, invalid_value


class _Inner(BaseModel):
    model_config = ConfigDict(strict=True)
    size: int = Field(ge=1)


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    batch: int | dict[str, int] | None = Field(default=None, alias="learning.batch")
    inner: _Inner | None = None
    tags: list[str] = Field(default_factory=list)
    sizes: dict[int, int] = Field(default_factory=dict)
    content: str


def _error(data: Any, prefix: str = "") -> InvalidRequestError:
    with pytest.raises(ValidationError) as caught:
        _Body.model_validate(data)
    return invalid_value(caught.value, data, prefix=prefix)


@pytest.mark.parametrize(("data", "param", "message"), [
    # a union member's tag (int, dict[str,int]) is not part of the path
    ({"content": "x", "learning.batch": {"private": "7"}}, "learning.batch.private",
     "Input should be a valid integer"),
    # the same key name as a member tag is a key all the same
    ({"content": "x", "learning.batch": {"int": "7"}}, "learning.batch.int",
     "Input should be a valid integer"),
    # both members fail at the value itself: one path, both reasons
    ({"content": "x", "learning.batch": "5"}, "learning.batch",
     "Input should be a valid integer or Input should be a valid dictionary"),
    ({"content": "x", "inner": {"size": 0}}, "inner.size", "greater than or equal to 1"),
    ({"content": "x", "tags": ["ok", 3]}, "tags.1", "valid string"),
    ({"content": "x", "sizes": {"a": 1}}, "sizes.a", "valid integer"),
    ({}, "content", "Field required"),
    ({"content": "x", "colour": "red"}, "colour", "Extra inputs are not permitted"),
])
def test_param_is_the_path_of_the_bad_value(data: dict[str, Any], param: str,
                                            message: str) -> None:
    """The param walks the request: nested keys and list indexes stay, pydantic's union
    tags and key markers go, a missing field is named; the message starts with it."""
    error = _error(data)
    assert (error.param, error.code, error.status_code) == (param, "invalid_value", 400)
    assert error.message.startswith(f"{param}: ")
    assert message in error.message


def test_a_prefix_names_the_section() -> None:
    """With a prefix (a settings section), the param is prefix.path."""
    error = _error({"content": "x", "inner": {"size": "2"}}, prefix="learning")
    assert error.param == "learning.inner.size"


def test_the_first_field_wins_over_later_ones() -> None:
    """Of several bad fields, the first one pydantic reports is named (a later, deeper
    error of another field does not take over)."""
    error = _error({"learning.batch": "5", "inner": {"size": 0}, "tags": [1]})
    assert error.param == "learning.batch"
