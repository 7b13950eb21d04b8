"""``email`` → ``[EMAIL]``: practical RFC 5322 subset (dot-atom local part, plus-addressing,
subdomains, alphabetic TLD), also with a full-width ``＠``/``．``; and addresses spelled
out as "name at domain dot tld" when the last label is a common TLD: ``at``, and the
separators of the local part (``dot``, ``underscore``, ``dash``, ``hyphen``, ``plus``) and of
the domain (``dot``, ``dash``, ``hyphen``) as words or in brackets ("alice dot smith at
example dot com"). An ``at`` word with every domain dot written ("works at example.com")
counts only beside a spelled separator in the local part or with ``at`` in brackets. Not
``@mentions``, ``icon@2x.png`` asset names, or ``git@host``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from proxy.learning.pii.findings import Span

# "@" may be the full-width "\uff20" and dots the full-width "\uff0e" or ideographic "\u3002".
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])"
    r"[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*"
    r"[@\uff20](?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?[.\uff0e\u3002])+[A-Za-z]{2,63}"
    r"(?![A-Za-z0-9-]|\.[A-Za-z0-9])"
)
# Spelled-out addresses: "alice at example dot com", "alice [at] example (dot) co (dot) uk",
# "alice dot smith at example dot com", "bob underscore lee AT mail DOT cn": every
# separator of the local part (dot, underscore, dash, hyphen, plus) and of the domain (dot,
# dash, hyphen) may be a word, bare or in brackets, or written. The last label must be a
# common top-level domain, and the first domain label no function word ("looked at the dot
# com bubble" stays prose).


def _word(words: str) -> str:
    """A spelled separator: one of ``words`` in brackets, or bare between spaces."""
    return (rf"(?:\s*[\[({{<]\s*(?i:{words})\s*[\])}}>]\s*"
            rf"|\s+(?i:{words})\s+)")


_DOT_WORD = _word("dot")
_LOCAL_SEP = _word("dot|underscore|dash|hyphen|plus")
_DASH_WORD = _word("dash|hyphen")
_LOCAL_LABEL = r"[A-Za-z0-9][A-Za-z0-9._%+-]*"
_DOMAIN_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
# Found from the "at": the domain is matched after it, then the local part before it (at
# most _LOCAL_WINDOW characters back), so prose without an "at" word costs one scan.
_AT = re.compile(r"[\[({<]\s*(?i:at)\s*[\])}>]|(?<=\s)(?i:at)(?=\s)")
_SPELLED_DOMAIN = re.compile(
    rf"\s*(?P<first>{_DOMAIN_LABEL}(?:{_DASH_WORD}{_DOMAIN_LABEL})*)"
    rf"(?P<rest>(?:(?:{_DOT_WORD}|\.){_DOMAIN_LABEL}(?:{_DASH_WORD}{_DOMAIN_LABEL})*)*"
    rf"(?:{_DOT_WORD}|\.))(?P<tld>[A-Za-z]{{2,6}})(?![A-Za-z0-9])"
)
_SPELLED_LOCAL = re.compile(
    rf"(?<![A-Za-z0-9._%+-]){_LOCAL_LABEL}(?:{_LOCAL_SEP}{_LOCAL_LABEL})*\Z")
_LOCAL_WINDOW = 160
# Without a "dot" word, a spelled address needs one of these (a spelled separator in the
# local part, or "at" in brackets).
_SPELLED_HINTS = ("underscore", "dash", "hyphen", "plus", "[", "(", "{", "<")
_SPELLED_SEP = re.compile(r"\b(?i:dot|underscore|dash|hyphen|plus)\b|[\[({<]")
_FUNCTION_WORDS = frozenset({
    "the", "a", "an", "this", "that", "these", "those", "my", "your", "his", "her", "our",
    "their", "its", "home", "work", "least", "most", "all", "first", "last", "once", "night",
    "noon", "school", "times", "which", "what", "some", "any", "one",
})


def _spelled(text: str) -> Iterator[Span]:
    """Spelled-out addresses (see above), not prose: a common TLD, a first domain label that
    is no function word, and — when every dot of the domain is written — "at" in brackets
    or a spelled separator in the local part ("works at example.com" is prose)."""
    for at in _AT.finditer(text):
        domain = _SPELLED_DOMAIN.match(text, at.end())
        if domain is None or domain.group("tld").lower() not in _COMMON_TLDS or \
                domain.group("first").lower() in _FUNCTION_WORDS:
            continue
        lo = max(0, at.start() - _LOCAL_WINDOW)
        local = _SPELLED_LOCAL.search(text[lo:at.start()].rstrip())
        if local is None:
            continue
        if not _SPELLED_SEP.search(domain.group("rest")) and not any(
                b in at.group() for b in "[({<") and not _SPELLED_SEP.search(local.group()):
            continue
        yield lo + local.start(), domain.end(), "email"


_COMMON_TLDS = frozenset({
    "com", "net", "org", "edu", "gov", "mil", "int", "io", "co", "ai", "app", "dev", "me",
    "info", "biz", "xyz", "online", "site", "tech", "cn", "uk", "de", "fr", "jp", "kr",
    "ru", "in", "br", "au", "ca", "us", "eu", "nl", "es", "it", "ch", "se", "no", "dk",
    "fi", "pl", "be", "at", "ie", "nz", "sg", "hk", "tw", "mx", "ar", "za", "il", "tr",
    "ua", "pt", "gr", "cz", "hu", "ro", "vn", "th", "id", "my", "ph",
})
_RETINA_ASSET = re.compile(r"@[0-9]+(?:\.[0-9]+)?x\.")
_URL_USERINFO_TAIL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@?#]*$")


def find_emails(text: str, _digits: int) -> Iterator[Span]:
    """E-mail addresses in ``text``, written or spelled out."""
    low = text.lower()
    if "at" in low and ("dot" in low or any(hint in low for hint in _SPELLED_HINTS)):
        yield from _spelled(text)
    if "@" not in text and "\uff20" not in text:
        return
    for m in _EMAIL.finditer(text):
        local = m.group()[: max(m.group().find("@"), m.group().find("\uff20"))]
        if local == "git" or _RETINA_ASSET.match(m.group(), len(local)):
            continue
        if _URL_USERINFO_TAIL.search(text, max(0, m.start() - 300), m.start()):
            continue  # the password (or user) of scheme://user:pass@host
        yield m.start(), m.end(), "email"
