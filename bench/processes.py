"""``serve --processes N``: gateway throughput with 1 and 2 processes on 1 and 2 cores.

Command (from the repository root)::

    .venv/bin/python -m bench.processes            # ~1 min
    .venv/bin/python -m bench.processes --seconds 20 --rounds 3

Setup: the fake upstream of ``bench.gateway`` (``bench/gateway/fake_upstream.py``) and this
process (the closed-loop load generator of ``bench/gateway/load.py``, 32 keep-alive
connections) run on core 0; the gateway (``memory-proxy serve``, SQLite, learning off,
requests without a user id — the pass-through path, which is pure gateway CPU) runs under
``taskset`` on:

- ``1 proc / core 1``: the baseline — one process, one core to itself;
- ``2 procs / core 1``: two processes sharing that one core (no gain expected: the check
  that the supervisor costs nothing);
- ``1 proc / cores 0-1`` and ``2 procs / cores 0-1``: one vs two processes when a second
  core is available (shared with the client and the upstream — on a 2-core machine they
  take part of core 0, so the gain is below 2×).

Each configuration is measured for non-streaming (``json``) and streaming (``stream``, 20
events per reply) requests; the figures are completed requests per second of wall time,
the best of ``--rounds`` rounds (the machine may be shared), beside the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.gateway import load, procs, targets, workload

CONFIGS = [("1 proc / core 1", 1, "1"), ("2 procs / core 1", 2, "1"),
           ("1 proc / cores 0-1", 1, "0,1"), ("2 procs / cores 0-1", 2, "0,1")]


def start_gateway(config: Path, *, processes: int, cores: str, port: int,
                  logs: Path) -> procs.Proc:
    log = logs / f"gateway-{processes}-{cores.replace(',', '')}.log"
    # ``-m proxy`` from the repository root: this checkout's code, whatever the venv's
    # editable install points at.
    argv = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port",
            str(port), "--processes", str(processes)]
    with log.open("wb") as handle:
        popen = subprocess.Popen(["taskset", "-c", cores, *argv], stdout=handle,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env={**os.environ, **targets.BASE_ENV}, cwd=targets.ROOT,
                                 start_new_session=True)
    return procs.Proc(name="gateway", port=port, popen=popen, log=log,
                      started_at=time.perf_counter())


async def ready(port: int, payload: bytes, gateway: procs.Proc) -> None:
    deadline = time.monotonic() + 90
    while not await load.one_request(port, payload):
        if not gateway.alive() or time.monotonic() > deadline:
            raise SystemExit(f"the gateway did not start:\n{gateway.tail()}")
        await asyncio.sleep(0.2)


async def measure(port: int, payloads: list[bytes], *, stream: bool,
                  seconds: float) -> float:
    await load.run_load(port=port, payloads=payloads, stream=stream, concurrency=32,
                        requests=200, seconds=seconds)  # warm-up, every process
    result = await load.run_load(port=port, payloads=payloads, stream=stream, concurrency=32,
                                 requests=10**9, seconds=seconds)
    if result.errors:
        print(f"  errors: {dict(result.errors)}", file=sys.stderr)
    return result.count / result.wall


async def main_async(args: argparse.Namespace) -> None:
    os.sched_setaffinity(0, {0})
    logs = Path(tempfile.mkdtemp(prefix="bench-processes-"))
    upstream = targets.start_upstream(core=0, logs=logs, chunks=20, usage="auto",
                                      interval_ms=0.0, paced_ms=10.0)
    figures: dict[tuple[str, str], float] = {}
    try:
        for name, processes, cores in CONFIGS:
            port = procs.free_port()
            config = targets.gateway_config(logs / "config.yaml", port=port,
                                            upstream_port=upstream.port, db=logs / "db.sqlite")
            gateway = start_gateway(config, processes=processes, cores=cores, port=port,
                                    logs=logs)
            try:
                kinds = workload.payloads(port, user=None)
                await ready(port, kinds["json"][0], gateway)
                for kind in ("json", "stream"):
                    best = 0.0
                    for _ in range(args.rounds):
                        best = max(best, await measure(port, kinds[kind], stream=kind == "stream",
                                                       seconds=args.seconds))
                    figures[(name, kind)] = best
                    print(f"{name:22s} {kind:6s} {best:8.0f} req/s", flush=True)
            finally:
                gateway.stop()
    finally:
        upstream.stop()
    base = {kind: figures[(CONFIGS[0][0], kind)] for kind in ("json", "stream")}
    print("\nrequests/s at concurrency 32 (best of rounds), × the 1-process/1-core baseline")
    print(f"{'':22s} {'json':>14s} {'stream':>14s}")
    for name, _, _ in CONFIGS:
        cells = [f"{figures[(name, k)]:7.0f} ({figures[(name, k)] / base[k]:.2f}×)"
                 for k in ("json", "stream")]
        print(f"{name:22s} {cells[0]:>14s} {cells[1]:>14s}")
    print(f"(logs: {logs}; cores on this machine: {os.cpu_count()})")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.processes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
