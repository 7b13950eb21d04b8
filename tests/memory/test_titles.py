"""A missing or too long title is the text cut at a word boundary (any character for CJK)
with an ellipsis, at most 30 characters — for manual memories on both backends and for
learned facts alike."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.learning.answers.models import MemoryItem
from proxy.memory.records import TITLE_MAX_CHARS
from proxy.memory.titles import short_title
from tests.fakes import FakeUpstream, Gateway, backend_overrides, make_settings, running_gateway

ENGLISH = "Prefers window seats on long-haul flights to Asia"
CJK = "喜欢在周末的早上去公园跑步然后喝一杯热乎乎的乌龙茶再回家看书和写日记"
LONG_WORD = "Pneumonoultramicroscopicsilicovolcanoconiosis"


@pytest.mark.parametrize(("text", "title"), [
    (ENGLISH, "Prefers window seats on…"),
    (CJK, CJK[:29] + "…"),
    (LONG_WORD, LONG_WORD[:29] + "…"),
    ("Lives in Lisbon", "Lives in Lisbon"),                        # fits: kept whole
    ("a" * 30, "a" * 30),                                          # exactly the limit
    ("Lives in\n  Lisbon,\tPortugal", "Lives in Lisbon, Portugal"),  # spaces made single
    ("Works at Acme, Lisbon, Portugal, since 2019", "Works at Acme, Lisbon…"),  # no comma
    ("Uses 乌龙茶 every morning before the stand-up", "Uses 乌龙茶 every morning before…"),
    ("喜欢喝乌龙茶 and also enjoys a long walk at dusk", "喜欢喝乌龙茶 and also enjoys a long…"),
    ("I am " + LONG_WORD, "I am " + LONG_WORD[:24] + "…"),          # boundary too early
    ("   ", ""),
])
def test_short_title_cuts_at_a_word_boundary_with_an_ellipsis(text: str, title: str) -> None:
    """Each title is at most the limit, ellipsis included, and is cut between words (or
    CJK characters); a single word longer than the room is cut inside it."""
    assert short_title(text) == title
    assert len(short_title(text)) <= TITLE_MAX_CHARS


def test_short_title_keeps_whole_words_only_when_it_cuts_between_them() -> None:
    """The English cut drops the word that did not fit instead of keeping half of it."""
    cut = short_title(ENGLISH).removesuffix("…")
    assert ENGLISH.startswith(cut)
    assert ENGLISH[len(cut)] == " "


def test_short_title_refuses_a_limit_without_room() -> None:
    with pytest.raises(ValueError, match="room"):
        short_title("anything", limit=1)


@pytest.mark.parametrize(("item", "title"), [
    ({"content": ENGLISH}, "Prefers window seats on…"),
    ({"content": "x", "title": CJK}, CJK[:29] + "…"),
    ({"content": ENGLISH, "title": "Seats"}, "Seats"),
])
def test_learned_facts_get_the_same_titles(item: dict[str, str], title: str) -> None:
    """A learned fact without a title, or with one over 30 characters, is titled alike."""
    assert MemoryItem.model_validate(item).title == title


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(make_settings(tmp_path, **backend_overrides(request, tmp_path)),
                               FakeUpstream()) as gateway:
        yield gateway


async def test_manual_memories_without_a_title_are_titled_at_a_word_boundary(
    gw: Gateway,
) -> None:
    """POST /v1/memories without a title stores the cut content (English, CJK, one long
    word); a given title is kept as sent."""
    async with gw.client(headers={"X-User-Id": "alice"}) as http:
        english = await http.post("/v1/memories", json={"content": ENGLISH})
        cjk = await http.post("/v1/memories", json={"content": CJK})
        word = await http.post("/v1/memories", json={"content": LONG_WORD})
        titled = await http.post("/v1/memories", json={"content": ENGLISH,
                                                       "title": "Window seats, always"})
        stored = await http.get(f"/v1/memories/{english.json()['id']}")
    assert [r.status_code for r in (english, cjk, word, titled)] == [201] * 4
    assert english.json()["title"] == "Prefers window seats on…"
    assert stored.json()["title"] == "Prefers window seats on…"
    assert cjk.json()["title"] == CJK[:29] + "…"
    assert word.json()["title"] == LONG_WORD[:29] + "…"
    assert titled.json()["title"] == "Window seats, always"
