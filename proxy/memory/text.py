"""Text normalisation and keyword terms, the same at write and at query time.

Chinese (and other CJK) runs are segmented with jieba's search mode; everything else is
split on word characters and lower-cased. jieba's dictionary (~0.7 s, ~67 MB) is loaded
only when CJK text first appears: code on the event loop awaits
:func:`load_segmenter_for` before tokenizing text that may hold CJK, so the load happens in
a worker thread, never on the loop. The result is a space-joined string that an
FTS5 ``porter unicode61`` tokenizer (SQLite) or a RediSearch TEXT field indexes as is, so
both backends see identical terms. Stemming of Latin words is left to the index.
"""

from __future__ import annotations

import asyncio
import re
import threading
import unicodedata
from functools import lru_cache
from typing import Any

_CJK = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
_RUN = re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)", re.UNICODE)
_HAS_CJK = re.compile(rf"[{_CJK}]")
_SPACE = re.compile(r"\s+")
# Latin-1 Supplement, Latin Extended-A/B, Latin Extended Additional: letters with marks.
_LATIN_MARKED = re.compile("[\u00c0-\u024f\u1e00-\u1eff]")

# Words too common to help keyword recall (English function words; Chinese particles).
STOPWORDS = frozenset((
    "a", "an", "the", "and", "or", "but", "if", "then", "else", "of", "to", "in", "on", "at",
    "by", "for", "with", "from", "into", "over", "under", "about", "as", "is", "am", "are",
    "was", "were", "be", "been", "being", "do", "does", "did", "doing", "have", "has", "had",
    "having", "i", "me", "my", "mine", "myself", "you", "your", "yours", "we", "us", "our",
    "they", "them", "their", "he", "him", "his", "she", "her", "it", "its", "this", "that",
    "these", "those", "there", "here", "what", "which", "who", "whom", "whose", "when",
    "where", "why", "how", "all", "any", "both", "each", "few", "more", "most", "other",
    "some", "such", "no", "nor", "not", "only", "own", "same", "so", "than", "too", "very",
    "can", "will", "just", "should", "would", "could", "may", "might", "must", "shall", "s",
    "t", "don", "doesn", "didn", "won", "isn", "aren", "wasn", "weren", "ve", "ll", "re", "d",
    "m", "o", "y", "also", "up", "down", "out", "off", "again", "further", "once", "let",
    "lets", "get", "got", "please", "tell", "know", "的", "了", "是", "在", "我", "你", "他", "她",
    "它", "们", "和", "与", "或", "也", "就", "都", "而", "及", "着", "吗", "呢", "吧", "啊", "呀", "嘛", "哦",
    "很", "这", "那", "有", "没", "不", "一个", "什么", "怎么", "为什么", "吗", "把", "被", "让", "给", "对", "从",
    "到", "为", "以", "之", "其", "中", "上", "下", "个", "要", "会", "能",
))

_jieba_lock = threading.Lock()
_jieba: Any = None


def _segmenter() -> Any:
    """jieba, imported and initialised once (its dictionary takes ~0.7 s to load)."""
    global _jieba  # noqa: PLW0603 - one process-wide, read-only dictionary, loaded lazily
    if _jieba is None:
        with _jieba_lock:
            if _jieba is None:
                import jieba

                jieba.setLogLevel(60)
                jieba.initialize()
                _jieba = jieba
    return _jieba


def warm_up() -> None:
    """Load the Chinese dictionary now (blocking: call it off the event loop)."""
    _segmenter()


def segmenter_loaded() -> bool:
    return _jieba is not None


async def load_segmenter_for(*texts: str) -> None:
    """Load the Chinese dictionary in a worker thread when one of ``texts`` holds CJK and
    it is not loaded yet; returns at once otherwise. Await it on the event loop before
    :func:`tokens` & co. may meet CJK text."""
    if _jieba is None and has_cjk("\n".join(texts)):
        await asyncio.to_thread(_segmenter)


def has_cjk(text: str) -> bool:
    return _HAS_CJK.search(text) is not None


# Characters that render as nothing: every format character (category Cf: soft hyphen,
# zero-width space/joiners U+200B–U+200D, LRM/RLM, bidi embeddings, overrides and isolates
# U+202A–U+202E and U+2066–U+2069, word joiner and invisible operators U+2060–U+2064, BOM
# U+FEFF, tag characters U+E0000–U+E007F) and control characters other than whitespace.
_HIDDEN_CATEGORIES = frozenset(("Cf", "Cc"))
# Also invisible, but letters or marks by category: combining grapheme joiner, Hangul
# fillers, variation selectors (dropped only in the detection form).
_HIDDEN_EXTRA = frozenset("\u034f\u115f\u1160\u3164\uffa0") | frozenset(
    chr(c) for c in range(0xFE00, 0xFE10))
# Latin look-alikes from other scripts (Cyrillic, Greek, IPA) that NFKC leaves alone, so
# "іgnоre" (Cyrillic і, о) reads as "ignore" to the filters. Detection form only.
_CONFUSABLES = str.maketrans({
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o",
    "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "і": "i", "ї": "i", "ј": "j",
    "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w", "һ": "h", "ӏ": "l", "α": "a", "ε": "e",
    "β": "b", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u", "χ": "x",
    "ı": "i", "ɡ": "g", "ɑ": "a", "ɩ": "i", "ʀ": "r",
})
_LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


def strip_invisible(text: str) -> str:
    """``text`` without format characters (zero-width, bidi controls, BOM, soft hyphen, tag
    characters: Unicode category Cf) and control characters other than whitespace (Cc).
    Everything visible is kept as written; used on memory text before it is stored."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(
        ch for ch in text
        if ch.isspace() or unicodedata.category(ch) not in _HIDDEN_CATEGORIES
    )


def _collapse_space(match: re.Match[str]) -> str:
    return "\n" if any(ch in _LINE_BREAKS for ch in match.group()) else " "


def detection_form(text: str, *, keep_case: bool = False) -> str:
    """The one canonical form every memory text rule (directive, link, JSON, placeholder,
    subject checks; learned and manual memories alike) is decided on, so no spelling the
    model reads the same way slips past a rule written for plain ASCII:

    NFKC (full-width and other compatibility forms → ASCII: ``Ｉｇｎｏｒｅ`` → ``Ignore``,
    ``：／／`` → ``://``); invisible characters removed (:func:`strip_invisible`, plus
    variation selectors, the combining grapheme joiner and Hangul fillers); combining marks
    removed (``ignóre`` → ``ignore``); common Cyrillic/Greek look-alikes of Latin letters
    mapped to them; case-folded (unless ``keep_case``, for detectors whose patterns are
    case-sensitive, such as API key formats); whitespace collapsed: a run holding a line
    break becomes ``"\\n"`` (so rules anchored at a line start still see lines), any other
    run one space; trimmed. Never stored or shown: it exists to be matched against.
    """
    folded = unicodedata.normalize("NFKC", strip_invisible(text))
    plain = folded.isascii()
    if not plain:
        decomposed = unicodedata.normalize("NFD", folded)
        folded = unicodedata.normalize("NFC", "".join(
            ch for ch in decomposed
            if ch not in _HIDDEN_EXTRA and not unicodedata.combining(ch)
        ))
    if not keep_case:
        folded = folded.casefold()
    if not plain:
        folded = folded.translate(_CONFUSABLES)
    return _SPACE.sub(_collapse_space, folded).strip()


@lru_cache(maxsize=8192)
def fold_char(ch: str) -> str:
    """One character as the detection form would read it, case aside: its NFKC form (may be
    several characters: ``ß`` stays, ``ﬁ`` → ``fi``) with Latin look-alikes mapped and
    case-folded; ``""`` for invisible characters and combining marks. For matching a
    pattern on a folded view while cutting from the text as written."""
    if ch in _HIDDEN_EXTRA or unicodedata.combining(ch) or (
            not ch.isspace() and unicodedata.category(ch) in _HIDDEN_CATEGORIES):
        return ""
    return unicodedata.normalize("NFKC", ch).casefold().translate(_CONFUSABLES)


def normalize(text: str) -> str:
    """NFKC, lower-case, collapsed whitespace, trimmed punctuation: the dedup key (SPEC §3.6)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    folded = re.sub(r"[^\w\s]", " ", folded)
    return _SPACE.sub(" ", folded).strip()


@lru_cache(maxsize=4096)
def tokens(text: str) -> tuple[str, ...]:
    """Keyword tokens of ``text``: lower-cased words and jieba-segmented CJK words."""
    out: list[str] = []
    for match in _RUN.finditer(unicodedata.normalize("NFKC", text)):
        cjk, word = match.groups()
        if cjk:
            out.extend(w for w in _segmenter().cut_for_search(cjk) if w.strip())
        elif word:
            out.append(word.casefold())
    return tuple(out)


def content_terms(text: str) -> tuple[str, ...]:
    """Tokens minus stopwords and single Latin letters, in order, duplicates kept."""
    return tuple(
        t for t in tokens(text)
        if t not in STOPWORDS and not (len(t) == 1 and t.isascii())
    )


def index_terms(text: str) -> str:
    """The space-joined term string stored in the keyword index for ``text``."""
    return " ".join(tokens(text))


def fold_diacritics(text: str) -> str:
    """Latin letters without their diacritics (``café`` → ``cafe``, ``Ł`` stays: it has no
    combining mark). SQLite's ``unicode61 remove_diacritics 2`` tokenizer does this inside
    the index; RediSearch does not, so the Redis store applies it to indexed and queried
    terms alike. Other scripts are left untouched (kana keep their voicing marks)."""
    if _LATIN_MARKED.search(text) is None:
        return text

    def bare(match: re.Match[str]) -> str:
        return "".join(c for c in unicodedata.normalize("NFD", match.group())
                       if not unicodedata.combining(c))

    return _LATIN_MARKED.sub(bare, text)


def query_terms(text: str, *, limit: int = 32) -> list[str]:
    """Distinct content terms of a query, first ``limit`` of them, in order."""
    seen: dict[str, None] = {}
    for term in content_terms(text):
        if term not in seen:
            seen[term] = None
            if len(seen) >= limit:
                break
    return list(seen)
