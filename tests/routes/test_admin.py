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


async def test_a_dead_learn_job_names_its_user_conversation_and_scrubbed_messages(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """A dead ``learn`` job lists the batch's user, conversation, channel and messages as
    the buffer stored them (a secret already replaced), and its time in epoch seconds."""
    upstream.extract = lambda body: "not json at all"
    async with gw.client(headers={**APP, "X-User-Id": "u1",
                                  "X-Conversation-Id": "c-42"}) as client:
        response = await client.post("/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content":
             "My config has OPENAI_API_KEY=sk-test-PLACEHOLDER0123456789abcdef and fails."}]})
    assert response.status_code == 200
    await gw.settle()
    async with gw.client(headers=ADMIN) as client:
        [dead] = (await client.get("/v1/admin/dead-letters")).json()["data"]
    assert (dead["kind"], dead["user"], dead["conversation"], dead["channel"]) == (
        "learn", "u1", "c-42", "private")
    assert dead["messages"][0]["role"] == "user"
    assert "[SECRET]" in dead["messages"][0]["text"]
    assert "PLACEHOLDER" not in str(dead["messages"])
    assert 1e9 < dead["failed_at"] < 1e11  # seconds, not milliseconds


async def test_a_global_admin_is_told_the_configured_tenants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upstream: FakeUpstream
) -> None:
    """GET /v1/me for a global admin key lists the tenants the configuration names."""
    monkeypatch.setenv("ZETA_KEY", "zeta-secret")
    monkeypatch.setenv("ADMIN_KEY", "admin-secret")
    monkeypatch.setenv("ROOT_KEY", "global-secret")
    settings = make_settings(tmp_path, auth={
        "keys": [{"key": "os.environ/ZETA_KEY", "tenant": "zeta"}],
        "admin_keys": [{"key": "os.environ/ADMIN_KEY", "tenant": "acme"}],
        "global_admin_keys": [{"key": "os.environ/ROOT_KEY", "name": "root"}]})
    async with running_gateway(settings, upstream) as gateway, gateway.client(
            headers={"Authorization": "Bearer global-secret"}) as client:
        me = (await client.get("/v1/me")).json()
    assert (me["role"], me["tenants"]) == ("global_admin", ["acme", "zeta"])


async def test_a_dead_job_can_be_dropped(gw: Gateway, upstream: FakeUpstream) -> None:
    """DELETE /v1/admin/dead-letters/{id} removes the tenant's failed job for good; a second
    delete, or an unknown id, is 404."""
    upstream.extract = lambda body: "not json at all"
    await say(gw, "I collect coins.")
    await gw.settle()
    async with gw.client(headers=ADMIN) as client:
        [dead] = (await client.get("/v1/admin/dead-letters")).json()["data"]
        dropped = await client.delete(f"/v1/admin/dead-letters/{dead['id']}")
        assert dropped.status_code == 200
        assert dropped.json() == {"object": "job.deleted", "id": dead["id"], "deleted": True}
        assert (await client.get("/v1/admin/dead-letters")).json()["data"] == []
        again = await client.delete(f"/v1/admin/dead-letters/{dead['id']}")
        assert again.status_code == 404
        assert again.json()["error"]["code"] == "job_not_found"
    assert (await gw.res.queue.depth()).dead == 0  # type: ignore[union-attr]
