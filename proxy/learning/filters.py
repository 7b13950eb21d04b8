"""Checks every extracted fact must pass before consolidation (pure).

- **too_long**: content over :data:`~proxy.memory.records.MAX_CONTENT_CHARS` or a title
  over :data:`~proxy.memory.records.MAX_TITLE_CHARS` — the caps manual memories have; a
  fact that long is a copied message, not a statement to remember.
- **instruction**: a fact whose title or content is an order to the assistant,
  carries a link, a role marker, a chat-template or tool-call token, a persona switch or
  an attempt to override the rules is dropped (:mod:`proxy.memory.directives`, the same
  rules the injected block applies again; docs/design.md#memory-text-is-data) — imperatives
  however framed and a structured-output library's scaffolding included. A statement of
  the user's preference *about* answers ("Prefers short answers", 偏好简洁回答) is no
  order: it is kept, and filed as ``user_preference/style`` or
  ``user_preference/language``.

Every text rule here is decided on :func:`~proxy.memory.text.detection_form` (NFKC,
invisible characters and accents removed, look-alike letters mapped, case-folded), so a
full-width or zero-width spelling is judged like its plain ASCII reading.
- **json**: a fact that itself looks like JSON or carries the schema's keys (an empty
  answer was once stored as a memory by a fallback).
- **example**: a copy of the prompt's own worked example (small models copy it).
- **pii**: a fact that still holds personal data or a secret after the input was
  scrubbed, or a placeholder such as ``[PHONE]`` (useless as memory).
- **subject**: a fact about someone else must name them the way a person is named (a few
  words, no sentence or key:value text) and that name must occur in the user's turns; a
  fact the model cannot attribute cleanly is skipped rather than stored against the wrong
  person (ambiguity → skip, docs/design.md#group-chats).
- **grounding** (docs/design.md#what-is-learned-from): a fact about the user must rest on
  the user's own turns of this batch: its numbers and capitalised names must occur there,
  and it must share at least one content word (Latin words compared on their first 4
  letters, to allow "lives"/"live"; CJK compared on character bigrams) with them.
  Assistant text never grounds a fact, so an assistant repeating known facts adds no
  evidence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from proxy.learning.answers import CandidateFact
from proxy.learning.pii import PLACEHOLDERS, Scrubber
from proxy.learning.prompts import EXAMPLE_FACTS
from proxy.memory.directives import answer_preference, is_directive
from proxy.memory.records import MAX_CONTENT_CHARS, MAX_TITLE_CHARS
from proxy.memory.text import content_terms, detection_form, has_cjk, normalize

_SCHEMA_KEYS = re.compile(r'"(?:title|content|category|facts|memories|subject)"\s*:')
_NUMBER = re.compile(r"\d+")
_WORD = re.compile(r"[A-Za-z][\w'-]*")
_SENTENCE = re.compile(r"[.!?;:]\s+")
_EXAMPLES = tuple(normalize(e) for e in EXAMPLE_FACTS)
_USER_SUBJECTS = frozenset({"user", "the user", "me", "i", "myself", "用户", "我"})
MAX_SUBJECT_CHARS = 60
MAX_SUBJECT_WORDS = 5
_PLACEHOLDER_FORMS = tuple(detection_form(p) for p in PLACEHOLDERS.values())


@dataclass(frozen=True, slots=True)
class Verdict:
    fact: CandidateFact
    reason: str | None  # None = accepted


def _stem(term: str) -> str:
    return term if has_cjk(term) else term[:4]


def _bigrams(text: str) -> set[str]:
    cjk = "".join(ch for ch in text if has_cjk(ch))
    return {cjk[i: i + 2] for i in range(len(cjk) - 1)} | set(cjk if len(cjk) == 1 else ())


def _capitalised(text: str) -> list[str]:
    """Capitalised Latin words that do not open a sentence: names, places, products."""
    out: list[str] = []
    for sentence in _SENTENCE.split(text):
        words = _WORD.findall(sentence)
        out.extend(w.removesuffix("'s").rstrip("'-") for w in words[1:] if w[0].isupper())
    return out


def contains_pii(scrubber: Scrubber, text: str) -> bool:
    """Whether ``scrubber`` finds personal data or a secret in ``text`` as written or in its
    case-kept detection form (full-width digits, ``＠``, zero-width characters inside an
    address or key do not hide it)."""
    if scrubber.contains_pii(text):
        return True
    form = detection_form(text, keep_case=True)
    return form != text and scrubber.contains_pii(form)


def pii_kinds(scrubber: Scrubber, text: str) -> set[str]:
    """The kinds of personal data or secrets (placeholder names: ``PHONE``, ``EMAIL`` …) that
    ``scrubber`` finds in ``text`` as written or in its case-kept detection form — what
    :func:`contains_pii` decides on, for messages that name what was found."""
    found = set(scrubber.scrub(text).counts)
    form = detection_form(text, keep_case=True)
    if form != text:
        found |= set(scrubber.scrub(form).counts)
    return found


class FactFilter:
    """Applies the checks above against the user turns of one batch."""

    def __init__(
        self, *, user_text: str, scrubber: Scrubber, user_names: Iterable[str] = ()
    ) -> None:
        self._scrubber = scrubber
        names = " ".join(user_names)
        self._lower = f"{user_text}\n{names}".casefold()
        self._stems = {_stem(t) for t in content_terms(user_text) if not has_cjk(t)}
        self._bigrams = _bigrams(user_text)
        self._numbers = set(_NUMBER.findall(user_text))

    def check(self, fact: CandidateFact, *, grounded: bool = True) -> str | None:
        """``None`` when the fact may be stored, else the reason it is dropped. Facts a
        vision model read from an image (``grounded=False``) cannot rest on the user's
        words; every other check still applies."""
        if len(fact.content) > MAX_CONTENT_CHARS or len(fact.title) > MAX_TITLE_CHARS:
            return "too_long"  # checked first: the checks below scan the whole text
        text = f"{fact.title}\n{fact.content}"
        if is_directive(fact.title) or is_directive(fact.content):
            return "instruction"
        form = detection_form(text)
        if detection_form(fact.content)[:1] in "{[" or _SCHEMA_KEYS.search(form):
            return "json"
        # A repaired broken escape: the fact lost characters (docs/design.md#parsing).
        if "\ufffd" in text:
            return "garbled"
        norm = normalize(fact.content)
        if any(example and (example in norm or norm in example) for example in _EXAMPLES):
            return "example"
        if any(p in form for p in _PLACEHOLDER_FORMS) or contains_pii(self._scrubber, text):
            return "pii"
        if not self._subject_ok(fact.subject):
            return "subject"
        if grounded and not self._grounded(fact):
            return "ungrounded"
        return None

    def _subject_ok(self, subject: str) -> bool:
        name = subject.strip()
        if not name or normalize(name) in _USER_SUBJECTS:
            return True
        form = detection_form(name)
        if len(name) > MAX_SUBJECT_CHARS or len(name.split()) > MAX_SUBJECT_WORDS or \
                any(ch in form for ch in ":;{}[]<>|=\n") or form.endswith((".", "!", "?")):
            return False
        return normalize(name) in normalize(self._lower)

    def _grounded(self, fact: CandidateFact) -> bool:
        content = fact.content
        for number in _NUMBER.findall(content):
            if number not in self._numbers:
                return False
        for name in _capitalised(content):
            if name.casefold() not in self._lower and name.casefold() not in {"user", "i"}:
                return False
        if has_cjk(content) and self._bigrams & _bigrams(content):
            return True
        stems = {_stem(t) for t in content_terms(content) if not has_cjk(t)}
        stems.discard("user")
        return bool(stems & self._stems)

    def split(
        self, facts: Iterable[CandidateFact], *, grounded: bool = True
    ) -> tuple[list[CandidateFact], list[Verdict]]:
        """(accepted facts, rejected verdicts)."""
        accepted, rejected = [], []
        for fact in facts:
            reason = self.check(fact, grounded=grounded)
            if reason is None:
                accepted.append(filed(fact))
            else:
                rejected.append(Verdict(fact, reason))
        return accepted, rejected


def filed(fact: CandidateFact) -> CandidateFact:
    """``fact`` filed as ``user_preference/style`` or ``user_preference/language`` when it
    states the user's own preference about answers
    (:func:`~proxy.memory.directives.answer_preference`), else unchanged."""
    if normalize(fact.subject.strip() or "user") not in _USER_SUBJECTS:
        return fact
    kind = answer_preference(fact.content)
    if kind is None or (fact.category == "user_preference" and fact.subcategory == kind):
        return fact
    return replace(fact, category="user_preference", subcategory=kind)


__all__ = ["FactFilter", "Verdict", "contains_pii", "filed", "is_directive", "pii_kinds"]
