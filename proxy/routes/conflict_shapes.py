"""Request and response models of the conflict and profile-history routes
(:mod:`proxy.routes.conflicts`; docs/design.md#conflicts,
docs/design.md#profile-over-time)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from proxy.routes.shapes import MemoryOut

StatusFilter = Literal["open", "settled", "all"]
_STATUS = ("open: awaiting a person (open conflicts and unconfirmed automatic "
           "retirements; the default), settled (confirmed or reversed), or all")


class ConflictParams(BaseModel):
    model_config = ConfigDict(extra="ignore")
    user: str | None = Field(default=None, min_length=1, max_length=256,
                             description="The end user, when no user header is sent")
    status: StatusFilter = Field(default="open", description=_STATUS)


class AdminConflictParams(BaseModel):
    model_config = ConfigDict(extra="ignore")
    user: str | None = Field(default=None, min_length=1, max_length=256, description=(
        "The user of the tenant; without it, the conflicts of every user of the tenant "
        "(newest first, at most 500 in all; each names its user_id)"))
    status: StatusFilter = Field(default="open", description=_STATUS)


class ConflictOut(BaseModel):
    """One pair: ``retired`` (retired by it, or to be while ``open``) and ``successor``."""

    id: str
    object: Literal["memory.conflict"]
    kind: Literal["supersede", "contradicts"]
    status: Literal["open", "unconfirmed", "confirmed", "reversed"]
    reason: str
    user_id: str
    retired: MemoryOut
    successor: MemoryOut
    created_at: str
    settled_at: str | None
    settled_by: Literal["user", "admin"] | None


class ConflictList(BaseModel):
    object: Literal["list"]
    data: list[ConflictOut]


class HistoryParams(BaseModel):
    model_config = ConfigDict(extra="ignore")
    user: str | None = Field(default=None, min_length=1, max_length=256,
                             description="The end user, when no user header is sent")
    since: str | None = Field(default=None, max_length=40, description=(
        "First week: ISO week 2026-W40, or an ISO 8601 date or time (its week)"))
    until: str | None = Field(default=None, max_length=40, description=(
        "Last week (inclusive), same forms as since"))


class WeightedTagOut(BaseModel):
    text: str
    score: float = Field(description="Effective score that week (decayed 0.9 per week)")


class ProfileWeekOut(BaseModel):
    week: str = Field(description="ISO week, e.g. 2026-W48")
    traits: list[WeightedTagOut]
    topics: list[WeightedTagOut]


class ProfileHistory(BaseModel):
    """Oldest week first, every week from the first stored snapshot on (a week without a
    snapshot repeats the one before it); the current week is the live profile."""

    object: Literal["list"]
    data: list[ProfileWeekOut]
