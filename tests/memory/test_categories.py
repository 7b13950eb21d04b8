"""Tests for proxy.memory.categories: the one definition of the memory categories."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import TypeAdapter

from proxy.learning.answers import EXTRACTION_SCHEMA
from proxy.memory.categories import CATEGORIES, DEFAULT_CATEGORY, SUBCATEGORIES, Category
from proxy.memory.records import Memory
from proxy.routes.shapes import NewMemory

WIRE_VALUES = ("user_preference", "business", "technical", "organizational", "domain")


def test_categories_keep_their_wire_values_and_order() -> None:
    """The five categories are spelled and ordered as stored and sent on the wire."""
    assert CATEGORIES == WIRE_VALUES
    assert get_args(Category) == WIRE_VALUES
    assert DEFAULT_CATEGORY == "user_preference"


def test_every_category_has_preset_subcategories() -> None:
    """Each category lists its preset subcategories; domain's is open-ended."""
    assert tuple(SUBCATEGORIES) == CATEGORIES
    assert SUBCATEGORIES["user_preference"] == ("style", "language", "tool", "topic")
    assert SUBCATEGORIES["domain"] == ("dynamic",)


def test_request_shapes_and_the_extraction_schema_use_the_same_categories() -> None:
    """The API's memory shape, the record default and the extraction schema offer exactly
    the categories of the one definition."""
    schema = TypeAdapter(NewMemory).json_schema()
    assert schema["properties"]["category"]["enum"] == list(CATEGORIES)
    extraction: Any = EXTRACTION_SCHEMA
    item = extraction["properties"]["memories"]["items"]
    assert item["properties"]["category"]["enum"] == list(CATEGORIES)
    assert Memory.__dataclass_fields__["category"].default == DEFAULT_CATEGORY
