"""Text normalisation and keyword terms, the same at write and at query time.

Chinese (and other CJK) runs are segmented with jieba's search mode; everything else is
split on word characters and lower-cased. jieba's dictionary (~0.7 s, ~67 MB) is loaded
only when CJK text first appears: code on the event loop awaits
:func:`load_segmenter_for` before tokenizing text that may hold CJK, so the load happens in
a worker thread, never on the loop. The result is a space-joined string that an
FTS5 ``porter unicode61`` tokenizer (SQLite) or a RediSearch TEXT field indexes as is, so
both backends see identical terms. Stemming of Latin words is left to the index.

Beside jieba's words, each CJK run also gives its character bigrams and single characters
(:func:`cjk_subwords`): a query's single-character word (茶) then finds a memory whose
jieba word is longer (乌龙茶), and a word jieba cuts differently in the query and in the
memory still meets it through the bigrams they share. Text without CJK gets exactly the
terms it got before sub-words existed; :data:`TERMS_VERSION` names the current rule so
stores can re-term what an older rule indexed.
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
_CJK_RUN = re.compile(rf"[{_CJK}]+")
# The rule that turns text into index terms; stores compare it with the one their index
# was built with and re-term stored memories when it changed. 1: jieba words only; 2: also
# the character bigrams and characters of CJK runs; 3: a title cut from the content is not
# indexed beside it (proxy.memory.titles.indexed_text).
TERMS_VERSION = 3
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
    """Whether ``text`` holds a CJK character (ASCII text answered without the regex)."""
    return not text.isascii() and _HAS_CJK.search(text) is not None


# Characters that render as nothing: every format character (category Cf: soft hyphen,
# zero-width space/joiners U+200B–U+200D, LRM/RLM, bidi embeddings, overrides and isolates
# U+202A–U+202E and U+2066–U+2069, word joiner and invisible operators U+2060–U+2064, BOM
# U+FEFF, tag characters U+E0000–U+E007F) and control characters other than whitespace.
_HIDDEN_CATEGORIES = frozenset(("Cf", "Cc"))
# Also invisible, but letters or marks by category: combining grapheme joiner, Hangul
# fillers, variation selectors (dropped only in the detection form).
_HIDDEN_EXTRA = frozenset("\u034f\u115f\u1160\u3164\uffa0") | frozenset(
    chr(c) for c in range(0xFE00, 0xFE10))
# Latin look-alikes NFKC leaves alone that the Unicode confusables data maps to a letter
# other than the one they are read as in an injection (Cyrillic і: "l" by TS #39's
# prototype of the capital, read "i"), or that it lacks. Applied over the data's table.
_CONFUSABLES_EXTRA = {
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o",
    "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "і": "i", "ї": "i", "ј": "j",
    "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w", "һ": "h", "ӏ": "l", "α": "a", "ε": "e",
    "β": "b", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u", "χ": "x",
    "ı": "i", "ɡ": "g", "ɑ": "a", "ɩ": "i", "ʀ": "r",
}
# Sources never mapped: CJK ideographs, kana, Hangul and CJK symbols (〇 is a Chinese zero,
# 丨 a stroke), so Chinese rules and text see Chinese as written.
_NOT_MAPPED = re.compile(rf"[{_CJK}\u2e80-\u2fff\u3000-\u303f\u3100-\u31ff]")


@lru_cache(maxsize=2)
def _latin_skeletons(*, keep_case: bool) -> dict[int, str]:
    """``str.translate`` table: every non-ASCII character that Unicode's confusables data
    (TS #39 ``confusables.txt``, as bundled by the ``confusable-homoglyphs`` package — no
    download) links to an ASCII letter, mapped to that letter; lower-cased unless
    ``keep_case`` (a capital-I look-alike whose prototype is ``l`` then stays ``I``).
    Decimal digits of other scripts stay digits (PII detectors read them), CJK is never
    mapped, ASCII is never mapped (TS #39 would turn ``m`` into ``rn``). ~1,200 entries,
    built in ~20 ms on the first text that is not ASCII."""
    from confusable_homoglyphs.utils import load

    pairs: dict[str, set[str]] = {}
    for source, entries in load("confusables.json").items():
        for entry in entries:
            target = entry["c"]
            if len(source) == 1 and len(target) == 1:
                pairs.setdefault(source, set()).add(target)
                pairs.setdefault(target, set()).add(source)
    table: dict[int, str] = {}
    for source in pairs:
        if source.isascii() or _NOT_MAPPED.match(source) or \
                unicodedata.category(source) == "Nd":
            continue
        # The nearest ASCII letters in the confusables graph (a source may reach its
        # prototype through another look-alike: н → ʜ → H).
        seen, frontier, letters = {source}, [source], set[str]()
        for _ in range(3):
            frontier = [n for ch in frontier for n in pairs[ch] if n not in seen]
            seen.update(frontier)
            letters = {n for n in frontier if n.isascii() and n.isalpha()}
            if letters or not frontier:
                break
        if len(letters) == 1:
            letter = letters.pop()
            if keep_case:
                if letter == "l" and unicodedata.category(source) == "Lu":
                    letter = "I"
            else:
                letter = letter.lower()
            table[ord(source)] = letter
    for source, letter in _CONFUSABLES_EXTRA.items():
        table[ord(source)] = letter
        if keep_case and source.upper() != source and len(source.upper()) == 1 \
                and ord(source.upper()) not in table:
            table[ord(source.upper())] = letter.upper()
    return table


def load_confusables() -> None:
    """Build the confusables tables now (~50–80 ms of CPU, blocking: call it off the event
    loop at startup; otherwise the first text that is not ASCII pays for it)."""
    _latin_skeletons(keep_case=False)
    _latin_skeletons(keep_case=True)


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


def _unmarked(text: str, *, keep_case: bool) -> tuple[str, bool]:
    """NFKC, invisible characters and combining marks removed, case-folded unless
    ``keep_case``; and whether the text is plain ASCII (nothing left to map)."""
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
    return folded, plain


def detection_form(text: str, *, keep_case: bool = False) -> str:
    """The one canonical form every memory text rule (directive, link, JSON, placeholder,
    subject checks; learned and manual memories alike) is decided on, so no spelling the
    model reads the same way slips past a rule written for plain ASCII:

    NFKC (full-width, mathematical alphanumerics and other compatibility forms → ASCII:
    ``Ｉｇｎｏｒｅ``, ``𝐢𝐠𝐧𝐨𝐫𝐞`` → ``ignore``, ``：／／`` → ``://``); invisible characters
    removed (:func:`strip_invisible`: zero-width, soft hyphen, bidi overrides; plus
    variation selectors, the combining grapheme joiner and Hangul fillers); combining marks
    removed (``ignóre`` → ``ignore``); case-folded (unless ``keep_case``, for detectors
    whose patterns are case-sensitive, such as API key formats); every Unicode confusable
    of a Latin letter mapped to that letter (Cyrillic, Greek, Armenian, Cherokee, IPA …:
    :func:`_latin_skeletons`; CJK and ASCII untouched); whitespace collapsed: a run holding
    a line break becomes ``"\\n"`` (so rules anchored at a line start still see lines), any
    other run one space; trimmed. Never stored or shown: it exists to be matched against.
    """
    folded, plain = _unmarked(text, keep_case=keep_case)
    if not plain:
        folded = folded.translate(_latin_skeletons(keep_case=keep_case))
    return _SPACE.sub(_collapse_space, folded).strip()


_WORD = re.compile(r"\w+")
_SEPARATOR = r"[^\w\n]{1,3}"  # 1–3 spaces or punctuation marks on one line
# Three or more single letters, each standing alone, separated: "i g n o r e",
# "i.g.n.o.r.e", "i - g - n". Joined when four or more, or when the three spell "you" (the
# one short word that opens an order or persona switch, "y o u are now …"): other runs of
# three are initials and abbreviations ("J. R. R.", "U.S.A.", "A, C, T and G") and stay.
_SPELLED = re.compile(rf"(?<!\w)[a-z](?:{_SEPARATOR}[a-z](?!\w)){{2,}}")
# The words the English rules are written with (proxy/memory/directives.py). A word split
# by spaces or punctuation ("ign ore", "in-structions") is joined back when the pieces spell
# one of them, and a run of spelled letters is split back into them
# ("ignorepreviousinstructions" → "ignore previous instructions"), longest first.
RULE_WORDS = (
    "ignore", "disregard", "forget", "override", "bypass", "overrule", "abandon", "discard",
    "previous", "prior", "earlier", "preceding", "above", "everything", "instructions",
    "instruction", "rules", "rule", "prompts", "prompt", "guidelines", "guidance",
    "directives", "policy", "policies", "system", "assistant", "developer", "pretend",
    "roleplay", "behave", "always", "never", "must", "should", "answer", "reply",
    "respond", "from", "now", "you", "are", "act", "all", "any", "your", "the", "new",
)
_RULE_WORD_SPLIT = re.compile("|".join(sorted(RULE_WORDS, key=len, reverse=True)))


def _spelled_out(match: re.Match[str]) -> str:
    letters = "".join(ch for ch in match.group() if ch.isalpha())
    if len(letters) < 4 and letters != "you":
        return match.group()
    return _SPACE.sub(" ", _RULE_WORD_SPLIT.sub(r" \g<0> ", letters)).strip()


# A rule word of four letters or more with 1–3 spaces or punctuation marks between any of
# its letters ("ign ore", "in-structions", "s.y.s.t.e.m"), as a whole word.
_SPLIT_RULE_WORD = re.compile(r"(?<!\w)(?:" + "|".join(
    f"(?:{_SEPARATOR})?".join(word)
    for word in sorted((w for w in RULE_WORDS if len(w) >= 4), key=len, reverse=True)
) + r")(?!\w)")
_NOT_LETTER = re.compile(r"[^a-z]+")


def _rejoined(match: re.Match[str]) -> str:
    return _NOT_LETTER.sub("", match.group())


def _rejoin_split_words(form: str) -> str:
    """``form`` with each rule word of four letters or more that is split by 1–3 spaces or
    punctuation marks between its letters (``ign ore``) joined back (``ignore``)."""
    return _SPLIT_RULE_WORD.sub(_rejoined, form)


def _transliterate_mixed(folded: str) -> str:
    """``folded`` with each word that mixes ASCII letters with letters of another script
    (``iгnore``) transliterated to ASCII (the ``anyascii`` package's tables, no download):
    such a word is read by its sound (г → g) as much as by its look (г → r). Words wholly
    in one script, and CJK characters, are left as they are."""
    def fix(match: re.Match[str]) -> str:
        word = match.group()
        if word.isascii() or not any("a" <= ch <= "z" for ch in word):
            return word
        from anyascii import anyascii

        return "".join(
            anyascii(ch).lower() if not ch.isascii() and not _NOT_MAPPED.match(ch) else ch
            for ch in word
        )

    return _WORD.sub(fix, folded)


def detection_forms(text: str) -> tuple[str, ...]:
    """The distinct forms the directive rules are checked on, :func:`detection_form` first:
    that form with words mixing Latin and other letters transliterated (``Iгnore`` →
    ``ignore``), and each of those with spelled-out letters and split words joined back
    (``i g n o r e``, ``i.g.n.o.r.e``, ``ign ore`` → ``ignore``). One to four strings; a
    text breaks a rule when any of them does."""
    folded, plain = _unmarked(text, keep_case=False)
    bases = [_SPACE.sub(_collapse_space, folded.translate(
        _latin_skeletons(keep_case=False)) if not plain else folded).strip()]
    if not plain:
        mixed = _transliterate_mixed(folded)
        if mixed != folded:
            bases.append(_SPACE.sub(_collapse_space, mixed.translate(
                _latin_skeletons(keep_case=False))).strip())
    forms = list(bases)
    for base in bases:
        joined = _rejoin_split_words(_SPELLED.sub(_spelled_out, base))
        if joined not in forms:
            forms.append(joined)
    return tuple(forms)


@lru_cache(maxsize=8192)
def fold_char(ch: str) -> str:
    """One character as the detection form would read it, case aside: its NFKC form (may be
    several characters: ``ß`` stays, ``ﬁ`` → ``fi``) with Latin look-alikes mapped and
    case-folded; ``""`` for invisible characters and combining marks. For matching a
    pattern on a folded view while cutting from the text as written."""
    if ch in _HIDDEN_EXTRA or unicodedata.combining(ch) or (
            not ch.isspace() and unicodedata.category(ch) in _HIDDEN_CATEGORIES):
        return ""
    return unicodedata.normalize("NFKC", ch).casefold().translate(
        _latin_skeletons(keep_case=False))


def normalize(text: str) -> str:
    """NFKC, lower-case, collapsed whitespace, trimmed punctuation: the dedup key
    (docs/design.md#evidence)."""
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


def cjk_subwords(run: str) -> list[str]:
    """The character bigrams of one CJK run, in order, then its characters:
    ``乌龙茶`` → ``乌龙 龙茶 乌 龙 茶``. A one-character run gives just that character."""
    return [run[i:i + 2] for i in range(len(run) - 1)] + list(run)


def _cjk_runs(text: str) -> list[str]:
    return _CJK_RUN.findall(unicodedata.normalize("NFKC", text))


def index_terms(text: str) -> str:
    """The space-joined term string stored in the keyword index for ``text``: its
    :func:`tokens`, then the :func:`cjk_subwords` of its CJK runs that are not already
    among them (repeats of a sub-word kept: they are its term frequency). Text without
    CJK gives its tokens alone, as before sub-words existed."""
    words = tokens(text)
    if text.isascii() or not has_cjk(text):
        return " ".join(words)
    seen = set(words)
    extra = [t for run in _cjk_runs(text) for t in cjk_subwords(run) if t not in seen]
    return " ".join((*words, *extra))


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


def query_terms(text: str, *, limit: int = 32, subwords: bool = True) -> list[str]:
    """Distinct content terms of a query, first ``limit`` of them, in order: its words
    (:func:`content_terms`), then — with ``subwords`` and only for CJK runs — the runs'
    character bigrams not already among them that are not made of stopwords alone
    (``推荐一款茶吧`` → ``推荐 一款 茶 荐一 款茶 茶吧``). The index holds each CJK
    character too, so a one-character word (茶) matches inside longer words (乌龙茶).
    Text without CJK gives exactly its words. ``subwords=False`` is for callers that
    require every term (substring filters), where a bigram spanning two words would narrow
    the match."""
    seen: dict[str, None] = {}
    for term in content_terms(text):
        if term not in seen:
            seen[term] = None
            if len(seen) >= limit:
                return list(seen)
    if subwords and not text.isascii() and has_cjk(text):
        for pair in _query_bigrams(text):
            if pair not in seen:
                seen[pair] = None
                if len(seen) >= limit:
                    break
    return list(seen)


@lru_cache(maxsize=4096)
def _query_bigrams(text: str) -> tuple[str, ...]:
    """The character bigrams of ``text``'s CJK runs, in order, less those that are a
    stopword or made of two stopword characters (memoised like :func:`tokens`: a chat's
    history is asked again on every turn)."""
    return tuple(
        pair for run in _cjk_runs(text) for pair in (run[i:i + 2] for i in range(len(run) - 1))
        if pair not in STOPWORDS and not (pair[0] in STOPWORDS and pair[1] in STOPWORDS)
    )


_PORTER: Any = None
# FTS5's porter tokenizer stems tokens of 3 to 64 bytes and passes the others through.
PORTER_MIN_BYTES, PORTER_MAX_BYTES = 3, 64


@lru_cache(maxsize=65_536)
def _stem(term: str) -> str:
    global _PORTER  # noqa: PLW0603 - one stateless stemmer, built on first use
    if not PORTER_MIN_BYTES <= len(term.encode()) <= PORTER_MAX_BYTES:
        return term
    if _PORTER is None:
        import snowballstemmer

        _PORTER = snowballstemmer.stemmer("porter")
    stemmed: str = _PORTER.stemWord(term)
    return stemmed


def stemmed_terms(terms: str) -> str:
    """Space-separated terms as SQLite's ``porter unicode61 remove_diacritics 2`` tokenizer
    indexes them: Latin diacritics folded, then Porter-stemmed (snowballstemmer's
    ``porter``, the same original algorithm; on the vocabulary of this repository and
    its benchmark data — 6,203 distinct tokens — they disagree on 3). The Redis TEXT field
    is ``NOSTEM`` and receives these stems at write *and* query time: RediSearch's own
    stemming would index each word twice (the word and ``+stem``) and credit a query term
    with a stem variant twice, so words with a distinct stem would outweigh those without
    and rankings would drift from SQLite's."""
    return " ".join(_stem(t) for t in fold_diacritics(terms).split())
