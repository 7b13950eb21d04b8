"""The admin API (admin keys only, scoped to the admin key's tenant).

- ``GET /v1/admin/prompts/{kind}`` — the scoring or extraction prompt in force (admin edit,
  else config, else built-in) and its saved versions
- ``PUT /v1/admin/prompts/{kind}`` ``{"text": "…"}`` — save a new version (audited);
  ``{"text": ""}`` goes back to the configured / built-in prompt
- the learning log, usage, users, settings, stats and prompt history:
  :mod:`proxy.routes.governance`
- ``GET /v1/admin/dead-letters`` · ``POST /v1/admin/dead-letters/{id}/requeue`` ·
  ``DELETE /v1/admin/dead-letters/{id}`` — the tenant's failed learning jobs: list, run
  again, drop. ``failed_at`` is epoch seconds. A ``learn`` job whose batch is still stored
  also names its ``user``, ``conversation``, ``channel`` and the batch's ``messages``
  (``role``, ``text``, ``name``) as the buffer keeps them, i.e. already PII-scrubbed; other
  jobs have ``null`` there and no messages. A job of another tenant (or one dead-lettered
  before jobs carried their tenant) is not listed and answers 404 ``job_not_found``; the
  operator's CLI ``memory-proxy dead-letters`` sees every job.

Every route reads and writes only the admin key's tenant (``tests/routes/test_admin.py``
holds a table of every route against a foreign tenant's data); a global admin key is 403
here, and so is a ``?tenant=`` naming another tenant (:mod:`proxy.routes.admin_scope`).
"""

from __future__ import annotations

from typing import Literal

from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.errors import InvalidRequestError, NotFoundError
from proxy.learning.prompts import EXTRACTION_EN, SCORING_EN
from proxy.learning.queue import DeadLetter, LearningQueue
from proxy.memory.records import to_iso
from proxy.memory.store import AuditEvent
from proxy.resources import Resources
from proxy.routes.admin_scope import caller
from proxy.routes.json import json_response
from proxy.routes.params import check_text
from proxy.routes.shapes import (
    DeadLetterList,
    JobDeleted,
    PromptIn,
    PromptOut,
    PromptSaved,
    Requeued,
    read_json,
)

MAX_PROMPT_CHARS = 20_000
PromptKind = Literal["scoring", "extraction"]
_BUILT_IN: dict[str, str] = {"scoring": SCORING_EN, "extraction": EXTRACTION_EN}


def _admin(request: Request) -> tuple[Resources, str, str]:
    """``(resources, tenant, actor)`` of a tenant admin; a global admin key and a foreign
    ``?tenant=`` are 403 (:func:`~proxy.routes.admin_scope.caller`)."""
    admin = caller(request)
    return admin.res, admin.tenant, admin.actor


def _kind(request: Request) -> PromptKind:
    kind = request.path_params["kind"]
    if kind not in _BUILT_IN:
        raise NotFoundError("Prompts are 'scoring' and 'extraction'.", param="kind",
                            code="unknown_prompt")
    return kind  # type: ignore[no-any-return]


async def get_prompt(request: Request) -> Response:
    res, tenant, _ = _admin(request)
    kind = _kind(request)
    versions = await res.store.prompt_versions(tenant, kind)
    configured = getattr(res.settings.learning, f"{kind}_prompt")
    if versions and versions[0].text:
        active, source = versions[0].text, f"admin version {versions[0].version}"
    elif configured:
        active, source = configured, "config"
    else:
        active, source = _BUILT_IN[kind], "built-in (English; a Chinese one is used for "\
                                           "Chinese conversations)"
    return json_response({
        "object": "prompt", "kind": kind, "text": active, "source": source,
        "versions": [{"version": v.version, "text": v.text, "actor": v.actor,
                      "at": to_iso(v.at)} for v in versions],
    })


async def put_prompt(request: Request) -> Response:
    res, tenant, actor = _admin(request)
    kind = _kind(request)
    body = await read_json(request)
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str) or len(text) > MAX_PROMPT_CHARS:
        raise InvalidRequestError(
            f"Send {{\"text\": \"...\"}} with at most {MAX_PROMPT_CHARS} characters "
            "(an empty text restores the configured / built-in prompt).", param="text",
            code="invalid_value")
    check_text(text, "text")
    saved = await res.store.save_prompt(tenant, kind, text.strip(), actor, res.clock())
    await res.store.audit([AuditEvent(
        tenant=tenant, user_id=None, action="edited", actor="admin", at=res.clock(),
        reason=f"{kind} prompt version {saved.version}",
        detail={"kind": kind, "version": saved.version, "by": actor,
                "chars": len(saved.text)})])
    return json_response({"object": "prompt.version", "kind": kind,
                          "version": saved.version, "at": to_iso(saved.at)})


# A learn job's id is this prefix and its batch key (both queue backends name it so).
_LEARN_PREFIX = "learn:"


async def _dead_letter(queue: LearningQueue, dead: DeadLetter) -> dict[str, object]:
    """One dead job as the API lists it (module docstring), its batch read when stored."""
    batch = None
    if dead.kind == "learn" and dead.id.startswith(_LEARN_PREFIX):
        batch = await queue.load_batch(dead.id.removeprefix(_LEARN_PREFIX))
    return {"id": dead.id, "kind": dead.kind, "attempts": dead.attempts,
            "last_error": dead.last_error, "failed_at": dead.failed_at,
            "user": batch.user if batch else None,
            "conversation": batch.conversation if batch else None,
            "channel": batch.channel if batch else None,
            "messages": [{"role": m.role, "text": m.text, "name": m.name}
                         for m in batch.messages] if batch else []}


async def dead_letters(request: Request) -> Response:
    res, tenant, _ = _admin(request)
    if res.queue is None:
        return json_response({"object": "list", "data": []})
    dead = await res.queue.dead_letters(limit=500, tenant=tenant)
    return json_response({"object": "list", "data": [
        await _dead_letter(res.queue, d) for d in dead]})


async def requeue(request: Request) -> Response:
    res, tenant, _ = _admin(request)
    job_id = request.path_params["job_id"]
    if res.queue is None or not await res.queue.requeue(job_id, tenant=tenant):
        raise NotFoundError("No dead job with that id.", param="job_id", code="job_not_found")
    return json_response({"object": "job.requeued", "id": job_id})


async def drop_dead_letter(request: Request) -> Response:
    res, tenant, _ = _admin(request)
    job_id = request.path_params["job_id"]
    if res.queue is None or not await res.queue.drop(job_id, tenant=tenant):
        raise NotFoundError("No dead job with that id.", param="job_id", code="job_not_found")
    return json_response({"object": "job.deleted", "id": job_id, "deleted": True})


openapi.register(
    openapi.Operation("GET", "/v1/admin/prompts/{kind}", "The learning prompt in force and "
                      "its versions", auth="admin", response=PromptOut, errors=(404,),
                      tags=("admin",)),
    openapi.Operation("PUT", "/v1/admin/prompts/{kind}", "Save a new prompt version",
                      auth="admin", body=PromptIn, response=PromptSaved, errors=(404,),
                      tags=("admin",)),
    # GET /v1/admin/audit and /v1/admin/usage: proxy/routes/governance.py
    openapi.Operation("GET", "/v1/admin/dead-letters", "Jobs that failed for good",
                      auth="admin", response=DeadLetterList, tags=("admin",)),
    openapi.Operation("POST", "/v1/admin/dead-letters/{job_id:path}/requeue",
                      "Retry a dead job", auth="admin", response=Requeued, errors=(404,),
                      tags=("admin",)),
    openapi.Operation("DELETE", "/v1/admin/dead-letters/{job_id:path}",
                      "Drop a dead job", auth="admin", response=JobDeleted, errors=(404,),
                      tags=("admin",)),
)
