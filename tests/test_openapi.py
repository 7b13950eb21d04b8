"""The OpenAPI document: valid OpenAPI 3.1, served without a key, covering every management
route; and schemathesis, driven by it against the running gateway, finds no 5xx and no
answer that breaks the documented schema."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from pydantic import BaseModel

from proxy import openapi
from tests.fakes import FakeUpstream, Gateway, make_settings, running_gateway

ADMIN_KEY = "admin-key-for-fuzzing"
GLOBAL_KEY = "global-admin-key-for-fuzzing"
APP_KEY = "app-key-for-fuzzing"
# The fuzz runs once per kind of key: every status each one can get must be documented.
KEYS = {"tenant-admin": ADMIN_KEY, "global-admin": GLOBAL_KEY, "app": APP_KEY}
REPO_ROOT = Path(__file__).resolve().parent.parent
# Routes outside the management API: the OpenAI-compatible chat (documented by OpenAI)
# and the document itself.
# The model protocols are documented by their owners (OpenAI's and Anthropic's API
# references); /mcp speaks MCP, not REST. The document covers the management routes.
UNDOCUMENTED = {("POST", "/v1/chat/completions"), ("POST", "/chat/completions"),
                ("POST", "/v1/responses"), ("POST", "/v1/messages"),
                ("GET", "/models"), ("GET", "/openapi.json")}
EXAMPLES_PER_OPERATION = 15  # per generation mode (valid and invalid data), tenant admin key
# The other keys reach the same handlers past their first check (a 403 or a narrower
# scope), so fewer cases each keep the fuzzing time of one run close to one key's.
EXAMPLES_BY_KEY = {"tenant-admin": EXAMPLES_PER_OPERATION, "global-admin": 5, "app": 5}


@pytest.fixture
async def gw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("FUZZ_ADMIN", ADMIN_KEY)
    monkeypatch.setenv("FUZZ_APP", APP_KEY)
    monkeypatch.setenv("FUZZ_GLOBAL", GLOBAL_KEY)
    settings = make_settings(
        tmp_path, learning={"enabled": True, "batch_messages": 1},
        auth={"keys": [{"key": "os.environ/FUZZ_APP", "tenant": "fuzz"}],
              "admin_keys": [{"key": "os.environ/FUZZ_ADMIN", "tenant": "fuzz"}],
              "global_admin_keys": [{"key": "os.environ/FUZZ_GLOBAL", "name": "root"}]})
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


async def test_document_is_valid_openapi_served_without_a_key(gw: Gateway) -> None:
    """GET /openapi.json answers without a key (keys are configured) with a document that
    openapi-spec-validator accepts, naming the configured user header."""
    async with gw.client() as client:
        response = await client.get("/openapi.json")
        assert (await client.get("/v1/memories")).status_code == 401
    assert response.status_code == 200
    document = response.json()
    validate(document)
    assert document["openapi"].startswith("3.1")
    listing = document["paths"]["/v1/memories"]["get"]
    assert {p["name"] for p in listing["parameters"]} >= {
        "X-User-Id", "q", "category", "scope", "enabled", "source", "include_retired",
        "limit", "after", "offset"}
    assert listing["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"}


async def test_every_management_route_is_documented(gw: Gateway) -> None:
    """Each route of the app but chat (and the document itself) has one operation."""
    from starlette.routing import Route

    from proxy.app import create_app

    routes = {(m, r.path) for r in create_app(gw.res.settings, resources=gw.res).routes
              if isinstance(r, Route) for m in (r.methods or ()) if m != "HEAD"}
    documented = {(op.method, op.path) for op in openapi.registered()}
    assert routes - UNDOCUMENTED == documented


def test_a_new_route_is_one_register_call() -> None:
    """Registering an operation adds its path, parameters and schemas to the document
    (how another module documents its routes); the document stays valid."""

    class Thing(BaseModel):
        name: str

    class ThingQuery(BaseModel):
        limit: int = 10

    extra = openapi.Operation("GET", "/v1/things/{thing_id}", "One thing", auth="admin",
                              query=ThingQuery, response=Thing, errors=(404,))
    document = openapi.document([*openapi.registered(), extra])
    validate(document)
    operation = document["paths"]["/v1/things/{thing_id}"]["get"]
    assert {p["name"] for p in operation["parameters"]} == {"thing_id", "limit"}
    assert "Thing" in document["components"]["schemas"]
    assert operation["security"] == [{"adminKey": []}]
    assert set(operation["responses"]) == {"200", "400", "401", "403", "404", "503"}


async def _fuzz_in_process(base_url: str, key: str, examples: int) -> Counter[str]:
    """:func:`_fuzz` in a child process. In a thread of this one it failed at random with
    CPython 3.11's "AST constructor recursion depth mismatch" (the ast module's recursion
    counter is shared between threads, gh-106905: hypothesis parses source in the fuzzing
    thread while the gateway works in the main one)."""
    code = ("import json, sys; from tests.test_openapi import _fuzz; "
            "print(json.dumps(_fuzz(sys.argv[1], sys.argv[2], int(sys.argv[3]))))")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, base_url, key, str(examples), cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await child.communicate()
    assert child.returncode == 0, err.decode(errors="replace")[-6000:]
    return Counter(json.loads(out.decode().strip().splitlines()[-1]))


def _fuzz(base_url: str, key: str, examples: int = EXAMPLES_PER_OPERATION) -> Counter[str]:
    """Run schemathesis on every operation (valid, then invalid data) with ``key``; returns
    the cases sent per operation. Raises on the first failing check."""
    import schemathesis
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation import GenerationMode

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    sent: Counter[str] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _runner(operation, mode, base_url, key, sent, examples=examples)()
            except Unsatisfiable:
                if mode is GenerationMode.POSITIVE:
                    raise  # an operation without inputs has no invalid data to send
    return sent


def _runner(operation: Any, mode: Any, base_url: str, key: str, sent: Counter[str], *,
            examples: int) -> Any:
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, response_schema_conformance, status_code_conformance,
              content_type_conformance]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        sent[operation.label] += 1
        case.call_and_validate(base_url=base_url,
                               headers={"Authorization": f"Bearer {key}"},
                               checks=checks, timeout=20)

    return run


@pytest.mark.parametrize("kind", sorted(KEYS))
async def test_schemathesis_finds_no_server_error_or_schema_violation(gw: Gateway,
                                                                      kind: str) -> None:
    """Every operation, fed valid and invalid requests generated from the document with a
    tenant admin key, a global admin key and an app key, never answers 5xx, an
    undocumented status (a global key's 403 on the end-user routes is one), another
    content type, or a body that breaks its schema."""
    async with gw.client() as client:  # give the fuzzer memories to find
        for i in range(3):
            response = await client.post("/v1/memories", json={"content": f"Likes jazz {i}"},
                                         headers={"Authorization": f"Bearer {ADMIN_KEY}",
                                                  "X-User-Id": "u1"})
            assert response.status_code == 201
    sent = await _fuzz_in_process(gw.base_url, KEYS[kind], EXAMPLES_BY_KEY[kind])
    assert len(sent) == len(openapi.registered())
    without_inputs = {"GET /healthz", "GET /readyz", "GET /metrics"}
    assert all(n >= EXAMPLES_BY_KEY[kind] for op, n in sent.items()
               if op not in without_inputs), sent
    async with gw.client() as client:
        assert (await client.get("/healthz")).status_code == 200


async def test_every_status_a_global_or_app_key_gets_is_documented(gw: Gateway) -> None:
    """Each operation called with a global admin key and with an app key (no user) answers
    a status its document lists — the global key's 403 on the end-user routes among them;
    a tenant admin key's answers the same, without that 403 on end-user routes."""
    async with gw.client() as client:
        document = (await client.get("/openapi.json")).json()
        seen: dict[str, set[int]] = {}
        for path, methods in document["paths"].items():
            concrete = path.replace("{kind}", "scoring").replace("{version}", "1")
            concrete = concrete.replace("{memory_id}", "m1").replace("{job_id}", "j1")
            for method, entry in methods.items():
                for name, key in KEYS.items():
                    response = await client.request(
                        method.upper(), concrete, headers={"Authorization": f"Bearer {key}"},
                        json={} if "requestBody" in entry else None)
                    assert str(response.status_code) in entry["responses"], (
                        name, method, path, response.status_code, response.text)
                    seen.setdefault(name, set()).add(response.status_code)
                    if name == "global-admin" and path == "/v1/memories" and method == "get":
                        assert response.status_code == 403
                    if name == "tenant-admin" and path == "/v1/memories" and method == "get":
                        assert response.status_code == 400  # no user named: not a 403
    assert 403 in seen["global-admin"]
    assert 403 in seen["app"]
