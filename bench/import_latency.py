"""``POST /v1/memories/import`` against the rest of the gateway: does a big import stall it?

Command (from the repository root)::

    .venv/bin/python -m bench.import_latency                 # this tree and a03c1f7, ~1 min
    .venv/bin/python -m bench.import_latency --items 2000 --baseline HEAD~3

Setup: ``memory-proxy serve`` (SQLite, learning off, no embedder,
``learning.max_memory_per_user`` raised to fit the import) pinned to one core (``taskset``),
started from this checkout and from ``--baseline`` (a commit, unpacked with ``git archive``
into a temporary directory and run with the same virtualenv). For each, one user imports
``--items`` memories of ``--chars`` random lower-case words each (what a user-bound key may
send: up to 2,000 items of up to 4,000 characters), then imports the same items again
(every item merges into a stored memory: a restored export), while another client asks
``GET /healthz`` every 20 ms. Printed: each import's wall time and the
``/healthz`` latencies (p50, p99, max) during it — a request that waits behind CPU work
on the event loop shows up there — this tree beside the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from bench.gateway import procs, targets

BASELINE = "a03c1f7"  # main before the import ran its checks off the event loop
PING_EVERY = 0.02  # seconds between two /healthz requests


@dataclass(frozen=True)
class Result:
    status: int
    import_seconds: float
    pings: list[float]  # /healthz latencies during the import, seconds

    def row(self, label: str) -> str:
        lat = sorted(self.pings)
        if not lat:
            return f"{label:<36} import {self.status} {self.import_seconds:6.2f} s  no ping"

        def q(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000

        return (f"{label:<36} import {self.status} {self.import_seconds:6.2f} s   /healthz "
                f"p50 {q(0.5):7.1f} ms  p99 {q(0.99):7.1f} ms  max {lat[-1] * 1000:7.1f} ms"
                f"  (n={len(lat)})")


def words(chars: int, rng: random.Random) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9)))
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


async def run_one(tree: Path, items: list[dict[str, str]], logs: Path,
                  core: int) -> tuple[Result, Result]:
    port, work = procs.free_port(), Path(tempfile.mkdtemp(prefix="bench-import-"))
    config = targets.gateway_config(work / "config.yaml", port=port, upstream_port=9,
                                    db=work / "memory.db")
    settings = yaml.safe_load(config.read_text())
    # Room for the whole import (the per-user quota, 500 by default, would refuse it).
    settings["learning"]["max_memory_per_user"] = 10 * len(items)
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    # ``-m proxy`` with cwd = the tree: that tree's code, whatever the editable install says.
    gateway = procs.start(f"gateway-{tree.name}", [sys.executable, "-m", "proxy", "serve",
                                                   "--config", str(config)],
                          core=core, port=port, logs=logs, env=targets.BASE_ENV, cwd=tree)
    headers = {"Authorization": f"Bearer {targets.CLIENT_KEY}", "X-User-Id": "importer"}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     timeout=600) as client:
            deadline = time.monotonic() + 90
            while True:
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if not gateway.alive() or time.monotonic() > deadline:
                    raise SystemExit(f"the gateway did not start:\n{gateway.tail()}")
                await asyncio.sleep(0.2)
            pings: list[float] = []
            done = asyncio.Event()

            async def pinger() -> None:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                             timeout=600) as own:
                    while not done.is_set():
                        began = time.perf_counter()
                        await own.get("/healthz")
                        pings.append(time.perf_counter() - began)
                        await asyncio.sleep(PING_EVERY)

            task = asyncio.create_task(pinger())
            await asyncio.sleep(0.3)
            results = []
            for _ in ("import", "re-import"):
                pings.clear()  # only the latencies while this import runs
                began = time.perf_counter()
                response = await client.post("/v1/memories/import", headers=headers,
                                             json={"memories": items})
                results.append(Result(response.status_code, time.perf_counter() - began,
                                      list(pings)))
            done.set()
            await task
            return results[0], results[1]
    finally:
        gateway.stop()


def unpack(commit: str) -> Path:
    """``commit``'s tree in a temporary directory (``git archive``)."""
    where = Path(tempfile.mkdtemp(prefix=f"bench-import-{commit}-")) / commit
    where.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=targets.ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


async def main_async(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    items = [{"content": "Fact " + words(args.chars - 5, rng)} for _ in range(args.items)]
    logs = Path(tempfile.mkdtemp(prefix="bench-import-logs-"))
    trees = [("this tree", targets.ROOT)]
    if args.baseline:
        trees.append((f"baseline {args.baseline}", unpack(args.baseline)))
    print(f"import of {args.items} items x {args.chars} characters, /healthz every "
          f"{PING_EVERY * 1000:.0f} ms, gateway on core {args.core} (logs: {logs})")
    for label, tree in trees:
        for _ in range(args.rounds):
            first, again = await run_one(tree, items, logs, args.core)
            print(first.row(f"{label}"), flush=True)
            print(again.row(f"{label}, re-import"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--chars", type=int, default=3900)
    parser.add_argument("--baseline", default=BASELINE,
                        help="commit to compare with ('' for none)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--core", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
