"""Reading one field of an extraction answer the way models write it.

Each function takes whatever JSON value a model put in a field (a string, a list, a number,
``null``, an object ...) and returns the normalised value, or an empty one when the value is
unusable; none raises. The pydantic models of :mod:`.extraction` apply them as ``before``
validators, so a wrong type in one field never loses the rest of the item.
"""

from __future__ import annotations

import re
from typing import Any, Final

from proxy.learning.answers.json_text import MISSING, loads
from proxy.memory.categories import Category

__all__ = [
    "category",
    "clean_text",
    "ids",
    "looks_like_json",
    "norm_key",
    "strings",
    "subject",
    "turns",
]

_SPELLINGS: Final[dict[Category, tuple[str, ...]]] = {
    "user_preference": (
        "user_preference",
        "user_preferences",
        "preference",
        "preferences",
        "pref",
        "personal",
        "personal_info",
        "user",
        "用户偏好",
        "偏好",
        "个人",
    ),
    "business": ("business", "biz", "commercial", "业务", "商业"),
    "technical": (
        "technical",
        "tech",
        "technology",
        "technical_detail",
        "skill",
        "skills",
        "技术",
    ),
    "organizational": (
        "organizational",
        "organisational",
        "organization",
        "organisation",
        "org",
        "relationship",
        "relationships",
        "team",
        "组织",
        "组织关系",
        "人际关系",
    ),
    "domain": ("domain", "domain_knowledge", "knowledge", "领域", "领域知识"),
}
"""Spellings models use for each category (normalised by :func:`norm_key`)."""
_CATEGORY_ALIASES: Final[dict[str, Category]] = {
    alias: name for name, aliases in _SPELLINGS.items() for alias in aliases
}

_USER_SUBJECTS: Final = frozenset(
    {
        "",
        "user",
        "the user",
        "the_user",
        "me",
        "myself",
        "i",
        "self",
        "用户",
        "我",
        "该用户",
        "本人",
    }
)
_NULL_IDS: Final = frozenset({"none", "null", "n/a", "na", "-", "无"})
_SCHEMA_KEY_TEXT = re.compile(
    r"[\"']\s*(?:title|content|category|subcategory|facts|memories|tags|supersedes)\s*[\"']\s*:",
    re.IGNORECASE,
)


def norm_key(key: str) -> str:
    """``key`` lower-cased and stripped, runs of spaces and dashes as ``_``."""
    return re.sub(r"[\s\-]+", "_", key.strip().lower())


def clean_text(value: Any) -> str:
    """A string stripped; anything else ``""``."""
    return value.strip() if isinstance(value, str) else ""


def looks_like_json(text: str) -> bool:
    """Whether ``text`` is a parser leak rather than a statement: it starts with ``{`` or
    ``[`` and parses, or holds a quoted schema key such as ``"title":``."""
    if _SCHEMA_KEY_TEXT.search(text):
        return True
    if text[:1] in ("{", "["):
        return loads(text) is not MISSING
    return False


def strings(value: Any, *, max_items: int, max_len: int | None = None) -> tuple[str, ...]:
    """A list of strings (or one comma-separated string): stripped, non-empty, deduplicated
    case-insensitively (first spelling kept), too-long ones dropped, at most ``max_items``."""
    if isinstance(value, str):
        value = re.split("[,\uff0c\u3001]", value)  # also full-width comma and 、
    if not isinstance(value, list):
        return ()
    out: list[str] = []
    seen: set[str] = set()
    for item in value:
        text = clean_text(item)
        if not text or (max_len is not None and len(text) > max_len):
            continue
        if text.casefold() not in seen:
            seen.add(text.casefold())
            out.append(text)
        if len(out) == max_items:
            break
    return tuple(out)


def ids(value: Any) -> tuple[str, ...]:
    """Memory ids (one or a list; strings or ints), ``"none"``/``"null"`` and repeats left
    out."""
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        number = isinstance(item, int) and not isinstance(item, bool)
        text = str(item) if number else clean_text(item)
        if text and text.lower() not in _NULL_IDS and text not in out:
            out.append(text)
    return tuple(out)


def turns(value: Any) -> tuple[int, ...]:
    """Transcript turn numbers (one or a list): non-negative ints only, repeats left out."""
    items = value if isinstance(value, list) else [value]
    out: list[int] = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0 and item not in out:
            out.append(item)
    return tuple(out)


def subject(value: Any) -> str:
    """``"user"`` for a missing subject or any way of saying the user, else the name."""
    text = clean_text(value)
    return "user" if text.lower() in _USER_SUBJECTS else text


def category(value: Any, about: str) -> Category:
    """The category a model's spelling names; missing or unknown: ``user_preference`` for a
    fact about the user (``about == "user"``), ``domain`` for one about someone else."""
    key = norm_key(value) if isinstance(value, str) else ""
    return _CATEGORY_ALIASES.get(key, "user_preference" if about == "user" else "domain")
