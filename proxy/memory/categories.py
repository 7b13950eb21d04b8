"""The memory categories: the one definition every module imports.

A memory is filed under one of five categories and a free-text subcategory. The wire and
storage value of a category is its name as written here (``"user_preference"`` ...); the
learning prompts ask the model for these names, the HTTP and MCP shapes accept them, and
injection lists memories under them in this order.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = ["CATEGORIES", "DEFAULT_CATEGORY", "SUBCATEGORIES", "Category"]

Category = Literal["user_preference", "business", "technical", "organizational", "domain"]
"""A memory category, as stored and sent on the wire."""

CATEGORIES: Final[tuple[Category, ...]] = get_args(Category)
"""Every category, in the order injection lists them."""

DEFAULT_CATEGORY: Final[Category] = "user_preference"
"""The category of a memory whose source names none (manual adds, imports)."""

SUBCATEGORIES: Final[dict[Category, tuple[str, ...]]] = {
    "user_preference": ("style", "language", "tool", "topic"),
    "business": ("rule", "process", "product", "customer"),
    "technical": ("architecture", "stack", "practice", "issue"),
    "organizational": ("team", "role", "project", "convention"),
    "domain": ("dynamic",),
}
"""The preset subcategories of each category (the prompts offer these); a subcategory is
free text, so a memory may carry another, and ``domain`` is open-ended."""
