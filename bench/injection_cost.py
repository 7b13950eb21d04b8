"""CPU cost of injection records (docs/design.md#injection-records), piece by piece,
for this checkout and a baseline source tree side by side in one run.

What it measures, in a child process per tree (``PYTHONPATH`` = that tree first, so its
``proxy`` package is the one timed), the trees alternating ``--rounds`` times:
    explain µs        :func:`proxy.memory.explain.explain` for one block: the gateway
                      benchmark's profile (style, impression, 3 traits, 3 topics; 4
                      lines kept) and 11 facts — 5 of 40 ranked memories, 6 resident ones
                      (bench/gateway/seed.py) — as the memory step calls it per request.
    record µs         one :class:`~proxy.memory.explain.InjectionRecord` with a fresh id
                      (the log's :class:`~proxy.memory.records.IdSequence`; in an older
                      tree :func:`proxy.memory.records.new_id`) queued on an
                      :class:`~proxy.memory.explain.InjectionLog`, as the memory step
                      queues it (in this tree: turned into its written form).
    flush µs/record   ``SqliteMemoryStore.record_injections`` of batches of 1, 30 and
                      300 such records for one user already at the per-user cap (1,000)
                      — the benchmark user's steady state, where every record written
                      drops the oldest — CPU of the whole process (the writer thread
                      included) ÷ records; "ms/flush" the same per call. Batches: one
                      per second at 1, 30 and 300 requests/s.
    flush of 200 users  the same for batches of one record from each of 200 users who
                      hold 300 records each (under the cap): many users chatting at once.
Each timed figure is the minimum over ``--repeats`` loops (CPU time, ``time.process_time``),
so other load on the machine inflates it less; compare within one run. Two figures do not
depend on the load at all: "explain Python calls" (function calls of one ``explain()``,
counted by ``cProfile``) and "flush of N: SQL steps/record" (SQLite virtual-machine
instructions the writer connection ran per record, counted by a progress handler every
10 instructions, so ±10 per flush).

    .venv/bin/python bench/injection_cost.py --baseline /tmp/before
    (the baseline tree: ``git archive <commit> proxy | tar -x -C /tmp/before``)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BATCHES = (1, 30, 300)
PER_USER = 1000
CROWD, CROWD_HOLDS = 200, 300  # many users, each under the cap, one record each a flush


def _best(fn: Callable[[], object], *, loops: int, repeats: int) -> float:
    """Minimum CPU µs per call of ``fn`` over ``repeats`` loops of ``loops`` calls."""
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(loops):
            fn()
        best = min(best, (time.process_time() - started) / loops * 1e6)
    return best


def child(repeats: int) -> dict[str, float]:
    """The figures of the ``proxy`` package on ``sys.path`` (run in a child process)."""
    from datetime import timedelta

    from bench.gateway.seed import TENANT, USER, build_memories, build_profile
    from proxy.backends.sqlite.database import SqliteDatabase
    from proxy.backends.sqlite.store import SqliteMemoryStore
    from proxy.memory.explain import InjectionLog, InjectionRecord, explain
    from proxy.memory.recall import Ranked
    from proxy.memory.records import new_id, utcnow

    memories = build_memories(60)
    ranked = [Ranked(m, 0.5, 0.9 - i / 100, True, i % 3 == 0, 0.0, 0.1 * (i % 2))
              for i, m in enumerate(memories[:40])]
    block = [r.memory for r in ranked[:5]] + memories[50:56]
    profile, now = build_profile(), utcnow()
    out = {"explain µs": _best(lambda: explain(block, ranked, profile, 4, now),
                               loops=2000, repeats=repeats)}
    profiler = cProfile.Profile()
    profiler.runcall(explain, block, ranked, profile, 4, now)
    out["explain Python calls"] = pstats.Stats(profiler).total_calls  # type: ignore[attr-defined]
    items = explain(block, ranked, profile, 4, now)

    # What the memory step does per reply: a record with a fresh id (the log's id
    # sequence, or new_id() in a tree without one) queued on the log, in whatever form
    # the tree queues it (its store writes that form).
    log = InjectionLog()
    ids = getattr(log, "ids", None)

    def queue(user: str = USER) -> None:
        at = utcnow()
        log.add(InjectionRecord(ids(at) if ids is not None else new_id(), TENANT, user, at,
                                "bench-model", None, "private", items))

    def queued(count: int, user: str = USER) -> list[Any]:
        log.pending.clear()
        for _ in range(count):
            queue(user)
        batch = list(log.pending)
        log.pending.clear()
        return batch

    def record() -> None:
        queue()
        if len(log.pending) >= 1000:
            log.pending.clear()

    out["record µs"] = _best(record, loops=2000, repeats=repeats)
    crowd = [f"user-{i}" for i in range(CROWD)]
    scenarios: list[tuple[str, Callable[[], list[Any]], int]] = [
        (f"flush of {size}", lambda size=size: queued(size),  # type: ignore[misc]
         max(3, 600 // size)) for size in BATCHES]
    scenarios.append((f"flush of {CROWD} users",
                      lambda: [r for u in crowd for r in queued(1, u)], 3))

    async def flushes() -> None:
        with tempfile.TemporaryDirectory() as folder:
            async with SqliteDatabase(Path(folder) / "bench.db") as db:
                store = SqliteMemoryStore(db)
                keep = {"retention": timedelta(days=7), "per_user": PER_USER}
                for _ in range(PER_USER // 100 + 1):  # past the cap
                    await store.record_injections(queued(100), now=utcnow(), **keep)
                for _ in range(CROWD_HOLDS // 100):  # the crowd: under the cap
                    await store.record_injections(
                        [r for u in crowd for r in queued(100, u)], now=utcnow(), **keep)
                steps = [0]

                def count(conn: sqlite3.Connection) -> None:
                    def tick() -> int:
                        steps[0] += 10
                        return 0
                    conn.set_progress_handler(tick, 10)

                for label, batch_of, calls in scenarios:
                    await db.write(count)
                    steps[0] = 0
                    written = 0
                    for _ in range(calls):
                        batch = batch_of()
                        written += len(batch)
                        await store.record_injections(batch, now=utcnow(), **keep)
                    await db.write(lambda c: c.set_progress_handler(None, 0))
                    out[f"{label}: SQL steps/record"] = steps[0] / written
                    best = float("inf")
                    for _ in range(repeats):
                        batches = [batch_of() for _ in range(calls)]
                        started = time.process_time()
                        for batch in batches:
                            await store.record_injections(batch, now=utcnow(), **keep)
                        best = min(best, time.process_time() - started)
                    out[f"{label}: µs/record"] = best / written * 1e6
                    out[f"{label}: ms/flush"] = best / calls * 1e3

    asyncio.run(flushes())
    return out


def run_tree(tree: Path, repeats: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(ROOT)]))
    done = subprocess.run([sys.executable, __file__, "--child", "--repeats", str(repeats)],
                          env=env, check=True, capture_output=True, text=True, cwd=ROOT)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="source tree to compare with")
    parser.add_argument("--rounds", type=int, default=2, help="child runs per tree")
    parser.add_argument("--repeats", type=int, default=5, help="timed loops per figure")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.repeats)))
        return
    trees = {"this": ROOT} | ({"baseline": args.baseline} if args.baseline else {})
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for round_no in range(args.rounds):
        order = list(trees.items())
        for name, tree in order if round_no % 2 == 0 else reversed(order):
            results[name].append(run_tree(tree, args.repeats))
    best: dict[str, dict[str, Any]] = {
        name: {k: min(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
    names = list(best)
    print(f"{'piece (min over rounds)':34s}" + "".join(f"{n:>12s}" for n in names))
    for key in best["this"]:
        print(f"{key:34s}" + "".join(f"{best[n][key]:12.2f}" for n in names))


if __name__ == "__main__":
    main()
