"""Erased text leaves Redis's files (docs/design.md#erasure): after an erasure the store
starts an AOF rewrite, so the append-only files no longer hold the user's words; a server
that refuses the rewrite (a managed Redis) still erases, and says so once.

Each test starts its own Redis with ``appendonly yes`` and ``rdbcompression no`` (the
rewritten base file is an RDB image: uncompressed, a word in it is greppable)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from proxy.backends.redis.client import connect
from proxy.backends.redis.queue import RedisLearningQueue
from proxy.backends.redis.store import RedisMemoryStore
from proxy.memory.store import AuditEvent
from tests.learning.test_queue_contract import exchange, turn
from tests.memory.test_store_contract import mem
from tests.redis_server import RedisServer

pytestmark = pytest.mark.redis
ERASED = "zanzibarquokkaxq"  # appears nowhere else
KEPT = "kilimanjarowombat"  # another user's word, which must stay


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(persistent=True, extra=("--rdbcompression", "no")) as running:
        yield running


def _files_hold(server: RedisServer, word: str) -> bool:
    return any(word.encode() in path.read_bytes()
               for path in server.directory.rglob("*") if path.is_file())


async def _rewritten(client: aioredis.Redis) -> None:
    for _ in range(200):
        info = await client.info("persistence")
        if not int(info["aof_rewrite_in_progress"]) and \
                not int(info["aof_rewrite_scheduled"]):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the AOF rewrite did not finish")


def _tombstone() -> AuditEvent:
    return AuditEvent(tenant="t1", user_id="u1", action="erased", actor="user",
                      at=datetime.now(UTC))


async def _write_words(store: RedisMemoryStore, queue: RedisLearningQueue) -> None:
    await store.add(mem(f"Owns a {ERASED} named Pip"))
    await store.add(mem(f"Owns a {KEPT}", user="u2"))
    await queue.buffer(exchange(turn(f"my {ERASED} sleeps all day")), batch_size=9,
                       now=1000)


async def test_the_aof_holds_no_erased_word_after_the_scheduled_rewrite(
        server: RedisServer) -> None:
    """Before: the AOF holds the erased word (and the other user's). After erasure and
    the rewrite it starts: the erased word is in no file, the other user's still is."""
    async with connect(server.url) as client:
        store = RedisMemoryStore(client, key_prefix="ef", purge_seconds=600)
        await store.prepare()
        queue = RedisLearningQueue(client, key_prefix="ef")
        await _write_words(store, queue)
        assert _files_hold(server, ERASED)
        await queue.erase_user("t1", "u1", names=[])
        await store.erase_user("t1", "u1", audit=_tombstone())
        await _rewritten(client)
        assert not _files_hold(server, ERASED)
        assert _files_hold(server, KEPT)
        # the period's one rewrite is spent: the next erasure's purge waits for it
        await store.erase_user("t1", "u3", audit=_tombstone())
        assert await store.purge_erased() is False


async def test_a_refused_rewrite_still_erases_and_is_logged_once(
        server: RedisServer) -> None:
    """A server that refuses BGREWRITEAOF (an ACL without it, as managed Redis does):
    erasure succeeds, the refusal is logged once for two erasures, the word stays in the
    AOF (what the README says stays on disk)."""
    async with connect(server.url) as admin:
        await admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*",
                                    "+@all", "-bgrewriteaof")
    url = server.url.replace("redis://", "redis://app:pw@")
    async with connect(url) as client:
        store = RedisMemoryStore(client, key_prefix="ef", purge_seconds=1)
        await store.prepare()
        queue = RedisLearningQueue(client, key_prefix="ef")
        await _write_words(store, queue)
        with capture_logs() as logs:
            assert await store.erase_user("t1", "u1", audit=_tombstone()) == 1
            await asyncio.sleep(1.2)  # the next period
            await store.add(mem("Another fact", user="u9"))
            assert await store.erase_user("t1", "u9", audit=_tombstone()) == 1
        assert [e["event"] for e in logs].count("redis_aof_rewrite_refused") == 1
        assert await store.get_profile("t1", "u1") is None
        assert _files_hold(server, ERASED)
