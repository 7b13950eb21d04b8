"""A memory's title when none was given, or when the given one is too long to list.

:func:`short_title` keeps a text that fits; a longer one is cut at the last word boundary
that fits (a space, or any edge of a Chinese, Japanese or Korean character, which are
written without spaces) and marked with an ellipsis, as injected lines are
(:func:`proxy.memory.inject.sanitize`): the result, ellipsis included, is at most the
limit. A single word longer than the limit — or a boundary so early that less than half
of the room would be kept — is cut inside the word.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.memory.records import TITLE_MAX_CHARS
from proxy.memory.text import has_cjk

ELLIPSIS = "…"
# Left off before the ellipsis, so a title never ends "Lives in Lisbon,…".
_TRAILING = " \t,;:.-–—、，；：。"


def _breaks_at(text: str, at: int) -> bool:
    """Whether ``text`` may be cut between ``text[at - 1]`` and ``text[at]``."""
    before, after = text[at - 1], text[at]
    return before == " " or after == " " or has_cjk(before) or has_cjk(after)


def short_title(text: str, *, limit: int = TITLE_MAX_CHARS) -> str:
    """``text`` with its whitespace runs made single spaces, cut to at most ``limit``
    characters (default :data:`~proxy.memory.records.TITLE_MAX_CHARS`, 30) at a word
    boundary with a trailing ``…``; ``""`` for a blank text. Raises ValueError for a
    ``limit`` below 2 (no room for a character and the ellipsis)."""
    if limit < 2:
        raise ValueError("a title needs room for a character and the ellipsis")
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    room = limit - 1
    cut = next((at for at in range(room, room // 2, -1) if _breaks_at(flat, at)), room)
    head = flat[:cut].rstrip(_TRAILING) or flat[:room]
    return head + ELLIPSIS


def indexed_text(title: str, content: str, tags: Sequence[str]) -> str:
    """What the keyword index holds terms of, one per line: the title, the content and
    the space-joined tags — the title left out (an empty first line) when it is the one
    :func:`short_title` cuts from the content, as learning stores a fact that came without
    one: its words are the content's first words, and indexing them twice would count
    them twice in BM25 (docs/design.md#recall). A title of its own is indexed."""
    if title and title == short_title(content):
        title = ""
    return f"{title}\n{content}\n{' '.join(tags)}"


def retitled(title: str, content: str, new_content: str) -> str:
    """The title of a memory whose ``content`` becomes ``new_content`` when no title is
    given with the edit: a title :func:`short_title` cut from the old content is cut again
    from the new one (it would otherwise keep the old words, indexed and searched as a
    title of its own: :func:`indexed_text`); a title of its own stays."""
    return short_title(new_content) if title == short_title(content) else title
