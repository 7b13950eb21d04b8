"""Request and response bodies of the admin governance routes, as pydantic
models: the routes validate with them and ``/openapi.json`` documents them
(``model_json_schema``). Query strings are validated with the ``*Query`` models."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from proxy.memory.categories import Category
from proxy.memory.records import MAX_CONTENT_CHARS, MAX_TITLE_CHARS
from proxy.routes.params import MemoryCursor
from proxy.routes.shapes import MAX_SUBCATEGORY_CHARS, MAX_TAGS, Tag
from proxy.settings.overrides import TENANT_OVERRIDABLE, BudgetValue

AdminScope = Literal["shared", "system"]


class _Query(BaseModel):
    # Unknown query parameters are ignored, as everywhere in the API.
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Body(BaseModel):
    # JSON bodies: unknown fields refused and no coercion — a boolean is true/false, a
    # number a JSON number ("false" or "0.7" is a 400 naming the field, never a value).
    model_config = ConfigDict(extra="forbid", strict=True)


# --- usage -------------------------------------------------------------------------------
class UsageQuery(_Query):
    """``GET /v1/admin/usage``: group by user, model or UTC day; optionally one user and a
    window of UTC days (inclusive). ``tenant``: global admin keys only."""

    group_by: Literal["user", "model", "day"] = "user"
    user: str | None = Field(default=None, min_length=1, max_length=256)
    since: date | None = None
    until: date | None = None
    tenant: str | None = None


class UserTokens(BaseModel):
    prompt: int
    completion: int


class UsageEntry(BaseModel):
    key: str | None = Field(description="user id (null: requests without a user), model "
                                        "name or UTC date, after group_by")
    requests: int
    user_tokens: UserTokens
    memory_tokens: int
    learning_tokens: dict[str, int] = Field(description="learning tokens (prompt + "
                                                        "completion) per ledger purpose")
    recall_tokens: int = Field(description="query-embedding tokens a remote embedder "
                                           "billed for recall (memory cost: in neither "
                                           "user_tokens nor learning_tokens)")


class UsageList(BaseModel):
    object: Literal["list"] = "list"
    data: list[UsageEntry]


# --- users -------------------------------------------------------------------------------
class UsersQuery(_Query):
    after: str | None = None
    limit: int = Field(default=100, ge=1, le=500)


class UserEntry(BaseModel):
    user: str
    memories: int = Field(description="active personal memories")
    last_seen: datetime = Field(description="time of the user's latest chat request or "
                                            "memory write (POST /v1/memories, MCP "
                                            "add_memory, import)")


class UserList(BaseModel):
    object: Literal["list"] = "list"
    data: list[UserEntry]
    first_id: str | None
    last_id: str | None
    has_more: bool


# --- audit -------------------------------------------------------------------------------
class AuditQuery(_Query):
    user: str | None = Field(default=None, min_length=1, max_length=256)
    action: str | None = None
    actor: Literal["auto", "user", "admin"] | None = None
    conversation: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = Field(default=100, ge=1, le=1000)
    before: int | None = Field(default=None, ge=0, le=2**62,
                               description="cursor: the id of the oldest event already "
                                           "seen")


class AuditEntry(BaseModel):
    id: int
    at: datetime
    user_id: str | None
    conversation_id: str | None
    actor: str
    action: str
    memory_id: str | None
    reason: str
    detail: dict[str, Any]


class AuditList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AuditEntry]


# --- prompts -------------------------------------------------------------------------------
class PromptVersionEntry(BaseModel):
    version: int
    text: str = Field(description="empty: back to the configured / built-in prompt")
    actor: str
    at: datetime


class PromptVersionList(BaseModel):
    object: Literal["list"] = "list"
    kind: Literal["scoring", "extraction"]
    data: list[PromptVersionEntry]


class PromptVersionsQuery(_Query):
    limit: int = Field(default=100, ge=1, le=1000)


class PromptRestored(BaseModel):
    object: Literal["prompt.version"] = "prompt.version"
    kind: Literal["scoring", "extraction"]
    version: int = Field(description="the new current version")
    restored_from: int
    at: datetime


# --- settings ------------------------------------------------------------------------------
class _SettingsPatchBody(_Body):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


# Field name (path with "_" for ".") → (the accepted type or null, aliased by the path).
_PATCH_FIELDS: dict[str, Any] = {
    setting.path.replace(".", "_"): (setting.patch_type | None,
                                     Field(default=None, alias=setting.path))
    for setting in TENANT_OVERRIDABLE
}
SettingsPatch: type[BaseModel] = create_model(
    "SettingsPatch",
    __base__=_SettingsPatchBody,
    __module__=__name__,
    __doc__="""``PATCH /v1/admin/settings``: config names as keys; ``null`` removes the tenant's
    override (back to ``config.yaml``). Values are JSON booleans and numbers (no string is
    coerced), then validated as at startup.""",
    **_PATCH_FIELDS,
)
"""One optional field per :data:`~proxy.settings.overrides.TENANT_OVERRIDABLE` entry,
aliased by its config path (``learning_score_threshold`` ↔ ``learning.score_threshold``)."""


class SettingsView(BaseModel):
    object: Literal["settings"] = "settings"
    tenant: str
    settings: dict[str, Any] = Field(description="effective value of every run-time "
                                                 "setting (config name → value)")
    overrides: dict[str, Any] = Field(description="the tenant's stored overrides")
    defaults: dict[str, Any] = Field(default_factory=dict,
                                     description="every setting's config.yaml value: what "
                                                 "removing the override (null) goes back to")
    learning_available: bool = Field(description="config.yaml has learning on (only then "
                                                 "can a tenant switch it on)")


# --- stats ---------------------------------------------------------------------------------
class StatsQuery(_Query):
    days: int = Field(default=30, ge=1, le=366)
    tenant: str | None = None


class BudgetState(BaseModel):
    budget: BudgetValue
    spent_today: int
    spent_this_month: int
    state: Literal["active", "paused"]
    paused_by: Literal["day", "month"] | None
    resumes_at: datetime | None


class LearningState(BaseModel):
    enabled: bool = Field(description="learning on for this tenant (config and override)")
    budget: BudgetState


class StatsTotals(BaseModel):
    users: int
    memories: dict[str, dict[str, int]] = Field(description="scope → {total (active: "
                                                            "enabled and not retired), "
                                                            "retired, disabled, <category>}")
    retired: int
    stored: dict[str, int] = Field(description="scope → every stored memory, retired and "
                                               "disabled included (total + retired + "
                                               "disabled): what GET /v1/memories/stats "
                                               "calls total, summed over the users")


class StatsDay(BaseModel):
    date: date
    learned: int
    merged: int
    retired: int
    rejected: int
    learning_tokens: int
    user_tokens: int
    active_users: int
    recall_tokens: int = Field(description="query-embedding tokens of recall that day "
                                           "(remote embedder)")


class Stats(BaseModel):
    object: Literal["stats"] = "stats"
    tenant: str
    totals: StatsTotals
    learning: LearningState
    daily: list[StatsDay]


# --- shared and system memories ------------------------------------------------------------
class AdminMemoriesQuery(_Query):
    scope: AdminScope = "shared"
    limit: int = Field(default=100, ge=1, le=500)
    after: MemoryCursor | None = None
    include_retired: bool = False


class PromoteQuery(_Query):
    user: str | None = Field(default=None, min_length=1, max_length=256,
                             description="the memory's owner (or header X-User-Id)")


class NewAdminMemory(_Body):
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    title: str = Field(default="", max_length=MAX_TITLE_CHARS)
    category: Category = "organizational"
    subcategory: str = Field(default="", max_length=MAX_SUBCATEGORY_CHARS)
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    scope: AdminScope | None = None  # else ?scope=, default shared


class AdminMemoryPatch(_Body):
    content: str | None = Field(default=None, min_length=1, max_length=MAX_CONTENT_CHARS)
    title: str | None = Field(default=None, max_length=MAX_TITLE_CHARS)
    category: Category | None = None
    subcategory: str | None = Field(default=None, max_length=MAX_SUBCATEGORY_CHARS)
    tags: list[Tag] | None = Field(default=None, max_length=MAX_TAGS)
    enabled: bool | None = None


class AdminMemory(BaseModel):
    """A memory as the API shows it: the memory record's field names
    (docs/design.md#memory-record), no embedding."""

    model_config = ConfigDict(extra="allow")

    object: Literal["memory"] = "memory"
    id: str
    scope: Literal["personal", "shared", "system"]
    content: str


class AdminMemoryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AdminMemory]
    first_id: str | None
    last_id: str | None
    has_more: bool


class AdminMemoryDeleted(BaseModel):
    id: str
    object: Literal["memory.deleted"] = "memory.deleted"
    deleted: bool
