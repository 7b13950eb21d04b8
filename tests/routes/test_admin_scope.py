"""Every admin route scopes alike (proxy/routes/admin_scope.py), both backends: a tenant
admin key naming another tenant with ``?tenant=`` — the global namespace included — is a
403 everywhere (never an answer about its own tenant), and a global admin key is refused
wherever a tenant is required: it reads a named tenant's stats and usage and manages
system memories, nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from proxy import openapi
from tests.fakes import FakeUpstream, Gateway, backend_overrides, make_settings, running_gateway

ACME = {"Authorization": "Bearer acme-admin"}
OTHER = {"Authorization": "Bearer other-admin"}
GLOBAL = {"Authorization": "Bearer root-key"}
OTHER_APP = {"Authorization": "Bearer other-app"}
SECRET_PROMPT = "OTHER-TENANT-PROMPT Extract facts. Answer JSON {\"memories\": []}."

# (method, path template, JSON body, what a global admin key may do there): "refused" (403),
# "reads_tenant" (needs ?tenant=, else 400), "system" (system memories; ?tenant= is 403).
ROUTES: list[tuple[str, str, Any, str]] = [
    ("GET", "/v1/admin/prompts/{kind}", None, "refused"),
    ("PUT", "/v1/admin/prompts/{kind}", {"text": "Score it."}, "refused"),
    ("GET", "/v1/admin/prompts/{kind}/versions", None, "refused"),
    ("POST", "/v1/admin/prompts/{kind}/versions/{version}/restore", None, "refused"),
    ("GET", "/v1/admin/dead-letters", None, "refused"),
    ("POST", "/v1/admin/dead-letters/{job_id}/requeue", None, "refused"),
    ("DELETE", "/v1/admin/dead-letters/{job_id}", None, "refused"),
    ("GET", "/v1/admin/audit", None, "refused"),
    ("GET", "/v1/admin/users", None, "refused"),
    ("GET", "/v1/admin/settings", None, "refused"),
    ("PATCH", "/v1/admin/settings", {"memory.injection_count": 5}, "refused"),
    ("POST", "/v1/admin/memories/{memory_id}/promote", None, "refused"),
    ("GET", "/v1/admin/conflicts", None, "refused"),
    ("GET", "/v1/admin/synonyms/candidates", None, "refused"),
    ("POST", "/v1/admin/synonyms/candidates/{candidate_id}/accept", None, "refused"),
    ("POST", "/v1/admin/synonyms/candidates/{candidate_id}/reject", None, "refused"),
    ("GET", "/v1/admin/usage", None, "reads_tenant"),
    ("GET", "/v1/admin/stats", None, "reads_tenant"),
    ("GET", "/v1/admin/memories", None, "system"),
    ("POST", "/v1/admin/memories", {"content": "The office closes at 6 pm"}, "system"),
    ("PATCH", "/v1/admin/memories/{memory_id}", {"enabled": False}, "system"),
    ("DELETE", "/v1/admin/memories/{memory_id}", None, "system"),
]
IDS = [f"{method} {path}" for method, path, _, _ in ROUTES]
# The path parameters the table's requests fill in (unknown ids: 404 once allowed).
FILLED = {"kind": "scoring", "version": "1", "job_id": "nope", "memory_id": "nope",
          "candidate_id": "nope"}


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path, upstream: FakeUpstream,
             monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    for name, value in (("ACME_ADMIN", "acme-admin"), ("OTHER_ADMIN", "other-admin"),
                        ("ROOT_KEY", "root-key"), ("OTHER_APP", "other-app")):
        monkeypatch.setenv(name, value)
    settings = make_settings(
        tmp_path, learning={"enabled": True, "batch_messages": 1, "max_attempts": 1},
        auth={"keys": [{"key": "os.environ/OTHER_APP", "tenant": "other"}],
              "admin_keys": [{"key": "os.environ/ACME_ADMIN", "tenant": "acme"},
                             {"key": "os.environ/OTHER_ADMIN", "tenant": "other"}],
              "global_admin_keys": [{"key": "os.environ/ROOT_KEY", "name": "root"}]},
        **backend_overrides(request, tmp_path))
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


async def send(gw: Gateway, headers: dict[str, str], method: str, path: str, body: Any,
               *, tenant: str | None, **query: str) -> Any:
    params = {**query, **({"tenant": tenant} if tenant else {})}
    async with gw.client(headers=headers) as client:
        return await client.request(method, path, json=body, params=params or None)


def test_the_table_holds_every_admin_route() -> None:
    """Each documented ``/v1/admin/*`` operation is in the table (a new admin route must
    say how it scopes)."""
    admin = {(op.method, op.path.replace(":path", "")) for op in openapi.registered()
             if op.path.startswith("/v1/admin/")}
    assert {(method, path) for method, path, _, _ in ROUTES} == admin


@pytest.mark.parametrize(("method", "path", "body", "global_use"), ROUTES, ids=IDS)
async def test_a_tenant_admin_naming_another_tenant_is_403_everywhere(
        gw: Gateway, method: str, path: str, body: Any, global_use: str) -> None:
    """``?tenant=other`` and ``?tenant=__global__`` from acme's admin are 403
    ``other_tenant``; ``?tenant=acme`` (its own) is served as without it."""
    for foreign in ("other", "__global__"):
        refused = await send(gw, ACME, method, path, body, tenant=foreign)
        assert refused.status_code == 403, (foreign, refused.text)
        assert refused.json()["error"]["code"] == "other_tenant"
    own = await send(gw, ACME, method, path, body, tenant="acme")
    assert own.status_code != 403, own.text
    assert own.status_code < 500


@pytest.mark.parametrize(("method", "path", "body", "global_use"), ROUTES, ids=IDS)
async def test_a_global_admin_key_is_refused_where_a_tenant_is_required(
        gw: Gateway, method: str, path: str, body: Any, global_use: str) -> None:
    """A global key: 403 ``tenant_admin_required`` on every tenant route, with or without
    ``?tenant=`` (the global namespace's own prompts and dead letters too); a tenant's
    stats and usage with ``?tenant=`` (400 without); system memories (``scope=system``)
    without ``?tenant=`` (403 with one)."""
    path = path.format(**FILLED)
    system = {"scope": "system"} if global_use == "system" else {}
    bare = await send(gw, GLOBAL, method, path, body, tenant=None, **system)
    named = await send(gw, GLOBAL, method, path, body, tenant="acme", **system)
    own = await send(gw, GLOBAL, method, path, body, tenant="__global__", **system)
    if global_use == "refused":
        for response in (bare, named, own):
            assert response.status_code == 403, response.text
            assert response.json()["error"]["code"] == "tenant_admin_required"
    elif global_use == "reads_tenant":
        assert named.status_code == 200, named.text
        assert (bare.status_code, own.status_code) == (400, 400)
        assert bare.json()["error"]["param"] == "tenant"
    else:
        assert bare.status_code not in (400, 403), bare.text
        assert bare.status_code < 500
        for response in (named, own):
            assert response.status_code == 403, response.text
            assert response.json()["error"]["code"] == "tenant_admin_required"


@pytest.mark.parametrize(("method", "path", "body", "global_use"), ROUTES, ids=IDS)
async def test_a_tenant_named_twice_names_no_tenant(gw: Gateway, method: str, path: str,
                                                    body: Any, global_use: str) -> None:
    """``?tenant=acme&tenant=other`` is a 400 naming ``tenant`` on every admin route, for a
    tenant key and a global key alike (the second name won before: a global key read the
    tenant named last); a missing key is still 401 first."""
    path = path.format(**FILLED)
    for headers in (ACME, GLOBAL):
        async with gw.client(headers=headers) as client:
            twice = await client.request(method, f"{path}?tenant=acme&tenant=other",
                                         json=body)
        assert twice.status_code == 400, twice.text
        assert (twice.json()["error"]["param"], twice.json()["error"]["code"]) == (
            "tenant", "invalid_value")
    async with gw.client() as client:
        anonymous = await client.request(method, f"{path}?tenant=acme&tenant=other",
                                         json=body)
    assert anonymous.status_code == 401, anonymous.text


async def test_another_tenants_dead_letters_and_prompts_stay_its_own(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """Another tenant's dead job and prompt are listed for its admin, and acme's admin
    naming that tenant gets a 403 that carries neither (it used to get its own list)."""
    upstream.extract = lambda _body: "not json at all"
    async with gw.client(headers={**OTHER_APP, "X-User-Id": "olga"}) as client:
        chat = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "I keep bees."}]})
    assert chat.status_code == 200
    await gw.settle()
    saved = await send(gw, OTHER, "PUT", "/v1/admin/prompts/extraction",
                       {"text": SECRET_PROMPT}, tenant=None)
    assert saved.status_code == 200
    theirs = await send(gw, OTHER, "GET", "/v1/admin/dead-letters", None, tenant=None)
    [job] = theirs.json()["data"]
    assert job["user"] == "olga"
    assert (await send(gw, OTHER, "GET", "/v1/admin/prompts/extraction", None,
                       tenant=None)).json()["text"] == SECRET_PROMPT
    for path in ("/v1/admin/dead-letters", "/v1/admin/prompts/extraction"):
        refused = await send(gw, ACME, "GET", path, None, tenant="other")
        assert refused.status_code == 403
        assert job["id"] not in refused.text
        assert "OTHER-TENANT-PROMPT" not in refused.text
    mine = await send(gw, ACME, "GET", "/v1/admin/dead-letters", None, tenant=None)
    assert mine.json()["data"] == []
    dropped = await send(gw, ACME, "DELETE", f"/v1/admin/dead-letters/{job['id']}", None,
                         tenant="other")
    assert dropped.status_code == 403
    assert len((await send(gw, OTHER, "GET", "/v1/admin/dead-letters", None,
                           tenant=None)).json()["data"]) == 1
