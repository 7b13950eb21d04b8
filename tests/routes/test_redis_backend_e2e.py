"""The gateway end to end with ``storage.backend: redis``.

The scenarios are the existing end-to-end tests, imported by name: pytest collects them
here too, and this module's ``settings`` / ``learning_settings`` fixtures make their
gateways store memories, profiles, settings, audit log and ledgers in Redis (the learning
queue stays SQLite). Learn → inject → delete-all, isolation (B25) and deletion (B32) run
unchanged against the second backend. Below them: Redis down at startup.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.settings import Settings
from tests.fakes import make_settings, running_gateway
from tests.learning.test_learning_e2e import (
    test_contradiction_retires_the_old_fact,
    test_every_learning_action_is_audited,
    test_learned_fact_is_injected_in_a_later_turn,
    test_learning_tokens_are_kept_apart_from_user_usage,
    test_model_duplicate_id_counts_as_evidence_across_languages,
    test_personal_learning_switch_is_respected,
    test_repeated_fact_counts_as_evidence,
    test_resent_history_is_never_learned_twice,
)
from tests.redis_server import free_port
from tests.routes.test_identity_and_memories import (
    chat,
    test_deleted_memories_never_come_back,
    test_deleted_single_memory_is_not_relearned_from_older_messages,
    test_health_endpoints,
    test_memory_api_round_trip,
    test_other_users_memory_is_not_found,
    test_users_never_see_each_others_memories,
)

pytestmark = pytest.mark.redis

REUSED = (
    test_contradiction_retires_the_old_fact,
    test_every_learning_action_is_audited,
    test_learned_fact_is_injected_in_a_later_turn,
    test_learning_tokens_are_kept_apart_from_user_usage,
    test_model_duplicate_id_counts_as_evidence_across_languages,
    test_personal_learning_switch_is_respected,
    test_repeated_fact_counts_as_evidence,
    test_resent_history_is_never_learned_twice,
    test_deleted_memories_never_come_back,
    test_deleted_single_memory_is_not_relearned_from_older_messages,
    test_health_endpoints,
    test_memory_api_round_trip,
    test_other_users_memory_is_not_found,
    test_users_never_see_each_others_memories,
)


def redis_storage(tmp_path: Path, url: str, prefix: str) -> dict[str, object]:
    return {"backend": "redis", "url": url, "key_prefix": prefix,
            "path": str(tmp_path / "memory.db")}


@pytest.fixture
def settings(tmp_path: Path, redis_url: str, redis_prefix: str) -> Settings:
    return make_settings(tmp_path, storage=redis_storage(tmp_path, redis_url, redis_prefix))


@pytest.fixture
def learning_settings(tmp_path: Path, redis_url: str, redis_prefix: str) -> Settings:
    return make_settings(tmp_path, storage=redis_storage(tmp_path, redis_url, redis_prefix),
                         learning={"enabled": True, "batch_messages": 1})


async def test_the_gateway_uses_the_redis_backend(settings: Settings) -> None:
    """With storage.backend redis the gateway's store and ledger are the Redis ones, and
    the learning queue is a SQLite file next to storage.path."""
    from proxy.ledger_redis import RedisLedger
    from proxy.memory.redis_store import RedisMemoryStore

    async with running_gateway(settings) as gateway:
        assert isinstance(gateway.res.store, RedisMemoryStore)
        assert isinstance(gateway.res.ledger, RedisLedger)
    assert settings.storage.queue_path.is_file()
    assert not settings.storage.path.exists()


async def test_chat_goes_on_when_redis_is_down(tmp_path: Path) -> None:
    """A gateway whose Redis is unreachable starts, answers chat with memory marked
    degraded, and /readyz says degraded (200) naming the store (SPEC §8)."""
    down = make_settings(tmp_path, storage=redis_storage(
        tmp_path, f"redis://127.0.0.1:{free_port()}/0", "down"))
    async with running_gateway(down) as gateway:
        response = await chat(gateway, None, "Where do I live?", header_user="u1")
        assert response.status_code == 200
        assert response.headers["x-memory-status"] == "degraded"
        async with gateway.client() as client:
            ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["status"] == "degraded"
        assert ready.json()["checks"]["store"].startswith("unavailable")
