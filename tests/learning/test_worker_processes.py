"""Two ``memory-proxy worker`` processes learn the same fact from many conversations at
once: every hit is counted and the fact is one row. Both backends."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.learning.sink import Turn
from proxy.memory.store import ListQuery
from proxy.resources import open_resources
from proxy.settings import load_settings
from tests.fakes import FakeUpstream, serve_upstream

REPO = Path(__file__).resolve().parents[2]
TURNS = 24
FACT = "Has a dog named Rex"


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "sqlite":
        return {"path": str(tmp_path / "memory.db")}
    return {"backend": "redis", "url": request.getfixturevalue("redis_url"),
            "key_prefix": request.getfixturevalue("redis_prefix"),
            "path": str(tmp_path / "memory.db")}


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_two_worker_processes_count_every_hit_of_one_fact(
        tmp_path: Path, storage: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """24 turns in 24 conversations, each a different message stating the same fact,
    ``batch_messages: 1``, a scripted extractor answering that fact, two worker processes:
    one row with hits 24."""
    monkeypatch.setenv("TEST_UPSTREAM_KEY", "sk-test")
    upstream = FakeUpstream()
    upstream.extract = lambda body: {"memories": [
        {"title": FACT, "content": FACT, "category": "user_preference", "subject": "user"}]}
    async with serve_upstream(upstream.handler) as port:
        config = {
            "model_list": [{"model_name": "m", "litellm_params": {
                "model": "openai/up-model", "api_base": f"http://127.0.0.1:{port}/v1",
                "api_key": "os.environ/TEST_UPSTREAM_KEY"}}],
            "storage": storage,
            "learning": {"enabled": True, "fingerprint_key": "k" * 32,
                         "batch_messages": 1, "poll_interval_seconds": 0.05,
                         "retry_base_seconds": 0.05},
        }
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "TEST_UPSTREAM_KEY": "sk-test",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        settings = load_settings(str(path))
        async with open_resources(settings) as res:
            for i in range(TURNS):
                res.sink.submit(Turn(
                    tenant="default", user="u1", conversation=f"c{i}", channel="private",
                    group=None, model="m", reply="Nice!", at=time.time(),
                    messages=[{"role": "user",
                               "content": f"My dog Rex ({i}) says hello, conversation {i}."}]))
            await res.sink.flush()
            workers = [await asyncio.create_subprocess_exec(
                sys.executable, "-m", "proxy", "worker", "--config", str(path), cwd=REPO,
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(2)]
            try:
                assert res.queue is not None
                deadline = time.monotonic() + 150
                while time.monotonic() < deadline:
                    depth = await res.queue.depth()
                    if depth.ready == depth.delayed == depth.leased == 0 \
                            and depth.buffered_messages == 0 \
                            and len([k for k, _ in upstream.learning_calls
                                     if k == "extract"]) >= TURNS:
                        break
                    assert all(w.returncode is None for w in workers), "a worker exited"
                    await asyncio.sleep(0.2)
            finally:
                for worker in workers:
                    worker.terminate()
                for worker in workers:
                    await asyncio.wait_for(worker.wait(), timeout=30)
            stored = await res.store.list_memories(ListQuery(tenant="default", user="u1",
                                                             include_retired=True))
            assert [(m.content, m.hits) for m in stored] == [(FACT, TURNS)]
            assert await res.queue.dead_letters() == []
