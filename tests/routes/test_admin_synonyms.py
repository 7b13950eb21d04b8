"""A vocabulary that grows: merged wordings become candidate synonyms an admin accepts
(into the tenant's learning.synonyms, used from the next batch) or rejects — on both
storage backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from proxy.memory.synonyms import SynonymExample, candidate_id
from proxy.settings import Settings
from tests.fakes import FakeUpstream, Gateway, make_settings, redis_storage, running_gateway
from tests.learning.test_learning_e2e import CrashAfterApply

ADMIN = {"Authorization": "Bearer acme-admin"}
OTHER_ADMIN = {"Authorization": "Bearer globex-admin"}
APP = {"Authorization": "Bearer acme-app"}
CONFIGURED = [["话少", "潜水", "沉默"], ["quiet", "reserved", "taciturn"]]
T0 = datetime(2026, 11, 2, tzinfo=UTC)


def traits(*texts: str) -> Callable[[dict[str, Any]], Any]:
    return lambda _body: {"memories": [], "profile": {"traits": list(texts), "topics": []}}


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def settings_for(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Settings]:
    for name in ("acme-admin", "globex-admin", "acme-app", "globex-app"):
        monkeypatch.setenv(name.upper().replace("-", "_"), name)
    storage: dict[str, object] = {"path": str(tmp_path / "memory.db")}
    if request.param == "redis":
        storage = redis_storage(
            tmp_path, request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        )

    def build(**learning: Any) -> Settings:
        return make_settings(
            tmp_path,
            storage=storage,
            learning={
                "enabled": True,
                "batch_messages": 1,
                "synonyms": CONFIGURED,
                "retry_base_seconds": 0.01,
                **learning,
            },
            auth={
                "keys": [
                    {"key": "os.environ/ACME_APP", "tenant": "acme"},
                    {"key": "os.environ/GLOBEX_APP", "tenant": "globex"},
                ],
                "admin_keys": [
                    {"key": "os.environ/ACME_ADMIN", "tenant": "acme", "name": "ops"},
                    {"key": "os.environ/GLOBEX_ADMIN", "tenant": "globex"},
                ],
            },
        )

    return build


@pytest.fixture
async def gw(
    settings_for: Callable[..., Settings], upstream: FakeUpstream
) -> AsyncIterator[Gateway]:
    async with running_gateway(settings_for(), upstream) as gateway:
        yield gateway


async def say(gw: Gateway, user: str, text: str) -> None:
    async with gw.client(headers={**APP, "X-User-Id": user}) as client:
        reply = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": text}]},
        )
        assert reply.status_code == 200
    await gw.settle()


async def admin(
    gw: Gateway, method: str, path: str, *, headers: dict[str, str] = ADMIN, **kwargs: Any
) -> Any:
    async with gw.client(headers=headers) as client:
        return await client.request(method, path, **kwargs)


async def listed(gw: Gateway, **params: str) -> list[dict[str, Any]]:
    response = await admin(gw, "GET", "/v1/admin/synonyms/candidates", params=params)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    return list(body["data"])


async def profile_traits(gw: Gateway, user: str) -> list[tuple[str, int]]:
    async with gw.client(headers={**APP, "X-User-Id": user}) as client:
        profile = (await client.get("/v1/profile")).json()
    return [(t["text"], t["hits"]) for t in profile["traits"]]


async def seed(gw: Gateway, kept: str, said: str, user: str = "u9") -> str:
    await gw.res.store.count_synonyms(
        "acme",
        user,
        [SynonymExample(field="traits", kept=kept, said=said, how="containment", at=T0)],
    )
    return candidate_id([kept, said])


async def test_a_merge_of_two_wordings_is_listed_as_a_candidate(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """A trait learned in other words merges and is counted once per applied batch; a
    batch that merges nothing lists nothing."""
    upstream.extract = traits("mountain hiking")
    await say(gw, "u1", "I go mountain hiking every weekend.")
    assert await listed(gw) == []
    upstream.extract = traits("hiking")
    await say(gw, "u1", "Went hiking again on Sunday.")
    [candidate] = await listed(gw)
    assert candidate["id"] == candidate_id(["mountain hiking", "hiking"])
    assert candidate["object"] == "synonym.candidate"
    assert (candidate["words"], candidate["count"], candidate["status"]) == (
        ["mountain hiking", "hiking"],
        1,
        "open",
    )
    [example] = candidate["examples"]
    assert {k: example[k] for k in ("field", "kept", "said", "how")} == {
        "field": "traits",
        "kept": "mountain hiking",
        "said": "hiking",
        "how": "containment",
    }
    assert "u1" not in str(candidate)
    assert await profile_traits(gw, "u1") == [("mountain hiking", 2)]
    # another tenant sees none of it
    other = await admin(gw, "GET", "/v1/admin/synonyms/candidates", headers=OTHER_ADMIN)
    assert other.json()["data"] == []


async def test_an_accepted_pair_joins_the_tenant_synonyms_for_the_next_batch(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """Before: two traits for "introverted" and "shy". Accepted: GET /v1/admin/settings
    shows the group as the tenant's learning.synonyms beside config.yaml's, and the next
    batch merges the two wordings."""
    upstream.extract = traits("introverted")
    await say(gw, "u1", "I am rather introverted.")
    await say(gw, "u2", "I am rather introverted.")
    upstream.extract = traits("shy")
    await say(gw, "u1", "People say I am shy.")
    assert sorted(await profile_traits(gw, "u1")) == [("introverted", 1), ("shy", 1)]
    cid = await seed(gw, "introverted", "shy")
    accepted = await admin(gw, "POST", f"/v1/admin/synonyms/candidates/{cid}/accept")
    assert accepted.status_code == 200, accepted.text
    assert (accepted.json()["status"], accepted.json()["decided_by"]) == ("accepted", "ops")
    view = (await admin(gw, "GET", "/v1/admin/settings")).json()
    assert view["overrides"]["learning.synonyms"] == [["introverted", "shy"]]
    assert view["defaults"]["learning.synonyms"] == CONFIGURED
    assert view["settings"]["learning.synonyms"] == [*CONFIGURED, ["introverted", "shy"]]
    await say(gw, "u2", "People say I am shy.")
    assert await profile_traits(gw, "u2") == [("introverted", 2)]
    assert await listed(gw) == []
    assert [c["id"] for c in await listed(gw, status="accepted")] == [cid]
    audit = (
        await admin(gw, "GET", "/v1/admin/audit", params={"action": "settings_changed"})
    ).json()["data"]
    assert audit[0]["detail"]["synonym_candidate"] == cid


async def test_accepts_made_at_once_all_join_the_tenant_synonyms(gw: Gateway) -> None:
    """Three candidates accepted by concurrent requests: every group is in the tenant's
    learning.synonyms (no accept overwrites another's), and every one is accepted."""
    pairs = [("introverted", "shy"), ("outgoing", "sociable"), ("curious", "inquisitive")]
    ids = [await seed(gw, kept, said) for kept, said in pairs]
    answers = await asyncio.gather(*(
        admin(gw, "POST", f"/v1/admin/synonyms/candidates/{cid}/accept") for cid in ids))
    assert [a.status_code for a in answers] == [200, 200, 200]
    view = (await admin(gw, "GET", "/v1/admin/settings")).json()
    assert sorted(view["overrides"]["learning.synonyms"]) == sorted(
        [list(p) for p in pairs])
    assert sorted(c["id"] for c in await listed(gw, status="accepted")) == sorted(ids)


async def test_accepting_a_candidate_again_changes_no_setting(gw: Gateway) -> None:
    """A candidate whose words a tenant group joins already is accepted again without a
    settings change (no second group, one settings_changed event)."""
    cid = await seed(gw, "introverted", "shy")
    for _ in range(2):
        accepted = await admin(gw, "POST", f"/v1/admin/synonyms/candidates/{cid}/accept")
        assert accepted.status_code == 200, accepted.text
    view = (await admin(gw, "GET", "/v1/admin/settings")).json()
    assert view["overrides"]["learning.synonyms"] == [["introverted", "shy"]]
    audit = (await admin(gw, "GET", "/v1/admin/audit",
                         params={"action": "settings_changed"})).json()["data"]
    assert len(audit) == 1


async def test_a_rejected_candidate_leaves_the_settings_alone(gw: Gateway) -> None:
    cid = await seed(gw, "introverted", "shy")
    rejected = await admin(gw, "POST", f"/v1/admin/synonyms/candidates/{cid}/reject")
    assert rejected.status_code == 200
    assert rejected.json()["status"] == "rejected"
    assert await listed(gw) == []
    assert [c["id"] for c in await listed(gw, status="all")] == [cid]
    view = (await admin(gw, "GET", "/v1/admin/settings")).json()
    assert "learning.synonyms" not in view["overrides"]
    assert view["settings"]["learning.synonyms"] == CONFIGURED


async def test_a_configured_group_lends_its_first_word(gw: Gateway) -> None:
    cid = await seed(gw, "很话少", "话少")
    assert (
        await admin(gw, "POST", f"/v1/admin/synonyms/candidates/{cid}/accept")
    ).status_code == 200
    view = (await admin(gw, "GET", "/v1/admin/settings")).json()
    assert view["overrides"]["learning.synonyms"] == [["话少", "很话少"]]


async def test_bad_decisions_answer_errors_and_change_nothing(gw: Gateway) -> None:
    """Unknown id and another tenant's id: 404; an app key: 403; words of two configured
    groups: 409; a bad status filter: 400 — nothing decided."""
    cid = await seed(gw, "话少", "quiet")
    for path, headers, status, code in [
        (
            "/v1/admin/synonyms/candidates/syn_0000000000000000/accept",
            ADMIN,
            404,
            "synonym_candidate_not_found",
        ),
        (
            f"/v1/admin/synonyms/candidates/{cid}/reject",
            OTHER_ADMIN,
            404,
            "synonym_candidate_not_found",
        ),
        (f"/v1/admin/synonyms/candidates/{cid}/accept", APP, 403, None),
        (f"/v1/admin/synonyms/candidates/{cid}/accept", ADMIN, 409, "synonym_conflict"),
    ]:
        response = await admin(gw, "POST", path, headers=headers)
        assert response.status_code == status, (path, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if code:
            assert error["code"] == code
    bad = await admin(gw, "GET", "/v1/admin/synonyms/candidates", params={"status": "x"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "status"
    [candidate] = await listed(gw)
    assert candidate["status"] == "open"
    assert (
        "learning.synonyms"
        not in (await admin(gw, "GET", "/v1/admin/settings")).json()["overrides"]
    )


async def test_patching_learning_synonyms_is_validated(gw: Gateway) -> None:
    ok = await admin(
        gw, "PATCH", "/v1/admin/settings", json={"learning.synonyms": [["chess", "go"]]}
    )
    assert ok.status_code == 200
    assert ok.json()["settings"]["learning.synonyms"] == [*CONFIGURED, ["chess", "go"]]
    for bad in ([["alone"]], [["", "x"]], "chess", [[1, 2]]):
        refused = await admin(gw, "PATCH", "/v1/admin/settings", json={"learning.synonyms": bad})
        assert refused.status_code == 400, bad
    assert (await admin(gw, "GET", "/v1/admin/settings")).json()["overrides"][
        "learning.synonyms"
    ] == [["chess", "go"]]


async def test_erasure_removes_the_users_candidates(gw: Gateway, upstream: FakeUpstream) -> None:
    upstream.extract = traits("mountain hiking")
    await say(gw, "u1", "I go mountain hiking every weekend.")
    upstream.extract = traits("hiking")
    await say(gw, "u1", "Went hiking again on Sunday.")
    kept = await seed(gw, "chess", "chess openings", user="u2")
    assert len(await listed(gw)) == 2
    async with gw.client(headers={**APP, "X-User-Id": "u1"}) as client:
        assert (await client.delete("/v1/me", params={"confirm": "true"})).status_code == 200
    assert [c["id"] for c in await listed(gw)] == [kept]


async def test_a_redelivered_batch_counts_its_merge_once(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """The worker dies after applying the merging batch and before dropping it: the batch
    is learned again, is not applied twice, and the candidate's count stays 1."""
    upstream.extract = traits("mountain hiking")
    await say(gw, "u1", "I go mountain hiking every weekend.")
    worker = gw.res.worker
    assert worker is not None
    crashing = CrashAfterApply(worker.queue)
    worker.queue = crashing  # type: ignore[assignment]
    upstream.extract = traits("hiking")
    await say(gw, "u1", "Went hiking again on Sunday.")
    assert crashing.crashed
    await asyncio.sleep(0.05)
    await gw.settle()
    assert [k for k, _ in upstream.learning_calls].count("extract") == 3
    [candidate] = await listed(gw)
    assert candidate["count"] == 1
    assert await profile_traits(gw, "u1") == [("mountain hiking", 2)]
