"""Which personal memories read as general knowledge, and so may be shared with a tenant
(docs/design.md#promotion).

A shared memory is injected into every user's prompt as a plain line ("- <text>"), the way
a user's own memories about themselves are. A memory about its owner — the note-style
facts learning writes without a subject ("Is allergic to hazelnuts", "Prefers short
answers"), or a text in the first person ("My manager is Dana", 我对坚果过敏) —
would then read to the model as a fact about whichever user is asking. ("The user" is
not looked for: "the user interface" and "user's guide" are general.) Such a memory is
not promoted: :func:`about_owner` says why, and the admin states the knowledge in general
words instead ("The office is closed on Fridays"). A memory about another person
(``subject`` their name) is injected as "About <name>: …" and reads the same for
everyone, so it is judged only by the other promotion rules.

The rules are word lists, not a parser: they look at the first word (a predicate with no
subject before it) and at first-person words anywhere, in English and Chinese. Where a
text could be read either way ("Plans for Q3 are due in May") they refuse: a refused
general fact costs the admin one ``POST /v1/admin/memories``, a promoted personal one
tells every user something false about themselves.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

from proxy.memory.records import USER_SUBJECT

# First words of a subjectless note about the owner: auxiliaries and the verbs learning's
# notes open with (third person singular, past), and adverbs that precede them.
_OPENERS: Final = frozenset((
    "is", "isn't", "was", "wasn't", "has", "hasn't", "had", "have", "does", "doesn't",
    "did", "didn't", "can", "can't", "cannot", "could", "couldn't", "will", "won't",
    "would", "wouldn't", "should", "shouldn't", "must", "may", "might", "am", "likes",
    "liked", "loves", "loved", "hates", "hated", "dislikes", "disliked", "prefers",
    "preferred", "enjoys", "enjoyed", "wants", "wanted", "needs", "needed", "uses", "lives",
    "lived", "works", "worked", "moved", "owns", "owned", "speaks", "spoke", "studies",
    "studied", "plans", "planned", "knows", "knew", "avoids", "avoided", "drinks", "drank",
    "eats", "ate", "plays", "played", "reads", "writes", "wrote", "runs", "ran", "drives",
    "drove", "travels", "travelled", "traveled", "visits", "visited", "keeps", "kept",
    "takes", "took", "attends", "attended", "manages", "managed", "leads", "teaches",
    "taught", "learns", "learned", "learnt", "wears", "follows", "tends", "grew", "goes",
    "went", "commutes", "cycles", "walks", "cooks", "bakes", "collects", "believes",
    "thinks", "feels", "finds", "considers", "hopes", "wishes", "intends", "expects",
    "remembers", "forgets", "suffers", "recovered", "graduated", "joined", "started",
    "stopped", "quit", "became", "got", "gets", "usually", "often", "always", "never",
    "recently", "currently", "rarely", "sometimes", "still", "already", "allergic",
    "vegetarian", "vegan", "married", "divorced", "pregnant", "born",
))
# An opener ending in "s" followed by one of these is a plural noun with its verb
# ("Drinks are free on Fridays", "Plans must be filed by May"): general, not a note.
_PLURAL_VERBS: Final = frozenset((
    "are", "aren't", "were", "weren't", "have", "go", "get", "must", "should", "shall",
    "will", "can", "may", "need",
))
_OPENERS_ZH: Final = ("喜欢", "不喜欢", "偏好", "更喜欢", "讨厌", "热爱", "住在", "来自", "在",
                      "是", "有", "对", "会", "不会", "想", "需要", "正在", "曾", "养", "用",
                      "使用", "经常", "总是", "从不", "每天", "不吃", "吃", "喝", "擅长")
# "I" counts only as a capital word, "me", "my", "mine", "myself" in lower case or
# capitalised (not "ME", a state's abbreviation); 我 but not 我们 ("we": a team can speak).
_FIRST_PERSON: Final = re.compile(
    r"\bI(?:'m|'ve|'d|'ll|’m|’ve|’d|’ll)?\b|\b[Mm](?:e|y|ine|yself)\b|我(?!们)|本人")
_WORD: Final = re.compile(r"[\w'’-]+")


def about_owner(*, content: str, title: str = "", subject: str = USER_SUBJECT) -> str | None:
    """Why the personal memory with this ``content``, ``title`` and ``subject`` reads as
    a fact about its owner (a sentence for the error message), or ``None`` when it reads
    as general knowledge or names another person as its subject. Pure."""
    if subject != USER_SUBJECT:
        return None
    for text in (content, title):
        found = _FIRST_PERSON.search(text)
        if found is not None:
            return f"it is in the first person ('{found.group(0)}')"
    stripped = content.strip()
    words = [w.casefold().replace("’", "'")
             for w in _WORD.findall(unicodedata.normalize("NFKC", stripped))[:2]]
    if words and words[0] in _OPENERS and not (
            words[0].endswith("s") and words[1:] and words[1] in _PLURAL_VERBS):
        return f"it opens with '{stripped.split()[0]}' and no subject of its own"
    if stripped.startswith(_OPENERS_ZH):
        return "it opens with a predicate and no subject of its own"
    return None
