"""Admins govern: usage, users, the filtered learning log, prompt history,
run-time settings and statistics, scoped to the admin key's tenant.

Global admin keys (``auth.global_admin_keys``) carry no tenant: here they read one
tenant's ``stats`` and ``usage`` by naming it (``?tenant=``); the other routes answer them
403; a tenant admin key naming another tenant gets 403 (:mod:`proxy.routes.admin_scope`:
one rule for every admin route). Bodies and answers are the models of
:mod:`proxy.routes.admin_models`.

- ``GET /v1/admin/usage?group_by=user|model|day&user=&since=&until=`` — chat tokens and,
  always apart, learning tokens per ledger purpose
- ``GET /v1/admin/users?after=&limit=`` — the tenant's users (id order, cursor ``after``)
- ``GET /v1/admin/audit?user=&action=&actor=&conversation=&since=&until=&limit=&before=``
- ``GET /v1/admin/prompts/{kind}/versions`` ·
  ``POST /v1/admin/prompts/{kind}/versions/{version}/restore``
- ``GET`` / ``PATCH /v1/admin/settings`` — :mod:`proxy.tenants`
- ``GET /v1/admin/stats?days=30``
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.errors import InvalidRequestError, NotFoundError
from proxy.learning.budget import LearningBudgets
from proxy.learning.policy import Switches
from proxy.ledger import PURPOSES, UsageRow
from proxy.memory.store import AuditEvent, AuditFilter
from proxy.routes import admin_models as m
from proxy.routes.admin_scope import Admin, caller
from proxy.routes.json import json_response
from proxy.routes.shapes import parse_body, parse_query, read_json
from proxy.settings import GLOBAL_NAMESPACE
from proxy.tenants import OVERRIDABLE, TenantConfig

T = TypeVar("T", bound=BaseModel)
PROMPT_KINDS = ("scoring", "extraction")
# Versions read to find the one to restore (the store keeps every version).
MAX_PROMPT_VERSIONS = 100_000


def query(model: type[T], request: Request) -> T:
    """The query string validated by ``model`` (400 on a bad value or a control
    character)."""
    return parse_query(request, model)


async def body(model: type[T], request: Request) -> T:
    """The JSON body validated by ``model`` (400 on bad JSON or a bad value)."""
    return parse_body(await read_json(request), model)


def _utc(value: datetime | None, param: str) -> datetime | None:
    """``value`` in UTC (naive times are UTC). 400 for a time UTC cannot hold."""
    if value is None:
        return None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (OverflowError, ValueError) as exc:
        raise InvalidRequestError(f"'{param}' is out of range.", param=param,
                                  code="invalid_value") from exc


def ok(model: BaseModel, *, status_code: int = 200) -> Response:
    return json_response(model.model_dump(mode="json"), status_code=status_code)


# --- usage and users ----------------------------------------------------------------------
def _usage_entry(row: UsageRow) -> m.UsageEntry:
    learning = dict.fromkeys(PURPOSES, 0)
    learning.update(row.learning)
    return m.UsageEntry(key=row.key, requests=row.requests,
                        user_tokens=m.UserTokens(prompt=row.prompt, completion=row.completion),
                        memory_tokens=row.memory, learning_tokens=learning,
                        recall_tokens=row.recall)


async def usage(request: Request) -> Response:
    """``GET /v1/admin/usage`` (:class:`~proxy.routes.admin_models.UsageList`)."""
    admin = caller(request, global_use="reads_tenant")
    q = query(m.UsageQuery, request)
    if q.since and q.until and q.since > q.until:
        raise InvalidRequestError("'since' is after 'until'.", param="since",
                                  code="invalid_value")
    await admin.res.usage.flush()
    rows = await admin.res.ledger.usage_report(admin.tenant, group_by=q.group_by,
                                               user=q.user, since=q.since, until=q.until)
    return ok(m.UsageList(data=[_usage_entry(r) for r in rows]))


async def users(request: Request) -> Response:
    """``GET /v1/admin/users`` (:class:`~proxy.routes.admin_models.UserList`)."""
    admin = caller(request)
    q = query(m.UsersQuery, request)
    await admin.res.usage.flush()
    known = await admin.res.ledger.users(admin.tenant, after=q.after, limit=q.limit + 1)
    page = known[:q.limit]
    counts = await asyncio.gather(*(admin.res.store.count(admin.tenant, u.user)
                                    for u in page))
    data = [m.UserEntry(user=u.user, memories=c.get("total", 0), last_seen=u.last_seen)
            for u, c in zip(page, counts, strict=True)]
    return ok(m.UserList(data=data, first_id=page[0].user if page else None,
                         last_id=page[-1].user if page else None,
                         has_more=len(known) > q.limit))


# --- audit -------------------------------------------------------------------------------
def audit_entry(event_id: int, event: AuditEvent) -> m.AuditEntry:
    return m.AuditEntry(id=event_id, at=event.at, user_id=event.user_id,
                        conversation_id=event.conversation_id, actor=event.actor,
                        action=event.action, memory_id=event.memory_id, reason=event.reason,
                        detail=event.detail)


async def audit_log(request: Request) -> Response:
    """``GET /v1/admin/audit`` (:class:`~proxy.routes.admin_models.AuditList`)."""
    admin = caller(request)
    q = query(m.AuditQuery, request)
    where = AuditFilter(user=q.user, action=q.action, actor=q.actor,
                        conversation=q.conversation, since=_utc(q.since, "since"),
                        until=_utc(q.until, "until"))
    rows = await admin.res.store.audit_search(admin.tenant, where, limit=q.limit,
                                              before_id=q.before)
    return ok(m.AuditList(data=[audit_entry(i, e) for i, e in rows]))


# --- prompts -----------------------------------------------------------------------------
def _kind(request: Request) -> str:
    kind = str(request.path_params["kind"])
    if kind not in PROMPT_KINDS:
        raise NotFoundError("Prompts are 'scoring' and 'extraction'.", param="kind",
                            code="unknown_prompt")
    return kind


async def prompt_versions(request: Request) -> Response:
    """``GET /v1/admin/prompts/{kind}/versions``: every saved version, newest first, with
    its author (the admin key's name) and time."""
    admin = caller(request)
    kind = _kind(request)
    q = query(m.PromptVersionsQuery, request)
    versions = await admin.res.store.prompt_versions(admin.tenant, kind, limit=q.limit)
    return ok(m.PromptVersionList(kind=kind, data=[  # type: ignore[arg-type]
        m.PromptVersionEntry(version=v.version, text=v.text, actor=v.actor, at=v.at)
        for v in versions]))


async def restore_prompt(request: Request) -> Response:
    """``POST /v1/admin/prompts/{kind}/versions/{version}/restore``: the old text becomes
    a new current version (audited ``edited``); 404 for a version that does not exist."""
    admin = caller(request)
    kind = _kind(request)
    try:
        number = int(request.path_params["version"])
    except ValueError as exc:
        raise InvalidRequestError("The version is an integer.", param="version",
                                  code="invalid_value") from exc
    versions = await admin.res.store.prompt_versions(admin.tenant, kind,
                                                     limit=MAX_PROMPT_VERSIONS)
    old = next((v for v in versions if v.version == number), None)
    if old is None:
        raise NotFoundError(f"No version {number} of the {kind} prompt.", param="version",
                            code="prompt_version_not_found")
    now = admin.res.clock()
    saved = await admin.res.store.save_prompt(admin.tenant, kind, old.text, admin.actor, now)
    await admin.res.store.audit([AuditEvent(
        tenant=admin.tenant, user_id=None, action="edited", actor="admin", at=now,
        reason=f"{kind} prompt version {saved.version} restores version {number}",
        detail={"kind": kind, "version": saved.version, "restored_from": number,
                "by": admin.actor, "chars": len(saved.text)})])
    return ok(m.PromptRestored(kind=kind, version=saved.version,  # type: ignore[arg-type]
                               restored_from=number, at=saved.at))


# --- settings ------------------------------------------------------------------------------
async def _settings_view(admin: Admin) -> m.SettingsView:
    config = await admin.res.tenants.get(admin.tenant)
    base = TenantConfig(tenant=admin.tenant, learning=admin.res.settings.learning,
                        memory=admin.res.settings.memory, overrides={})
    return m.SettingsView(tenant=admin.tenant,
                          settings={name: config.value(name) for name in OVERRIDABLE},
                          overrides=dict(config.overrides),
                          defaults={name: base.value(name) for name in OVERRIDABLE},
                          learning_available=admin.res.tenants.learning_available)


async def get_settings(request: Request) -> Response:
    """``GET /v1/admin/settings`` (:class:`~proxy.routes.admin_models.SettingsView`)."""
    return ok(await _settings_view(caller(request)))


async def patch_settings(request: Request) -> Response:
    """``PATCH /v1/admin/settings``: 400 naming the setting for a bad value, 409 for
    ``learning.enabled: true`` while ``config.yaml`` has learning off; audit
    ``settings_changed`` with what changed."""
    admin = caller(request)
    patch = await body(m.SettingsPatch, request)
    values = patch.model_dump(by_alias=True, exclude_unset=True, mode="json")
    if not values:
        raise InvalidRequestError("Send at least one setting, e.g. "
                                  "{\"learning.score_threshold\": 0.7}.",
                                  code="invalid_value")
    # A budget is replaced whole; its caps left out are none.
    _, changed = await admin.res.tenants.update(admin.tenant, values)
    if changed:
        await admin.res.store.audit([AuditEvent(
            tenant=admin.tenant, user_id=None, action="settings_changed", actor="admin",
            at=admin.res.clock(), reason=", ".join(sorted(changed)),
            detail={"by": admin.actor, "changed": changed})])
    return ok(await _settings_view(admin))


# --- stats -------------------------------------------------------------------------------
async def stats(request: Request) -> Response:
    """``GET /v1/admin/stats?days=30`` (:class:`~proxy.routes.admin_models.Stats`): totals,
    the learning state with its budget, and one row per UTC day, oldest first."""
    admin = caller(request, global_use="reads_tenant")
    q = query(m.StatsQuery, request)
    res, tenant = admin.res, admin.tenant
    await res.usage.flush()
    today = res.clock().astimezone(UTC).date()
    since = today - timedelta(days=q.days - 1)
    config = await res.tenants.get(tenant)
    user_count, counts, system, audit_counts, daily, budget = await asyncio.gather(
        res.ledger.user_count(tenant), res.store.tenant_counts(tenant),
        res.store.tenant_counts(GLOBAL_NAMESPACE),
        res.store.audit_counts(tenant, since=datetime.combine(since, datetime.min.time(),
                                                              tzinfo=UTC)),
        res.ledger.daily(tenant, since=since, until=today),
        LearningBudgets(res.ledger, clock=res.clock).state(tenant, config.learning.budget),
    )
    res.metrics.learning_budget(tenant, paused=budget.spent)
    memories = {scope: counts.get(scope, {"total": 0, "retired": 0, "disabled": 0})
                for scope in ("personal", "shared")}
    memories["system"] = system.get("system", {"total": 0, "retired": 0, "disabled": 0})

    def events(day: str, action: str, actor: str | None = None) -> int:
        return sum(n for (d, a, who), n in audit_counts.items()
                   if d == day and a == action and (actor is None or who == actor))

    rows = []
    for d in daily:
        day = d.day.isoformat()
        rows.append(m.StatsDay(
            date=d.day, learned=events(day, "created", "auto"),
            merged=events(day, "merged"), retired=events(day, "retired"),
            rejected=events(day, "rejected"), learning_tokens=d.learning_tokens,
            user_tokens=d.user_tokens, active_users=d.active_users,
            recall_tokens=d.recall_tokens))
    enabled = Switches(config=res.learning_enabled, tenant=config.learning.enabled).tenant_learns
    return ok(m.Stats(
        tenant=tenant,
        totals=m.StatsTotals(users=user_count, memories=memories,
                             retired=sum(c["retired"] for c in memories.values()),
                             stored={scope: c["total"] + c["retired"] + c["disabled"]
                                     for scope, c in memories.items()}),
        learning=m.LearningState(enabled=enabled,
                                 budget=m.BudgetState.model_validate(budget.to_api())),
        daily=rows))


_GLOBAL_READS = ("Global admin keys name the tenant with ?tenant= (400 without it); a "
                 "tenant admin key naming another tenant gets 403.")
openapi.register(
    openapi.Operation("GET", "/v1/admin/usage", "Usage by user, model or day; learning "
                      "tokens apart, per purpose", auth="admin", query=m.UsageQuery,
                      response=m.UsageList, tags=("admin",), description=_GLOBAL_READS),
    openapi.Operation("GET", "/v1/admin/users", "The tenant's users, their memories and "
                      "last chat", auth="admin", query=m.UsersQuery, response=m.UserList,
                      tags=("admin",)),
    openapi.Operation("GET", "/v1/admin/audit", "The learning log, filtered",
                      auth="admin", query=m.AuditQuery, response=m.AuditList,
                      tags=("admin",)),
    openapi.Operation("GET", "/v1/admin/prompts/{kind}/versions", "Prompt history with "
                      "author and time", auth="admin", query=m.PromptVersionsQuery,
                      response=m.PromptVersionList, errors=(404,), tags=("admin",),
                      path_params={"kind": "scoring or extraction"}),
    openapi.Operation("POST", "/v1/admin/prompts/{kind}/versions/{version}/restore",
                      "Restore an old prompt version as the new current one",
                      auth="admin", response=m.PromptRestored, errors=(404,),
                      tags=("admin",),
                      path_params={"kind": "scoring or extraction",
                                   "version": "the version number to restore"}),
    openapi.Operation("GET", "/v1/admin/settings", "The tenant's run-time settings",
                      auth="admin", response=m.SettingsView, tags=("admin",)),
    openapi.Operation("PATCH", "/v1/admin/settings", "Change run-time settings (null "
                      "removes an override)", auth="admin", body=m.SettingsPatch,
                      response=m.SettingsView, errors=(409,), tags=("admin",)),
    openapi.Operation("GET", "/v1/admin/stats", "Totals, learning state and budget, daily "
                      "figures", auth="admin", query=m.StatsQuery, response=m.Stats,
                      tags=("admin",), description=_GLOBAL_READS),
)
