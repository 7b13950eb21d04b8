"""What the detectors produce and how findings become placeholders: the kinds and their
placeholders, :class:`Finding` and :class:`ScrubResult`, the merge of overlapping spans and
the rendering of the scrubbed text."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

PLACEHOLDERS: dict[str, str] = {
    "phone": "[PHONE]",
    "email": "[EMAIL]",
    "cn_id": "[ID_NUMBER]",
    "bank_card": "[BANK_CARD]",
    "secret": "[SECRET]",
    "ip": "[IP]",
    "custom": "[CUSTOM]",
}
"""Kind → placeholder text. Extra patterns (kind ``custom:<name>``) all use ``[CUSTOM]``."""

KINDS: frozenset[str] = frozenset(PLACEHOLDERS) - {"custom"}
"""The built-in kinds that ``Scrubber(kinds=...)`` can select."""

# When findings of different kinds cover exactly the same span, the earlier kind names it
# (an 18-digit ID number that happens to pass Luhn stays an ID number).
_PRIORITY = {k: i for i, k in enumerate(("secret", "cn_id", "bank_card", "email", "phone", "ip"))}

PLACEHOLDER_RE = re.compile(r"\[(?:PHONE|EMAIL|ID_NUMBER|BANK_CARD|SECRET|IP|CUSTOM)\]")

Span = tuple[int, int, str]
"""A detector's candidate: ``[start, end)`` character offsets and the kind."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One scrubbed span: ``kind`` (a key of ``PLACEHOLDERS`` or ``custom:<name>``) and its
    ``[start, end)`` character offsets in the original text."""

    kind: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ScrubResult:
    """The scrubbed ``text`` and its ``findings`` in original-text order (offsets refer to
    the original text; findings never overlap)."""

    text: str
    findings: tuple[Finding, ...]

    @property
    def counts(self) -> dict[str, int]:
        """Number of findings per kind, e.g. ``{"phone": 2, "email": 1}``."""
        return dict(Counter(f.kind for f in self.findings))


def placeholder_for(kind: str) -> str:
    """The placeholder that replaces a finding of ``kind`` (``custom:*`` → ``[CUSTOM]``)."""
    if kind.startswith("custom:"):
        return PLACEHOLDERS["custom"]
    return PLACEHOLDERS[kind]


def render(text: str, findings: tuple[Finding, ...]) -> str:
    parts: list[str] = []
    pos = 0
    for f in findings:
        parts.append(text[pos : f.start])
        parts.append(placeholder_for(f.kind))
        pos = f.end
    parts.append(text[pos:])
    return "".join(parts)


def to_original(
    findings: tuple[Finding, ...], extra: tuple[Finding, ...]
) -> Iterator[Finding]:
    """Map findings in the rendered text back to the original. They never overlap a
    placeholder (``Scrubber._find`` drops such candidates), so each lies in one untouched
    stretch."""
    shift = 0  # rendered offset minus original offset after the placeholders so far
    bounds = [(0, 0)]  # (rendered start of an untouched stretch, its shift)
    for f in findings:
        shift += len(placeholder_for(f.kind)) - (f.end - f.start)
        bounds.append((f.start + shift + (f.end - f.start), shift))
    for e in extra:
        stretch_shift = next(sh for start, sh in reversed(bounds) if start <= e.start)
        yield Finding(e.kind, e.start - stretch_shift, e.end - stretch_shift)


def merge(spans: list[Span]) -> tuple[Finding, ...]:
    """Merge overlapping spans into one finding over their union; the longest member (then
    the higher-priority kind, then the earliest) names the merged finding."""
    spans.sort(key=lambda s: (s[0], -s[1]))
    out: list[Finding] = []
    group: list[Span] = []
    group_end = -1
    for span in spans:
        if group and span[0] >= group_end:
            out.append(_finding(group, group_end))
            group = []
        group.append(span)
        group_end = max(group_end, span[1]) if len(group) > 1 else span[1]
    if group:
        out.append(_finding(group, group_end))
    return tuple(out)


def _finding(group: list[Span], end: int) -> Finding:
    best = min(group, key=lambda s: (s[0] - s[1], _PRIORITY.get(s[2], len(_PRIORITY)), s[0]))
    return Finding(best[2], group[0][0], end)
