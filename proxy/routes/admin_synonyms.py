"""Candidate synonyms for an admin to settle (docs/design.md#growing-vocabulary), scoped
to the admin key's tenant like every admin route (global keys: 403).

- ``GET /v1/admin/synonyms/candidates?status=open|accepted|rejected|all&limit=`` — the
  tenant's candidates, most counted first (default: open ones)
- ``POST /v1/admin/synonyms/candidates/{id}/accept`` — the words join the tenant's
  ``learning.synonyms`` override (added after ``config.yaml``'s groups; audited
  ``settings_changed``), counted from the next batch; 409 ``synonym_conflict`` when the
  words sit in two different configured groups
- ``POST /v1/admin/synonyms/candidates/{id}/reject`` — not suggested again (an accepted
  group stays in the settings: remove it with ``PATCH /v1/admin/settings``)

An unknown id, or one of another tenant, answers 404 ``synonym_candidate_not_found``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.errors import NotFoundError
from proxy.learning.vocabulary import accept_group
from proxy.memory.store import AuditEvent
from proxy.memory.synonyms import MAX_CANDIDATES, SynonymCandidate, SynonymStatus
from proxy.routes.admin_scope import Admin, caller
from proxy.routes.governance import ok, query

SYNONYMS = "learning.synonyms"


class CandidatesQuery(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # as every query model

    status: Literal["open", "accepted", "rejected", "all"] = "open"
    limit: int = Field(default=100, ge=1, le=MAX_CANDIDATES)


class SynonymExampleOut(BaseModel):
    field: Literal["traits", "topics"]
    kept: str = Field(description="the stored trait or topic")
    said: str = Field(description="the new wording merged into it")
    how: Literal["containment", "synonym", "neighbour"]
    at: datetime


class SynonymCandidateOut(BaseModel):
    object: Literal["synonym.candidate"] = "synonym.candidate"
    id: str
    words: list[str] = Field(description="the pair, the kept word first as first seen")
    count: int = Field(description="merges of the pair across the tenant's users")
    examples: list[SynonymExampleOut] = Field(
        description="the newest merges (at most 5); no user ids"
    )
    status: Literal["open", "accepted", "rejected"]
    created_at: datetime
    updated_at: datetime = Field(description="the newest merge")
    decided_at: datetime | None
    decided_by: str | None = Field(description="the deciding admin key's name")


class SynonymCandidateList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SynonymCandidateOut]


def _out(candidate: SynonymCandidate) -> SynonymCandidateOut:
    return SynonymCandidateOut(
        id=candidate.id,
        words=list(candidate.words),
        count=candidate.count,
        examples=[
            SynonymExampleOut(field=e.field, kept=e.kept, said=e.said, how=e.how, at=e.at)
            for e in candidate.examples
        ],
        status=candidate.status,
        created_at=candidate.created_at,
        updated_at=candidate.updated_at,
        decided_at=candidate.decided_at,
        decided_by=candidate.decided_by,
    )


async def candidates(request: Request) -> Response:
    """``GET /v1/admin/synonyms/candidates`` (:class:`SynonymCandidateList`)."""
    admin = caller(request)
    q = query(CandidatesQuery, request)
    status: SynonymStatus | None = None if q.status == "all" else q.status
    found = await admin.res.store.synonym_candidates(admin.tenant, status=status, limit=q.limit)
    return ok(SynonymCandidateList(data=[_out(c) for c in found]))


async def _candidate(admin: Admin, request: Request) -> SynonymCandidate:
    cid = str(request.path_params["candidate_id"])
    found = await admin.res.store.synonym_candidates(
        admin.tenant, status=None, limit=MAX_CANDIDATES
    )
    candidate = next((c for c in found if c.id == cid), None)
    if candidate is None:
        raise NotFoundError(
            "No synonym candidate with that id.",
            param="candidate_id",
            code="synonym_candidate_not_found",
        )
    return candidate


async def _decide(admin: Admin, candidate: SynonymCandidate, status: SynonymStatus) -> Response:
    decided = await admin.res.store.decide_synonym(
        admin.tenant, candidate.id, status=status, actor=admin.actor, at=admin.res.clock()
    )
    if decided is None:  # erased meanwhile
        raise NotFoundError(
            "No synonym candidate with that id.",
            param="candidate_id",
            code="synonym_candidate_not_found",
        )
    return ok(_out(decided))


async def accept(request: Request) -> Response:
    """``POST /v1/admin/synonyms/candidates/{id}/accept`` (module docstring)."""
    admin = caller(request)
    candidate = await _candidate(admin, request)
    configured = admin.res.settings.learning.synonyms

    def add_group(stored: Mapping[str, Any]) -> dict[str, Any]:
        """The patch adding the candidate's words to the stored groups (none when they
        are joined already); run inside the store's atomic change, so two accepts made at
        once both stay."""
        mine = stored.get(SYNONYMS)
        tenant_groups = [list(g) for g in mine] if isinstance(mine, list) else []
        groups = accept_group(candidate.words, configured=configured, tenant=tenant_groups)
        return {} if groups == tenant_groups else {SYNONYMS: groups}

    _, changed = await admin.res.tenants.change(admin.tenant, add_group)
    if changed:
        await admin.res.store.audit(
            [
                AuditEvent(
                    tenant=admin.tenant,
                    user_id=None,
                    action="settings_changed",
                    actor="admin",
                    at=admin.res.clock(),
                    reason=SYNONYMS,
                    detail={
                        "by": admin.actor,
                        "changed": changed,
                        "synonym_candidate": candidate.id,
                    },
                )
            ]
        )
    return await _decide(admin, candidate, "accepted")


async def reject(request: Request) -> Response:
    """``POST /v1/admin/synonyms/candidates/{id}/reject`` (module docstring)."""
    admin = caller(request)
    return await _decide(admin, await _candidate(admin, request), "rejected")


_ID = {"candidate_id": "the candidate's id (syn_…)"}
openapi.register(
    openapi.Operation(
        "GET",
        "/v1/admin/synonyms/candidates",
        "Candidate synonyms mined from merged traits and topics",
        auth="admin",
        query=CandidatesQuery,
        response=SynonymCandidateList,
        tags=("admin",),
    ),
    openapi.Operation(
        "POST",
        "/v1/admin/synonyms/candidates/{candidate_id}/accept",
        "Accept a candidate: its words join the tenant's learning.synonyms",
        auth="admin",
        response=SynonymCandidateOut,
        errors=(404, 409),
        tags=("admin",),
        path_params=_ID,
    ),
    openapi.Operation(
        "POST",
        "/v1/admin/synonyms/candidates/{candidate_id}/reject",
        "Reject a candidate",
        auth="admin",
        response=SynonymCandidateOut,
        errors=(404,),
        tags=("admin",),
        path_params=_ID,
    ),
)
