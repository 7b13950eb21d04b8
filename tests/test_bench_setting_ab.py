"""The in-process setting A/B's arithmetic: paired differences, their 95 % interval, the
budget and the verdict read against the interval's ends; and the config it starts."""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import pytest
import yaml

from bench.gateway import procs, targets
from bench.gateway.report import Scenario
from bench.setting_ab import Paired, Readings, budget, main_share, render


def test_the_interval_is_students_t_over_the_pairs() -> None:
    pair = Readings(on=[1.10, 1.20, 1.30, 1.25], off=[1.00, 1.15, 1.18, 1.20]).paired()
    assert pair.differences == pytest.approx((0.10, 0.05, 0.12, 0.05))
    assert pair.mean == pytest.approx(0.08)
    # sd of (0.10, 0.05, 0.12, 0.05) = 0.03559; t(0.975, 3 df) = 3.182; √4 = 2
    assert pair.half_width == pytest.approx(3.182 * 0.035590 / 2, rel=1e-4)


def test_one_pair_has_no_interval_and_resolves_nothing() -> None:
    pair = Paired((0.01,))
    assert math.isinf(pair.half_width)
    assert pair.verdict(0.1) == "unresolved"


@pytest.mark.parametrize(("differences", "verdict"), [
    ((0.02, 0.03, 0.025, 0.035), "within"),     # upper end well under 0.1
    ((0.20, 0.22, 0.21, 0.19), "over"),         # lower end above 0.1
    ((0.02, 0.18, 0.05, 0.15), "unresolved"),   # the interval holds 0.1
])
def test_the_verdict_reads_the_interval_not_the_mean(differences: tuple[float, ...],
                                                     verdict: str) -> None:
    assert Paired(differences).verdict(0.1) == verdict


def test_the_budget_is_the_larger_of_the_bound_and_the_share() -> None:
    assert budget(1.2, bound_ms=0.1, bound_share=0.03) == 0.1
    assert budget(6.0, bound_ms=0.1, bound_share=0.03) == pytest.approx(0.18)


def test_the_table_gives_each_scenario_its_figures_and_pairs() -> None:
    results = {Scenario(32, "json"): Readings(on=[1.2, 1.3], off=[1.1, 1.25],
                                              on_main=[1.1, 1.2], off_main=[1.05, 1.2]),
               Scenario(1, "json"): Readings(on=[2.6, 2.7, 2.8], off=[2.4, 2.45, 2.5],
                                             on_main=[2.5, 2.6, 2.7],
                                             off_main=[2.4, 2.45, 2.5])}
    lines = render("memory.record_injections", results, bound_ms=0.1, bound_share=0.03)
    c32 = next(line for line in lines if line.startswith("c=32 json"))
    assert c32.split()[2:5] == ["1.250", "1.175", "+0.075"]
    assert c32.endswith("unresolved")
    c1 = next(line for line in lines if line.startswith("c=1 json"))
    assert c1.endswith("over")  # +0.25 with a tight interval, past 0.1 (3 % of 2.7 = 0.081)
    assert "  c=32 json: pairs +0.100 +0.050" in lines
    # main: +0.05, +0.00 → +0.025; the other threads the rest of +0.075
    split = next(line for line in lines if line.startswith("  c=32 json   main"))
    assert "main +0.025" in split
    assert split.endswith("others +0.050")


def test_the_main_threads_share_is_read_from_the_threads_cpu() -> None:
    before = {"main": 10.0, "memory-proxy": 1.0}
    after = {"main": 13.0, "memory-proxy": 2.0, "new-thread": 0.0}
    assert main_share(before, after) == pytest.approx(0.75)
    assert main_share(after, after) == 1.0  # nothing spent: all of nothing is the loop's


def test_a_busy_thread_is_counted_apart_from_the_main_thread() -> None:
    """A thread that spent 0.3 s of CPU reads as at least 0.2 s more (10 ms clock ticks)
    outside the main thread, and the main thread is read apart."""
    spun, done = threading.Event(), threading.Event()

    def spin() -> None:
        deadline = time.thread_time() + 0.3
        while time.thread_time() < deadline:
            pass
        spun.set()
        done.wait(10)

    before = procs.thread_cpu_seconds(os.getpid())
    worker = threading.Thread(target=spin, name="bench-spinner")
    worker.start()
    try:
        assert spun.wait(10)
        seen = procs.thread_cpu_seconds(os.getpid())
    finally:
        done.set()
        worker.join()
    def others(reading: dict[str, float]) -> float:
        return sum(seconds for name, seconds in reading.items() if name != "main")

    assert "main" in before
    assert "main" in seen
    assert others(seen) - others(before) >= 0.2


def test_the_admin_config_adds_a_tenant_admin_key(tmp_path: Path) -> None:
    plain = yaml.safe_load(targets.gateway_config(
        tmp_path / "a.yaml", port=1, upstream_port=2, db=tmp_path / "a.db").read_text())
    admin = yaml.safe_load(targets.gateway_config(
        tmp_path / "b.yaml", port=1, upstream_port=2, db=tmp_path / "b.db",
        admin=True).read_text())
    assert "admin_keys" not in plain["auth"]
    assert admin["auth"]["keys"] == plain["auth"]["keys"]
    assert admin["auth"]["admin_keys"] == [
        {"key": f"os.environ/{targets.ADMIN_KEY_ENV}", "name": "bench-admin"}]
    assert targets.BASE_ENV[targets.ADMIN_KEY_ENV] == targets.ADMIN_KEY


async def test_measuring_waits_until_the_server_is_idle() -> None:
    """A process still busy after its first reply (a background import, say) is waited
    for until a window of it passes idle; an idle one is not held past one window."""
    import asyncio
    import sys

    busy = await asyncio.create_subprocess_exec(
        sys.executable, "-c",
        "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\ntime.sleep(30)")
    try:
        waited = await procs.wait_idle(busy.pid, window=0.3, within=10)
        assert 1.2 <= waited < 5
        assert await procs.wait_idle(busy.pid, window=0.3, within=10) < 0.6
    finally:
        busy.kill()
        await busy.wait()
