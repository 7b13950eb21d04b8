"""``email`` → ``[EMAIL]``: practical RFC 5322 subset (dot-atom local part, plus-addressing,
subdomains, alphabetic TLD), also with a full-width ``＠``/``．``; and addresses spelled
out as "name at domain dot tld" (``at``/``dot`` as words or in brackets) when the last
label is a common TLD. Not ``@mentions``, ``icon@2x.png`` asset names, or ``git@host``.
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
# "alice AT example DOT org". The last label must be a common top-level domain, so
# "look at this dot product" stays prose.
_AT_WORD = r"\s*(?:[\[({<]\s*(?i:at)\s*[\])}>]|(?<=\s)(?i:at)(?=\s))\s*"
_DOT_WORD = r"\s*(?:[\[({<]\s*(?i:dot)\s*[\])}>]|(?<=\s)(?i:dot)(?=\s))\s*"
_SPELLED_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*" + _AT_WORD
    + r"[A-Za-z0-9][A-Za-z0-9-]*(?:" + _DOT_WORD + r"[A-Za-z0-9][A-Za-z0-9-]*)*"
    + _DOT_WORD + r"(?P<tld>[A-Za-z]{2,6})(?![A-Za-z0-9])"
)
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
    if "at" in low and "dot" in low:
        for m in _SPELLED_EMAIL.finditer(text):
            if m.group("tld").lower() in _COMMON_TLDS:
                yield m.start(), m.end(), "email"
    if "@" not in text and "\uff20" not in text:
        return
    for m in _EMAIL.finditer(text):
        local = m.group()[: max(m.group().find("@"), m.group().find("\uff20"))]
        if local == "git" or _RETINA_ASSET.match(m.group(), len(local)):
            continue
        if _URL_USERINFO_TAIL.search(text, max(0, m.start() - 300), m.start()):
            continue  # the password (or user) of scheme://user:pass@host
        yield m.start(), m.end(), "email"
