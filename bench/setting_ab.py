"""What one tenant setting costs the request path, measured inside one gateway process:
the setting switched on and off between measurements, each pair read as a difference.

Why beside ``bench.gateway --variant``: that compares two trees in two processes, and two
processes of the same code differ here by up to 0.24 ms CPU per request (memory layout,
string hashing; ``bench/gateway/__main__.py``) — more than a small feature costs. A setting
that a tenant may change at run time (``PATCH /v1/admin/settings``, applied at once by the
process that takes it: ``proxy/tenants.py``) can instead be measured on and off in the
same process, minutes apart, so the process's own speed cancels out of each difference.

Command (from the repository root, after ``scripts/bootstrap test``)::

    .venv/bin/python bench/setting_ab.py                       # memory.record_injections
    .venv/bin/python bench/setting_ab.py --pairs 12 --concurrency 1,32 --kinds json,stream

What runs: ``bench.gateway``'s store (one user, 500 memories and a profile, seeded through
the store API), fake upstream and load generator on core 0 (``--client-core``), one
``memory-proxy serve`` on core 1 (``--server-core``; embedded SQLite, keyword recall,
learning off, an admin key), every request carrying the seeded user (memory on), measured
once the server is idle after its first reply (``procs.wait_idle``). For each
scenario, ``--pairs`` pairs of measurements: the setting true then false in even pairs,
false then true in odd ones (ABBA, so a drift over the run cancels too). Each measurement is
``bench.gateway``'s: 100 discarded warm-up requests, then up to ``--requests`` (c=1;
×3 at c > 1) or ``--seconds``, the server's CPU read until 1 s after the last reply — so
what the process does every second on the block's behalf (flushing the injection records
and access counters) is charged to that block. A measurement during which other processes
took more than ``--quiet`` of the cores is taken again (up to ``--retries`` times).

Prints per scenario: CPU ms/request with the setting true and false (means over the
pairs), the paired difference true − false (mean, its 95 % confidence interval from
Student's t over the pairs, and each pair's difference), and the verdict against a budget
of ``--bound-ms`` (0.1) or ``--bound-share`` (3 %) of the "true" figure, whichever is
larger: "within" when the interval's upper end is under it, "over" when its lower end is
above it, "unresolved" otherwise. Then the same difference split by thread: the event
loop's (``main``; the request path proper) and every other thread's (the store's writer
thread, executors), each measurement's CPU divided in the shares ``/proc/<pid>/task``
gives its threads over the measurement and its warm-up. ``results.json`` and the server's log go to
``.bench/setting_ab/<time>/``. ``--tree DIR`` runs the gateway from another source tree
(``PYTHONPATH``), e.g. to see which part of a feature costs what.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway import procs, seed, targets  # noqa: E402
from bench.gateway.report import Scenario  # noqa: E402
from bench.gateway.run import Plan, Target, measure, wait_first_reply  # noqa: E402
from bench.gateway.workload import payloads  # noqa: E402

# Student's t distribution, two-sided 95 % (the 0.975 quantile) for 1…30 degrees of
# freedom; past 30 the normal distribution's 1.96.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


@dataclass(frozen=True)
class Paired:
    """Paired differences ``a − b`` (ms per request): their mean and 95 % interval."""

    differences: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.differences)

    @property
    def half_width(self) -> float:
        """Half the 95 % confidence interval of the mean (``inf`` for one pair)."""
        n = len(self.differences)
        if n < 2:
            return math.inf
        t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
        return t * statistics.stdev(self.differences) / math.sqrt(n)

    def verdict(self, bound: float) -> str:
        """``within`` (upper end < ``bound``), ``over`` (lower end > ``bound``), else
        ``unresolved``."""
        if self.mean + self.half_width < bound:
            return "within"
        if self.mean - self.half_width > bound:
            return "over"
        return "unresolved"


@dataclass
class Readings:
    """Per-request figures of one scenario's measurements, by setting value — CPU ms
    here, instructions in ``bench/instructions_ab.py``; ``*_main`` the part of each that
    the process's main thread (the event loop) took."""

    on: list[float] = field(default_factory=list)
    off: list[float] = field(default_factory=list)
    on_main: list[float] = field(default_factory=list)
    off_main: list[float] = field(default_factory=list)

    def paired(self) -> Paired:
        return Paired(tuple(a - b for a, b in zip(self.on, self.off, strict=True)))

    def paired_main(self) -> Paired:
        return Paired(tuple(a - b for a, b in zip(self.on_main, self.off_main, strict=True)))


def main_share(before: dict[str, float], after: dict[str, float]) -> float:
    """The main thread's share of the CPU all threads took between two
    :func:`~bench.gateway.procs.thread_cpu_seconds` readings (1.0 when none was taken)."""
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    total = sum(spent.values())
    return spent.get("main", 0.0) / total if total > 0 else 1.0


def budget(on_ms: float, *, bound_ms: float, bound_share: float) -> float:
    """The larger of ``bound_ms`` and ``bound_share`` of ``on_ms`` (ms per request)."""
    return max(bound_ms, bound_share * on_ms)


def render(setting: str, results: dict[Scenario, Readings], *, bound_ms: float,
           bound_share: float) -> list[str]:
    """The table: one line per scenario, then each pair's difference."""
    lines = [f"{setting}: CPU ms/request, one process, true vs false (pairs ABBA)", "",
             f"{'scenario':<12}{'true':>8}{'false':>8}{'true−false':>12}{'95 % CI':>20}"
             f"{'budget':>9}  verdict"]
    for scenario, readings in results.items():
        pair = readings.paired()
        on, off = statistics.fmean(readings.on), statistics.fmean(readings.off)
        limit = budget(on, bound_ms=bound_ms, bound_share=bound_share)
        low, high = pair.mean - pair.half_width, pair.mean + pair.half_width
        lines.append(f"{scenario.name:<12}{on:8.3f}{off:8.3f}{pair.mean:+12.3f}"
                     f"{f'[{low:+.3f}, {high:+.3f}]':>20}{limit:9.3f}  {pair.verdict(limit)}")
    lines.append("")
    lines.append("by thread, true−false: the event loop (main) and every other thread (the "
                 "store's writer, executors)")
    for scenario, readings in results.items():
        main = readings.paired_main()
        lines.append(f"  {scenario.name:<12}main {main.mean:+.3f} ± {main.half_width:.3f}"
                     f"   others {readings.paired().mean - main.mean:+.3f}")
    lines.append("")
    for scenario, readings in results.items():
        each = " ".join(f"{d:+.3f}" for d in readings.paired().differences)
        lines.append(f"  {scenario.name}: pairs {each}")
    return lines


async def set_value(port: int, setting: str, value: bool) -> None:
    """PATCH the tenant's ``setting`` and check the answer carries it."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        answer = await client.patch(
            "/v1/admin/settings", json={setting: value},
            headers={"Authorization": f"Bearer {targets.ADMIN_KEY}"})
        answer.raise_for_status()
        if answer.json()["settings"].get(setting) is not value:
            raise SystemExit(f"PATCH {setting}={value} answered {answer.text[:300]}")


def shared_arguments(parser: argparse.ArgumentParser, *, out: Path) -> None:
    """The options this benchmark and ``bench/instructions_ab.py`` share: the seeded store,
    the cores, the cost bound, the source tree and where a run's directory goes (``out``)."""
    parser.add_argument("--memories", type=int, default=seed.MEMORIES,
                        help="memories seeded for the benchmark user (default: %(default)s)")
    parser.add_argument("--server-core", type=int, default=1,
                        help="CPU the gateway is pinned to (default: %(default)s)")
    parser.add_argument("--client-core", type=int, default=0,
                        help="CPU the load client and fake upstream are pinned to "
                             "(default: %(default)s)")
    parser.add_argument("--bound-ms", type=float, default=0.1,
                        help="the cost bound is the larger of this (CPU ms per request) "
                             "and --bound-share of memory-on (default: %(default)s)")
    parser.add_argument("--bound-share", type=float, default=0.03,
                        help="share of memory-on CPU per request (default: %(default)s)")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="the gateway's source tree (default this checkout; e.g. a `git "
                             "archive <commit> proxy | tar -x -C DIR`)")
    parser.add_argument("--out", type=Path, default=out,
                        help="where each run's directory goes (default: %(default)s)")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", default="memory.record_injections",
                        help="a boolean the admin API may change (default: %(default)s)")
    parser.add_argument("--pairs", type=int, default=8,
                        help="ABBA pairs measured (default: %(default)s)")
    parser.add_argument("--concurrency", default="32,1",
                        help="requests in flight, comma-separated (default: %(default)s)")
    parser.add_argument("--kinds", default="json", help="json, stream (comma-separated)")
    parser.add_argument("--requests", type=int, default=1000,
                        help="per measurement at c=1 (×3 at c > 1)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="longest one measurement may run (default: %(default)s)")
    parser.add_argument("--quiet", type=float, default=0.15,
                        help="share of the cores other processes may take during a "
                             "measurement before it is taken again (default: %(default)s)")
    parser.add_argument("--retries", type=int, default=2,
                        help="times a measurement that was not quiet is taken again "
                             "(default: %(default)s)")
    shared_arguments(parser, out=ROOT / ".bench" / "setting_ab")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    os.sched_setaffinity(0, {args.client_core})
    workdir = args.out / time.strftime("%Y%m%d-%H%M%S")
    logs = workdir / "logs"
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "gateway.db"
    stored = await seed.seed_store(workdir / "seeded.db", count=args.memories)
    shutil.copyfile(workdir / "seeded.db", db)
    print(f"seeded {stored} memories for {seed.USER}", flush=True)
    upstream = targets.start_upstream(core=args.client_core, logs=logs, chunks=20,
                                      usage="auto", interval_ms=0.0, paced_ms=10.0)
    started = [upstream]
    try:
        port = procs.free_port()
        config = targets.gateway_config(workdir / "gateway.yaml", port=port,
                                        upstream_port=upstream.port, db=db, admin=True)
        env = {**targets.BASE_ENV, "PYTHONPATH": str(args.tree.resolve())}
        server = procs.start("gateway", targets.gateway_argv(config), core=args.server_core,
                             port=port, logs=logs, env=env, cwd=workdir)
        started.append(server)
        target = Target("gw-on", port, server, server, payloads(port, user=seed.USER))
        await wait_first_reply(server, target.payloads["json"][0], within=60)
        await procs.wait_idle(server.pid)
        plan = Plan(rounds=args.pairs,
                    requests={c: args.requests * (1 if c == 1 else 3)
                              for c in (1, 2, 4, 8, 16, 32, 64, 128)},
                    seconds=args.seconds, warmup=100, settle=1.0)
        levels = [int(c) for c in args.concurrency.split(",")]
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        scenarios = [Scenario(c, kind) for c in levels for kind in kinds]
        results = {s: Readings() for s in scenarios}
        for number in range(args.pairs):
            order = (True, False) if number % 2 == 0 else (False, True)
            for scenario in scenarios:
                for value in order:
                    server.resume()
                    await set_value(port, args.setting, value)
                    threads = procs.thread_cpu_seconds(server.pid)
                    for attempt in range(args.retries + 1):
                        result, cpu, foreign = await measure(
                            target, scenario, plan, server_core=args.server_core,
                            client_core=args.client_core, upstream=upstream)
                        if foreign / max(result.wall, 1e-9) <= args.quiet or \
                                attempt == args.retries:
                            break
                        await asyncio.sleep(2.0)
                    if result.errors or result.memory_status.get("injected", 0) \
                            != result.count:
                        raise SystemExit(f"{scenario.name}: errors {dict(result.errors)}, "
                                         f"memory {dict(result.memory_status)}")
                    ms = 1000 * cpu / max(1, result.count)
                    main = ms * main_share(threads, procs.thread_cpu_seconds(server.pid))
                    readings = results[scenario]
                    (readings.on if value else readings.off).append(ms)
                    (readings.on_main if value else readings.off_main).append(main)
                    print(f"pair {number + 1}/{args.pairs} {scenario.name:<11} "
                          f"{args.setting}={str(value).lower():<5} {result.count:5d} req "
                          f"CPU {ms:6.3f} ms/req  others "
                          f"{100 * foreign / max(result.wall, 1e-9):3.0f}%", flush=True)
    finally:
        for proc in reversed(started):
            proc.stop()
    print()
    print("\n".join(render(args.setting, results, bound_ms=args.bound_ms,
                           bound_share=args.bound_share)))
    (workdir / "results.json").write_text(json.dumps({
        "setting": args.setting,
        "scenarios": {s.name: {"true": r.on, "false": r.off, "true_main": r.on_main,
                               "false_main": r.off_main} for s, r in results.items()},
    }, indent=2))
    print(f"\nraw figures: {workdir / 'results.json'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
