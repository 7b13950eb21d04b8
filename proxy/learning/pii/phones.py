"""``phone`` → ``[PHONE]``: ``phonenumbers.PhoneNumberMatcher`` (leniency VALID) in the
default region (``CN``): mainland mobiles and landlines in any usual grouping, and every
``+``-prefixed E.164 number (a ``+`` number is parsed the same whatever the default region,
so no second pass with region ``None``/``US`` is needed), plus a regex safety net for
mainland mobiles ``1[3-9]`` + 9 digits (MIIT numbering plan; contiguous or 3-4-4, optional
``+86``) that also covers blocks phonenumbers' metadata does not know. Only digit runs of
≥ 7 characters that are not plain dates reach phonenumbers; numbers glued together by
spaces, which the matcher reads as one invalid candidate, are retried piecewise. Two
safety nets catch what the matcher's validity metadata rejects, where it found nothing:
any ``+``/``＋`` number of 8-15 digits (ITU-T E.164) in groups separated by a space, dash,
dot or bracket (fictional ranges such as +44 7700 900xxx, unassigned country codes), and
national forms with a bracketed area code or dashes (``(555) 010-0147``,
``(0755) 8888-6666``, ``555-010-0147``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import phonenumbers

from proxy.learning.pii.findings import Span

# Mainland mobile (MIIT plan: 1[3-9] + 9 digits), contiguous or 3-4-4 with one space/dash,
# optionally after +86: the safety net under phonenumbers, which rejects unallocated blocks.
_CN_MOBILE_BODY = r"(?:\+86[ -]?)?1[3-9][0-9]([ -]?)[0-9]{4}\1[0-9]{4}"
_CN_MOBILE = re.compile(rf"(?<![0-9]){_CN_MOBILE_BODY}(?![0-9])")
# Digit runs that could hold a phone number (ASCII or full-width digits, with the separators
# phonenumbers accepts). Only windows around runs with >= 7 digits go to PhoneNumberMatcher,
# which otherwise parses every number in the text (years, prices) and costs ~20 µs each.
_PHONE_RUN = re.compile(
    r"[+\uff0b]?[(\uff08]?[0-9\uff10-\uff19]"
    r"[0-9\uff10-\uff19 \t\u00a0\u3000\-./()\u2010-\u2015\uff0d\uff08\uff09]*[0-9\uff10-\uff19]"
)
_MIN_PHONE_DIGITS = 7
_MAX_PHONE_SPLITS = 6
_MAX_SPLIT_RUN = 80  # longer runs (tables of numbers) get one matcher pass only
# Any ``+``-prefixed international number, whatever phonenumbers' validity metadata says
# (fictional ranges such as +44 7700 900xxx, new or unallocated blocks): ``+``, a country
# code and then digits in groups separated by one space, dash, dot or bracket; 8-15 digits
# in all (ITU-T E.164 allows at most 15).
_INTL_PHONE = re.compile(
    r"(?<![0-9A-Za-z+\uff0b])[+\uff0b][1-9][0-9]{0,2}"
    r"(?:[ \-.\u00a0]?\(?[0-9]{1,5}\)?)(?:[ \-.\u00a0]?[0-9]{1,5}){1,6}(?![0-9])"
)
_E164_DIGITS = (8, 15)
# National numbers written with an area code in brackets or with dashes, which
# phonenumbers may not accept outside the default region: "(555) 123-4567", "(010)
# 1234-5678", "555-123-4567", "0755-8888-6666".
_NATIONAL_PHONE = re.compile(
    r"(?<![0-9A-Za-z\-./])(?:"
    r"[(\uff08]0?[0-9]{2,4}[)\uff09][ \u00a0]?[0-9]{3,4}[ \-.]?[0-9]{4}"
    r"|0?[0-9]{2,4}-[0-9]{3,4}-[0-9]{4}"
    r")(?![0-9A-Za-z]|[\-.][0-9])"
)
# A country code left just before a number the matcher read without it ("+1 (415) …").
_DANGLING_COUNTRY_CODE = re.compile(r"[+\uff0b][0-9]{1,3}[ \-.]?$")
# A run that is exactly one mainland mobile needs no phonenumbers parse.
_CN_MOBILE_RUN = re.compile(_CN_MOBILE_BODY)
_FULLWIDTH_DIGIT = re.compile(r"[\uff10-\uff19]")
# A run that is only a date (optionally with the hour after it) is not worth parsing.
_DATE_RUN = re.compile(
    r"(?:[0-9]{4}([-/.])[0-9]{1,2}\1[0-9]{1,2}|[0-9]{1,2}([-/.])[0-9]{1,2}\2[0-9]{4})"
    r"(?: [0-9]{1,2})?"
)


def find_phones(text: str, digits: int, *, region: str) -> Iterator[Span]:
    """Phone numbers in ``text``; ``region`` (ISO 3166, e.g. ``"CN"``) reads numbers
    written without ``+``."""
    if digits < _MIN_PHONE_DIGITS and not _FULLWIDTH_DIGIT.search(text):
        return
    found: list[tuple[int, int]] = []
    for run in _PHONE_RUN.finditer(text):
        if len(run.group()) < _MIN_PHONE_DIGITS or _DATE_RUN.fullmatch(run.group()):
            continue
        for m in _CN_MOBILE.finditer(text, max(0, run.start() - 1), run.end() + 1):
            found.append((m.start(), m.end()))
            yield m.start(), m.end(), "phone"
        if _CN_MOBILE_RUN.fullmatch(run.group()):
            continue
        for start, end in _phone_segment(text, run.start(), run.end(), _MAX_PHONE_SPLITS,
                                         region=region):
            cc = _DANGLING_COUNTRY_CODE.search(text, max(run.start(), start - 5), start)
            found.append(((cc.start() if cc else start), end))
            yield (cc.start() if cc else start), end, "phone"
    # Safety nets for what the matcher rejected; where it found a number, its extent
    # stands (it knows where "+81 3-1234-5678" ends before "4111 1111 …").
    for start, end, kind in [*_international_phones(text), *(
            (m.start(), m.end(), "phone") for m in _NATIONAL_PHONE.finditer(text)
            if not _DATE_RUN.fullmatch(m.group()))]:
        if not any(a < end and start < b for a, b in found):
            yield start, end, kind


def _phone_segment(text: str, start: int, end: int, budget: int, *,
                   region: str) -> list[tuple[int, int]]:
    """Phone numbers in the digit run ``text[start:end]``.

    PhoneNumberMatcher reads digits glued by spaces as one candidate, so in
    ``+1 (415) 555-2671 13000000000`` it finds only the mobile. Parts it leaves uncovered
    are searched again, and a run where it finds nothing is retried without its last
    space-separated group (at most ``budget`` retries, runs up to ``_MAX_SPLIT_RUN``).
    """
    if sum(c.isdigit() for c in text[start:end]) < _MIN_PHONE_DIGITS:
        return []
    # One character of context each side keeps the matcher's own checks (a Latin
    # letter or currency sign next to the digits means "not a phone number").
    lo = max(0, start - 1)
    found = [
        (lo + m.start, lo + m.end)
        for m in phonenumbers.PhoneNumberMatcher(
            text[lo : end + 1], region, leniency=phonenumbers.Leniency.VALID
        )
    ]
    if budget <= 0 or end - start > _MAX_SPLIT_RUN:
        return found
    if not found:
        cut = max(text.rfind(" ", start, end), text.rfind("\u3000", start, end))
        if cut <= start:
            return []
        left = _PHONE_RUN.search(text, start, cut)
        right = _PHONE_RUN.search(text, cut, end)
        out = (_phone_segment(text, left.start(), left.end(), budget - 1, region=region)
               if left else [])
        if right:
            out += _phone_segment(text, right.start(), right.end(), budget - 1, region=region)
        return out
    pos = start
    for a, b in [*sorted(found), (end, end)]:
        for gap in _PHONE_RUN.finditer(text, pos, a):
            found += _phone_segment(text, gap.start(), gap.end(), budget - 1, region=region)
        pos = max(pos, b)
    return found


def _international_phones(text: str) -> Iterator[Span]:
    """``+``-prefixed numbers of 8-15 digits (:data:`_INTL_PHONE`); a trailing group that
    pushes a run past 15 digits is left out (it is another number)."""
    if "+" not in text and "\uff0b" not in text:
        return
    for m in _INTL_PHONE.finditer(text):
        end = m.end()
        while True:
            digits = sum(c.isdigit() for c in text[m.start():end])
            if digits <= _E164_DIGITS[1]:
                break
            cut = max(text.rfind(c, m.start(), end) for c in " -.\u00a0")
            if cut <= m.start():
                break
            end = cut
        if _E164_DIGITS[0] <= digits <= _E164_DIGITS[1]:
            yield m.start(), end, "phone"
