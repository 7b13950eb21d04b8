"""CPU of one chat recall (memory on, keyword recall) in process, beside a baseline tree.

What it does
    1. Seeds a temporary SQLite store with bench/gateway's user: 500 memories and a profile
       (:mod:`bench.gateway.seed`), and opens a :class:`~proxy.memory.service.MemoryService`
       on it with the default settings (recall index on, no embedder; ``--embedder
       static|local``: each memory with its vector and that embedder, query cache off).
    2. Sends bench/gateway's 48 conversations through
       :meth:`~proxy.memory.service.MemoryService.prepare` (``count_access=False``: no
       writes), ``--warmup`` rounds first (the index built, memos warm), then times
       ``--rounds`` rounds and keeps the best round's µs per recall (process CPU time).
    3. ``--profile``: cProfile over one more round, the top functions by cumulative time.
    4. ``--variant NAME=DIR``: the same in a subprocess that imports the tree DIR (e.g. a
       ``git archive`` of main), printed beside this checkout's figure; and whether both
       trees injected the same blocks (a digest of every block text and token count).

Run it from the repo root:

    .venv/bin/python bench/recall_cpu.py [--rounds 20] [--warmup 3] [--profile]
                                         [--variant base=/path/to/tree]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import importlib.util
import io
import json
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if "--root" in sys.argv:  # a variant run imports the tree it is given
    sys.path.insert(0, sys.argv[sys.argv.index("--root") + 1])
else:
    sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT))  # bench.gateway's seed and workload come from this checkout

import orjson  # noqa: E402

from bench.gateway.seed import TENANT, USER, questions, seed_store  # noqa: E402
from bench.gateway.workload import chat_body  # noqa: E402
from proxy.backends.sqlite.database import SqliteDatabase  # noqa: E402
from proxy.backends.sqlite.store import SqliteMemoryStore  # noqa: E402
from proxy.identity import Identity  # noqa: E402
from proxy.memory import recall, retrieve  # noqa: E402
from proxy.memory.embedders import build_embedder  # noqa: E402
from proxy.memory.service import MemoryService  # noqa: E402
from proxy.models import ModelRegistry  # noqa: E402
from proxy.request.chat import parse_chat_body  # noqa: E402
from proxy.settings import load_settings  # noqa: E402
from proxy.tokens import TokenCounter  # noqa: E402

Call = tuple[tuple[Any, ...], dict[str, Any]]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "memory.db"
        await seed_store(path, embed=args.embedder, cache_dir=args.embedder_cache)
        memory: dict[str, Any] = {} if args.embedder is None else {"embedder": {
            "provider": args.embedder, "model": "all-MiniLM-L6-v2", "cache_size": 0,
            "cache_dir": str(args.embedder_cache), "reindex_on_start": False}}
        settings = load_settings(use_file=False, model_list=[{
            "model_name": "m", "litellm_params": {
                "model": "openai/up-model", "api_base": "http://127.0.0.1:9/v1",
                "api_key": "sk-x"}, "model_info": {"max_input_tokens": 128000}}],
            storage={"path": str(path)}, learning={"enabled": False}, memory=memory)
        embedder = build_embedder(settings.memory.embedder)
        if embedder is not None:
            await embedder.start()
        route = ModelRegistry(settings).route("m")
        requests = [parse_chat_body(orjson.loads(chat_body(q, stream=False, model="m")))
                    for q in questions()]
        identity = Identity(tenant=TENANT, user=USER, conversation="bench")
        async with SqliteDatabase(path) as db:
            service = MemoryService(store=SqliteMemoryStore(db), settings=settings.memory,
                                    counter=TokenCounter(), embedder=embedder)

            async def one_round() -> list[tuple[str, int]]:
                out = []
                for request in requests:
                    injection = await service.prepare(identity, request, route,
                                                      count_access=args.count_access)
                    out.append((injection.block, injection.tokens))
                return out

            for _ in range(args.warmup):
                blocks = await one_round()
            captured = await ranking_inputs(one_round)
            best = float("inf")
            for _ in range(args.rounds):
                start = time.process_time()
                await one_round()
                best = min(best, time.process_time() - start)
            profile = ""
            if args.profile:
                profiler = cProfile.Profile()
                profiler.enable()
                await one_round()
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats(args.sort).print_stats(35)
                profile = text.getvalue()
        if embedder is not None:
            await embedder.aclose()
    digest = hashlib.sha256(json.dumps(blocks).encode()).hexdigest()[:16]
    return {"us": best / len(requests) * 1e6, "digest": digest,
            "injected": sum(1 for b, _ in blocks if b), "profile": profile,
            "captured": captured}


async def ranking_inputs(one_round: Callable[[], Awaitable[object]]) -> list[Call]:
    """The arguments of every :func:`~proxy.memory.recall.rank` call of one round."""
    calls: list[Call] = []
    plain = retrieve.rank

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return plain(*args, **kwargs)

    retrieve.rank = recording
    try:
        await one_round()
    finally:
        retrieve.rank = plain
    return calls


def rank_us(trees: dict[str, Path], calls: list[Call], repeats: int) -> dict[str, float]:
    """µs per call of each tree's ``rank`` (its proxy/memory/recall.py loaded beside this
    one) on the same ``calls``, best of ``repeats`` interleaved passes; raises
    ``AssertionError`` when a tree ranks differently from this checkout."""
    ranks: dict[str, Callable[..., Any]] = {"this": recall.rank}
    for name, tree in trees.items():
        spec = importlib.util.spec_from_file_location(
            f"variant_recall_{name}", tree / "proxy" / "memory" / "recall.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        ranks[name] = module.rank
    expected = [[(r.memory.id, r.final, r.relevance, r.keyword, r.vector, r.when, r.context)
                 for r in recall.rank(*a, **k)] for a, k in calls]
    for name, fn in ranks.items():
        got = [[(r.memory.id, r.final, r.relevance, r.keyword, r.vector, r.when, r.context)
                for r in fn(*a, **k)] for a, k in calls]
        assert got == expected, f"{name} ranks differently"
    best = dict.fromkeys(ranks, float("inf"))
    for _ in range(repeats):
        for name, fn in ranks.items():
            start = time.process_time()
            for a, k in calls:
                fn(*a, **k)
            best[name] = min(best[name], time.process_time() - start)
    return {name: seconds / len(calls) * 1e6 for name, seconds in best.items()}


def variant(name: str, tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--root", str(tree), "--rounds", str(args.rounds),
         "--warmup", str(args.warmup), "--json",
         *(["--embedder", args.embedder, "--embedder-cache", str(args.embedder_cache)]
           if args.embedder else []),
         *(["--count-access"] if args.count_access else [])],
        check=True, capture_output=True, text=True, cwd=tree).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["name"] = name
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--count-access", action="store_true",
                        help="as the chat route: access counted, injection recorded")
    parser.add_argument("--sort", default="cumulative", help="cProfile order (tottime, ...)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--embedder", choices=("static", "local"),
                        help="hybrid recall with this embedder (query cache off), as "
                             "bench.gateway's gw-static / gw-emb")
    parser.add_argument("--embedder-cache", type=Path, default=ROOT / ".bench" / "embedders",
                        help="where the static model is distilled (as bench.gateway)")
    parser.add_argument("--rank-repeats", type=int, default=200)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:  # a variant's subprocess
        print(json.dumps({k: v for k, v in asyncio.run(measure(args)).items()
                          if k != "captured"}))
        return
    rows = [variant(*spec.split("=", 1), args) for spec in args.variant]
    this = asyncio.run(measure(args))
    rows.append({**this, "name": "this"})
    trees = {name: Path(tree) for name, tree in (v.split("=", 1) for v in args.variant)}
    ranked = rank_us(trees, this["captured"], args.rank_repeats)
    print(f"{'tree':<10} {'µs/recall':>10} {'injected':>9}  blocks digest")
    for row in rows:
        print(f"{row['name']:<10} {row['us']:>10.0f} {row['injected']:>9}  {row['digest']}")
    if len({row["digest"] for row in rows}) > 1:
        print("blocks DIFFER between trees")
    print(f"rank() alone, same {len(this['captured'])} inputs, same results, best of "
          f"{args.rank_repeats}: " + ", ".join(f"{n} {us:.1f} µs" for n, us in ranked.items()))
    if this["profile"]:
        print(this["profile"])


if __name__ == "__main__":
    main()
