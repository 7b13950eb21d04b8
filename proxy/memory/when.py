"""Dates a query mentions, and how well a memory's time matches them (pure).

"What did I tell you on 16 June, 2023?" names the time a fact was said; a memory's
``created_at`` / ``last_seen_at`` say when it was said. :func:`mentioned_periods` finds
absolute calendar dates in English and Chinese text — ``16 June, 2023``, ``June 16th 2023``,
``Jun 2023``, ``2023-06-16``, ``2023/6/16``, ``2023年6月16日``, ``2023年6月`` — as half-open UTC
periods (a day or a month). Relative phrases ("last week") and bare years are left out: the
first need the time the user spoke, the second match nearly everything.

:func:`time_match` is 1.0 inside a period and decays as ``exp(−days outside / tau)``
(tau 7 days for a day, 15 for a month), so that "in December" still favours late
November over March.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
_MONTH = r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?" \
         r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"((?:19|20)\d{2})"
_DAY_MONTH_YEAR = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\.?,?\s+{_YEAR}\b", re.IGNORECASE)
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\.?\s+{_DAY},?\s+{_YEAR}\b", re.IGNORECASE)
_MONTH_YEAR = re.compile(rf"\b{_MONTH}\.?,?\s+(?:of\s+)?{_YEAR}\b", re.IGNORECASE)
_ISO_DAY = re.compile(rf"\b{_YEAR}[-/.](\d{{1,2}})[-/.](\d{{1,2}})\b")
_ZH_DAY = re.compile(rf"{_YEAR}\s*年\s*(\d{{1,2}})\s*月\s*(\d{{1,2}})\s*[日号]")
_ZH_MONTH = re.compile(rf"{_YEAR}\s*年\s*(\d{{1,2}})\s*月(?!\s*\d)")
# Every pattern above names a year: a text without one names no period (one scan, not six).
_ANY_YEAR = re.compile(_YEAR)

DAY_TAU_DAYS = 7.0
MONTH_TAU_DAYS = 15.0


@dataclass(frozen=True, slots=True)
class Period:
    """A half-open UTC interval ``[start, end)`` and how fast a match decays outside it."""

    start: datetime
    end: datetime
    tau_days: float


def _month(name: str) -> int:
    return next(i for i, full in enumerate(_MONTHS, start=1) if full.startswith(name.lower()))


def _day(year: int, month: int, day: int) -> Period | None:
    try:
        start = datetime(year, month, day, tzinfo=UTC)
    except ValueError:
        return None
    return Period(start, start + timedelta(days=1), DAY_TAU_DAYS)


def _whole_month(year: int, month: int) -> Period | None:
    if not 1 <= month <= 12:
        return None
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return Period(start, end, MONTH_TAU_DAYS)


def mentioned_periods(text: str) -> tuple[Period, ...]:
    """Calendar days and months named in ``text``, in order of appearance, without
    duplicates; a month is dropped when a day inside it is named too."""
    if _ANY_YEAR.search(text) is None:
        return ()
    found: list[tuple[int, Period | None]] = []
    spans: list[tuple[int, int]] = []  # text covered by day mentions, valid or not
    for match in _DAY_MONTH_YEAR.finditer(text):
        found.append((match.start(), _day(int(match[3]), _month(match[2]), int(match[1]))))
        spans.append(match.span())
    for match in _MONTH_DAY_YEAR.finditer(text):
        found.append((match.start(), _day(int(match[3]), _month(match[1]), int(match[2]))))
        spans.append(match.span())
    for match in _ISO_DAY.finditer(text):
        found.append((match.start(), _day(int(match[1]), int(match[2]), int(match[3]))))
        spans.append(match.span())
    for match in _ZH_DAY.finditer(text):
        found.append((match.start(), _day(int(match[1]), int(match[2]), int(match[3]))))
        spans.append(match.span())
    days = [p for _, p in found if p is not None]
    for pattern, year_group, month_group in ((_MONTH_YEAR, 2, 1), (_ZH_MONTH, 1, 2)):
        for match in pattern.finditer(text):
            if any(start < match.end() and match.start() < end for start, end in spans):
                continue
            raw = match[month_group]
            month = int(raw) if raw.isdigit() else _month(raw)
            period = _whole_month(int(match[year_group]), month)
            if period is not None and not any(period.start <= d.start < period.end
                                              for d in days):
                found.append((match.start(), period))
    ordered = [p for _, p in sorted(found, key=lambda item: item[0]) if p is not None]
    return tuple(dict.fromkeys(ordered))


def time_match(moments: Sequence[datetime], periods: Sequence[Period]) -> float:
    """Best match in [0, 1] of any of ``moments`` with any of ``periods`` (0 when there
    are no periods): 1 inside, ``exp(−days outside / tau)`` beyond."""
    best = 0.0
    for period in periods:
        for moment in moments:
            if period.start <= moment < period.end:
                return 1.0
            gap = (period.start - moment if moment < period.start else moment - period.end)
            best = max(best, math.exp(-gap.total_seconds() / 86400 / period.tau_days))
    return best
