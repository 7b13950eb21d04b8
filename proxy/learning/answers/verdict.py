"""The near-neighbour verdict's answer: are two profile wordings the same trait or topic?

The verdict prompt (:data:`proxy.learning.prompts.VERDICT_EN`) asks for
``{"verdict": "same"}`` or ``{"verdict": "different"}``; :class:`VerdictAnswer` also reads
the Chinese 相同 / 不同, any case and surrounding spaces, and a JSON boolean under
``same``. :data:`VERDICT_SCHEMA` is generated from it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from proxy.learning.answers.json_text import parse_model_json
from proxy.learning.answers.output import ModelOutput, ParseError
from proxy.learning.answers.schema import answer_schema

__all__ = ["VERDICT_SCHEMA", "VerdictAnswer", "parse_verdict"]

_SAYS: dict[str, Literal["same", "different"]] = {
    "same": "same",
    "different": "different",
    "相同": "same",
    "不同": "different",
    "一样": "same",
    "不一样": "different",
}


class VerdictAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    verdict: Literal["same", "different"]

    @model_validator(mode="before")
    @classmethod
    def _variants(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        if isinstance(value.get("same"), bool) and "verdict" not in value:
            return {"verdict": "same" if value["same"] else "different"}
        said = value.get("verdict")
        if isinstance(said, str):
            return {**value, "verdict": _SAYS.get(said.strip().lower(), said)}
        return value


VERDICT_SCHEMA = answer_schema(VerdictAnswer)


def _valid(value: Any) -> bool:
    try:
        VerdictAnswer.model_validate(value)
    except ValidationError:
        return False
    return True


def parse_verdict(output: ModelOutput) -> bool:
    """``True`` when the answer says the two wordings are the same, ``False`` when it says
    different. Raises :class:`ParseError` when it says neither."""
    found = parse_model_json(output, validate=_valid, expect=dict)
    if not _valid(found):
        raise ParseError("the verdict answer says neither same nor different")
    return VerdictAnswer.model_validate(found).verdict == "same"
