"""Candidate synonyms from merged traits and topics, and accepted pairs as synonym groups."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from proxy.errors import ConflictError
from proxy.learning.answers import ProfileUpdate
from proxy.learning.consolidate import canonical_tag, merge_tags
from proxy.learning.vocabulary import accept_group, profile_merges
from proxy.memory.records import Profile, ScoredTag

NOW = datetime(2026, 11, 2, tzinfo=UTC)
GROUPS = [["话少", "潜水", "沉默"], ["quiet", "reserved", "taciturn"]]


def profile(traits: list[str], topics: list[str] = ()) -> Profile:  # type: ignore[assignment]
    def tags(texts: list[str]) -> tuple[ScoredTag, ...]:
        return tuple(ScoredTag(text=t, score=1.0, hits=1, at=NOW) for t in texts)

    return Profile(tenant="t", user_id="u", traits=tags(traits), topics=tags(list(topics)))


def update(traits: list[str], topics: list[str] = ()) -> ProfileUpdate:  # type: ignore[assignment]
    return ProfileUpdate(style=None, impression=None, traits=tuple(traits), topics=tuple(topics))


@pytest.mark.parametrize(
    ("stored", "said", "pair"),
    [
        (["很话少"], ["话少"], ("很话少", "话少", "containment")),
        (["mountain hiking"], ["hiking"], ("mountain hiking", "hiking", "containment")),
        (["很话少"], ["潜水"], ("很话少", "潜水", "synonym")),  # 潜水 → 话少 ⊂ 很话少
        (["quiet"], ["reserved"], None),  # one configured group joins them already
        (["hiking"], ["hiking"], None),  # the same wording
        (["Hiking"], ["hiking!"], None),  # the same once normalised
        (["hiking"], ["chess"], None),  # no merge at all
        (["trait 1"], ["trait 10"], None),  # words, not characters
    ],
    ids=[
        "cjk-containment",
        "word-containment",
        "through-group",
        "known-group",
        "same",
        "same-normalised",
        "unrelated",
        "no-partial-word",
    ],
)
def test_a_merge_of_two_wordings_is_a_candidate(
    stored: list[str], said: list[str], pair: tuple[str, str, str] | None
) -> None:
    merges = profile_merges(profile(stored), update(said), synonyms=GROUPS, neighbours={}, now=NOW)
    assert [(m.kept, m.said, m.how) for m in merges] == ([pair] if pair else [])


def test_merges_replay_consolidation_within_one_update() -> None:
    """A tag new in this update takes later wordings; topics are their own field; each
    merge carries its field and time."""
    merges = profile_merges(
        profile([], ["mountain hiking"]),
        update(["chess player", "chess"], ["hiking"]),
        synonyms=GROUPS,
        neighbours={},
        now=NOW,
    )
    assert [(m.field, m.kept, m.said) for m in merges] == [
        ("traits", "chess player", "chess"),
        ("topics", "mountain hiking", "hiking"),
    ]
    assert all(m.at == NOW for m in merges)
    kept = merge_tags((), ["chess player", "chess"], now=NOW, synonyms=GROUPS, cap=12)
    assert [t.hits for t in kept] == [2]  # consolidation merged the same pair


def test_a_confirmed_neighbour_is_a_candidate_of_its_own_kind() -> None:
    merges = profile_merges(
        profile(["introverted"]),
        update(["shy"]),
        synonyms=GROUPS,
        neighbours={"shy": "introverted"},
        now=NOW,
    )
    assert [(m.kept, m.said, m.how) for m in merges] == [("introverted", "shy", "neighbour")]
    assert (
        profile_merges(
            profile(["introverted"]), update(["shy"]), synonyms=GROUPS, neighbours={}, now=NOW
        )
        == []
    )


def test_no_update_or_an_overlong_word_gives_no_candidate() -> None:
    assert profile_merges(profile(["quiet"]), None, synonyms=GROUPS, neighbours={}, now=NOW) == []
    long = "likes " + "very " * 15 + "long hikes"
    assert (
        profile_merges(
            profile([long]), update(["long hikes"]), synonyms=GROUPS, neighbours={}, now=NOW
        )
        == []
    )


@pytest.mark.parametrize(
    ("words", "tenant", "expected"),
    [
        (["hiking", "mountain hiking"], [], [["hiking", "mountain hiking"]]),
        # a configured group lends its first word; configured words are not repeated
        (["很话少", "潜水"], [], [["话少", "很话少"]]),
        # an existing tenant group is extended (and moves to the end)
        (
            ["hike", "hiking"],
            [["hiking", "trekking"], ["chess", "go"]],
            [["chess", "go"], ["hiking", "trekking", "hike"]],
        ),
        # two tenant groups are merged into the first
        (
            ["go", "hiking"],
            [["hiking", "trekking"], ["chess", "go"]],
            [["hiking", "trekking", "chess", "go"]],
        ),
        # both words in one configured group: nothing to add
        (["quiet", "reserved"], [["a", "b"]], [["a", "b"]]),
    ],
    ids=["new", "configured-anchor", "extend", "merge-two", "already-configured"],
)
def test_an_accepted_pair_joins_the_tenant_groups(
    words: list[str], tenant: list[list[str]], expected: list[list[str]]
) -> None:
    groups = accept_group(words, configured=GROUPS, tenant=tenant)
    assert groups == expected
    in_force = [*GROUPS, *groups]
    assert len({canonical_tag(w, in_force) for w in words}) == 1


def test_words_of_two_configured_groups_cannot_be_joined_by_a_tenant() -> None:
    with pytest.raises(ConflictError) as caught:
        accept_group(["话少", "quiet"], configured=GROUPS, tenant=[])
    assert caught.value.code == "synonym_conflict"
