"""The JSON schema of an answer model, in the plain form sent to the learning model.

``model_json_schema`` writes titles, defaults, ``$defs`` with ``$ref`` pointers and
``anyOf: [X, {"type": "null"}]`` for optional values. The learning model (and providers'
structured-output modes) only needs the shape, so :func:`answer_schema` inlines every
reference, drops titles, descriptions (the docstrings) and defaults, writes a nullable
value as ``"type": [X, "null"]`` and puts ``type`` first in every node.
Fields marked with :func:`not_null_in_schema` are asked for as non-null even though the
parser also reads a missing or unusable value as ``None``.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel

__all__ = ["answer_schema", "not_null_in_schema"]

_NULL = {"type": "null"}
_DROPPED_KEYS = frozenset({"title", "description", "default"})


def not_null_in_schema(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a nullable field the model is asked to fill: keeps only the
    non-null branch of its ``anyOf``."""
    options = [option for option in schema.pop("anyOf", []) if option != _NULL]
    if len(options) == 1:
        schema.update(options[0])
    elif options:
        schema["anyOf"] = options


def answer_schema(model: type[BaseModel]) -> dict[str, object]:
    """The plain JSON schema of ``model``'s validation input (aliases: the first choice)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions: dict[str, Any] = raw.pop("$defs", {})
    plain: dict[str, object] = _plain(raw, definitions)
    return plain


def _plain(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_plain(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return _plain({**definitions[name], **{k: v for k, v in node.items() if k != "$ref"}},
                      definitions)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _plain(item, definitions) for name, item in value.items()}
        elif key not in _DROPPED_KEYS:
            out[key] = _plain(value, definitions)
    return _ordered(_nullable(out))


_KEY_ORDER: Final = {key: rank for rank, key in enumerate(
    ("type", "properties", "items", "enum", "minimum", "maximum", "required"))}


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its keys in the order a person writes them: ``type`` first, then the
    contents, ``required`` last (pydantic sorts them alphabetically); others keep theirs."""
    return dict(sorted(node.items(), key=lambda item: _KEY_ORDER.get(item[0], len(_KEY_ORDER))))


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    """``{"anyOf": [X, {"type": "null"}]}`` as X with ``"type": [X's type, "null"]``."""
    options = node.get("anyOf")
    if not isinstance(options, list) or len(options) != 2 or _NULL not in options:
        return node
    other = options[0] if options[1] == _NULL else options[1]
    if not isinstance(other.get("type"), str):
        return node
    rest = {key: value for key, value in node.items() if key != "anyOf"}
    return {**other, **rest, "type": [other["type"], "null"]}
