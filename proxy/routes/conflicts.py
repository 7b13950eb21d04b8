"""Conflicts a person settles and the profile over time (docs/design.md#conflicts,
docs/design.md#profile-over-time), scoped to the caller's (tenant, user) like the rest of
the memory API (:mod:`proxy.routes.owner`: an admin key acts for ``X-User-Id``).

- ``GET /v1/memories/conflicts?status=open|settled|all`` → ``{"object": "list", "data":
  [conflict…]}``, newest first; default ``open``: open conflicts and unconfirmed automatic
  retirements. A conflict is ``{"id", "object": "memory.conflict", "kind", "status",
  "reason", "user_id", "retired": memory, "successor": memory, "created_at",
  "settled_at", "settled_by"}``; a pair one of whose memories was deleted is not listed.
- ``POST /v1/memories/conflicts/{id}/confirm`` → the conflict, ``confirmed``: the successor
  stands (an open conflict retires the old memory now).
- ``POST /v1/memories/conflicts/{id}/reverse`` → the conflict, ``reversed``: the old memory
  is active again, the successor retired (audited ``retired`` like a supersede).
  Both: 404 ``conflict_not_found`` (also another user's), 409 ``conflict_settled``, or
  ``conflict_stale`` when a later fact replaced one of the pair's facts.
- ``GET /v1/admin/conflicts?user=&status=`` (tenant admin key) → the user's conflicts;
  without ``user``, those of every user of the caller's tenant (each item names its
  ``user_id``), newest first, at most :data:`LIST_LIMIT` in all.
- ``GET /v1/profile/history?since=&until=`` → ``{"object": "list", "data": [{"week",
  "traits": [{"text", "score"}], "topics": [...]}]}``, oldest first, one per week from
  the first stored snapshot on: a week in which nothing was learned repeats the week
  before it; the current week is the live profile, so a new user gets the current week
  (empty lists) rather than nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.errors import ConflictError, InvalidRequestError, NotFoundError
from proxy.memory.conflicts import (
    STATUS_FILTERS,
    Conflict,
    history,
    mark_pair,
    parse_week,
    settle,
    snapshot,
    unmarked,
)
from proxy.memory.records import Memory
from proxy.memory.store import AuditEvent, ChangeSet
from proxy.resources import Resources
from proxy.routes import conflict_shapes as cs
from proxy.routes.admin_scope import caller
from proxy.routes.json import json_response
from proxy.routes.owner import Owner, owner
from proxy.routes.shapes import UserParams, parse_query

LIST_LIMIT = 500  # conflicts listed at most (a user holds at most 500 memories)


async def _listed(res: Resources, tenant: str, user: str | None,
                  status: str) -> list[dict[str, Any]]:
    """The conflicts of the status filter — the user's, or with ``user`` ``None`` those of
    every user of the tenant — with both memories (pairs with a deleted memory left
    out)."""
    statuses = STATUS_FILTERS[status]
    if user is None:
        await res.usage.flush()  # the tenant's users index includes this process's users
        found = await res.store.list_tenant_conflicts(tenant, statuses=statuses,
                                                      limit=LIST_LIMIT)
    else:
        found = await res.store.list_conflicts(tenant, user, statuses=statuses,
                                               limit=LIST_LIMIT)
    out = []
    for conflict in found:
        pair = await _pair(res, tenant, conflict.user_id, conflict)
        if pair is not None:
            out.append(conflict.to_api(*pair))
    return out


async def _pair(res: Resources, tenant: str, user: str,
                conflict: Conflict) -> tuple[Memory, Memory] | None:
    retired = await res.store.get(tenant, user, conflict.retired_id)
    successor = await res.store.get(tenant, user, conflict.successor_id)
    return None if retired is None or successor is None else (retired, successor)


async def list_conflicts(request: Request) -> Response:
    """``GET /v1/memories/conflicts`` (:class:`~proxy.routes.conflict_shapes.ConflictList`)."""
    res: Resources = request.app.state.resources
    params = parse_query(request, cs.ConflictParams)
    me = owner(request, res, dict(request.query_params))
    return json_response({"object": "list",
                          "data": await _listed(res, me.tenant, me.user, params.status)})


async def admin_conflicts(request: Request) -> Response:
    """``GET /v1/admin/conflicts?user=`` for the tenant's admin key: one user's
    conflicts, or without ``user`` the tenant's."""
    admin = caller(request)
    params = parse_query(request, cs.AdminConflictParams)
    return json_response({"object": "list", "data": await _listed(
        admin.res, admin.tenant, params.user, params.status)})


def _events(me: Owner, res: Resources, done: Conflict, retired: Memory,
            successor: Memory) -> tuple[AuditEvent, ...]:
    """The settlement's audit events: the conflict's own, and ``retired`` for the memory
    it retires (as a supersede is audited)."""
    action = "conflict_reversed" if done.status == "reversed" else "conflict_confirmed"
    events = [me.audit(res, action, done.successor_id, reason=done.kind,
                       detail={"conflict": done.id, "retired": done.retired_id})]
    for memory, by in ((successor, retired), (retired, successor)):
        if not memory.active and memory.superseded_at == done.settled_at:
            events.append(me.audit(res, "retired", memory.id, reason="superseded",
                                   detail={"superseded_by": by.id, "conflict": done.id}))
    return tuple(events)


async def _settle(request: Request, *, reverse: bool) -> Response:
    res: Resources = request.app.state.resources
    me = owner(request, res, dict(request.query_params))
    conflict_id = request.path_params["conflict_id"]
    conflict = await res.store.get_conflict(me.tenant, me.user, conflict_id)
    pair = None if conflict is None else await _pair(res, me.tenant, me.user, conflict)
    if conflict is None or pair is None:
        raise NotFoundError("No such conflict.", param="conflict_id",
                            code="conflict_not_found")
    if conflict.settled:
        raise ConflictError(f"The conflict is {conflict.status} already.",
                            param="conflict_id", code="conflict_settled")
    if _overtaken(*pair):
        raise ConflictError("A later fact has replaced one of this conflict's facts since; "
                            "settle that newer conflict instead.", param="conflict_id",
                            code="conflict_stale")
    done, (retired, successor) = settle(conflict, *pair, reverse=reverse, at=res.clock(),
                                        actor=me.actor)
    applied = await res.store.apply(ChangeSet(
        tenant=me.tenant, user_id=me.user, batch_key=f"conflict:{done.id}",
        upserts=(retired, successor), conflicts=(done,),
        audit=_events(me, res, done, retired, successor)))
    if not applied:  # settled by a concurrent request
        raise ConflictError("The conflict is settled already.", param="conflict_id",
                            code="conflict_settled")
    return json_response(done.to_api(retired, successor))


def _overtaken(first: Memory, second: Memory) -> bool:
    """Whether either memory of a pair was retired by a memory outside the pair (settling
    it then would make two contradicting facts active at once)."""
    return any(m.superseded_at is not None and m.superseded_by not in (first.id, second.id)
               for m in (first, second))


async def confirm_conflict(request: Request) -> Response:
    """``POST /v1/memories/conflicts/{conflict_id}/confirm``."""
    return await _settle(request, reverse=False)


async def reverse_conflict(request: Request) -> Response:
    """``POST /v1/memories/conflicts/{conflict_id}/reverse``."""
    return await _settle(request, reverse=True)


async def release_partner(res: Resources, memory: Memory) -> None:
    """After ``memory`` was deleted: the other memory of its open conflict is no longer
    held back by it (its mark is removed)."""
    if memory.conflict_with is None or memory.user_id is None:
        return
    partner = await res.store.get(memory.tenant, memory.user_id, memory.conflict_with)
    if partner is not None and partner.conflict_with == memory.id:
        try:
            await res.store.update(unmarked(partner))
        except KeyError:  # deleted meanwhile
            return


async def switch_in_pair(res: Resources, memory: Memory,
                         write: Callable[[Memory], Awaitable[None]]) -> Memory:
    """Write ``memory``, switched on or off by a person, with ``write``, and choose the
    marks of its open conflict again (:func:`~proxy.memory.conflicts.mark_pair`: an
    enabled memory before a disabled one): disabling the memory recall kept releases the
    other, enabling it again restores the choice. The other memory is written before
    ``memory`` when it is to yield and after it when it is released, so a failure
    between the two writes never leaves both injected. Raises what ``write`` raises
    (:class:`NotFoundError` for a memory deleted meanwhile: the other one is then
    released). Returns ``memory`` as written."""
    partner = None
    if memory.conflict_with is not None and memory.user_id is not None:
        partner = await res.store.get(memory.tenant, memory.user_id, memory.conflict_with)
    if partner is None or partner.conflict_with != memory.id:
        await write(memory)
        return memory
    mine, theirs = mark_pair(memory, partner)
    changed = theirs != partner
    if changed and theirs.conflict_yields:
        await _update_partner(res, theirs)
    try:
        await write(mine)
    except NotFoundError:  # deleted meanwhile: nothing holds the other memory back
        if changed and theirs.conflict_yields:
            await _update_partner(res, unmarked(theirs))
        raise
    if changed and not theirs.conflict_yields:
        await _update_partner(res, theirs)
    return mine


async def _update_partner(res: Resources, partner: Memory) -> None:
    try:
        await res.store.update(partner)
    except KeyError:  # deleted meanwhile: nothing to hold back
        return


def _week(value: str | None, param: str) -> str | None:
    if value is None:
        return None
    try:
        return parse_week(value)
    except ValueError as exc:
        raise InvalidRequestError(
            f"{param}: an ISO week such as 2026-W48, or an ISO 8601 date or time",
            param=param, code="invalid_value") from exc


async def profile_history(request: Request) -> Response:
    """``GET /v1/profile/history`` (:class:`~proxy.routes.conflict_shapes.ProfileHistory`)."""
    res: Resources = request.app.state.resources
    params = parse_query(request, cs.HistoryParams)
    me = owner(request, res, dict(request.query_params))
    since, until = _week(params.since, "since"), _week(params.until, "until")
    if since is not None and until is not None and since > until:
        raise InvalidRequestError("since: must not be after until", param="since",
                                  code="invalid_value")
    stored = await res.store.profile_history(me.tenant, me.user)
    live = snapshot(await res.store.get_profile(me.tenant, me.user), tenant=me.tenant,
                    user=me.user, now=res.clock())
    weeks = history(stored, live, since=since, until=until)
    return json_response({"object": "list", "data": [w.to_api() for w in weeks]})


_SETTLE_ERRORS = (404, 409)
_ID = {"conflict_id": "A conflict id from GET /v1/memories/conflicts"}
openapi.register(
    openapi.Operation("GET", "/v1/memories/conflicts", "The user's conflicts: pairs of "
                      "contradicting memories (newest first)", query=cs.ConflictParams,
                      response=cs.ConflictList, tags=("memories",)),
    openapi.Operation("POST", "/v1/memories/conflicts/{conflict_id}/confirm",
                      "Keep the successor (an open conflict retires the old memory)",
                      query=UserParams, response=cs.ConflictOut, errors=_SETTLE_ERRORS,
                      tags=("memories",), path_params=_ID),
    openapi.Operation("POST", "/v1/memories/conflicts/{conflict_id}/reverse",
                      "Make the old memory active again and retire the successor",
                      query=UserParams, response=cs.ConflictOut, errors=_SETTLE_ERRORS,
                      tags=("memories",), path_params=_ID),
    openapi.Operation("GET", "/v1/admin/conflicts", "A user's conflicts, or without user "
                      "every user's of the tenant (tenant admin; newest first, at most "
                      "500)",
                      auth="admin", query=cs.AdminConflictParams, response=cs.ConflictList,
                      tags=("admin",)),
    openapi.Operation("GET", "/v1/profile/history", "The user's traits and topics week by "
                      "week (oldest first; the current week is the live profile)",
                      description="One entry per week from the first stored snapshot "
                      "on: a week in which nothing was learned repeats the week before it "
                      "(weeks before the first snapshot are absent).",
                      query=cs.HistoryParams, response=cs.ProfileHistory,
                      tags=("profile",)),
)
