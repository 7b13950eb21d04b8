"""Replay LoCoMo conversations through a running gateway and measure what memory injects.

What it does
    1. Starts an *oracle* upstream on 127.0.0.1 — an OpenAI-compatible server for this
       benchmark only: chat replies are the dataset's next line of the other speaker, and
       the learning prompts are answered from the dataset's own annotated observations for
       the user turns the gateway shows it (a perfect extractor).
    2. Starts the gateway (``memory-proxy serve``, embedded SQLite, learning on) pointed at
       the oracle — or uses ``--gateway URL`` if you started one yourself with the config
       this script prints (``--print-config``).
    3. Replays every session in date order with the official ``openai`` SDK: one user per
       speaker (``user`` = "<conv>:<speaker>"), one conversation per session and speaker,
       the speaker's lines as user messages and the other speaker's as assistant messages.
    4. Flushes learning, then asks each QA question (categories 1–4) as the speaker whose
       turns hold its evidence, and checks whether the evidence observations are in the
       memory block the oracle received.

Because the extractor is the dataset's annotation, the figures measure the gateway's
batching, storage, dedup, filters, retrieval, budget and injection — not extraction
quality. Data: ../shared/data/locomo-dev.json (LoCoMo, CC BY-NC 4.0; not redistributed).

    python bench/locomo_replay.py [--data PATH] [--conversations N] [--questions N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn
import yaml
from openai import AsyncOpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"
sys.path.insert(0, str(ROOT))

from proxy.learning.prompts import (  # noqa: E402
    EXTRACTION_EN,
    SCORING_EN,
    TRANSCRIPT_END,
    TRANSCRIPT_START,
)
from proxy.memory.inject import BLOCK_END, BLOCK_START  # noqa: E402
from proxy.memory.text import normalize  # noqa: E402
from proxy.tokens import TokenCounter  # noqa: E402

_USER_LINE = re.compile(r"^\[\d+\] user(?: \(([^)]*)\))?: (.*)$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def turn_text(turn: dict[str, Any]) -> str:
    text = str(turn["text"])
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


@dataclass
class Dataset:
    conversations: list[dict[str, Any]]
    # normalised user-turn text → [(conv id, dia_id, speaker)]
    by_text: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    # (conv id, dia_id) → [(speaker, observation)]
    observations: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)
    # (conv id, dia_id) → next line of the other speaker
    replies: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, limit: int) -> Dataset:
        data = orjson.loads(path.read_bytes())[:limit]
        out = cls(conversations=data)
        for conv in data:
            cid = conv["sample_id"]
            c = conv["conversation"]
            for session in sessions(c):
                turns = c[session]
                for index, turn in enumerate(turns):
                    out.by_text.setdefault(normalize(turn_text(turn)), []).append(
                        (cid, turn["dia_id"], turn["speaker"]))
                    if index + 1 < len(turns):
                        out.replies[normalize(turn_text(turn))] = turn_text(turns[index + 1])
            for per_speaker in conv["observation"].values():
                for speaker, facts in per_speaker.items():
                    for fact_text, dia in facts:
                        dias = dia if isinstance(dia, list) else [dia]
                        for d in dias:
                            out.observations.setdefault((cid, str(d)), []).append(
                                (speaker, str(fact_text)))
        return out


def sessions(conversation: dict[str, Any]) -> list[str]:
    names = [k for k in conversation if re.fullmatch(r"session_\d+", k)]
    return sorted(names, key=lambda k: int(k.split("_")[1]))


class Oracle:
    """The benchmark's upstream (see module docstring)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.calls: Counter[str] = Counter()
        self.last_block: dict[str, str] = {}
        self.unmatched_turns = 0
        self.offered = 0

    async def handle(self, request: Request) -> JSONResponse:
        body = orjson.loads(await request.body())
        messages = body["messages"]
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        if system == SCORING_EN:
            self.calls["score"] += 1
            found = self._observed(messages[1]["content"])
            value = 0.9 if found else 0.1
            return self._json({"score": value, "dimensions": dict.fromkeys(
                ("density", "clarity", "depth", "relevance", "novelty"), value),
                "reason": "oracle"})
        if system == EXTRACTION_EN:
            self.calls["extract"] += 1
            facts = self._observed(messages[1]["content"])
            self.offered += len(facts)
            return self._json({"memories": [
                {"title": text[:30], "content": text, "category": "domain",
                 "subcategory": "life", "tags": [], "subject": "user"} for text in facts
            ], "profile": None})
        self.calls["chat"] += 1
        user_id = str(body.get("user", ""))
        block = ""
        if isinstance(system, str) and BLOCK_START in system:
            block = system[system.index(BLOCK_START): system.index(BLOCK_END) + len(BLOCK_END)]
        self.last_block[user_id] = block
        last = next((m for m in reversed(messages) if m["role"] == "user"), None)
        text = last["content"] if last and isinstance(last["content"], str) else ""
        reply = self.dataset.replies.get(normalize(text), "I see.")
        return JSONResponse({
            "id": "oracle", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model"), "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": reply}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def _observed(self, prompt: str) -> list[str]:
        """Observations for the user turns of a learning prompt, of that turn's speaker."""
        facts: list[str] = []
        # One entry per message: continuation lines are indented; markers are dropped.
        entries: list[str] = []
        for raw in prompt.split("\n"):
            if raw.startswith("    ") and entries:
                entries[-1] += "\n" + raw[4:]
            elif raw not in (TRANSCRIPT_START, TRANSCRIPT_END):
                entries.append(raw)
        for line in (e.replace("\n", " ") for e in entries):
            match = _USER_LINE.match(line)
            if not match:
                continue
            speaker, text = match.group(1), match.group(2)
            hits = self.dataset.by_text.get(normalize(text), [])
            if not hits:
                self.unmatched_turns += 1
            for cid, dia, turn_speaker in hits:
                if speaker and turn_speaker != speaker:
                    continue
                for obs_speaker, fact_text in self.dataset.observations.get((cid, dia), []):
                    if obs_speaker == turn_speaker and fact_text not in facts:
                        facts.append(fact_text)
        return facts

    @staticmethod
    def _json(content: dict[str, Any]) -> JSONResponse:
        return JSONResponse({
            "id": "oracle-learn", "object": "chat.completion", "created": int(time.time()),
            "model": "oracle", "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": orjson.dumps(content).decode()}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.handle, methods=["POST"])])


def gateway_config(oracle_port: int, db: Path, window: int, batch: int,
                   embedder: str = "none") -> dict[str, Any]:
    memory: dict[str, Any] = {"language": "en"}
    if embedder == "local":
        # The local model needs a longer recall deadline than keyword search (CPU).
        memory.update(embedder={"provider": "local", "model": "all-MiniLM-L6-v2"},
                      recall_timeout_ms=1000)
    return {
        "model_list": [{"model_name": "oracle", "litellm_params": {
            "model": "openai/oracle", "api_base": f"http://127.0.0.1:{oracle_port}/v1",
            "api_key": "none"}, "model_info": {"max_input_tokens": window}}],
        "storage": {"path": str(db)},
        "server": {"log_level": "warning"},
        "learning": {"enabled": True, "batch_messages": batch, "idle_flush_seconds": 5,
                     "maintenance_interval_seconds": 1, "poll_interval_seconds": 0.05},
        "memory": memory,
    }


async def wait_ready(url: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url + "/healthz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"gateway at {url} did not become ready")


async def wait_learning_idle(url: str, within: float = 600) -> None:
    deadline = time.monotonic() + within
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            checks = (await client.get(url + "/readyz")).json()["checks"]
            queue = checks.get("learning_queue", {})
            if isinstance(queue, dict) and queue.get("ready", 0) == 0 and \
                    queue.get("leased", 0) == 0 and queue.get("delayed", 0) == 0:
                return
            await asyncio.sleep(0.2)
    raise RuntimeError("learning did not finish in time")


async def replay(client: AsyncOpenAI, dataset: Dataset, *, concurrency: int) -> int:
    """Send every turn of every session (both speakers' views). Returns requests sent."""
    sent = 0
    semaphore = asyncio.Semaphore(concurrency)

    async def one_view(cid: str, conv: dict[str, Any], session: str, me: str) -> int:
        turns = conv[session]
        date = conv.get(f"{session}_date_time", "")
        history: list[dict[str, Any]] = [{"role": "system", "content":
                                          f"You are chatting with {me}. Today is {date}."}]
        count = 0
        for turn in turns:
            text = turn_text(turn)
            if turn["speaker"] != me:
                history.append({"role": "assistant", "content": text})
                continue
            history.append({"role": "user", "content": text, "name": me.replace(" ", "_")})
            async with semaphore:
                await client.chat.completions.create(
                    model="oracle", messages=history, user=f"{cid}:{me}",  # type: ignore[arg-type]
                    extra_headers={"X-Conversation-Id": f"{cid}:{session}:{me}"})
            count += 1
        return count

    for conv in dataset.conversations:
        cid, c = conv["sample_id"], conv["conversation"]
        for session in sessions(c):  # date order: sessions are numbered chronologically
            results = await asyncio.gather(*(one_view(cid, c, session, who)
                                             for who in (c["speaker_a"], c["speaker_b"])))
            sent += sum(results)
    return sent


@dataclass
class QAResult:
    category: int
    evidence: int
    found: int
    block_tokens: int
    history_tokens: int


async def ask(client: AsyncOpenAI, oracle: Oracle, dataset: Dataset, counter: TokenCounter,
              *, limit: int | None) -> tuple[list[QAResult], int]:
    results: list[QAResult] = []
    skipped = 0
    for conv in dataset.conversations:
        cid, c = conv["sample_id"], conv["conversation"]
        history_tokens = sum(counter.count(turn_text(t), "o200k_base")
                             for s in sessions(c) for t in c[s])
        questions = [q for q in conv["qa"] if q.get("category") in (1, 2, 3, 4)]
        for question in questions[:limit]:
            evidence = [part for e in question.get("evidence", [])
                        for part in re.split(r"[;,\s]+", str(e)) if part]
            speakers = Counter(sp for e in evidence
                               for sp, _ in dataset.observations.get((cid, e), []))
            if not speakers:
                skipped += 1
                continue
            who = speakers.most_common(1)[0][0]
            wanted = {normalize(text) for e in evidence
                      for sp, text in dataset.observations.get((cid, e), []) if sp == who}
            user = f"{cid}:{who}"
            await client.chat.completions.create(
                model="oracle", user=user, extra_headers={"X-Memory": "read-only"},
                messages=[{"role": "user", "content": question["question"]}])
            block = normalize(oracle.last_block.get(user, ""))
            found = sum(1 for w in wanted if w and w in block)
            results.append(QAResult(
                category=int(question["category"]), evidence=len(wanted), found=found,
                block_tokens=counter.count(oracle.last_block.get(user, ""), "o200k_base"),
                history_tokens=history_tokens))
    return results, skipped


@dataclass
class Stored:
    """What the gateway kept: memories per category and the evidence they carry."""

    by_category: Counter[str] = field(default_factory=Counter)
    hits: int = 0  # sum of hits over the memories (1 per memory + 1 per merge)

    @property
    def total(self) -> int:
        return sum(self.by_category.values())


async def count_memories(url: str, users: list[str]) -> Stored:
    stored = Stored()
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for user in users:
            offset = 0
            while True:
                page = (await client.get("/v1/memories", params={
                    "limit": 500, "offset": offset}, headers={"X-User-Id": user})).json()
                for memory in page["data"]:
                    kind = memory["category"]
                    if memory.get("subcategory"):
                        kind += "/" + memory["subcategory"]
                    stored.by_category[kind] += 1
                    stored.hits += int(memory.get("hits", 1))
                if not page["has_more"]:
                    break
                offset += 500
    return stored


async def flush_all(url: str, users: list[str]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for user in users:
            await client.post("/v1/memories/flush", headers={"X-User-Id": user})


def audit_counts(db: Path) -> tuple[Counter[str], int]:
    """Why facts were rejected, and how many merges (repeated facts counted as evidence),
    from the gateway's audit log (embedded mode only)."""
    if not db.is_file():
        return Counter(), 0
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT reason, count(*) FROM audit_log WHERE action = 'rejected' "
                            "GROUP BY reason").fetchall()
        merges = conn.execute("SELECT count(*) FROM audit_log WHERE action = 'merged'"
                              ).fetchone()[0]
    return Counter({str(reason): int(n) for reason, n in rows}), int(merges)


def report(results: list[QAResult], skipped: int, *, sessions_replayed: int, sent: int,
           stored: Stored, oracle: Oracle, elapsed: float, rejected: Counter[str],
           merges: int | None) -> None:
    by_cat: dict[int, list[QAResult]] = defaultdict(list)
    for r in results:
        by_cat[r.category].append(r)

    def row(name: str, rs: list[QAResult]) -> str:
        if not rs:
            return f"{name:<22}{0:>6}"
        any_hit = sum(1 for r in rs if r.found > 0) / len(rs)
        all_hit = sum(1 for r in rs if r.found == r.evidence) / len(rs)
        recall = statistics.mean(r.found / r.evidence for r in rs)
        return f"{name:<22}{len(rs):>6}{any_hit:>10.3f}{all_hit:>10.3f}{recall:>10.3f}"

    names = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
    print("\nLoCoMo replay through memory-proxy (oracle extractor = dataset annotations;")
    print("measures batching, storage, dedup, filters, retrieval, budget and injection,")
    print("not extraction quality)\n")
    print(f"sessions replayed (x2 speakers): {sessions_replayed}")
    print(f"chat requests sent:              {sent}")
    print(f"learning calls made:             score {oracle.calls['score']}, "
          f"extract {oracle.calls['extract']}")
    print(f"observations offered / stored:   {oracle.offered} / {stored.total}")
    print("facts stored per category:       " + (", ".join(
        f"{k} {n}" for k, n in sorted(stored.by_category.items())) or "none"))
    print("facts rejected per reason:       " + (", ".join(
        f"{k} {n}" for k, n in sorted(rejected.items())) or
        ("none" if merges is not None else "n/a (external gateway)")))
    print(f"merges (evidence):               "
          f"{'n/a' if merges is None else merges} audited, "
          f"{stored.hits - stored.total} extra hits on stored facts")
    print(f"questions asked (cat 1-4):       {len(results)} (+{skipped} without observations)")
    print(f"replay + learning wall time:     {elapsed:.1f} s\n")
    print(f"{'category':<22}{'n':>6}{'any-ev':>10}{'all-ev':>10}{'recall':>10}")
    for cat in sorted(by_cat):
        print(row(names.get(cat, str(cat)), by_cat[cat]))
    print(row("all", results))
    tokens = [r.block_tokens for r in results]
    history = [r.history_tokens for r in results]
    print(f"\nmemory tokens injected per question: mean {statistics.mean(tokens):.0f}, "
          f"p50 {statistics.median(tokens):.0f}, max {max(tokens)}")
    print(f"full-history tokens per conversation: mean {statistics.mean(history):.0f} "
          f"→ the block is {statistics.mean(tokens) / statistics.mean(history):.1%} of it")
    print("any-ev: share of questions with at least one evidence observation in the block;")
    print("all-ev: with all of them; recall: mean share of evidence observations injected.")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--questions", type=int, default=None,
                        help="questions per conversation (default: all of categories 1-4)")
    parser.add_argument("--gateway", help="use a running gateway instead of starting one")
    parser.add_argument("--oracle-port", type=int, default=0)
    parser.add_argument("--context-window", type=int, default=16000)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--embedder", choices=("none", "local"), default="none",
                        help="local: hybrid recall with the bundled MiniLM (embeddings extra)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the gateway config for --gateway mode and exit")
    args = parser.parse_args()
    if not args.data.is_file():
        sys.exit(f"data file not found: {args.data} — pass --data /path/to/locomo-dev.json "
                 "(the LoCoMo subset lives in ../shared/data/ next to the repository)")
    dataset = Dataset.load(args.data, args.conversations)
    replayed = sum(len(sessions(c["conversation"])) for c in dataset.conversations)
    oracle = Oracle(dataset)
    oracle_port = args.oracle_port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="locomo-"))
    config = gateway_config(oracle_port, workdir / "memory.db", args.context_window, args.batch,
                            args.embedder)
    if args.print_config:
        print(yaml.safe_dump(config, sort_keys=False))
        return
    server = uvicorn.Server(uvicorn.Config(oracle.app(), host="127.0.0.1", port=oracle_port,
                                           log_level="warning", lifespan="off"))
    oracle_task = asyncio.create_task(server.serve())
    process = None
    url = args.gateway
    try:
        if url is None:
            config_path = workdir / "config.yaml"
            config_path.write_text(yaml.safe_dump(config))
            port = free_port()
            env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
            process = subprocess.Popen(  # noqa: ASYNC220 - started once, before any I/O
                [sys.executable, "-m", "proxy", "serve", "--config", str(config_path),
                 "--port", str(port)], cwd=ROOT, env=env)
            url = f"http://127.0.0.1:{port}"
        await wait_ready(url)
        client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                             timeout=120)
        started = time.monotonic()
        sent = await replay(client, dataset, concurrency=args.concurrency)
        users = [f"{c['sample_id']}:{c['conversation'][s]}" for c in dataset.conversations
                 for s in ("speaker_a", "speaker_b")]
        await flush_all(url, users)
        await asyncio.sleep(1.5)
        await wait_learning_idle(url)
        elapsed = time.monotonic() - started
        stored = await count_memories(url, users)
        results, skipped = await ask(client, oracle, dataset, TokenCounter(),
                                     limit=args.questions)
        await client.close()
        rejected, merges = audit_counts(workdir / "memory.db") if args.gateway is None \
            else (Counter(), None)
        report(results, skipped, sessions_replayed=replayed, sent=sent, stored=stored,
               oracle=oracle, elapsed=elapsed, rejected=rejected, merges=merges)
        if oracle.unmatched_turns:
            print(f"(oracle could not match {oracle.unmatched_turns} transcript lines to the "
                  "dataset, e.g. after PII scrubbing changed them)")
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=15)
        server.should_exit = True
        await oracle_task


if __name__ == "__main__":
    asyncio.run(main())
