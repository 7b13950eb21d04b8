"""A pydantic :class:`~pydantic.ValidationError` as the gateway's 400.

The first error pydantic reports (models declare their fields in checking order) becomes an
:class:`~proxy.errors.InvalidRequestError` whose ``param`` is the error's location in
OpenAI's bracket form — ``messages[0].content[1].text``, ``stream_options.include_usage`` —
and whose message and ``code`` come from a table of rules keyed by the location's pattern
(indices written ``[]``): ``invalid_type`` for a value of the wrong type,
``missing_required_parameter`` for a required value that is absent or null,
``invalid_value`` for a value of the right type that breaks a rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from proxy.errors import InvalidRequestError

ShapeT = TypeVar("ShapeT", bound=BaseModel)
Pattern = tuple[str, ...]
INDEX = "[]"  # an array index in a Pattern


@dataclass(frozen=True, slots=True)
class Rule:
    """How an error at one location pattern is told.

    ``message`` may name the location as ``{param}``; ``keep`` cuts the location to its
    first ``keep`` segments (an error in a part's ``type`` names the part); ``suffix`` is
    appended to the ``param`` (a turn that is no object names its ``.role``);
    ``required`` makes an absent or null value ``missing_required_parameter``.
    """

    message: str
    code: str = "invalid_type"
    keep: int | None = None
    suffix: str = ""
    required: bool = False


def param_of(location: Sequence[int | str]) -> str:
    """``("messages", 0, "content", 1)`` → ``"messages[0].content[1]"``; segments that are
    union tags (they start with ``~``) are skipped."""
    out = ""
    for segment in location:
        if isinstance(segment, int):
            out += f"[{segment}]"
        elif not segment.startswith("~"):
            out += f".{segment}" if out else segment
    return out


def pattern_of(location: Sequence[int | str]) -> Pattern:
    """A location without union tags, indices as ``[]``."""
    return tuple(INDEX if isinstance(s, int) else s for s in location
                 if isinstance(s, int) or not s.startswith("~"))


def invalid_request(error: ValidationError, rules: Mapping[Pattern, Rule]) -> InvalidRequestError:
    """The 400 for the first error of ``error``, told by ``rules`` (a location no rule names
    gets pydantic's own sentence after the ``param``)."""
    first = error.errors(include_url=False, include_context=False)[0]
    location = [s for s in first["loc"] if isinstance(s, int) or not s.startswith("~")]
    rule = rules.get(pattern_of(location))
    if rule is None:
        param = param_of(location)
        code = "invalid_type" if first["type"].endswith("_type") else "invalid_value"
        return InvalidRequestError(f"{param}: {first['msg']}.", param=param, code=code)
    if rule.keep is not None:
        location = location[:rule.keep]
    param = param_of(location) + rule.suffix
    code = rule.code
    if rule.required and (first["type"] == "missing" or first.get("input") is None):
        code = "missing_required_parameter"
    return InvalidRequestError(rule.message.format(param=param), param=param, code=code)


def checked(shape: type[ShapeT], body: dict[str, Any], rules: Mapping[Pattern, Rule]) -> ShapeT:
    """``body`` validated as ``shape``; raises :class:`InvalidRequestError` (400) told by
    ``rules`` for the first problem."""
    try:
        return shape.model_validate(body)
    except ValidationError as exc:
        raise invalid_request(exc, rules) from None
