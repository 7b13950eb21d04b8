"""Pydantic models of the extraction answer, tolerant of the variants models write.

The extraction prompt asks for ``{"memories": [...], "profile": {...}, "summary": "...",
"images": [...], "profiles": [...]}``. Each model here is that shape; ``before``
validators (the readers of :mod:`.fields`) and alias choices read what models write
instead, and :data:`.extraction.EXTRACTION_SCHEMA` is generated from
:class:`ExtractionAnswer`. Validation of an answer object never fails: an unusable memory
is dropped and counted, an unusable image or profile entry is left out.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, TypeVar

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from proxy.learning.answers import fields
from proxy.learning.answers.results import (
    CandidateFact,
    ExtractionResult,
    ImageTier,
    ImageVerdict,
    ProfileUpdate,
)
from proxy.memory.categories import Category
from proxy.memory.titles import short_title

__all__ = ["ExtractionAnswer", "ImageAnswer", "MemoryItem", "ProfileAnswer", "SpeakerProfile"]

LIST_KEYS: Final = ("memories", "facts", "items")
"""Keys under which an answer object lists its memories; the first holding a list wins."""
CONTENT_KEYS: Final = ("content", "fact", "text", "memory")
"""Keys of a memory's statement; the first holding a non-empty string wins."""
_SUPERSEDES_KEYS: Final = ("supersedes", "replaces")
_TAG_MAX: Final = 40  # characters of one tag; longer ones are sentences, dropped
_TAGS_MAX: Final = 10
_PROFILE_LIST_MAX: Final = 20
_SUMMARY_MAX: Final = 600  # characters of a conversation summary kept


def _text_or_none(value: Any) -> str | None:
    return fields.clean_text(value) or None


def _statement_or_none(value: Any) -> str | None:
    text = fields.clean_text(value) or None
    return None if text is not None and fields.looks_like_json(text) else text


def _summary(value: Any) -> str | None:
    text = fields.clean_text(value)[:_SUMMARY_MAX] or None
    return None if text is not None and fields.looks_like_json(text) else text


def _tier(value: Any) -> str:
    return fields.clean_text(value).lower()


def _first_id(value: Any) -> str | None:
    found = fields.ids(value)
    return found[0] if found else None


def _tags(value: Any) -> tuple[str, ...]:
    return fields.strings(value, max_items=_TAGS_MAX, max_len=_TAG_MAX)


def _profile_list(value: Any) -> tuple[str, ...]:
    return fields.strings(value, max_items=_PROFILE_LIST_MAX)


def _content(item: dict[str, Any]) -> str:
    for key in CONTENT_KEYS:
        content = fields.clean_text(item.get(key))
        if content:
            return content
    return ""


_Text = Annotated[str, BeforeValidator(fields.clean_text)]
_OptionalText = Annotated[str | None, BeforeValidator(_text_or_none)]
_ProfileList = Annotated[tuple[str, ...], BeforeValidator(_profile_list)]


class MemoryItem(BaseModel):
    """One memory of the answer; a plain string is its content, about the user.

    Raises ``ValidationError`` for an item that is not an object or a string, has no
    content, or whose content or title looks like JSON (a parser leak, not a fact)."""

    model_config = ConfigDict(frozen=True)

    title: str
    content: str
    category: Category
    subcategory: _Text = ""
    tags: Annotated[tuple[str, ...], BeforeValidator(_tags)] = ()
    subject: str
    duplicate_of: Annotated[str | None, BeforeValidator(_first_id)] = Field(
        default=None, validation_alias=AliasChoices("duplicate_of", "duplicates", "same_as"))
    supersedes: tuple[str, ...] = ()
    # Unsure: the stored memories this fact may contradict (docs/design.md#conflicts).
    contradicts: tuple[str, ...] = ()
    source_turns: SkipJsonSchema[Annotated[tuple[int, ...], BeforeValidator(fields.turns)]] = (
        Field(default=(), validation_alias=AliasChoices("source_turns", "evidence")))
    speaker: SkipJsonSchema[_OptionalText] = Field(
        default=None, validation_alias=AliasChoices("speaker", "stated_by", "said_by"))

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, item: Any) -> Any:
        if isinstance(item, MemoryItem):
            return item
        if isinstance(item, str):
            item = {"content": item}
        if not isinstance(item, dict):
            # ValueError, not TypeError: pydantic reports only ValueError as invalid input
            raise ValueError("a memory must be an object or a string")  # noqa: TRY004
        content = _content(item)
        raw_title = fields.clean_text(item.get("title"))
        if not content or fields.looks_like_json(content) or (
                raw_title and fields.looks_like_json(raw_title)):
            raise ValueError("a memory needs a content that is a statement, not JSON")
        about = fields.subject(item.get("subject"))
        supersedes: list[str] = []
        for key in _SUPERSEDES_KEYS:
            supersedes.extend(i for i in fields.ids(item.get(key)) if i not in supersedes)
        return {
            **item,
            "title": short_title(raw_title or content),
            "content": content,
            "category": fields.category(item.get("category"), about),
            "subject": about,
            "supersedes": tuple(supersedes),
            "contradicts": tuple(i for i in fields.ids(item.get("contradicts"))
                                 if i not in supersedes),
        }

    def fact(self) -> CandidateFact:
        """This memory as the worker's :class:`.CandidateFact`."""
        return CandidateFact(
            title=self.title, content=self.content, category=self.category,
            subcategory=self.subcategory, tags=self.tags, subject=self.subject,
            supersedes=self.supersedes, duplicate_of=self.duplicate_of,
            source_turns=self.source_turns, speaker=self.speaker,
            contradicts=self.contradicts)


class ProfileAnswer(BaseModel):
    """The ``profile`` object: how the user talks, one impression, traits and topics."""

    model_config = ConfigDict(frozen=True)

    style: _OptionalText = None
    impression: _OptionalText = None
    traits: _ProfileList = ()
    topics: _ProfileList = ()

    def update(self) -> ProfileUpdate | None:
        """This profile as a :class:`.ProfileUpdate`; ``None`` when it says nothing."""
        update = ProfileUpdate(style=self.style, impression=self.impression,
                               traits=self.traits, topics=self.topics)
        return None if update == ProfileUpdate(None, None, (), ()) else update


class _Speaker(BaseModel):
    model_config = ConfigDict(frozen=True)

    speaker: _Text


class SpeakerProfile(ProfileAnswer, _Speaker):
    """One entry of a group answer's ``profiles``: a participant (``speaker``, the name as
    written in the transcript) and their profile update."""


class ImageAnswer(BaseModel):
    """One entry of ``images``: the image's number, its tier and what was learned from it.

    Raises ``ValidationError`` for a number that is not a non-negative integer or an
    unknown tier."""

    model_config = ConfigDict(frozen=True)

    image: int
    tier: Annotated[ImageTier, BeforeValidator(_tier)]
    memory: Annotated[str | None, BeforeValidator(_statement_or_none)] = None

    @field_validator("image", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError("an image number is a non-negative integer")
        return value

    def verdict(self) -> ImageVerdict:
        """This entry as an :class:`.ImageVerdict`."""
        return ImageVerdict(image=self.image, tier=self.tier, memory=self.memory)


_M = TypeVar("_M", bound=BaseModel)


def _valid(model: type[_M], items: list[Any]) -> tuple[list[_M], int]:
    """The items that validate as ``model``, and how many did not."""
    out: list[_M] = []
    for item in items:
        try:
            out.append(model.model_validate(item))
        except ValidationError:
            continue
    return out, len(items) - len(out)


def fact_list(value: Any) -> list[Any] | None:
    """The memories of an answer: a bare list, or the first list under :data:`LIST_KEYS`."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        for key in LIST_KEYS:
            if isinstance(value.get(key), list):
                return list(value[key])
    return None


class ExtractionAnswer(BaseModel):
    """The extraction prompt's answer: an answer object, or a bare list of memories."""

    model_config = ConfigDict(frozen=True)

    memories: tuple[MemoryItem, ...]
    images: tuple[ImageAnswer, ...] = ()
    summary: Annotated[str | None, BeforeValidator(_summary)] = None
    profile: ProfileAnswer | None = None
    profiles: tuple[SpeakerProfile, ...] = ()
    dropped: SkipJsonSchema[int] = 0  # memories present but unusable

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, value: Any) -> Any:
        if isinstance(value, ExtractionAnswer):
            return value
        memories, dropped = _valid(MemoryItem, fact_list(value) or [])
        if not isinstance(value, dict):
            return {"memories": memories, "dropped": dropped}
        images = value.get("images")
        profiles = value.get("profiles")
        return {
            "memories": memories,
            "dropped": dropped,
            "images": _valid(ImageAnswer, images)[0] if isinstance(images, list) else (),
            "summary": value.get("summary"),
            "profile": value.get("profile") if isinstance(value.get("profile"), dict) else None,
            "profiles": _valid(SpeakerProfile, profiles)[0] if isinstance(profiles, list) else (),
        }

    def result(self, *, truncated: bool) -> ExtractionResult:
        """This answer as the worker's :class:`.ExtractionResult`."""
        profiles = tuple((entry.speaker, update) for entry in self.profiles
                         if entry.speaker and (update := entry.update()) is not None)
        return ExtractionResult(
            facts=tuple(item.fact() for item in self.memories),
            profile=self.profile.update() if self.profile is not None else None,
            dropped=self.dropped, truncated=truncated,
            images=tuple(image.verdict() for image in self.images),
            summary=self.summary, profiles=profiles)
