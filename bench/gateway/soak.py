"""A bounded soak: N mixed requests against one gateway with memory on, sampled over time.

Requests go in segments of ~N/40, alternating non-streaming and streaming; in streaming
segments every 50th client goes away after the first event (a disconnect mid-stream).
Requests name the seeded user (500 memories) and, one in four, one of 64 other users with
no memories. After each segment and once more after a 3 s rest the gateway's ``VmRSS``,
open file descriptors, threads and asyncio tasks (``memory_proxy_event_loop_tasks`` on
``/metrics``) are sampled. A leak shows as a series that keeps rising; the verdict compares
the second half of the run with the first and the rested end with the start.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

from bench.gateway import procs, seed
from bench.gateway.load import get, run_load
from bench.gateway.report import compress
from bench.gateway.workload import chat_request

OTHER_USERS = 64
DISCONNECT_EVERY = 50
_TASKS = re.compile(rb"^memory_proxy_event_loop_tasks (\S+)$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class SoakSample:
    requests: int
    seconds: float
    rss_mb: float
    fds: int
    threads: int
    tasks: int


async def sample(proc: procs.Proc, requests: int, started: float) -> SoakSample:
    body = await get(proc.port, "/metrics")
    match = _TASKS.search(body)
    return SoakSample(
        requests=requests, seconds=time.perf_counter() - started,
        rss_mb=procs.status_kb(proc.pid, "VmRSS") / 1024, fds=procs.fd_count(proc.pid),
        threads=procs.thread_count(proc.pid), tasks=int(float(match.group(1))) if match else -1,
    )


def mixed_payloads(port: int) -> dict[bool, list[bytes]]:  # by stream
    """The seeded user's requests, with every fourth one sent as another user instead."""
    questions = seed.questions(96)
    return {
        stream: [chat_request(port, q, stream=stream,
                              user=seed.USER if i % 4 else f"soak-user-{i % OTHER_USERS}")
                 for i, q in enumerate(questions)]
        for stream in (False, True)
    }


async def run(proc: procs.Proc, *, total: int, concurrency: int) -> int:
    """Run the soak against ``proc`` (a started gateway) and print the series and verdict;
    returns the exit status (1 when a leak or an error was seen)."""
    proc.resume()
    mixed = mixed_payloads(proc.port)
    segment = max(100, total // 40)
    started = time.perf_counter()
    samples = [await sample(proc, 0, started)]
    done = errors = aborted = 0
    statuses: dict[str, int] = {}
    stream = False
    while done < total:
        count = min(segment, total - done)
        result = await run_load(port=proc.port, payloads=mixed[stream], stream=stream,
                                concurrency=concurrency, requests=count, seconds=600,
                                abort_every=DISCONNECT_EVERY if stream else 0)
        done += result.count + result.aborted + sum(result.errors.values())
        errors += sum(result.errors.values())
        aborted += result.aborted
        for key, value in result.memory_status.items():
            statuses[key] = statuses.get(key, 0) + value
        samples.append(await sample(proc, done, started))
        stream = not stream
    await asyncio.sleep(3.0)
    rested = await sample(proc, done, started)
    samples.append(rested)
    print(f"soak: {done} requests ({aborted} closed by the client mid-stream on purpose, "
          f"{errors} errors) in {rested.seconds:.0f} s at concurrency {concurrency}; "
          f"memory status {statuses}")
    print(f"  samples: {len(samples)} (start, after each of {len(samples) - 2} segments, "
          "after a 3 s rest); 12 evenly spaced shown")
    print(f"  requests   {compress([s.requests for s in samples], digits=0)}")
    print(f"  VmRSS MB   {compress([s.rss_mb for s in samples])}")
    print(f"  open fds   {compress([s.fds for s in samples], digits=0)}")
    print(f"  threads    {compress([s.threads for s in samples], digits=0)}")
    print(f"  asyncio    {compress([s.tasks for s in samples], digits=0)}")
    half = samples[len(samples) // 2]
    growth = rested.rss_mb - half.rss_mb
    early_growth = half.rss_mb - samples[1].rss_mb
    peak = procs.status_kb(proc.pid, "VmHWM") / 1024
    print(f"  RSS: {samples[1].rss_mb:.1f} MB after the first segment, {half.rss_mb:.1f} MB at "
          f"half-way, {rested.rss_mb:.1f} MB at the end (second half {growth:+.1f} MB, "
          f"first half {early_growth:+.1f} MB); peak {peak:.1f} MB")
    leaks = []
    if growth > max(5.0, 0.05 * half.rss_mb):
        leaks.append("RSS still growing in the second half")
    # The upstream connection pool fills during the first segments: fds and threads at
    # the end are compared with their highest value in the first half, asyncio tasks
    # with the idle start.
    first_half = samples[1:len(samples) // 2]
    if rested.fds > max(s.fds for s in first_half):
        leaks.append(f"fds {max(s.fds for s in first_half)} → {rested.fds}")
    if rested.tasks > samples[0].tasks:
        leaks.append(f"asyncio tasks {samples[0].tasks} → {rested.tasks}")
    if rested.threads > max(s.threads for s in first_half):
        leaks.append("threads grew")
    print("  verdict: " + ("no leak seen (RSS flat in the second half; fds and threads no "
                           "higher than in the first half; asyncio tasks back to the idle "
                           "count)" if not leaks else
                           "POSSIBLE LEAK: " + "; ".join(leaks)))
    return 1 if leaks or errors else 0
