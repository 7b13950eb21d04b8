"""Pipeline stages that hand facts to their owners: each returns its result and the audit
events of what it did (a caller's audit list is never appended to)."""

from __future__ import annotations

from datetime import UTC, datetime

from proxy.learning.answers import CandidateFact, ExtractionResult, ImageVerdict
from proxy.learning.exchange import TranscriptMessage
from proxy.learning.owners import GroupOwners, PrivateOwners
from proxy.learning.pipeline import assign, image_facts
from proxy.learning.queue import Batch

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _fact(content: str, speaker: str | None = None) -> CandidateFact:
    return CandidateFact(title=content, content=content, category="domain",
                         subcategory="", tags=(), subject="user", supersedes=(),
                         duplicate_of=None, source_turns=(), speaker=speaker)


def _batch(user: str, *messages: TranscriptMessage) -> Batch:
    return Batch(key="b1", tenant="t", user=user, conversation="c", channel="private",
                 model="m", messages=messages, oldest_at=0.0, newest_at=0.0)


def _said(name: str | None, *images: str) -> TranscriptMessage:
    return TranscriptMessage(role="user", text="look", fingerprint=name or "me", name=name,
                             images=images)


class _Counts(list[tuple[str, str]]):
    def __call__(self, event: str, label: str) -> None:
        self.append((event, label))


def test_a_private_batch_gives_every_fact_to_its_user() -> None:
    """Speakers do not matter in a private batch; nothing is rejected."""
    counts = _Counts()
    extraction = ExtractionResult(facts=(_fact("a"), _fact("b", "Zed")), profile=None,
                                  dropped=0)
    per_owner, audit = assign(_batch("alice"), PrivateOwners(), extraction,
                              owners={None: "alice"}, now=NOW, count=counts)
    assert [f.content for f in per_owner["alice"]] == ["a", "b"]
    assert (audit, counts) == ([], [])


def test_a_group_fact_of_an_unknown_speaker_is_rejected_and_audited() -> None:
    """In a group, a fact goes to its named participant; an unknown speaker's fact is
    dropped with one ``rejected`` event and one count."""
    counts = _Counts()
    extraction = ExtractionResult(facts=(_fact("a", "Ann"), _fact("b", "Zed")),
                                  profile=None, dropped=0)
    per_owner, audit = assign(_batch("group:g"), GroupOwners(), extraction,
                              owners={"Ann": "u-ann"}, now=NOW, count=counts)
    assert [f.content for f in per_owner["u-ann"]] == ["a"]
    assert [(e.action, e.reason, e.detail) for e in audit] == [
        ("rejected", "speaker not identified", {"batch": "b1", "speaker": "Zed"})]
    assert counts == [("fact_rejected", "speaker")]


def test_person_and_long_images_become_memories_of_their_sharer() -> None:
    """``person`` and ``long`` verdicts become facts of the image's sharer; ``short`` and
    ``skip`` do not; one event counts the verdicts by tier."""
    counts = _Counts()
    batch = _batch("group:g", _said("Ann", "u1", "u2"), _said("Bob", "u3", "u4"))
    extraction = ExtractionResult(facts=(), profile=None, dropped=0, images=(
        ImageVerdict(1, "person", "has red hair"), ImageVerdict(2, "short", "a lunch"),
        ImageVerdict(3, "long", "owns a sailboat"), ImageVerdict(4, "skip", None),
        ImageVerdict(9, "long", "no such image")))
    out, audit = image_facts(batch, GroupOwners(), extraction,
                             owners={"Ann": "u-ann", "Bob": "u-bob"}, now=NOW, count=counts)
    assert {o: [(f.content, f.subcategory) for f in facts] for o, facts in out.items()} == {
        "u-ann": [("has red hair", "appearance")], "u-bob": [("owns a sailboat", "image")]}
    assert [(e.action, e.reason, e.detail) for e in audit] == [
        ("extracted", "images", {"batch": "b1", "tiers": {
            "person": 1, "short": 1, "long": 1, "skip": 1}})]
    assert len(counts) == 4


def test_no_image_verdict_means_no_event() -> None:
    """Without verdicts on the batch's images, the stage reports nothing."""
    out, audit = image_facts(_batch("alice", _said(None, "u1")), PrivateOwners(),
                             ExtractionResult(facts=(), profile=None, dropped=0),
                             owners={None: "alice"}, now=NOW, count=_Counts())
    assert (out, audit) == ({}, [])
