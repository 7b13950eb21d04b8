"""``secret`` → ``[SECRET]``: vendor key formats (OpenAI/Anthropic ``sk-``, GitHub
``ghp_``…/``github_pat_``, Slack ``xox?-``, AWS ``AKIA``/``ASIA``, Google ``AIza``, Stripe
``sk_live_``…), also pasted in equal groups separated by spaces, dashes or dots
(``AKIA-IOSF-ODNN-7EXA-MPLE``, ``sk- abcd 1234 …``), JWTs, ``Bearer``/``Authorization``
credentials, PEM private-key blocks
(whole block; a truncated block up to the end of its base64 body), the password in
``scheme://user:password@host``, the value of assignments whose name ends in a secret word
(``OPENAI_API_KEY=sk-…`` → ``OPENAI_API_KEY=[SECRET]``, ``"password": "…"``, ``--token x``,
``密码 = …``), ``my password is …`` when the value has a digit or symbol, and generic
tokens: a run of ≥ 32 characters of ``[A-Za-z0-9+/_-]`` (plus ``=`` padding) with letters
and digits, Shannon entropy ≥ 4.0 bits/char, and either ≥ 4 letter/digit alternations or
a lower/upper/digit class change at ≥ half the positions (random strings alternate; words,
paths and camelCase identifiers do not; ~1.5 % of random 32-character base62 strings are
missed, ~0.2 % at 40). Pure hex shorter than 64 characters
(git shas, MD5/SHA-1 digests) and UUIDs are identifiers, not secrets, and are kept; inside
URLs only single path segments are judged, never the path as a whole. A key or token pasted
one character at a time (``s k - p r o j - …``, ``A.K.I.A.…``; one repeated separator, at
least 16 characters) is judged the same way once the separators are removed.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator

from proxy.learning.pii.findings import Span

_KEY_CHARS = "A-Za-z0-9_-"
_KEY_CHAR_SET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# No leading look-behind (it would defeat the regex engine's first-character scan); the
# character before a match is checked in code instead.
_VENDOR_KEY = re.compile(
    r"(?:"
    r"sk-ant-[A-Za-z0-9_-]{16,}"
    r"|sk-[A-Za-z0-9_-]{16,}"
    r"|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{35}"
    r"|eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}"
    rf")(?![{_KEY_CHARS}])"
)
# The same keys pasted with separators between groups ("sk- abcd 1234 …",
# "AKIA-IOSF-ODNN-7EXA-MPLE"): the prefix, then >= 3 groups of key characters of one length
# (the last may be shorter) separated by one space, dash or dot — words of prose differ in
# length — judged on the characters without the separators (:func:`_separated_key`).
_SEPARATED_KEY = re.compile(
    r"(?<![A-Za-z0-9_])(?P<prefix>sk-ant-|sk-|(?:sk|rk|pk)_(?:live|test)_|gh[pousr]_"
    r"|github_pat_|xox[abposr]-|AKIA|ASIA|AIza)[ .\-]?"
    r"(?P<body>[A-Za-z0-9_]{2,}(?:[ .\-][A-Za-z0-9_]{2,}){2,})(?![A-Za-z0-9_])"
)
_PEM = re.compile(
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?:"
    r"[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY-----"  # whole block
    # truncated paste: RFC 1421 header lines and base64 chunks of >= 16 characters
    r"|(?:\s*\n[A-Za-z-]+:[^\n]*|\s+[A-Za-z0-9+/]{16,}={0,2})*"
    r")"
)
_BEARER = re.compile(
    r"(?<![A-Za-z])(?:Bearer|bearer|BEARER)\s+(?P<v>[A-Za-z0-9._~+/=-]{8,})"
    r"|(?i:authorization)\s*[:=]\s*[\"']?(?i:basic|token|digest)\s+(?P<b>[A-Za-z0-9._~+/=-]{8,})"
)
_URL_CREDENTIALS = re.compile(
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@?#]*:(?P<v>[^\s/@?#]+)@"
)
_SENSITIVE_NAME = (
    r"(?:api[_-]?key|apikey|api[_-]?secret|secret|secret[_-]?key|access[_-]?key(?:[_-]?id)?"
    r"|private[_-]?key|token|passw(?:or)?d|passphrase|passcode|credentials?)"
)
_BARE_VALUE = r"[^\s\"'`,;&<>]*[^\s\"'`,;&<>.)\]}!?:]"
# Anchored on the sensitive word at the end of the name (whatever precedes it is kept).
_ASSIGNMENT = re.compile(
    rf"{_SENSITIVE_NAME}[\"']?"
    r"\s*(?::=|=>|==|[:=])\s*"
    rf"(?:\"(?P<dq>[^\"\n]{{1,256}})\"|'(?P<sq>[^'\n]{{1,256}})'|(?P<v>{_BARE_VALUE}))",
    re.IGNORECASE,
)
_FLAG = re.compile(
    rf"(?<![A-Za-z0-9_-])--?[A-Za-z0-9_-]*?{_SENSITIVE_NAME}\s+(?P<v>{_BARE_VALUE})",
    re.IGNORECASE,
)
_PROSE_PASSWORD = re.compile(
    rf"(?<![A-Za-z])(?:password|passcode|passphrase|pin)\s+(?:is|was)\s+[\"']?(?P<v>{_BARE_VALUE})",
    re.IGNORECASE,
)
# 密码 password, 口令 passphrase, 密钥/秘钥 secret key, 令牌 token, 验证码 one-time code;
# \uff1a is the full-width colon.
_ZH_PASSWORD = re.compile(
    r"(?:密码|口令|密钥|秘钥|令牌|验证码)\s*(?:[:=\uff1a]|是|为)\s*(?P<v>[!-~]+)"
)
_VALUE_STOPWORDS = frozenset(
    {"none", "null", "nil", "true", "false", "str", "string", "bytes", "int", "optional",
     "undefined", "required", "secretstr", "env", "redacted", "hidden"}
)
_CODE_EXPRESSION = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*[(\[]")  # getenv( / os.environ[
_ASSIGNMENT_GATE = ("key", "secret", "token", "pass", "credential")
_RANDOM_RUN = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{32,}={0,2}(?![A-Za-z0-9+/_-])")
_HEX_OR_UUID = re.compile(r"[0-9A-Fa-f-]+")
_MIN_ENTROPY = 4.0
_MIN_ALTERNATIONS = 4
_MIN_SWITCH_RATIO = 0.5


def shannon_entropy(text: str) -> float:
    """Shannon entropy of ``text`` in bits per character (0.0 for empty text)."""
    n = len(text)
    if not n:
        return 0.0
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def _class_switches(text: str) -> tuple[int, int]:
    """(letter/digit alternations, lower/upper/digit class changes) between adjacent
    alphanumerics; separators are skipped."""
    alternations = switches = 0
    prev = 0  # 1 lower, 2 upper, 3 digit
    for ch in text:
        if "a" <= ch <= "z":
            cur = 1
        elif "A" <= ch <= "Z":
            cur = 2
        elif "0" <= ch <= "9":
            cur = 3
        else:
            continue
        if prev and cur != prev:
            switches += 1
            if cur == 3 or prev == 3:
                alternations += 1
        prev = cur
    return alternations, switches


def _looks_random(token: str) -> bool:
    """Whether a run of token characters reads as a random secret rather than a word,
    identifier or path: ≥ 32 characters, letters and digits, not hex/UUID, entropy ≥ 4.0,
    and letters/digits alternating ≥ 4 times or the character class changing at ≥ half of
    the positions (camelCase identifiers change at about 0.4, random base62 at about 0.6)."""
    body = token.rstrip("=")
    if len(body) < 32:
        return False
    if not any(c.isdigit() for c in body) or not any(c.isalpha() for c in body):
        return False
    if _HEX_OR_UUID.fullmatch(body) and sum(c != "-" for c in body) < 64:
        return False  # git shas, digests, UUIDs: identifiers
    if shannon_entropy(body) < _MIN_ENTROPY:
        return False
    alternations, switches = _class_switches(body)
    return alternations >= _MIN_ALTERNATIONS or switches >= _MIN_SWITCH_RATIO * len(body)


def _secret_value_ok(value: str) -> bool:
    """Whether an assignment's value may be a secret (not a reference, type or keyword)."""
    if value[0] in "$%{" or value.lower() in _VALUE_STOPWORDS or set(value) <= {"*", "x", "."}:
        return False
    return not _CODE_EXPRESSION.fullmatch(value)


def _value_group(m: re.Match[str]) -> tuple[int, int] | None:
    for name in ("dq", "sq", "v", "b"):
        if name in m.re.groupindex and m.group(name) is not None:
            return m.start(name), m.end(name)
    return None


_ZH_TRAILING = ".,;:)]}"  # "!" and "?" are common inside passwords


def find_secrets(text: str, _digits: int) -> Iterator[Span]:
    """Keys, tokens, passwords and private keys in ``text``."""
    low = text.lower()
    for m in _VENDOR_KEY.finditer(text):
        if m.start() and text[m.start() - 1] in _KEY_CHAR_SET:
            continue  # inside a longer token
        if _vendor_key_ok(m.group()):
            yield m.start(), m.end(), "secret"
    for m in _SEPARATED_KEY.finditer(text):
        end = _separated_key(m)
        if end is not None:
            yield m.start(), end, "secret"
    if "PRIVATE KEY-----" in text:
        for m in _PEM.finditer(text):
            yield m.start(), m.end(), "secret"
    if "bearer" in low or "authorization" in low:
        for m in _BEARER.finditer(text):
            span = _value_group(m)
            value = m.group("v") or m.group("b")
            if span and (any(c.isdigit() for c in value) or len(value) >= 20):
                yield span[0], span[1], "secret"
    if "://" in text and "@" in text:
        for m in _URL_CREDENTIALS.finditer(text):
            yield m.start("v"), m.end("v"), "secret"
    if any(word in low for word in _ASSIGNMENT_GATE):
        for pattern in (_ASSIGNMENT, _FLAG):
            for m in pattern.finditer(text):
                span = _value_group(m)
                if span and _secret_value_ok(text[span[0] : span[1]]):
                    yield span[0], span[1], "secret"
    if "pass" in low or "pin" in low:
        for m in _PROSE_PASSWORD.finditer(text):
            value = m.group("v")
            if len(value) >= 4 and any(not c.isalpha() for c in value):
                yield m.start("v"), m.end("v"), "secret"
    for m in _ZH_PASSWORD.finditer(text):
        start, end = m.start("v"), m.end("v")
        while end > start and text[end - 1] in _ZH_TRAILING:
            end -= 1
        if end > start and _secret_value_ok(text[start:end]):
            yield start, end, "secret"
    for m in _RANDOM_RUN.finditer(text):
        yield from _random_spans(text, m)
    if len(text) >= 2 * _MIN_SPACED_CHARS - 1:
        yield from _letter_spaced(text)


# A key pasted one character at a time ("s k - p r o j - A b 1 …", "A.K.I.A.…"): single key
# characters joined by one repeated separator (one or two spaces, ".", "·", ",", ", "),
# judged once the separators are removed like a contiguous token.
_MIN_SPACED_CHARS = 16
_SPACED_CHAR = "[A-Za-z0-9_+/=-]"
_SPACED_RUN = re.compile(
    rf"(?<![A-Za-z0-9_+/=-]){_SPACED_CHAR}(?P<sep>[ \t]{{1,2}}|[.·]|, ?)"
    rf"(?:{_SPACED_CHAR}(?P=sep)){{{_MIN_SPACED_CHARS - 2},}}{_SPACED_CHAR}"
    rf"(?![A-Za-z0-9_+/=-])"
)


def _letter_spaced(text: str) -> Iterator[Span]:
    """Letter-spaced runs that, joined, are a vendor key (:data:`_VENDOR_KEY`, with the
    same check of ``sk-`` prose) or a random-looking token (:func:`_looks_random`); spelled
    words, initials and digit lists join to neither."""
    for m in _SPACED_RUN.finditer(text):
        joined = m.group()[:: len(m.group("sep")) + 1]
        if (_VENDOR_KEY.fullmatch(joined) and _vendor_key_ok(joined)) or _looks_random(joined):
            yield m.start(), m.end(), "secret"


def _vendor_key_ok(token: str) -> bool:
    """A :data:`_VENDOR_KEY` match is a key, not prose: an ``sk-`` body holds a digit or
    mixed case ("sk-learn-compatible-estimators" is prose)."""
    if token.startswith("sk-") and not token.startswith("sk-ant-"):
        body = token[3:]
        mixed = any(c.isupper() for c in body) and any(c.islower() for c in body)
        return any(c.isdigit() for c in body) or mixed
    return True


_KEY_GROUP = re.compile(r"[A-Za-z0-9_]+")


def _separated_key(m: re.Match[str]) -> int | None:
    """End of the key a :data:`_SEPARATED_KEY` match holds, or ``None``: its groups of one
    length (and one shorter last group), at least three of them, forming a key
    (:func:`_separated_key_ok`)."""
    body_text = m.group("body")
    groups = list(_KEY_GROUP.finditer(body_text))
    size = len(groups[0].group())
    separator = body_text[groups[0].end():groups[1].start()]

    def joined(i: int) -> bool:  # group i follows the one before with the same separator
        return body_text[groups[i - 1].end():groups[i].start()] == separator

    taken = 1
    while taken < len(groups) and len(groups[taken].group()) == size and joined(taken):
        taken += 1
    if taken < len(groups) and len(groups[taken].group()) < size and joined(taken):
        taken += 1
    if taken < 3:
        return None
    body = "".join(g.group() for g in groups[:taken])
    if not _separated_key_ok(m.group("prefix"), body):
        return None
    return m.start("body") + groups[taken - 1].end()


def _separated_key_ok(prefix: str, body: str) -> bool:
    """A vendor key once its separators are removed: AWS and Google keys by their exact
    shape, the others with >= 16 characters holding a digit (prose after "sk-" has none)."""
    if prefix in ("AKIA", "ASIA"):
        return len(body) == 16 and body.isalnum() and body == body.upper()
    if prefix == "AIza":
        return len(body) == 35
    return len(body) >= 16 and any(c.isdigit() for c in body)


def _random_spans(text: str, m: re.Match[str]) -> Iterator[Span]:
    """High-entropy tokens in one run; inside a URL or path only single segments count."""
    run = m.group()
    line_start = max(text.rfind(" ", 0, m.start()), text.rfind("\n", 0, m.start())) + 1
    in_url = "://" in text[line_start : m.start()] or run.startswith("/")
    if "/" in run and in_url:
        offset = m.start()
        for segment in run.split("/"):
            if _looks_random(segment):
                yield offset, offset + len(segment), "secret"
            offset += len(segment) + 1
    elif _looks_random(run):
        yield m.start(), m.end(), "secret"
