"""What one tenant setting costs the request path in instructions: the gateway run under
callgrind, the setting switched on and off between measurements in one process.

Why beside ``bench/setting_ab.py``: CPU time on a shared virtual machine drifts with what
its neighbours do (the same measurement has read 1.1 and 1.9 ms per request an hour
apart), so a difference of a few hundredths of a millisecond can stay unresolved for hours.
Instructions executed do not drift: callgrind counts every instruction the process runs,
whatever else the machine is doing, and the same requests against the same process give
the same count to within about 2 % (what varies is work done on a timer: under callgrind
the process runs ~50× slower, so a once-a-second flush writes ~50× fewer records at a time
and its fixed cost per flush weighs on each record ~50× more than when native — the other
threads' part of a difference is an upper bound). An instruction is not a fixed time, so
the difference is also given in milliseconds as its share of the instructions with the
setting true times the CPU ms per request measured natively with it true, in the same run
(the added code taken to run at the process's average instructions per millisecond).

Command (from the repository root, after ``scripts/bootstrap test``; needs Debian's
``valgrind``)::

    .venv/bin/python bench/instructions_ab.py                      # ~15 min
    .venv/bin/python bench/instructions_ab.py --pairs 2 --requests 300 --concurrency 4

What runs: ``bench.gateway``'s store (one user, 500 memories and a profile), fake upstream
and load generator on core 0, one ``memory-proxy serve`` on core 1 (embedded SQLite,
keyword recall, learning off, an admin key), every request carrying the seeded user (memory
on). First the native calibration: the server as deployed, ``--calibrate`` measurements of
CPU ms per request (``bench.gateway``'s) with the setting true, their median. Then the same
server under ``valgrind --tool=callgrind`` (about fifty times slower, so recall's deadlines
are raised for it to 60 s: nothing is cut short), left until it is idle after its first
reply; a first pair is measured and dropped (the first measurement in a process was seen to
carry some 70 M instructions of one-off work). For each of ``--pairs`` pairs, the setting
true then false (false then true in odd pairs): 20 discarded requests, the counters zeroed,
``--requests`` requests at ``--concurrency`` (each reply must have injected memory), 2.5 s
for what the process does every second on their behalf (the injection records' and access
counters' flush), then the counters dumped; instructions ÷ requests, for the main thread
(the event loop) and all threads.

Prints per kind: instructions per request true and false (means over the pairs), the
difference (with its 95 % interval over the pairs, Student's t), its share of "true",
that share × the native CPU ms, the budget (``--bound-ms`` 0.1 or ``--bound-share`` 3 % of
the native CPU ms, whichever is larger) and the verdict read against the interval's ends
(``bench/setting_ab.py``'s, the budget taken to instructions at the same rate); then the main
thread's part of the difference and each pair's figures. ``results.json``, the callgrind
dumps and the server's log go to ``.bench/instructions_ab/<time>/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway import procs, seed, targets  # noqa: E402
from bench.gateway.report import Scenario  # noqa: E402
from bench.gateway.run import Plan, Target, measure, wait_first_reply  # noqa: E402
from bench.gateway.workload import chat_body, payloads  # noqa: E402
from bench.setting_ab import Readings, budget, set_value, shared_arguments  # noqa: E402

# Under callgrind the gateway runs ~50× slower: recall's deadlines (milliseconds when
# native) are raised so that no measured request loses its memory to one.
SLOW_ENV = {"MEMORY_PROXY_MEMORY__RECALL_TIMEOUT_MS": "60000",
            "MEMORY_PROXY_MEMORY__RECALL_HARD_TIMEOUT_MS": "60000"}
WARMUP = 20        # requests before each measurement (the setting's first use)
SETTLE = 2.5       # seconds after the last reply: the once-a-second flushes run
_DUMP = re.compile(r"\.(\d+)-(\d+)$")  # <out>.<dump number>-<thread number>


def dump_totals(path: Path) -> int:
    """Instructions (``Ir``) a callgrind dump file counted: its ``totals:`` or
    ``summary:`` line. Raises ``ValueError`` when the file has neither."""
    text = path.read_text(errors="replace")
    events = re.search(r"^events:\s*(.+)$", text, re.M)
    total = re.search(r"^totals:\s*(.+)$", text, re.M) or \
        re.search(r"^summary:\s*(.+)$", text, re.M)
    if events is None or total is None:
        raise ValueError(f"{path}: not a callgrind dump (no events or totals line)")
    counts = dict(zip(events.group(1).split(), total.group(1).split(), strict=False))
    if "Ir" not in counts:
        raise ValueError(f"{path}: no Ir among the events {events.group(1)!r}")
    return int(counts["Ir"])


def dumps_by_thread(out: Path, number: int) -> dict[int, Path]:
    """Dump ``number``'s files (``--separate-threads=yes``: one per thread) by thread
    number (1 = the main thread)."""
    found: dict[int, Path] = {}
    for path in out.parent.glob(out.name + ".*"):
        match = _DUMP.search(path.name)
        if match and int(match.group(1)) == number:
            found[int(match.group(2))] = path
    return found


def render(setting: str, counts: dict[str, Readings], native_ms: dict[str, float], *,
           bound_ms: float, bound_share: float) -> list[str]:
    """The table: per kind, instructions (thousands) per request true / false, the
    difference and its interval, its share of true, that share × the native CPU ms with
    the setting true, the budget and the verdict (the interval's ends against the budget
    taken to instructions at that rate); then the main thread's part and each pair."""
    lines = [f"{setting}: instructions per request (callgrind), one process, true vs false",
             "", f"{'kind':<8}{'true k':>10}{'false k':>10}{'true−false k':>15}"
                 f"{'95 % CI k':>20}{'share':>8}{'native ms':>11}{'≈ ms':>8}{'budget':>8}"
                 "  verdict"]
    for kind, c in counts.items():
        pair = c.paired()
        on, off = statistics.fmean(c.on), statistics.fmean(c.off)
        share = pair.mean / on
        native = native_ms[kind]
        limit = budget(native, bound_ms=bound_ms, bound_share=bound_share)
        estimate = share * native
        verdict = pair.verdict(limit / native * on)  # the budget in instructions
        low, high = (pair.mean - pair.half_width) / 1e3, (pair.mean + pair.half_width) / 1e3
        lines.append(f"{kind:<8}{on / 1e3:10.1f}{off / 1e3:10.1f}{pair.mean / 1e3:+15.1f}"
                     f"{f'[{low:+.1f}, {high:+.1f}]':>20}{100 * share:7.2f}%{native:11.3f}"
                     f"{estimate:+8.3f}{limit:8.3f}  {verdict}")
    lines.append("")
    lines.append("by thread, true−false (k instructions): the event loop (main) and every "
                 "other thread (the store's writer, executors)")
    for kind, c in counts.items():
        main = c.paired_main().mean
        lines.append(f"  {kind:<8}main {main / 1e3:+.1f}   others "
                     f"{(c.paired().mean - main) / 1e3:+.1f}")
    lines.append("")
    for kind, c in counts.items():
        each = " ".join(f"{a / 1e3:.1f}/{b / 1e3:.1f}" for a, b in zip(c.on, c.off,
                                                                        strict=True))
        lines.append(f"  {kind}: pairs (true/false k) {each}")
    return lines


async def send(port: int, bodies: Sequence[bytes], count: int, concurrency: int) -> int:
    """Send ``count`` requests (``bodies`` in turn) with ``concurrency`` clients, each
    read to its end; how many failed or came back without memory injected."""
    next_one, failed = 0, 0
    headers = {"Authorization": f"Bearer {targets.CLIENT_KEY}", "X-User-Id": seed.USER,
               "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=300,
                                 headers=headers) as client:
        async def client_loop() -> None:
            nonlocal next_one, failed
            while next_one < count:
                body = bodies[next_one % len(bodies)]
                next_one += 1
                async with client.stream("POST", "/v1/chat/completions",
                                         content=body) as reply:
                    await reply.aread()
                    if reply.status_code != 200 or \
                            reply.headers.get("x-memory-status") != "injected":
                        failed += 1
        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return failed


def callgrind(pid: int, action: str) -> None:
    """``callgrind_control -z`` (zero the counters) or ``-d`` (dump them) for ``pid``."""
    subprocess.run(["callgrind_control", action, str(pid)], check=True,
                   capture_output=True, timeout=120)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", default="memory.record_injections",
                        help="a boolean the admin API may change (default: %(default)s)")
    parser.add_argument("--pairs", type=int, default=4,
                        help="ABBA pairs measured, after one dropped pair (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=300,
                        help="requests per measurement under callgrind")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="requests in flight (default: %(default)s)")
    parser.add_argument("--kinds", default="json", help="json, stream (comma-separated)")
    parser.add_argument("--calibrate", type=int, default=5,
                        help="native measurements of CPU ms per request (their median)")
    shared_arguments(parser, out=ROOT / ".bench" / "instructions_ab")
    return parser.parse_args(argv)


async def calibrate(args: argparse.Namespace, kinds: list[str], workdir: Path,
                    upstream: procs.Proc) -> dict[str, float]:
    """The native server's CPU ms per request with the setting true, per kind (the
    median of ``--calibrate`` measurements of ``bench.gateway``'s)."""
    db = workdir / "native.db"
    shutil.copyfile(workdir / "seeded.db", db)
    port = procs.free_port()
    config = targets.gateway_config(workdir / "native.yaml", port=port,
                                    upstream_port=upstream.port, db=db, admin=True)
    env = {**targets.BASE_ENV, "PYTHONPATH": str(args.tree.resolve())}
    server = procs.start("native", targets.gateway_argv(config), core=args.server_core,
                         port=port, logs=workdir / "logs", env=env, cwd=workdir)
    try:
        target = Target("gw-on", port, server, server, payloads(port, user=seed.USER))
        await wait_first_reply(server, target.payloads["json"][0], within=60)
        await procs.wait_idle(server.pid)
        await set_value(port, args.setting, True)
        plan = Plan(rounds=1, requests={args.concurrency: 1000}, seconds=10.0, warmup=100,
                    settle=1.0)
        native: dict[str, float] = {}
        for kind in kinds:
            readings = []
            for _ in range(args.calibrate):
                result, cpu, _foreign = await measure(
                    target, Scenario(args.concurrency, kind), plan,
                    server_core=args.server_core, client_core=args.client_core,
                    upstream=upstream)
                readings.append(1000 * cpu / max(1, result.count))
            native[kind] = statistics.median(readings)
            print(f"native {kind}: CPU ms/request {native[kind]:.3f} "
                  f"({', '.join(f'{r:.3f}' for r in readings)})", flush=True)
        return native
    finally:
        server.stop()


async def run(args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (Debian: apt-get install valgrind)")
    os.sched_setaffinity(0, {args.client_core})
    workdir = args.out / time.strftime("%Y%m%d-%H%M%S")
    logs = workdir / "logs"
    workdir.mkdir(parents=True, exist_ok=True)
    stored = await seed.seed_store(workdir / "seeded.db", count=args.memories)
    print(f"seeded {stored} memories for {seed.USER}", flush=True)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bodies = {kind: [chat_body(q, stream=kind == "stream") for q in seed.questions()]
              for kind in kinds}
    upstream = targets.start_upstream(core=args.client_core, logs=logs, chunks=20,
                                      usage="auto", interval_ms=0.0, paced_ms=10.0)
    started = [upstream]
    counts = {kind: Readings() for kind in kinds}
    try:
        native = await calibrate(args, kinds, workdir, upstream)
        db = workdir / "gateway.db"
        shutil.copyfile(workdir / "seeded.db", db)
        port = procs.free_port()
        config = targets.gateway_config(workdir / "gateway.yaml", port=port,
                                        upstream_port=upstream.port, db=db, admin=True)
        out = workdir / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", "--cache-sim=no", "--dump-instr=no",
                "--separate-threads=yes", f"--callgrind-out-file={out}", sys.executable,
                *targets.gateway_argv(config)]
        env = {**targets.BASE_ENV, **SLOW_ENV, "PYTHONPATH": str(args.tree.resolve())}
        server = procs.start("gateway", argv, core=args.server_core, port=port, logs=logs,
                             env=env, cwd=workdir)
        started.append(server)
        await wait_first_reply(server, payloads(port, user=seed.USER)["json"][0],
                               within=900)
        # What the process finishes after its first reply (the MCP SDK's import in a
        # thread, the collector's passes), then a whole pair measured and dropped (caches,
        # the recall index, the first records' flush, work a first measurement in this
        # process was seen to carry): none of it is the requests' own.
        await procs.wait_idle(server.pid, window=5.0, within=900)
        dump = 0
        for number in range(-1, args.pairs):
            order = (True, False) if number % 2 == 0 else (False, True)
            for kind in kinds:
                for value in order:
                    await set_value(port, args.setting, value)
                    await send(port, bodies[kind], WARMUP, args.concurrency)
                    await asyncio.sleep(SETTLE)
                    callgrind(server.pid, "-z")
                    failed = await send(port, bodies[kind], args.requests, args.concurrency)
                    if failed:
                        raise SystemExit(f"{kind}: {failed} of {args.requests} replies "
                                         "failed or injected no memory")
                    await asyncio.sleep(SETTLE)
                    callgrind(server.pid, "-d")
                    dump += 1
                    threads = dumps_by_thread(out, dump)
                    if 1 not in threads:
                        raise SystemExit(f"callgrind dump {dump} not found beside {out}")
                    every = sum(dump_totals(p) for p in threads.values()) / args.requests
                    main = dump_totals(threads[1]) / args.requests
                    c = counts[kind]
                    if number >= 0:
                        (c.on if value else c.off).append(every)
                        (c.on_main if value else c.off_main).append(main)
                    label = f"pair {number + 1}/{args.pairs}" if number >= 0 else "warm-up"
                    print(f"{label:<9} {kind:<6} "
                          f"{args.setting}={str(value).lower():<5} {args.requests} req "
                          f"{every / 1e3:9.1f} k instructions/req (main {main / 1e3:.1f} k)",
                          flush=True)
    finally:
        for proc in reversed(started):
            proc.stop()
    print()
    print("\n".join(render(args.setting, counts, native, bound_ms=args.bound_ms,
                           bound_share=args.bound_share)))
    (workdir / "results.json").write_text(json.dumps({
        "setting": args.setting, "native_cpu_ms_true": native,
        "kinds": {k: {"true": c.on, "false": c.off, "true_main": c.on_main,
                      "false_main": c.off_main} for k, c in counts.items()},
    }, indent=2))
    print(f"\nraw figures: {workdir / 'results.json'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
