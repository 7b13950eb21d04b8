"""Dates named in a query, and how well a memory's time matches them."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from proxy.memory.when import mentioned_periods, time_match


def day(y: int, m: int, d: int) -> datetime:
    return datetime(y, m, d, tzinfo=UTC)


@pytest.mark.parametrize(("text", "expected"), [
    ("What did I say on 16 June, 2023?", [(day(2023, 6, 16), day(2023, 6, 17))]),
    ("what happened on June 16th 2023", [(day(2023, 6, 16), day(2023, 6, 17))]),
    ("the 3rd of Sept 2022 trip", [(day(2022, 9, 3), day(2022, 9, 4))]),
    ("meeting 2023-06-16 notes", [(day(2023, 6, 16), day(2023, 6, 17))]),
    ("2023/6/1 的会议", [(day(2023, 6, 1), day(2023, 6, 2))]),
    ("我2023年6月16日说了什么", [(day(2023, 6, 16), day(2023, 6, 17))]),
    ("2023年12月的计划", [(day(2023, 12, 1), day(2024, 1, 1))]),
    ("What did Maria donate in December 2023?", [(day(2023, 12, 1), day(2024, 1, 1))]),
    ("in Jan 2024 and on 5 March, 2024",
     [(day(2024, 1, 1), day(2024, 2, 1)), (day(2024, 3, 5), day(2024, 3, 6))]),
    # a month that contains a named day is not repeated as a whole month
    ("June 16, 2023 in June 2023", [(day(2023, 6, 16), day(2023, 6, 17))]),
])
def test_named_dates_become_periods(text: str,
                                    expected: list[tuple[datetime, datetime]]) -> None:
    """Absolute days and months in English and Chinese are found, in order."""
    assert [(p.start, p.end) for p in mentioned_periods(text)] == expected


@pytest.mark.parametrize("text", [
    "What did I tell you last week?",  # relative: needs the time of speaking
    "How many times in 2023?",  # a bare year matches nearly everything
    "I may 2 go",  # "may" the verb, no year
    "on 31 February, 2023",  # no such day
    "2023-13-40",
    "version 3.11.2 is out",
    "What did I say on 16 June?",  # a day without its year
    "6月16日我说了什么",
    "",
])
def test_no_period_without_an_absolute_date(text: str) -> None:
    """Relative phrases, bare years, impossible dates and version numbers name no date."""
    assert mentioned_periods(text) == ()


def test_time_match_is_one_inside_and_decays_outside() -> None:
    """Inside a period → 1.0; a week after a named day → e^-1; no period → 0."""
    (june16,) = mentioned_periods("on 16 June, 2023")
    assert time_match([day(2023, 6, 16)], [june16]) == 1.0
    assert math.isclose(time_match([day(2023, 6, 24)], [june16]), math.exp(-1))
    assert time_match([day(2023, 6, 24)], [june16]) > time_match([day(2023, 9, 1)], [june16])
    assert time_match([day(2023, 6, 16)], []) == 0.0


def test_any_of_the_moments_may_match() -> None:
    """A memory first said long ago but repeated on the named day matches fully."""
    (june16,) = mentioned_periods("2023-06-16")
    assert time_match([day(2022, 1, 1), day(2023, 6, 16)], [june16]) == 1.0
