"""The gateway end to end with ``storage.backend: redis``.

The scenarios are the existing end-to-end tests, imported by name: pytest collects them
here too, and this module's ``settings`` / ``learning_settings`` / ``faulty`` fixtures make
their gateways keep memories, profiles, settings, audit log, ledgers and the learning queue
in Redis. Learn → inject → delete-all, isolation between users, deletion that
reaches every index, and the worker's
fault handling (crashed worker, retries, dead letters) run unchanged against the second
backend. Below them: Redis down at startup.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from proxy.memory.store import ListQuery
from proxy.settings import Settings
from tests.fakes import (
    Configure,
    FakeUpstream,
    Gateway,
    make_settings,
    redis_storage,
    running_gateway,
)
from tests.learning.test_learning_e2e import (
    test_batches_wait_for_enough_user_messages,
    test_contradiction_retires_the_old_fact,
    test_every_learning_action_is_audited,
    test_explicit_flush_learns_a_partial_batch,
    test_learned_fact_is_injected_in_a_later_turn,
    test_learning_tokens_are_kept_apart_from_user_usage,
    test_model_duplicate_id_counts_as_evidence_across_languages,
    test_personal_learning_switch_is_respected,
    test_redelivered_batch_is_applied_once,
    test_repeat_is_merged_even_beyond_the_prompts_related_memories,
    test_repeated_fact_counts_as_evidence,
    test_resent_history_is_never_learned_twice,
    test_unparseable_extraction_writes_nothing_and_dead_letters,
)
from tests.learning.test_learning_evidence import (
    test_a_paraphrased_order_is_refused_and_the_preference_beside_it_kept,
    test_a_retried_request_adds_no_hit_and_no_learning_call,
    test_a_tool_call_round_trip_is_not_a_new_statement,
    test_an_answer_style_preference_is_stored_and_injected,
    test_the_same_words_in_a_later_conversation_are_one_more_hit,
    test_the_same_words_later_in_one_conversation_are_one_more_hit,
)
from tests.learning.test_worker_faults import (
    test_garbage_forever_ends_in_the_dead_letter_list,
    test_job_of_a_dead_worker_is_redelivered_after_its_lease,
    test_store_outage_mid_batch_is_retried,
    test_timeouts_are_retried_then_succeed,
    test_truncated_extraction_is_retried_with_more_tokens,
)
from tests.redis_server import free_port
from tests.routes.test_chat_stream_rules import test_a_turn_the_upstream_refused_queues_no_learning
from tests.routes.test_identity_and_memories import (
    chat,
    test_deleted_memories_never_come_back,
    test_deleted_single_memory_is_not_relearned_from_older_messages,
    test_health_endpoints,
    test_memory_api_round_trip,
    test_other_users_memory_is_not_found,
    test_users_never_see_each_others_memories,
)
from tests.routes.test_mcp import (
    test_add_search_update_delete_round_trip_is_audited,
    test_profile_is_the_users_own,
    test_users_are_isolated,
)

pytestmark = pytest.mark.redis

REUSED = (
    test_a_paraphrased_order_is_refused_and_the_preference_beside_it_kept,
    test_a_retried_request_adds_no_hit_and_no_learning_call,
    test_a_tool_call_round_trip_is_not_a_new_statement,
    test_an_answer_style_preference_is_stored_and_injected,
    test_the_same_words_in_a_later_conversation_are_one_more_hit,
    test_the_same_words_later_in_one_conversation_are_one_more_hit,
    test_batches_wait_for_enough_user_messages,
    test_contradiction_retires_the_old_fact,
    test_every_learning_action_is_audited,
    test_explicit_flush_learns_a_partial_batch,
    test_learned_fact_is_injected_in_a_later_turn,
    test_learning_tokens_are_kept_apart_from_user_usage,
    test_model_duplicate_id_counts_as_evidence_across_languages,
    test_personal_learning_switch_is_respected,
    test_redelivered_batch_is_applied_once,
    test_repeat_is_merged_even_beyond_the_prompts_related_memories,
    test_repeated_fact_counts_as_evidence,
    test_resent_history_is_never_learned_twice,
    test_unparseable_extraction_writes_nothing_and_dead_letters,
    test_deleted_memories_never_come_back,
    test_deleted_single_memory_is_not_relearned_from_older_messages,
    test_health_endpoints,
    test_memory_api_round_trip,
    test_other_users_memory_is_not_found,
    test_users_never_see_each_others_memories,
    test_garbage_forever_ends_in_the_dead_letter_list,
    test_job_of_a_dead_worker_is_redelivered_after_its_lease,
    test_store_outage_mid_batch_is_retried,
    test_timeouts_are_retried_then_succeed,
    test_truncated_extraction_is_retried_with_more_tokens,
    test_a_turn_the_upstream_refused_queues_no_learning,
    test_add_search_update_delete_round_trip_is_audited,
    test_profile_is_the_users_own,
    test_users_are_isolated,
)


@pytest.fixture
def configure(tmp_path: Path, redis_url: str, redis_prefix: str) -> Configure:
    """Settings as in the reused tests, with storage in Redis under this test's prefix."""
    def build(**overrides: Any) -> Settings:
        return make_settings(tmp_path, storage=redis_storage(tmp_path, redis_url, redis_prefix),
                             **overrides)
    return build


@pytest.fixture
def settings(configure: Configure) -> Settings:
    return configure()


@pytest.fixture
def learning_settings(configure: Configure) -> Settings:
    return configure(learning={"enabled": True, "batch_messages": 1})


@pytest.fixture
async def faulty(configure: Configure, upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    settings = configure(learning={"enabled": True, "batch_messages": 1, "max_attempts": 3,
                                   "retry_base_seconds": 0.01, "lease_seconds": 5})
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


async def test_the_gateway_uses_the_redis_backend(
    learning_settings: Settings, tmp_path: Path
) -> None:
    """With storage.backend redis the gateway's store, ledger and learning queue are the
    Redis ones, and no local database file is created."""
    from proxy.backends.redis.ledger import RedisLedger
    from proxy.backends.redis.queue import RedisLearningQueue
    from proxy.backends.redis.store import RedisMemoryStore

    async with running_gateway(learning_settings) as gateway:
        assert isinstance(gateway.res.store, RedisMemoryStore)
        assert isinstance(gateway.res.ledger, RedisLedger)
        assert isinstance(gateway.res.queue, RedisLearningQueue)
        assert gateway.res.worker is not None
        assert gateway.res.worker.queue is gateway.res.queue
    assert [p.name for p in os.scandir(tmp_path)] == []


async def test_gateways_share_the_redis_queue(
    learning_settings: Settings, upstream: FakeUpstream
) -> None:
    """A turn served by one gateway is learned by another process's worker: with Redis,
    ``serve --no-worker`` pods and ``memory-proxy worker`` share one queue."""
    upstream.extract = lambda body: {"memories": [{
        "title": "Grows tomatoes", "content": "Grows tomatoes", "category": "user_preference",
        "subject": "user"}]}
    async with running_gateway(learning_settings, upstream) as front, \
            running_gateway(learning_settings, upstream) as back:
        response = await chat(front, None, "I grow tomatoes.", header_user="u1")
        assert response.status_code == 200
        await front.res.sink.flush()
        assert back.res.worker is not None
        assert await back.res.worker.drain() == 2  # the exchange, then its batch
        found = await back.res.store.list_memories(ListQuery(tenant="default", user="u1"))
        assert [m.content for m in found] == ["Grows tomatoes"]


async def test_chat_goes_on_when_redis_is_down(tmp_path: Path) -> None:
    """A gateway whose Redis is unreachable starts, answers chat with memory marked
    degraded, and /readyz says degraded (200) naming the store
    (docs/design.md#storage)."""
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
