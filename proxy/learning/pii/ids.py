"""Identity and card numbers: ``cn_id`` and ``bank_card``, each a precise pattern plus its
check digit.

``cn_id`` → ``[ID_NUMBER]``: PRC resident identity number, GB 11643-1999: 6-digit area
code, birth date YYYYMMDD (1900..current year, a real calendar date), 3-digit sequence,
ISO 7064 MOD 11-2 check character (weights 7 9 10 5 8 4 2 1 6 3 7 9 10 5 8 4 2, check
characters ``10X98765432``). Contiguous, 6-8-4 or in groups of four (4-4-4-4-2) with one
kind of separator (space, dash or dot). The 15-digit pre-1999 form has no checksum and is
not detected.

``bank_card`` → ``[BANK_CARD]``: 13-19 digits, contiguous or in groups of 4 (or Amex
4-6-5) separated by one space, dash or dot, passing the Luhn check (ISO/IEC 7812-1 Annex B) and
starting with a payment-card major industry identifier (ISO/IEC 7812: 2-6 and 9, the last
for Chinese domestic cards), which keeps 13-digit millisecond timestamps (``17…``) out.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterator

from proxy.learning.pii.findings import Span

# --- cn_id (GB 11643-1999) ---------------------------------------------------------------
_CN_ID = re.compile(
    r"(?<![0-9A-Za-z])[1-9][0-9]{5} ?(?:19|20)[0-9]{2}(?:0[1-9]|1[0-2])"
    r"(?:0[1-9]|[12][0-9]|3[01]) ?[0-9]{3}[0-9Xx](?![0-9A-Za-z])"
)
# The same number written with dashes, dots or spaces: 6-8-4 with one separator, or in
# groups of four (4-4-4-4-2) as people copy it from a card.
_CN_ID_SEPARATED = re.compile(
    r"(?<![0-9A-Za-z])(?:"
    r"[1-9][0-9]{5}([ .\-])(?:19|20)[0-9]{6}\1[0-9]{3}[0-9Xx]"
    r"|[1-9][0-9]{3}([ .\-])[0-9]{4}\2[0-9]{4}\2[0-9]{4}\2[0-9][0-9Xx]"
    r")(?![0-9A-Za-z])"
)
_CN_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_CN_ID_CHECK = "10X98765432"

# --- bank_card (ISO/IEC 7812) ------------------------------------------------------------
_CARD = re.compile(
    r"(?<![0-9])(?:"
    r"[0-9]{13,19}"
    r"|[0-9]{4}([ .-])[0-9]{4}(?:\1[0-9]{4}){1,2}(?:\1[0-9]{1,3})?"
    r"|[0-9]{4}([ .-])[0-9]{6}\2[0-9]{5}"
    r")(?![0-9])"
)
_CARD_MII = frozenset("234569")


def cn_id_valid(number: str, *, current_year: int | None = None) -> bool:
    """Whether an 18-character PRC resident ID (no spaces) has a real birth date in
    1900..``current_year`` (default: this year) and a correct GB 11643-1999 check character."""
    if len(number) != 18 or not number[:17].isdigit():
        return False
    year = int(number[6:10])
    top = _dt.date.today().year if current_year is None else current_year
    if not 1900 <= year <= top:
        return False
    try:
        _dt.date(year, int(number[10:12]), int(number[12:14]))
    except ValueError:
        return False
    total = sum(int(d) * w for d, w in zip(number, _CN_ID_WEIGHTS, strict=False))
    return _CN_ID_CHECK[total % 11] == number[17].upper()


def luhn_valid(digits: str) -> bool:
    """Whether a string of ASCII digits passes the Luhn check (ISO/IEC 7812-1 Annex B)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def find_cn_ids(text: str, digits: int) -> Iterator[Span]:
    """PRC resident identity numbers (18 characters, valid check character) in ``text``."""
    if digits < 17:
        return
    year = _dt.date.today().year
    for m in _CN_ID.finditer(text):
        if cn_id_valid(m.group().replace(" ", ""), current_year=year):
            yield m.start(), m.end(), "cn_id"
    for m in _CN_ID_SEPARATED.finditer(text):
        number = re.sub(r"[ .\-]", "", m.group())
        if cn_id_valid(number, current_year=year):
            yield m.start(), m.end(), "cn_id"


def find_cards(text: str, digits: int) -> Iterator[Span]:
    """Payment card numbers (Luhn-valid, payment-card MII) in ``text``."""
    if digits < 13:
        return
    pos = 0
    while m := _CARD.search(text, pos):
        match = m.group()
        ends = [len(match)]
        cut = max(match.rfind(" "), match.rfind("-"), match.rfind("."))
        if cut > 0 and len(match) - cut <= 4:  # short last group: maybe not part of it
            ends.append(cut)
        for end in ends:
            number = match[:end].replace(" ", "").replace("-", "").replace(".", "")
            if 13 <= len(number) <= 19 and number[0] in _CARD_MII and luhn_valid(number):
                yield m.start(), m.start() + end, "bank_card"
                pos = m.end()
                break
        else:  # a card may start at a later group of this run ("order 12 4111 1111 …")
            pos = m.start() + 1
