"""A few LoCoMo sessions through the gateway with a REAL model as chat and learning model.

Not a quality measurement: it proves the plumbing with real tokens, real SSE and real,
imperfect JSON (a tiny local model serves: SmolLM2-135M behind llama.cpp's
OpenAI-compatible server). It starts the gateway
(embedded storage, learning on, batch of 5) against ``--api-base``, replays the first
``--sessions`` sessions of one LoCoMo conversation (both speakers, streaming), flushes
learning, waits for the queue to drain and prints what happened: chat requests, learning
calls, parse failures (retries and dead letters), memories written, and what a later
request got injected.

    python bench/real_model_smoke.py --api-base http://127.0.0.1:8081/v1 --model smollm2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import yaml
from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from locomo_replay import (
    DEFAULT_DATA,
    ROOT,
    Dataset,
    free_port,
    sessions,
    turn_text,
    wait_learning_idle,
    wait_ready,
)


def config(api_base: str, model: str, db: Path, threshold: float) -> dict[str, object]:
    return {
        "model_list": [{"model_name": model, "litellm_params": {
            "model": f"openai/{model}", "api_base": api_base, "api_key": "none"},
            "model_info": {"max_input_tokens": 4096, "supports_response_schema": True}}],
        "storage": {"path": str(db)},
        "server": {"log_level": "warning"},
        "learning": {"enabled": True, "batch_messages": 5, "max_output_tokens": 512,
                     "score_threshold": threshold,
                     "max_attempts": 2, "retry_base_seconds": 1,
                     "maintenance_interval_seconds": 1, "poll_interval_seconds": 0.1},
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--api-base", default="http://127.0.0.1:8081/v1")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--score-threshold", type=float, default=0.6,
                        help="0 lets every batch reach extraction (tiny models score low)")
    args = parser.parse_args()
    dataset = Dataset.load(args.data, 1)
    conv = dataset.conversations[0]
    cid, c = conv["sample_id"], conv["conversation"]
    workdir = Path(tempfile.mkdtemp(prefix="real-model-"))
    db = workdir / "memory.db"
    (workdir / "config.yaml").write_text(yaml.safe_dump(
        config(args.api_base, args.model, db, args.score_threshold)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(  # noqa: ASYNC220 - started once, before any I/O
        [sys.executable, "-m", "proxy", "serve", "--config", str(workdir / "config.yaml"),
         "--port", str(port)], cwd=ROOT, env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    started = time.monotonic()
    chats = 0
    try:
        await wait_ready(url)
        client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        users = [f"{cid}:{c['speaker_a']}", f"{cid}:{c['speaker_b']}"]
        for session in sessions(c)[: args.sessions]:
            for me in (c["speaker_a"], c["speaker_b"]):
                history: list[dict[str, str]] = []
                for turn in c[session]:
                    text = turn_text(turn)
                    if turn["speaker"] != me:
                        history.append({"role": "assistant", "content": text})
                        continue
                    history.append({"role": "user", "content": text})
                    stream = await client.chat.completions.create(
                        model=args.model, messages=history, user=f"{cid}:{me}",  # type: ignore[arg-type]
                        stream=True, max_tokens=48,
                        extra_headers={"X-Conversation-Id": f"{cid}:{session}:{me}"})
                    async for _ in stream:
                        pass
                    chats += 1
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            for user in users:
                await http.post("/v1/memories/flush", headers={"X-User-Id": user})
            await asyncio.sleep(2)
            await wait_learning_idle(url, within=1800)
            metrics = (await http.get("/metrics")).text
            memories = {u: (await http.get("/v1/memories", params={"limit": 500},
                                           headers={"X-User-Id": u})).json()["data"]
                        for u in users}
        probe = await client.chat.completions.create(
            model=args.model, user=users[0], max_tokens=32,
            messages=[{"role": "user", "content": "What did I do recently?"}])
        raw = await client.chat.completions.with_raw_response.create(
            model=args.model, user=users[0], max_tokens=16,
            messages=[{"role": "user", "content": "What did I do recently?"}])
        del probe
        await client.close()
    finally:
        process.terminate()
        process.wait(timeout=20)
    events = Counter()
    for line in metrics.splitlines():
        if line.startswith("memory_proxy_learning_events_total{"):
            labels, value = line.rsplit(" ", 1)
            events[labels.split("{", 1)[1].rstrip("}")] += int(float(value))
    with sqlite3.connect(db) as conn:
        calls = dict(conn.execute("SELECT purpose, count(*) FROM learning_ledger GROUP BY 1"))
        tokens = conn.execute("SELECT coalesce(sum(prompt_tokens),0), "
                              "coalesce(sum(completion_tokens),0) FROM learning_ledger").fetchone()
        dead = conn.execute("SELECT count(*), group_concat(substr(last_error, 1, 90), ' | ') "
                            "FROM jobs WHERE status = 'dead'").fetchone()
        audit = dict(conn.execute("SELECT action, count(*) FROM audit_log GROUP BY 1"))
        rejected = dict(conn.execute("SELECT reason, count(*) FROM audit_log "
                                     "WHERE action = 'rejected' GROUP BY 1"))
    print(f"\nReal-model smoke run: {args.model} at {args.api_base} (chat + learning)")
    print(f"sessions: {args.sessions} x 2 speakers; streamed chat requests: {chats}; "
          f"wall time {time.monotonic() - started:.0f} s")
    print(f"learning calls by purpose: {calls}; learning tokens prompt/completion: "
          f"{tokens[0]}/{tokens[1]}")
    print(f"worker events: {dict(events)}")
    print(f"dead-lettered jobs: {dead[0]} {('— ' + dead[1]) if dead[1] else ''}")
    print(f"audit actions: {audit}; facts rejected by filters: {rejected}")
    for user, items in memories.items():
        print(f"memories of {user}: {len(items)}")
        for item in items[:8]:
            print(f"   - {item['content'][:110]!r} (hits {item['hits']})")
    print(f"probe request headers: status={raw.headers.get('x-memory-status')} "
          f"injected={raw.headers.get('x-memory-injected')} "
          f"tokens={raw.headers.get('x-memory-tokens')}")


if __name__ == "__main__":
    asyncio.run(main())
