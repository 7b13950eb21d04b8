"""The admin API: prompts edited at run time, learning log, usage, dead letters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.learning.prompts import SCORING_EN
from tests.fakes import FakeUpstream, Gateway, make_settings, running_gateway

ADMIN = {"Authorization": "Bearer admin-secret"}
APP = {"Authorization": "Bearer app-secret"}


@pytest.fixture
async def gw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upstream: FakeUpstream) -> Any:
    monkeypatch.setenv("ADMIN_KEY", "admin-secret")
    monkeypatch.setenv("APP_KEY", "app-secret")
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1,
                                                 "max_attempts": 1},
                             auth={"keys": [{"key": "os.environ/APP_KEY", "tenant": "acme"}],
                                   "admin_keys": [{"key": "os.environ/ADMIN_KEY",
                                                   "tenant": "acme", "name": "ops"}]})
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


async def say(gateway: Gateway, text: str) -> None:
    async with gateway.client(headers={**APP, "X-User-Id": "u1"}) as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200


async def test_edited_extraction_prompt_is_used_versioned_and_audited(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """An admin's new extraction prompt is what the learning model gets next; versions are
    kept; an empty text restores the built-in prompt."""
    custom = "Extract facts about the user's garden only. Answer JSON {\"memories\": []}."
    async with gw.client(headers=ADMIN) as client:
        saved = await client.put("/v1/admin/prompts/extraction", json={"text": custom})
        assert saved.json()["version"] == 1
        shown = (await client.get("/v1/admin/prompts/extraction")).json()
        assert shown["text"] == custom
        assert shown["source"] == "admin version 1"
    upstream.extract = lambda body: {"memories": []}
    await say(gw, "My tomatoes are ripening.")
    await gw.settle()
    # The custom prompt is not one FakeUpstream recognises: it answered it as chat.
    sent = [r for r in upstream.requests if r["messages"][0]["content"] == custom]
    assert len(sent) == 1
    async with gw.client(headers=ADMIN) as client:
        await client.put("/v1/admin/prompts/extraction", json={"text": ""})
        shown = (await client.get("/v1/admin/prompts/extraction")).json()
        assert shown["source"].startswith("built-in")
        assert [v["version"] for v in shown["versions"]] == [2, 1]
        log = (await client.get("/v1/admin/audit")).json()["data"]
        assert [e["detail"]["version"] for e in log if e["action"] == "edited"] == [2, 1]
        assert (await client.get("/v1/admin/prompts/scoring")).json()["text"] == SCORING_EN


@pytest.mark.parametrize(("headers", "status"), [({}, 401), (APP, 403),
                                                 ({"Authorization": "Bearer nope"}, 401)])
async def test_admin_api_needs_an_admin_key(gw: Gateway, headers: dict[str, str],
                                            status: int) -> None:
    """Without an admin key the admin API answers 401/403 in the error envelope."""
    async with gw.client(headers=headers) as client:
        response = await client.put("/v1/admin/prompts/scoring", json={"text": "x"})
    assert response.status_code == status
    assert "error" in response.json()


async def test_admin_api_is_off_without_admin_keys(gateway: Gateway) -> None:
    """A gateway with no admin keys refuses the admin API (403), even in open mode."""
    async with gateway.client() as client:
        response = await client.get("/v1/admin/usage")
    assert response.status_code == 403


async def test_bad_prompt_input_is_400(gw: Gateway) -> None:
    """A prompt must be a string; unknown prompt kinds are 404."""
    async with gw.client(headers=ADMIN) as client:
        assert (await client.put("/v1/admin/prompts/scoring",
                                 json={"text": 5})).status_code == 400
        assert (await client.get("/v1/admin/prompts/poetry")).status_code == 404


async def test_usage_and_dead_letters(gw: Gateway, upstream: FakeUpstream) -> None:
    """Usage shows user tokens and learning tokens apart; a failed job can be requeued."""
    upstream.extract = lambda body: "not json at all"
    await say(gw, "I collect stamps.")
    await gw.settle()
    async with gw.client(headers=ADMIN) as client:
        usage = (await client.get("/v1/admin/usage", params={"user": "u1"})).json()
        assert [row["requests"] for row in usage["data"]] == [1]
        assert usage["data"][0]["learning_tokens"]["score"] > 0
        assert usage["data"][0]["learning_tokens"]["extract"] > 0
        dead = (await client.get("/v1/admin/dead-letters")).json()["data"]
        assert len(dead) == 1
        assert "ParseError" in dead[0]["last_error"]
        upstream.extract = lambda body: {"memories": [{"title": "Stamps", "content":
                                                       "Collects stamps", "subject": "user"}]}
        requeued = await client.post(f"/v1/admin/dead-letters/{dead[0]['id']}/requeue")
        assert requeued.status_code == 200
        assert (await client.post("/v1/admin/dead-letters/nope/requeue")).status_code == 404
    await gw.settle()
    async with gw.client(headers={**APP, "X-User-Id": "u1"}) as client:
        assert [m["content"] for m in (await client.get("/v1/memories")).json()["data"]] == [
            "Collects stamps"]
