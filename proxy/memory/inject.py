"""The memory block: render, fit to the token budget, splice into the messages (pure).

The block is Markdown between fixed markers (``<user_memory>`` … ``</user_memory>``), so it
can be found and removed later (from transcripts, so learning never relearns it) and renders
byte-identically for the same inputs (no times, ids or random nonces inside). Memory text is
data: each line is sanitised so a stored memory cannot close the block, start a heading, or
smuggle chat-template control tokens (docs/design.md#memory-text-is-data). Source channels
and ids never appear in it.

Placement (docs/design.md#injection): exactly one leading instruction message, never two.

- ``system`` — appended to the first system/developer message (after the app's own
  instructions, before user input); a new system message at index 0 when there is none.
  The list's shape is otherwise unchanged, so any list the upstream accepted still is.
- ``before_last_user`` — prepended inside the latest user message; everything before it
  stays byte-identical across turns, so the provider's prompt cache keeps the prefix.

``developer`` messages become ``system`` for upstreams that do not accept that role.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Literal

from proxy.memory.categories import CATEGORIES
from proxy.memory.records import Memory, Profile, ScoredTag, tag_order
from proxy.memory.text import fold_char, has_cjk
from proxy.request import Message, message_text
from proxy.settings import InjectTemplate

BLOCK_START = "<user_memory>"
BLOCK_END = "</user_memory>"
MAX_LINE_CHARS = 400
MAX_PROFILE_TAGS = 6
_MARKERS = re.compile(
    r"[<‹〈《]\s*/?\s*user[\s_-]*memor(?:y|ies)[^>›〉》]{0,40}[>›〉》]"  # our block markers
    # role tags: <system>, </assistant>, <developer …>
    r"|[<‹〈《]\s*/?\s*(?:system|assistant|developer|user|human|tool|function|instructions?"
    r"|系统|助手|开发者)(?:\b|(?<=[统手者]))[^<>‹›〈〉《》]{0,40}[>›〉》]"
    r"|<\|[^|<>]{0,40}\|>"  # ChatML / Llama-3 control tokens: <|im_start|>, <|eot_id|>
    r"|\[/?INST\]|<<\s*/?\s*SYS\s*>>|</?s>"  # Llama-2 / Mistral control tokens
    r"|```+",  # fences could swallow the rest of the prompt
    re.IGNORECASE,
)
_SPACE = re.compile(r"\s+")
# Markdown structure a line must not open with, ASCII and full-width.
_LEADING_STRUCTURE = "#>*-+=| ＃＞＊－＋＝｜"
_BLOCK = re.compile(re.escape(BLOCK_START) + r".*?" + re.escape(BLOCK_END), re.DOTALL)
Position = Literal["system", "before_last_user"]


@lru_cache(maxsize=4096)
def sanitize(text: str, *, max_chars: int = MAX_LINE_CHARS) -> str:
    """One safe line: invisible format characters (soft hyphen, zero-width and bidi
    controls) and control characters dropped; block markers, role tags and chat-template
    control tokens removed, whitespace collapsed, leading Markdown structure stripped, cut
    to ``max_chars`` (an ellipsis marks the cut). Markers are found on a folded view of the
    text (NFKC, Latin look-alikes, no combining marks: :func:`~proxy.memory.text.fold_char`)
    so full-width spellings such as ``＜/user_memory＞`` are removed too, but the text kept is
    the text as written: CJK punctuation (``，。：！？（）``) and other compatibility
    characters (``℃``, ``㎡``) are never rewritten to ASCII. Removal repeats until nothing is
    left to remove, so a marker hidden inside another (``</user_</s>memory>``) cannot
    reappear. Memoised: the lines of a user's block repeat from request to request."""
    visible = "".join(
        ch for ch in text
        if ch.isspace() or unicodedata.category(ch) not in ("Cf", "Cc", "Co", "Cs")
    )
    cleaned = _SPACE.sub(" ", _remove_markers(visible)).strip()
    cleaned = cleaned.lstrip(_LEADING_STRUCTURE).strip()
    if len(cleaned) > max_chars:
        cleaned = cleaned[: max_chars - 1].rstrip() + "…"
    return cleaned


def _remove_markers(text: str) -> str:
    """``text`` with every ``_MARKERS`` match on its folded view replaced by one space,
    repeated until none is left (each round shortens the text or turns a character into a
    space, so it ends)."""
    while True:
        if text.isascii():
            stripped = _MARKERS.sub(" ", text)
            if stripped == text:
                return text
            text = stripped
            continue
        pieces: list[str] = []
        origin: list[int] = []  # folded position → index of the character it came from
        for index, ch in enumerate(text):
            folded = fold_char(ch)
            pieces.append(folded)
            origin.extend([index] * len(folded))
        out: list[str] = []
        last = 0
        for match in _MARKERS.finditer("".join(pieces)):
            start, end = origin[match.start()], origin[match.end() - 1] + 1
            out.append(text[last:max(start, last)])
            out.append(" ")
            last = max(end, last)
        if not out:
            return text
        out.append(text[last:])
        text = "".join(out)


def strip_blocks(text: str) -> str:
    """Remove any memory block from ``text`` (defence for transcripts sent to learning)."""
    return _BLOCK.sub("", text) if BLOCK_START in text else text


def choose_language(messages: Sequence[Message], setting: str) -> Literal["en", "zh"]:
    """``en`` / ``zh`` as configured; ``auto`` picks Chinese when the latest user turn has
    CJK characters."""
    if setting in ("en", "zh"):
        return setting  # type: ignore[return-value]
    for message in reversed(messages):
        if message.get("role") == "user":
            return "zh" if has_cjk(message_text(message)) else "en"
    return "en"


def _fact_line(memory: Memory, template: InjectTemplate) -> str:
    text = sanitize(memory.content or memory.title)
    if not memory.about_user:
        subject = sanitize(memory.subject, max_chars=60)
        return f"- {template.about.format(subject=subject)}: {text}"
    return f"- {text}"


def _profile_lines(
    profile: Profile | None, template: InjectTemplate, now: datetime
) -> list[str]:
    if profile is None or profile.empty:
        return []
    lines = []
    if profile.style:
        lines.append(f"- {template.style}: {sanitize(profile.style)}")
    if profile.impression:
        lines.append(f"- {template.impression}: {sanitize(profile.impression)}")
    for label, tags in ((template.traits, profile.traits), (template.topics, profile.topics)):
        top = _top_tags(tags, now)
        if top:
            lines.append(f"- {label}: {', '.join(top)}")
    return lines


def _top_tags(tags: tuple[ScoredTag, ...], now: datetime) -> list[str]:
    return [sanitize(tags[i].text, max_chars=40)
            for i in tag_order(tags, now)[:MAX_PROFILE_TAGS]]


def render_block(
    *,
    template: InjectTemplate,
    profile_lines: Sequence[str],
    facts: Sequence[Memory],
) -> str:
    """The block for these profile lines and facts ("" when both are empty). Facts are
    grouped by category in a fixed order, keeping their given order within a category."""
    if not profile_lines and not facts:
        return ""
    parts = [BLOCK_START, template.title, template.intro]
    if profile_lines:
        parts.append(template.profile)
        parts.extend(profile_lines)
    by_category: dict[str, list[str]] = {}
    for memory in facts:
        by_category.setdefault(memory.category, []).append(_fact_line(memory, template))
    for category in (*CATEGORIES, *sorted(set(by_category) - set(CATEGORIES))):
        lines = by_category.get(category)
        if lines:
            parts.append(template.categories.get(category, template.facts))
            parts.extend(lines)
    parts.append(BLOCK_END)
    return "\n".join(parts)


@dataclass(frozen=True, slots=True)
class BlockPlan:
    text: str
    memories: tuple[Memory, ...]
    tokens: int
    trimmed: int  # facts dropped to fit the budget
    profile_lines: int = 0  # profile lines the block kept (from the first)


def fit_block(
    *,
    template: InjectTemplate,
    profile: Profile | None,
    facts: Sequence[Memory],
    budget_tokens: int,
    count: Callable[[str], int],
    now: datetime,
) -> BlockPlan:
    """The largest block within ``budget_tokens``: facts are given best first and the
    lowest-ranked are dropped first (docs/design.md#injection), then the
    profile lines from the end. Token counts use ``count`` (the target model's tokenizer).
    """
    profile_lines = _profile_lines(profile, template, now)
    if budget_tokens <= 0:
        return BlockPlan("", (), 0, len(facts))

    def attempt(n_facts: int, n_profile: int) -> tuple[str, int]:
        text = render_block(template=template, profile_lines=profile_lines[:n_profile],
                            facts=facts[:n_facts])
        return text, count(text) if text else 0

    text, tokens = attempt(len(facts), len(profile_lines))
    if tokens <= budget_tokens:
        return BlockPlan(text, tuple(facts), tokens, 0, len(profile_lines))
    # Largest fact count that fits, by binary search (token count grows with n).
    low, high = 0, len(facts) - 1
    best: tuple[int, str, int] | None = None
    while low <= high:
        middle = (low + high) // 2
        text, tokens = attempt(middle, len(profile_lines))
        if tokens <= budget_tokens:
            best = (middle, text, tokens)
            low = middle + 1
        else:
            high = middle - 1
    if best is not None and (best[0] > 0 or profile_lines):
        n, text, tokens = best
        return BlockPlan(text, tuple(facts[:n]), tokens, len(facts) - n, len(profile_lines))
    for n_profile in range(len(profile_lines) - 1, 0, -1):
        text, tokens = attempt(0, n_profile)
        if tokens <= budget_tokens:
            return BlockPlan(text, (), tokens, len(facts), n_profile)
    return BlockPlan("", (), 0, len(facts))


def _with_text(message: Message, block: str, *, prepend: bool) -> Message:
    content = message.get("content")
    if isinstance(content, list):
        part = {"type": "text", "text": block}
        return {**message, "content": [part, *content] if prepend else [*content, part]}
    text = content if isinstance(content, str) else ""
    if not text:
        return {**message, "content": block}
    joined = f"{block}\n\n{text}" if prepend else f"{text}\n\n{block}"
    return {**message, "content": joined}


def splice(
    messages: Sequence[Message],
    block: str,
    *,
    position: Position,
    developer_ok: bool,
    system_ok: bool,
) -> list[Message]:
    """A new message list with ``block`` placed (the input is never mutated)."""
    out: list[Message] = [
        {**m, "role": "system"} if not developer_ok and m.get("role") == "developer" else m
        for m in messages
    ]
    if not block:
        return out
    if position == "system" and system_ok:
        for index, message in enumerate(out):
            if message.get("role") in ("system", "developer"):
                out[index] = _with_text(message, block, prepend=False)
                return out
        return [{"role": "system", "content": block}, *out]
    for index in range(len(out) - 1, -1, -1):
        if out[index].get("role") == "user":
            out[index] = _with_text(out[index], block, prepend=True)
            return out
    return [{"role": "system", "content": block}, *out] if system_ok else out


__all__ = [
    "BLOCK_END", "BLOCK_START", "BlockPlan", "choose_language", "fit_block", "render_block",
    "sanitize", "splice", "strip_blocks",
]
