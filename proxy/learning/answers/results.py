"""What a parsed extraction answer hands the learning worker: frozen, hashable records.

These are plain dataclasses (the worker and the filters copy them with
``dataclasses.replace``); :mod:`.extraction` builds them from its validated pydantic models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "IMAGE_TIERS",
    "CandidateFact",
    "ExtractionResult",
    "ImageTier",
    "ImageVerdict",
    "ProfileUpdate",
]

ImageTier = Literal["person", "long", "short", "skip"]
IMAGE_TIERS: Final[tuple[ImageTier, ...]] = ("person", "long", "short", "skip")
"""How an image the user shared is remembered, from most to least lasting."""


@dataclass(frozen=True, slots=True)
class CandidateFact:
    """One fact the extraction model proposed, normalised (see
    :func:`.extraction.parse_extraction`)."""

    title: str
    content: str
    category: str
    subcategory: str
    tags: tuple[str, ...]
    subject: str
    supersedes: tuple[str, ...]
    duplicate_of: str | None
    source_turns: tuple[int, ...]
    # Group chats: the participant who stated the fact, as named in the transcript.
    speaker: str | None = None
    # Stored memories the fact may contradict, the model being unsure: an open conflict for
    # a person to settle, nothing retired (docs/design.md#conflicts).
    contradicts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProfileUpdate:
    """The optional ``profile`` object of an extraction answer."""

    style: str | None
    impression: str | None
    traits: tuple[str, ...]
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ImageVerdict:
    """How an image the user shared is remembered: ``person`` (stable information about the
    person), ``long`` (worth keeping), ``short`` (only for now) or ``skip``; ``memory`` is
    the statement learned from it, if any; ``image`` is its number in the transcript
    (``[image n]``)."""

    image: int
    tier: str
    memory: str | None


@dataclass(frozen=True, slots=True)
class ExtractionResult:
    """A parsed extraction answer.

    ``facts`` may be empty: that is a successful "nothing worth remembering".
    ``dropped`` counts items that were present but unusable (not an object or string, no
    content, JSON-looking content, or an item cut off by truncation).
    ``truncated`` is ``True`` when the facts were salvaged from a document that was cut off;
    the complete items before the cut are kept and the partial last item is not.
    """

    facts: tuple[CandidateFact, ...]
    profile: ProfileUpdate | None
    dropped: int
    truncated: bool = False
    images: tuple[ImageVerdict, ...] = ()
    # group chats: (speaker name as written, its profile update) per participant
    profiles: tuple[tuple[str, ProfileUpdate], ...] = ()
    summary: str | None = None  # what the new messages were about (medium-term memory)
