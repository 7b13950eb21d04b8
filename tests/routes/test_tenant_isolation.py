"""Every route reads and writes only its caller's tenant.

Tenant ``beta`` has a memory, a prompt version, a dead learning job, a candidate synonym, an
audit log and usage.
Tenant ``acme`` then calls every route with its own app and admin keys against beta's ids
and users; each call must answer as if beta's data did not exist (404 for an id, an empty
or acme-only answer for a list), and beta's data must be unchanged afterwards. Runs on both
storage backends.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from proxy.memory.synonyms import SynonymExample, candidate_id
from tests.fakes import (
    FakeUpstream,
    Gateway,
    backend_overrides,
    make_settings,
    running_gateway,
)

ACME_APP = {"Authorization": "Bearer acme-app"}
ACME_ADMIN = {"Authorization": "Bearer acme-admin"}
BETA_APP = {"Authorization": "Bearer beta-app"}
BETA_ADMIN = {"Authorization": "Bearer beta-admin"}
BETA_SYNONYM = candidate_id(["beekeeper", "bees"])
SECRET_PROMPT = "BETA-ONLY extraction prompt. Answer JSON {\"memories\": []}."


def tenant_settings(tmp_path: Path, **extra: Any) -> Any:
    """Two tenants, each with an app key and an admin key; learning on, one attempt."""
    digest = {k: hashlib.sha256(k.encode()).hexdigest()
              for k in ("acme-app", "beta-app", "acme-admin", "beta-admin")}
    return make_settings(
        tmp_path, learning={"enabled": True, "batch_messages": 1, "max_attempts": 1},
        auth={"keys": [{"key_sha256": digest["acme-app"], "tenant": "acme"},
                       {"key_sha256": digest["beta-app"], "tenant": "beta"}],
              "admin_keys": [{"key_sha256": digest["acme-admin"], "tenant": "acme", "name": "a"},
                             {"key_sha256": digest["beta-admin"], "tenant": "beta", "name": "b"}]},
        **extra)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def two_tenants(request: pytest.FixtureRequest, tmp_path: Path,
                      upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    extra = backend_overrides(request, tmp_path)
    async with running_gateway(tenant_settings(tmp_path, **extra), upstream) as gateway:
        yield gateway


async def beta_state(gw: Gateway) -> dict[str, Any]:
    """What beta can see of its own data (compared before and after acme's calls)."""
    async with gw.client(headers={**BETA_APP, "X-User-Id": "u1"}) as client:
        memories = (await client.get("/v1/memories")).json()["data"]
    async with gw.client(headers=BETA_ADMIN) as client:
        prompt = (await client.get("/v1/admin/prompts/extraction")).json()
        audit = (await client.get("/v1/admin/audit", params={"user": "u1"})).json()["data"]
        usage = (await client.get("/v1/admin/usage", params={"user": "u1"})).json()
        dead = (await client.get("/v1/admin/dead-letters")).json()["data"]
        synonyms = (await client.get("/v1/admin/synonyms/candidates",
                                     params={"status": "all"})).json()["data"]
    return {"synonyms": [(s["id"], s["status"], s["count"]) for s in synonyms],
            "memories": [(m["id"], m["content"], m["enabled"]) for m in memories],
            "prompt": (prompt["text"], [v["version"] for v in prompt["versions"]]),
            "audit": [e["id"] for e in audit],
            "usage": sum(row["requests"] for row in usage["data"]),
            "dead": [(d["id"], d["attempts"]) for d in dead]}


async def seed_beta(gw: Gateway, upstream: FakeUpstream) -> tuple[str, str]:
    """beta: one manual memory, one prompt version, one dead job. Returns (memory id, job
    id)."""
    async with gw.client(headers={**BETA_APP, "X-User-Id": "u1"}) as client:
        made = await client.post("/v1/memories", json={"content": "Keeps bees"})
        assert made.status_code == 201
        upstream.extract = lambda body: "not json at all"
        chat = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "I keep bees."}]})
        assert chat.status_code == 200
    await gw.settle()
    async with gw.client(headers=BETA_ADMIN) as client:
        assert (await client.put("/v1/admin/prompts/extraction",
                                 json={"text": SECRET_PROMPT})).status_code == 200
        [dead] = (await client.get("/v1/admin/dead-letters")).json()["data"]
    await gw.res.store.count_synonyms("beta", "u1", [SynonymExample(
        field="traits", kept="beekeeper", said="bees", how="containment",
        at=datetime(2026, 11, 2, tzinfo=UTC))])
    return made.json()["id"], dead["id"]


# (method, path template, body or None, query, expected status, what must not show)
# {mid} = beta's memory id, {jid} = beta's dead job id. The acme caller names beta's user
# "u1" (X-User-Id) wherever a user is named.
ROUTES: list[tuple[str, str, Any, dict[str, str], int]] = [
    ("GET", "/v1/memories", None, {}, 200),
    ("GET", "/v1/memories", None, {"q": "bees", "include_retired": "true"}, 200),
    ("GET", "/v1/memories/{mid}", None, {}, 404),
    ("DELETE", "/v1/memories/{mid}", None, {}, 404),
    ("POST", "/v1/memories/flush", {}, {}, 202),
    ("DELETE", "/v1/memories", None, {"confirm": "true"}, 200),
    ("GET", "/v1/admin/prompts/extraction", None, {}, 200),
    ("PUT", "/v1/admin/prompts/scoring", {"text": "acme's scoring"}, {}, 200),
    ("GET", "/v1/admin/audit", None, {"user": "u1"}, 200),
    ("GET", "/v1/admin/usage", None, {"user": "u1"}, 200),
    ("GET", "/v1/admin/dead-letters", None, {}, 200),
    ("POST", "/v1/admin/dead-letters/{jid}/requeue", None, {}, 404),
    ("DELETE", "/v1/admin/dead-letters/{jid}", None, {}, 404),
    ("GET", "/v1/admin/synonyms/candidates", None, {"status": "all"}, 200),
    ("POST", "/v1/admin/synonyms/candidates/{sid}/accept", None, {}, 404),
    ("POST", "/v1/admin/synonyms/candidates/{sid}/reject", None, {}, 404),
]


async def test_no_route_reaches_another_tenant(two_tenants: Gateway,
                                               upstream: FakeUpstream) -> None:
    """Every route called by acme's app key and admin key against beta's ids and user
    answers as if beta's data did not exist, and changes nothing of beta's."""
    gw = two_tenants
    memory_id, job_id = await seed_beta(gw, upstream)
    before = await beta_state(gw)
    assert before["memories"]
    assert before["dead"]
    assert before["audit"]
    assert before["synonyms"]
    tried = 0
    for keys in (ACME_APP, ACME_ADMIN):
        for method, template, body, query, status in ROUTES:
            path = template.format(mid=memory_id, jid=job_id, sid=BETA_SYNONYM)
            admin_route = path.startswith("/v1/admin/")
            async with gw.client(headers={**keys, "X-User-Id": "u1"}) as client:
                response = await client.request(method, path, params=query, json=body)
            expected = 403 if admin_route and keys is ACME_APP else status
            assert response.status_code == expected, (keys, method, path, response.text)
            text = response.text
            for secret in (memory_id, "Keeps bees", job_id, "BETA-ONLY", "beekeeper"):
                assert secret not in text, (method, path, secret)
            if path == "/v1/admin/usage" and expected == 200:
                assert sum(row["requests"] for row in response.json()["data"]) == 0
            if path == "/v1/admin/audit" and expected == 200:
                shown = response.json()["data"]
                assert not {e["id"] for e in shown} & set(before["audit"])
                assert all(e["memory_id"] != memory_id for e in shown)
            tried += 1
    await gw.settle()
    assert tried == 2 * len(ROUTES)
    assert await beta_state(gw) == before
