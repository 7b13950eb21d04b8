"""A vocabulary that grows: candidate synonyms from merged traits and topics, and how an
accepted one joins the tenant's synonym groups (pure; docs/design.md#growing-vocabulary).

:func:`profile_merges` replays a batch's profile update against the stored profile with
consolidation's own rule (:func:`~proxy.learning.consolidate.tag_matches`) and names every
merge of two differently worded tags — by containment, through a synonym group, or a near
neighbour the verdict call confirmed — except pairs the groups in force already join.
:func:`accept_group` turns an accepted pair into the tenant's new ``learning.synonyms``
override: groups added after ``config.yaml``'s, each word in at most one of them, so that
both words map to the same first word (:func:`~proxy.learning.consolidate.canonical_tag`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from proxy.errors import ConflictError
from proxy.learning.answers import ProfileUpdate
from proxy.learning.consolidate import canonical_tag, tag_matches
from proxy.memory.records import Profile
from proxy.memory.synonyms import MAX_WORD_CHARS, MergeKind, SynonymExample, TagField
from proxy.memory.text import normalize

Groups = Sequence[Sequence[str]]
FIELDS: tuple[TagField, ...] = ("traits", "topics")


def _group_of(word: str, groups: Groups) -> int | None:
    norm = normalize(word)
    return next((i for i, g in enumerate(groups) if any(normalize(w) == norm for w in g)), None)


def profile_merges(
    profile: Profile | None,
    update: ProfileUpdate | None,
    *,
    synonyms: Groups,
    neighbours: Mapping[str, str],
    now: datetime,
) -> list[SynonymExample]:
    """The merges of two differently worded tags that consolidating ``update`` into
    ``profile`` makes, in order. ``neighbours``: normalised new wording → the stored tag
    text a verdict call judged the same (merged as ``"neighbour"``). A pair already joined
    by one group of ``synonyms`` or with a word over :data:`MAX_WORD_CHARS` is left out."""
    if update is None:
        return []
    out: list[SynonymExample] = []
    for field in FIELDS:
        tags = [t.text for t in getattr(profile, field)] if profile is not None else []
        for raw in getattr(update, field):
            said = raw.strip()
            text = canonical_tag(said, synonyms)
            if not normalize(text):
                continue
            how: MergeKind
            kept = neighbours.get(normalize(said))
            if kept is not None:
                how = "neighbour"
            else:
                kept = next((t for t in tags if tag_matches(t, text, synonyms)), None)
                if kept is None:
                    tags.append(text)
                    continue
                how = _how(kept, said, synonyms)
            if (
                normalize(kept) == normalize(said)
                or _joined(kept, said, synonyms)
                or max(len(kept), len(said)) > MAX_WORD_CHARS
            ):
                continue
            out.append(SynonymExample(field=field, kept=kept, said=said, how=how, at=now))
    return out


def _how(kept: str, said: str, synonyms: Groups) -> MergeKind:
    """``"synonym"`` when a group renamed either word before they matched."""
    renamed = any(normalize(canonical_tag(w, synonyms)) != normalize(w) for w in (kept, said))
    return "synonym" if renamed else "containment"


def _joined(a: str, b: str, groups: Groups) -> bool:
    """Both words are in one group already: nothing new to suggest."""
    first = _group_of(a, groups)
    return first is not None and first == _group_of(b, groups)


def accept_group(words: Sequence[str], *, configured: Groups, tenant: Groups) -> list[list[str]]:
    """The tenant's synonym groups once ``words`` are accepted as synonyms.

    ``configured``: ``config.yaml``'s groups (never changed here; they come first when
    groups are matched); ``tenant``: the tenant's own. A word already in a group joins the
    others to it: a tenant group is extended (two of them are merged into the first), a
    configured group lends its first word as the new tenant group's first, so every word
    maps to it. Unchanged groups keep their order; a changed one moves to the end.

    Raises :class:`~proxy.errors.ConflictError` (409 ``synonym_conflict``) when the words
    sit in two different configured groups: only ``config.yaml`` can join those."""
    in_config = [_group_of(w, configured) for w in words]
    found = {i for i in in_config if i is not None}
    if len(found) > 1:
        raise ConflictError(
            "These words belong to two different synonym groups of config.yaml "
            "(learning.synonyms); join those groups there.",
            code="synonym_conflict",
        )
    groups = [list(g) for g in tenant]
    touched = sorted({i for w in words if (i := _group_of(w, groups)) is not None})
    members = [w for i in touched for w in groups[i]]
    anchor = [configured[next(iter(found))][0]] if found else []
    merged: list[str] = []
    for raw in (*anchor, *members, *words):
        word = raw.strip()
        norm = normalize(word)
        if not norm or any(normalize(w) == norm for w in merged):
            continue
        if merged and _group_of(word, configured) is not None:
            continue  # a configured word maps to the anchor already
        merged.append(word)
    kept = [g for i, g in enumerate(groups) if i not in touched]
    return [*kept, merged] if len(merged) > 1 else kept
