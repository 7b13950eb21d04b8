"""Pydantic models of the management API: the query and body models that validate
requests, and the response models the OpenAPI document (:mod:`proxy.openapi`) publishes.

Response models describe exactly what the handlers write (``Memory.to_api``, the list
envelope, …); ``tests/test_openapi.py`` checks live answers against them (schemathesis).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
from starlette.requests import Request

from proxy.errors import InvalidRequestError, decode_json, invalid_value
from proxy.http import read_body
from proxy.identity import header_text
from proxy.memory.categories import Category as CategoryName
from proxy.memory.records import MAX_CONTENT_CHARS, MAX_TITLE_CHARS, from_iso
from proxy.routes.params import check_query
from proxy.settings import ID_RULE, id_problem

SourceName = Literal["auto", "manual", "system"]
MAX_TAGS = 20
MAX_SUBCATEGORY_CHARS = 60
# Longest tag, in characters: a tag is a label, bounded like a subcategory (the memory API,
# import, MCP and the admin API alike; learning keeps its own, shorter 40).
MAX_TAG_CHARS = MAX_SUBCATEGORY_CHARS
Tag = Annotated[str, Field(max_length=MAX_TAG_CHARS)]
MAX_SUBJECT_CHARS = 120
MAX_PAGE = 500  # largest page of GET /v1/memories
# How far after the gateway's clock a given created_at may be: a client's clock that runs
# a little ahead is not an error; a date further on is (a memory cannot come from the
# future, and the ranking's date signal would misread it).
MAX_CLOCK_SKEW = timedelta(minutes=5)
M = TypeVar("M", bound=BaseModel)


# helpers ----------------------------------------------------------------------------

def invalid(exc: ValidationError, data: Any) -> InvalidRequestError:
    """The first pydantic error of validating ``data`` as a 400 whose ``param`` is the
    dotted path of the bad value (:func:`proxy.errors.invalid_value`)."""
    return invalid_value(exc, data)


async def read_json(request: Request) -> Any:
    """The request body decoded as JSON (``None`` when empty), read up to
    ``server.max_request_bytes``. Raises :class:`InvalidRequestError` (400 ``invalid_json``)
    and :class:`~proxy.errors.RequestTooLargeError` (413)."""
    limit = request.app.state.resources.settings.server.max_request_bytes
    return decode_json(await read_body(request, limit), "Send a JSON object.")


def given_time(value: str | None, param: str, *,
               now: datetime | None = None) -> datetime | None:
    """``value`` (ISO 8601; without an offset it is UTC) as a UTC time, ``None`` when
    absent. Given ``now``, a time more than :data:`MAX_CLOCK_SKEW` after it is refused.
    Raises :class:`InvalidRequestError` (400 ``invalid_value`` naming ``param``) for text
    that is not such a time, one UTC cannot hold, or one too far ahead."""
    if value is None:
        return None
    try:
        parsed = from_iso(value)
        at = parsed.astimezone(UTC) if parsed is not None else None
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidRequestError(f"{param}: not an ISO 8601 time in UTC's range",
                                  param=param, code="invalid_value") from exc
    if now is not None and at is not None and at > now + MAX_CLOCK_SKEW:
        raise InvalidRequestError(
            f"{param}: {value} is in the future (at most "
            f"{int(MAX_CLOCK_SKEW.total_seconds() // 60)} minutes after the gateway's "
            "clock)", param=param, code="invalid_value")
    return at


def request_conversation(request: Request) -> str | None:
    """The conversation the request names in the identity settings' conversation header
    (``X-Conversation-Id`` by default), trimmed; ``None`` when absent or blank. Raises
    :class:`InvalidRequestError` (400 naming the header) for an id longer than
    :data:`~proxy.settings.MAX_ID_LENGTH` or holding control characters, as for chat."""
    header = request.app.state.resources.settings.identity.conversation_header
    value = header_text(request.headers.get(header))
    if not value or not value.strip():
        return None
    value = value.strip()
    problem = id_problem(value)
    if problem is not None:
        raise InvalidRequestError(f"{header} {problem}; {ID_RULE}.", param=header,
                                  code="invalid_value")
    return value


def parse_query(request: Request, model: type[M]) -> M:
    """Validate the query string with ``model``; empty values count as absent. Raises
    :class:`InvalidRequestError` (400, ``param`` = the parameter)."""
    check_query(request.query_params)
    raw = {k: v for k, v in request.query_params.items() if v != ""}
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise invalid(exc, raw) from exc


def parse_body(raw: Any, model: type[M]) -> M:
    """Validate a decoded JSON body with ``model`` (400 naming the field)."""
    if not isinstance(raw, dict):
        raise InvalidRequestError("The request body must be a JSON object.",
                                  code="invalid_json")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise invalid(exc, raw) from exc


class _Query(BaseModel):
    model_config = ConfigDict(extra="ignore")
    user: str | None = Field(default=None, min_length=1, max_length=256,
                             description="The end user, when no user header is sent")


class _Strict(BaseModel):
    # A JSON body: unknown fields refused, and no coercion — a boolean is true/false, a
    # number a JSON number ("false", "3" or 1 for a boolean are 400s, not silent values).
    model_config = ConfigDict(extra="forbid", strict=True)


# memories ---------------------------------------------------------------------------

class MemoryOut(BaseModel):
    """One memory (docs/design.md#memory-record field names; no embedding vector)."""

    object: Literal["memory"]
    id: str
    tenant: str
    user_id: str | None
    scope: Literal["personal", "shared", "system"]
    category: CategoryName
    subcategory: str
    title: str
    content: str
    tags: list[str]
    subject: str
    source: SourceName
    source_conversation_id: str | None
    source_channel: str | None
    score: float
    has_embedding: bool
    enabled: bool
    hits: int
    created_at: str
    updated_at: str
    last_seen_at: str
    access_count: int
    last_access_at: str | None
    superseded_at: str | None
    superseded_by: str | None
    supersede_reason: str | None
    conflict_with: str | None = Field(
        default=None, description="The other memory of an open conflict")
    conflict_yields: bool = Field(
        default=False, description="Recall skips this memory while its open conflict is "
        "unsettled: the other one has more evidence (then is newer)")


class MemoryList(BaseModel):
    """OpenAI's list shape; ``after=<last_id>`` fetches the next page (with ``q``,
    ``last_id`` is an opaque page token rather than a memory id)."""

    object: Literal["list"]
    data: list[MemoryOut]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ListParams(_Query):
    q: str | None = Field(default=None, max_length=500,
                          description="Search text: results best match first, ranked as "
                                      "chat recall ranks memories (without q: newest "
                                      "first)")
    category: CategoryName | None = None
    scope: Literal["personal", "shared", "system"] = Field(
        default="personal", description="shared/system: the tenant's memories this user "
                                        "receives (read-only here)")
    enabled: bool | None = None
    source: SourceName | None = None
    include_retired: bool = False
    limit: int = Field(default=100, ge=1, le=MAX_PAGE)
    after: str | None = Field(default=None, min_length=1, max_length=64,
                              description="Cursor: the last_id of the previous page "
                                          "(with q an opaque page token, valid with the "
                                          "same q)")
    offset: int = Field(default=0, ge=0, le=1_000_000)


class NewMemory(_Strict):
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    title: str = Field(default="", max_length=MAX_TITLE_CHARS)
    category: CategoryName = "user_preference"
    subcategory: str = Field(default="", max_length=MAX_SUBCATEGORY_CHARS)
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    subject: str = Field(default="user", max_length=MAX_SUBJECT_CHARS)
    created_at: str | None = Field(
        default=None, max_length=64,
        description="When the fact was stated (ISO 8601; no offset: UTC); default now. "
        "At most 5 minutes after the gateway's clock.")
    user: str | None = None  # accepted like the chat body's ``user``


class MemoryPatch(_Strict):
    """Fields to change; at least one. ``enabled: false`` disables (never injected)."""

    title: str | None = Field(default=None, max_length=MAX_TITLE_CHARS)
    content: str | None = Field(default=None, min_length=1, max_length=MAX_CONTENT_CHARS)
    category: CategoryName | None = None
    subcategory: str | None = Field(default=None, max_length=MAX_SUBCATEGORY_CHARS)
    tags: list[Tag] | None = Field(default=None, max_length=MAX_TAGS)
    enabled: bool | None = None
    user: str | None = None


class ConfirmParams(_Query):
    confirm: bool = Field(default=False, description="Must be true")


class UserParams(_Query):
    pass


class MemoryDeleted(BaseModel):
    id: str
    object: Literal["memory.deleted"]
    deleted: bool


class MemoriesCleared(BaseModel):
    object: Literal["memory.cleared"]
    deleted: int


class FlushQueued(BaseModel):
    object: Literal["memory.flush"]
    queued: bool


class FlushBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    user: str | None = None


# learning switches, stats -------------------------------------------------------------

class LearningState(BaseModel):
    """``global``: learning.enabled; ``personal``: the user's switch (null: no user);
    ``effective``: both on."""

    model_config = ConfigDict(populate_by_name=True)
    global_: bool = Field(alias="global")
    personal: bool | None
    effective: bool


class MemoryStats(BaseModel):
    """``total``: every stored memory of the user, ``enabled + disabled + retired``;
    ``enabled``: active ones (what ``GET /v1/admin/stats`` counts as a scope's ``total``);
    ``by_category``/``by_source`` count non-retired ones."""

    object: Literal["memory.stats"]
    total: int = Field(description="every stored memory: enabled + disabled + retired "
                                   "(GET /v1/admin/stats: totals.stored)")
    enabled: int = Field(description="active: enabled and not retired (GET /v1/admin/stats: "
                                     "memories.<scope>.total)")
    disabled: int = Field(description="switched off by the user, not retired")
    retired: int
    by_category: dict[str, int]
    by_source: dict[str, int]
    last_learned_at: str | None
    learning: LearningState


class UserSettingsOut(BaseModel):
    object: Literal["settings"]
    personal_learning: bool
    learning_indicator: bool


class UserSettingsPatch(_Strict):
    # JSON booleans only: "yes" or 1 is a 400, not a silent switch.
    personal_learning: StrictBool | None = None
    learning_indicator: StrictBool | None = None
    user: str | None = None


class IdentityOut(BaseModel):
    object: Literal["identity"]
    tenant: str
    user: str | None
    role: Literal["user", "app", "admin", "global_admin"]
    learning: LearningState


class Erased(BaseModel):
    object: Literal["identity.erased"]
    tenant: str
    user: str
    memories_deleted: int


# profile ------------------------------------------------------------------------------

class ScoredTagOut(BaseModel):
    text: str
    score: float
    effective_score: float
    hits: int
    at: str


class TimelineEvent(BaseModel):
    at: str
    action: str
    actor: str
    reason: str


class FactOut(BaseModel):
    id: str
    title: str
    content: str
    category: CategoryName
    subcategory: str
    hits: int
    created_at: str
    last_seen_at: str
    timeline: list[TimelineEvent]


class ProfileOut(BaseModel):
    object: Literal["profile"]
    user: str
    names: list[str]
    first_seen: str | None
    last_seen: str | None
    message_count: int
    style: str
    impression: str
    traits: list[ScoredTagOut]
    topics: list[ScoredTagOut]
    facts: list[FactOut]


# export / import ----------------------------------------------------------------------

class ExportParams(_Query):
    format: Literal["json", "markdown"] = "json"


class ExportedMemory(BaseModel):
    """One memory as exported (every record field but the embedding) and as imported
    (only ``content`` is required)."""

    # Strict: "false" or "3" is not a boolean or a count (the item is rejected).
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str | None = Field(default=None, max_length=64)
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    title: str = Field(default="", max_length=MAX_TITLE_CHARS)
    scope: Literal["personal", "shared", "system"] = "personal"
    category: CategoryName = "user_preference"
    subcategory: str = Field(default="", max_length=MAX_SUBCATEGORY_CHARS)
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    subject: str = Field(default="user", min_length=1, max_length=MAX_SUBJECT_CHARS)
    source: SourceName = "manual"
    source_conversation_id: str | None = Field(default=None, max_length=256)
    source_channel: str | None = Field(default=None, max_length=300)
    score: float = Field(default=1.0, ge=0, le=1_000)
    enabled: bool = True
    hits: int = Field(default=1, ge=1, le=1_000_000)
    created_at: str | None = None
    updated_at: str | None = None
    last_seen_at: str | None = None
    access_count: int = Field(default=0, ge=0)
    last_access_at: str | None = None
    superseded_at: str | None = None
    superseded_by: str | None = Field(default=None, max_length=64)
    supersede_reason: str | None = Field(default=None, max_length=500)


class ExportOut(BaseModel):
    object: Literal["memory.export"]
    version: int
    exported_at: str
    user: str
    memories: list[MemoryOut]
    profile: ProfileOut
    settings: UserSettingsOut


class ImportBody(BaseModel):
    """Our export (``object: memory.export`` with ``memories``) or mem0's ``get_all``
    answer (``results``: ``{"memory", "metadata", "created_at", …}``)."""

    model_config = ConfigDict(extra="allow")
    object: str | None = None
    # Items are checked one by one (a bad one is listed in ``rejected``, not a 400).
    memories: list[Any] | None = None
    results: list[Any] | None = None
    user: str | None = None


class Rejected(BaseModel):
    """An item left out: its position, the rule's code (``invalid_value``,
    ``instruction_not_allowed``, ``pii_not_allowed`` …) and a readable message."""

    index: int
    reason: str
    message: str


class ImportResult(BaseModel):
    object: Literal["memory.import"]
    imported: int
    merged: int
    rejected: list[Rejected]


# existing routes -----------------------------------------------------------------------

class ModelOut(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelOut]


class Healthz(BaseModel):
    status: Literal["ok"]


class Readyz(BaseModel):
    status: Literal["ok", "degraded", "unavailable"]
    checks: dict[str, Any]


class PromptVersionOut(BaseModel):
    version: int
    text: str
    actor: str
    at: str | None


class PromptOut(BaseModel):
    object: Literal["prompt"]
    kind: Literal["scoring", "extraction"]
    text: str
    source: str
    versions: list[PromptVersionOut]


class PromptIn(BaseModel):
    text: str = Field(max_length=20_000)


class PromptSaved(BaseModel):
    object: Literal["prompt.version"]
    kind: Literal["scoring", "extraction"]
    version: int
    at: str | None


class DeadLetterMessage(BaseModel):
    role: str
    text: str
    name: str | None


class DeadLetterOut(BaseModel):
    id: str
    kind: str
    attempts: int
    last_error: str
    failed_at: float = Field(description="epoch seconds")
    user: str | None = Field(default=None, description="a learn job's user (its batch)")
    conversation: str | None = None
    channel: str | None = None
    messages: list[DeadLetterMessage] = Field(
        default_factory=list, description="the batch's messages as stored (PII-scrubbed)")


class DeadLetterList(BaseModel):
    object: Literal["list"]
    data: list[DeadLetterOut]


class Requeued(BaseModel):
    object: Literal["job.requeued"]
    id: str


class JobDeleted(BaseModel):
    object: Literal["job.deleted"]
    id: str
    deleted: bool
