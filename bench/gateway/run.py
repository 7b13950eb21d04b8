"""Orchestration of one benchmark run (see ``bench/gateway/__main__.py`` for the doc)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.gateway import procs, profile, report, seed, soak, targets
from bench.gateway.load import LoadResult, one_request, run_load
from bench.gateway.report import Cell, Scenario, TargetReport
from bench.gateway.workload import payloads

TARGET_KEYS = ("direct", "gw-off", "gw-on", "gw-emb", "gw-static", "litellm")
LABELS = {"direct": "direct", "gw-off": "gw mem-off", "gw-on": "gw mem-on",
          "gw-emb": "gw mem-on+emb", "gw-static": "gw mem-on+static",
          "litellm": "LiteLLM proxy"}
EMBEDDERS = {"gw-emb": "local", "gw-static": "static"}  # target → memory.embedder.provider


@dataclass(frozen=True)
class Plan:
    """How much to measure per (target, scenario, round)."""

    rounds: int
    requests: dict[int, int]  # by concurrency
    seconds: float  # cap per measurement
    warmup: int  # requests sent and discarded before each measurement
    settle: float  # seconds after the last reply before reading CPU (deferred work)


@dataclass
class Target:
    key: str
    port: int
    proc: procs.Proc | None  # None: the fake upstream itself (direct calls)
    cpu_proc: procs.Proc  # whose CPU is charged to this column
    payloads: dict[str, list[bytes]] = field(default_factory=dict)
    report: TargetReport = field(init=False)

    def __post_init__(self) -> None:
        self.report = TargetReport(self.key, label(self.key))


def memory_on(key: str) -> bool:
    """Whether the target's requests carry the seeded user (memory on)."""
    return key.endswith(("-on", "-static")) or key in EMBEDDERS


def embedder(key: str) -> str | None:
    """The target's ``memory.embedder.provider`` (``NAME-static``: a variant's gw-static)."""
    return EMBEDDERS.get(key) or ("static" if key.endswith("-static") else None)


def label(key: str) -> str:
    """Column title: the fixed targets' names; ``NAME-on`` / ``NAME-off`` /
    ``NAME-static`` for variants."""
    if key in LABELS:
        return LABELS[key]
    name, _, memory = key.rpartition("-")
    return f"{name} mem-{memory}"


def variants(args: argparse.Namespace) -> dict[str, Path]:
    """``--variant NAME=DIR`` options: gateway source trees to run beside this one."""
    out = {}
    for spec in args.variant:
        name, sep, path = spec.partition("=")
        if not sep or not name or name in ("gw", "litellm", "direct"):
            raise SystemExit(f"--variant wants NAME=DIR, got {spec!r}")
        if not (Path(path) / "proxy" / "cli.py").is_file():
            raise SystemExit(f"--variant {name}: {path} holds no proxy/ package")
        out[name] = Path(path).resolve()
    return out


async def wait_first_reply(proc: procs.Proc, payload: bytes, *, within: float) -> float:
    """Seconds from process start to its first good reply (polling every 20 ms)."""
    deadline = time.perf_counter() + within
    while time.perf_counter() < deadline:
        if not proc.alive():
            raise SystemExit(f"{proc.name} exited during startup:\n{proc.tail()}")
        if await one_request(proc.port, payload, reply_timeout=5.0):
            return time.perf_counter() - proc.started_at
        await asyncio.sleep(0.02)
    raise SystemExit(f"{proc.name} gave no good reply within {within:.0f} s:\n{proc.tail()}")


async def measure(target: Target, scenario: Scenario, plan: Plan, *, server_core: int,
                  client_core: int, upstream: procs.Proc,
                  profile_to: Path | None = None,
                  ) -> tuple[LoadResult, float, float]:
    """One measurement: warm up, then the bounded load. Returns it, the server's CPU
    seconds, and the CPU seconds other processes took meanwhile on the cores the
    measurement uses (the server's core for servers, the client core for direct calls,
    the larger of the two shares when both matter). With ``profile_to``, py-spy samples
    the server during the measured load."""
    if target.proc is not None:
        target.proc.resume()
    try:
        data = target.payloads[scenario.kind]
        await run_load(port=target.port, payloads=data, stream=scenario.stream,
                       concurrency=scenario.concurrency, requests=plan.warmup, seconds=10)
        before = procs.cpu_seconds(target.cpu_proc.pid)
        core_before = procs.core_busy_seconds(server_core)
        client_before = procs.core_busy_seconds(client_core)
        ours_before = procs.cpu_seconds(os.getpid()) + procs.cpu_seconds(upstream.pid)
        with contextlib.ExitStack() as stack:
            if profile_to is not None:
                stack.enter_context(profile.recording(target.cpu_proc.pid, profile_to,
                                                      core=client_core))
            result = await run_load(port=target.port, payloads=data, stream=scenario.stream,
                                    concurrency=scenario.concurrency,
                                    requests=plan.requests[scenario.concurrency],
                                    seconds=plan.seconds)
        busy = procs.core_busy_seconds(server_core) - core_before
        client_busy = procs.core_busy_seconds(client_core) - client_before
        ours = procs.cpu_seconds(os.getpid()) + procs.cpu_seconds(upstream.pid) - ours_before
        server_cpu = procs.cpu_seconds(target.cpu_proc.pid) - before
        if target.proc is not None:
            await asyncio.sleep(plan.settle)
        cpu = procs.cpu_seconds(target.cpu_proc.pid) - before
    finally:
        if target.proc is not None:
            target.proc.pause()
    foreign_client = max(0.0, client_busy - ours)
    if target.proc is None:
        return result, cpu, foreign_client
    return result, cpu, max(foreign_client, busy - server_cpu, 0.0)


def record(cell: Cell, result: LoadResult, cpu: float, foreign: float) -> None:
    cell.ttft.extend(s.ttft for s in result.samples)
    cell.total.extend(s.total for s in result.samples)
    cell.requests += result.count
    cell.wall += result.wall
    cell.cpu += cpu
    cell.errors.update(result.errors)
    cell.memory_status.update(result.memory_status)
    cell.aborted += result.aborted
    cell.foreign += foreign


@contextlib.contextmanager
def running(procs_: list[procs.Proc]) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in reversed(procs_):
            proc.stop()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    from bench.gateway import __main__ as entry

    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=entry.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short sanity run")
    parser.add_argument("--rounds", type=int, help="A/B rounds (default 3; quick 1)")
    parser.add_argument("--requests", type=int,
                        help="requests per measurement at c=1 (c=32: ×3); default 1000")
    parser.add_argument("--seconds", type=float, help="cap per measurement (default 10 s)")
    parser.add_argument("--targets", default=",".join(TARGET_KEYS),
                        help=f"comma-separated subset of {','.join(TARGET_KEYS)}")
    parser.add_argument("--concurrency", default="1,32", help="comma-separated levels")
    parser.add_argument("--kinds", default="json,stream,paced",
                        help="scenario kinds: json, stream, paced (paced only at c > 1)")
    parser.add_argument("--chunks", type=int, default=20, help="events per streamed reply")
    parser.add_argument("--usage", choices=("auto", "always", "never"), default="auto",
                        help="upstream usage chunk: when asked (auto), always, never")
    parser.add_argument("--interval-ms", type=float, default=0.0,
                        help="upstream pause between streamed events (0: one burst)")
    parser.add_argument("--paced-ms", type=float, default=10.0,
                        help="pause between events of the paced streams (c=32 paced)")
    parser.add_argument("--memories", type=int, default=seed.MEMORIES)
    parser.add_argument("--embedder-cache", type=Path,
                        default=targets.ROOT / ".bench" / "embedders",
                        help="memory.embedder.cache_dir of gw-static (the distilled model "
                             "is made there on first use, ~2 min CPU)")
    parser.add_argument("--server-core", type=int, default=1,
                        help="core of the gateway / LiteLLM under test")
    parser.add_argument("--client-core", type=int, default=0,
                        help="core of the fake upstream and this load generator")
    parser.add_argument("--litellm-venv", type=Path, default=targets.ROOT / ".bench" /
                        "litellm-venv")
    parser.add_argument("--litellm-spec", default=targets.LITELLM_SPEC)
    parser.add_argument("--out", type=Path, default=targets.ROOT / ".bench" / "gateway",
                        help="run directory root (configs, databases, logs, results.json)")
    parser.add_argument("--soak", type=int, metavar="N",
                        help="instead of the table: N mixed requests, memory on, sampling "
                             "RSS, fds, threads and asyncio tasks")
    parser.add_argument("--soak-concurrency", type=int, default=32)
    parser.add_argument("--quiet", type=float, default=0.15,
                        help="a measurement during which other processes took more than "
                             "this share of the cores in use is taken again (--retries)")
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                        help="also run the gateway from the source tree DIR (e.g. a `git "
                             "archive` of an older commit) as targets NAME-off, NAME-on")
    parser.add_argument("--restart", action="store_true",
                        help="start every server target afresh (new process, fresh copy of "
                             "its database) before each round after the first, so the figures "
                             "pool as many server processes as rounds")
    parser.add_argument("--profile", default="", metavar="TARGETS",
                        help="comma-separated targets to sample with py-spy during the "
                             "measured load (collapsed stacks + summary in the run directory)")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    os.sched_setaffinity(0, {args.client_core})
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = args.out / stamp
    logs = workdir / "logs"
    workdir.mkdir(parents=True, exist_ok=True)
    keys = [k.strip() for k in args.targets.split(",") if k.strip()]
    trees = variants(args)
    extra = [f"{name}-{memory}" for name in trees for memory in ("off", "on")]
    extra += [f"{name}-static" for name in trees if "gw-static" in keys]
    keys += [k for k in extra if k not in keys]
    unknown = set(keys) - set(TARGET_KEYS) - set(extra)
    if unknown:
        raise SystemExit(f"unknown targets: {', '.join(sorted(unknown))}")
    if args.soak:
        keys = ["gw-on"]
    litellm_version = ""
    if "litellm" in keys:
        litellm_version = targets.ensure_litellm(args.litellm_venv, args.litellm_spec)
    if "gw-emb" in keys and not seed.can_embed():
        if "gw-emb" in [k.strip() for k in args.targets.split(",")]:
            raise SystemExit("target gw-emb needs the embeddings extra: "
                             "scripts/bootstrap test,embeddings")
        keys.remove("gw-emb")
        print("gw mem-on+emb skipped: the embeddings extra is not installed", flush=True)
    if any(k.endswith("-on") for k in keys):
        stored = await seed.seed_store(workdir / "seeded.db", count=args.memories)
        print(f"seeded {stored} memories for {seed.USER} through the store API", flush=True)
    for key, provider in EMBEDDERS.items():
        if key in keys:
            stored = await seed.seed_store(workdir / f"seeded-{provider}.db",
                                           count=args.memories, embed=provider,
                                           cache_dir=args.embedder_cache)
            print(f"seeded {stored} memories with {provider} vectors for {key}", flush=True)

    started: list[procs.Proc] = []
    with running(started):
        upstream = targets.start_upstream(core=args.client_core, logs=logs, chunks=args.chunks,
                                          usage=args.usage, interval_ms=args.interval_ms,
                                          paced_ms=args.paced_ms)
        started.append(upstream)
        upstream_startup = await wait_first_reply(
            upstream, payloads(upstream.port, user=None)["json"][0], within=20)
        table: list[Target] = []
        for key in keys:
            target = await start_target(key, args, workdir=workdir, logs=logs,
                                        upstream=upstream, started=started,
                                        src=trees.get(key.rpartition("-")[0]))
            if key == "direct":
                target.report.startup = upstream_startup
            table.append(target)
        for target in table:
            if target.key == "litellm":
                target.report.note = (f"litellm {litellm_version}, 1 worker, LITELLM_LOG=ERROR,"
                                      " no database")
            if target.key == "direct":
                target.report.note = ("absolute TTFT p50/p99 in brackets; CPU and RSS are the "
                                      "fake upstream's own")
        if args.soak:
            gateway = table[0].proc
            assert gateway is not None
            return await soak.run(gateway, total=args.soak, concurrency=args.soak_concurrency)
        async def restart(target: Target) -> None:
            assert target.proc is not None
            target.report.peak_rss_kb = max(target.report.peak_rss_kb, procs.status_kb(
                target.proc.pid, "VmHWM"))
            target.proc.stop()  # before its database is copied afresh
            started.remove(target.proc)
            fresh = await start_target(target.key, args, workdir=workdir, logs=logs,
                                       upstream=upstream, started=started,
                                       src=trees.get(target.key.rpartition("-")[0]),
                                       quiet=True)
            assert fresh.proc is not None
            target.port, target.proc, target.cpu_proc = fresh.port, fresh.proc, fresh.proc
            target.payloads = fresh.payloads

        return await compare(args, table, workdir, upstream,
                             restart=restart if args.restart else None)


async def start_target(key: str, args: argparse.Namespace, *, workdir: Path, logs: Path,
                       upstream: procs.Proc, started: list[procs.Proc],
                       src: Path | None = None, quiet: bool = False) -> Target:
    """Start one server (others paused), time its first reply, read its idle RSS.
    ``src``: run the gateway's code from that source tree (``PYTHONPATH``); ``quiet``:
    print nothing (a restart between rounds)."""
    if key == "direct":
        target = Target(key, upstream.port, None, upstream, payloads(upstream.port, user=None))
        target.report.idle_rss_kb = procs.status_kb(upstream.pid, "VmRSS")
        return target
    for other in started[1:]:
        other.pause()
    port = procs.free_port()
    if key == "litellm":
        config = targets.litellm_config(workdir / "litellm.yaml", upstream_port=upstream.port)
        proc = procs.start(key, targets.litellm_argv(args.litellm_venv, config, port=port),
                           core=args.server_core, port=port, logs=logs,
                           env=targets.LITELLM_ENV, cwd=workdir)
    else:
        db = workdir / f"{key}.db"
        for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            stale.unlink(missing_ok=True)  # a restarted target's last process left them
        if memory_on(key):
            provider = embedder(key)
            shutil.copyfile(workdir / (f"seeded-{provider}.db" if provider else "seeded.db"), db)
        config = targets.gateway_config(workdir / f"{key}.yaml", port=port,
                                        upstream_port=upstream.port, db=db,
                                        embedder=embedder(key),
                                        cache_dir=args.embedder_cache)
        env = dict(targets.BASE_ENV)
        # This checkout's code (the shared virtualenv may hold another tree's editable
        # install), or the variant's source tree.
        env["PYTHONPATH"] = str(src if src is not None else targets.ROOT)
        proc = procs.start(key, targets.gateway_argv(config), core=args.server_core, port=port,
                           logs=logs, env=env, cwd=workdir)
    started.append(proc)
    user = seed.USER if memory_on(key) else None
    target = Target(key, port, proc, proc, payloads(port, user=user))
    target.report.startup = await wait_first_reply(
        proc, target.payloads["json"][0], within=180 if key == "litellm" else 60)
    await asyncio.sleep(2.0)
    target.report.idle_rss_kb = procs.status_kb(proc.pid, "VmRSS")
    await procs.wait_idle(proc.pid)
    if not quiet:
        print(f"{label(key)}: first reply after {target.report.startup:.2f} s, idle RSS "
              f"{target.report.idle_rss_kb / 1024:.0f} MB (pid {proc.pid}, core "
              f"{args.server_core})", flush=True)
    proc.pause()
    return target


async def compare(args: argparse.Namespace, table: list[Target], workdir: Path,
                  upstream: procs.Proc, *,
                  restart: Callable[[Target], Awaitable[None]] | None = None) -> int:
    """Measure every scenario on every target, round by round, and print the table.
    ``restart``: called for each server target before each round after the first
    (``--restart``)."""
    quick = args.quick
    base = args.requests or (150 if quick else 1000)
    plan = Plan(
        rounds=args.rounds or (1 if quick else 3),
        requests={1: base, **dict.fromkeys((2, 4, 8, 16, 32, 64, 128), base * 3)},
        seconds=args.seconds or (3.0 if quick else 10.0),
        warmup=30 if quick else 100,
        settle=0.5 if quick else 1.0,
    )
    levels = [int(c) for c in args.concurrency.split(",")]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    scenarios = [Scenario(c, kind) for c in levels for kind in ("json", "stream")
                 if kind in kinds]
    scenarios += [Scenario(c, "paced") for c in levels if c > 1 and "paced" in kinds]
    for c in levels:
        plan.requests.setdefault(c, base * 3)
    profiled = {k.strip() for k in args.profile.split(",") if k.strip()}
    profiles: list[Path] = []
    started = time.perf_counter()
    for number in range(plan.rounds):
        order = table if number % 2 == 0 else list(reversed(table))
        if restart is not None and number > 0:
            for target in table:
                if target.proc is not None:
                    await restart(target)
            print(f"round {number + 1}/{plan.rounds}: every server started afresh", flush=True)
        for scenario in scenarios:
            for target in order:
                profile_to = None
                if target.key in profiled:
                    profile_to = workdir / (f"profile-{target.key}-r{number + 1}-c"
                                            f"{scenario.concurrency}-"
                                            f"{scenario.kind}.txt")
                    profiles.append(profile_to)
                for attempt in range(args.retries + 1):
                    result, cpu, foreign = await measure(
                        target, scenario, plan, server_core=args.server_core,
                        client_core=args.client_core, upstream=upstream,
                        profile_to=profile_to)
                    share = foreign / max(result.wall, 1e-9)
                    if share <= args.quiet or attempt == args.retries:
                        break
                    print(f"round {number + 1}/{plan.rounds} {scenario.name:<11} "
                          f"{target.report.label:<14} other processes took {share:.0%} of "
                          "the cores: measuring again", flush=True)
                    await asyncio.sleep(2.0)
                record(target.report.cells.setdefault(scenario, Cell()), result, cpu, foreign)
                print(f"round {number + 1}/{plan.rounds} {scenario.name:<11} "
                      f"{target.report.label:<14} {result.count:5d} req "
                      f"{result.count / result.wall:7.0f}/s  p50 TTFT "
                      f"{1000 * report.percentile([s.ttft for s in result.samples], 50):6.2f} ms"
                      f"  CPU {1000 * cpu / max(1, result.count):6.2f} ms/req"
                      f"  others {100 * foreign / max(result.wall, 1e-9):3.0f}%"
                      + (f"  errors {dict(result.errors)}" if result.errors else ""),
                      flush=True)
    for target in table:
        target.report.peak_rss_kb = max(target.report.peak_rss_kb, procs.status_kb(
            target.cpu_proc.pid, "VmHWM"))
    header = (f"gateway overhead — {plan.rounds} round(s) A/B alternated, "
              f"{time.perf_counter() - started:.0f} s of measurement; server under test on "
              f"core {args.server_core} (others paused with SIGSTOP), fake upstream + load "
              f"generator on core {args.client_core}; upstream streams {args.chunks} chunks "
              + ("in one burst" if not args.interval_ms else f"every {args.interval_ms} ms")
              + f"; mem-on = 1 user with {args.memories} memories, keyword recall; "
              "mem-on+emb = the same with local all-MiniLM-L6-v2 hybrid recall, query "
              "cache off")
    reports = [t.report for t in table]
    print()
    print(report.render(reports, scenarios, header=header))
    print()
    print("targets (memory on, keyword recall):")
    for line in report.targets(reports, scenarios):
        print("  " + line)
    print("hot-path targets (CPU figures: the server's process tree):")
    for line in report.hot_path_targets(reports, scenarios):
        print("  " + line)
    print("recall-cost targets (each against memory off in this run):")
    for line in report.recall_cost_targets(reports, scenarios):
        print("  " + line)
    embedding = report.embedding_cost(reports, scenarios)
    if embedding:
        print("local-embedding recall (gw mem-on+emb) over keyword recall (gw mem-on):")
        for line in embedding:
            print("  " + line)
    for path in profiles:
        if path.exists():
            summary = profile.summarize(path)
            path.with_suffix(".summary").write_text(summary + "\n")
            print("\n" + summary)
    results = workdir / "results.json"
    results.write_text(json.dumps(_json(reports, scenarios), indent=1))
    print(f"\nraw figures: {results}")
    return 0


def _json(reports: Sequence[TargetReport], scenarios: Sequence[Scenario]) -> object:
    out = []
    for r in reports:
        cells = {}
        for s in scenarios:
            cell = r.cells.get(s)
            if cell is None:
                continue
            cells[s.name] = {
                "requests": cell.requests, "wall_s": cell.wall, "rps": cell.rps,
                "cpu_ms_per_request": cell.cpu_ms,
                "ttft_ms": {q: 1000 * report.percentile(cell.ttft, q) for q in (50, 90, 99)},
                "total_ms": {q: 1000 * report.percentile(cell.total, q) for q in (50, 90, 99)},
                "errors": dict(cell.errors), "memory_status": dict(cell.memory_status),
            }
        out.append({"target": r.key, "startup_s": r.startup, "idle_rss_kb": r.idle_rss_kb,
                    "peak_rss_kb": r.peak_rss_kb, "cells": cells})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - comes with uvicorn[standard]
        return asyncio.run(run(args))
    return uvloop.run(run(args))
