"""The gateway bench's recall-cost targets: each figure read against memory off in the
same run, met when within its bound and NOT met past it."""

from __future__ import annotations

from collections import Counter

from bench.gateway.report import Cell, Scenario, TargetReport, recall_cost_targets, render

C1_JSON, C1_STREAM, C32_PACED, C32_JSON = (Scenario(1, "json"), Scenario(1, "stream"),
                                           Scenario(32, "paced"), Scenario(32, "json"))
SCENARIOS = [C1_JSON, C1_STREAM, C32_JSON, C32_PACED]


def cell(cpu_ms: float, ttft_ms: float, *, statuses: dict[str, int] | None = None) -> Cell:
    return Cell(ttft=[ttft_ms / 1000] * 10, cpu=cpu_ms / 1000 * 100, requests=100, wall=1.0,
                memory_status=Counter(statuses or {}))


def report(key: str, label: str, cells: dict[Scenario, Cell]) -> TargetReport:
    return TargetReport(key=key, label=label, cells=cells)


def lines(on_cpu: float, *, static_degraded: int = 0, base_off_cpu: float = 1.0,
          on_ttft: float = 2.2, paced_p99: float = 40.0) -> list[str]:
    off = report("gw-off", "gw mem-off", {s: cell(1.0, 30.0 if s is C32_PACED else 2.0)
                                          for s in SCENARIOS})
    on = report("gw-on", "gw mem-on", {C1_JSON: cell(on_cpu, on_ttft),
                                       C1_STREAM: cell(on_cpu, on_ttft),
                                       C32_PACED: cell(on_cpu, paced_p99)})
    static = report("gw-static", "gw static", {
        C1_JSON: cell(1.9, 2.4),
        C32_JSON: cell(2.0, 3.0, statuses={"injected": 100 - static_degraded,
                                           "degraded": static_degraded}),
        C32_PACED: cell(2.0, 3.0, statuses={"injected": 100})})
    direct = report("direct", "direct", {s: cell(0.0, 1.0) for s in SCENARIOS})
    base = report("base-off", "base mem-off", {C1_JSON: cell(base_off_cpu, 2.0)})
    return recall_cost_targets([direct, off, on, static, base], SCENARIOS)


def verdicts(found: list[str], start: str) -> list[str]:
    picked = [line for line in found if line.startswith(start)]
    assert picked, f"no line starts with {start!r} in {found}"
    return ["NOT met" if line.endswith("NOT met") else "met" for line in picked]


def test_figures_within_their_bounds_are_met() -> None:
    found = lines(1.4)
    assert verdicts(found, "mem-on CPU/request <= 1.5x") == ["met", "met"]
    assert verdicts(found, "mem-on TTFT p50") == ["met"]
    assert verdicts(found, "static CPU/request <= 2x") == ["met"]
    assert verdicts(found, "static degraded") == ["met", "met"]
    assert verdicts(found, "mem-on added TTFT p99") == ["met"]
    assert verdicts(found, "mem-off within 3 % of base mem-off") == ["met"]


def test_figures_past_their_bounds_are_not_met() -> None:
    found = lines(1.6, static_degraded=2, base_off_cpu=0.95, on_ttft=2.6, paced_p99=56.0)
    assert verdicts(found, "mem-on CPU/request <= 1.5x") == ["NOT met", "NOT met"]
    assert verdicts(found, "mem-on TTFT p50") == ["NOT met"]
    assert verdicts(found, "static degraded <= 1 %") == ["NOT met"]
    assert verdicts(found, "mem-on added TTFT p99") == ["NOT met"]
    assert verdicts(found, "mem-off within 3 % of base mem-off") == ["NOT met"]


def test_without_both_memory_columns_it_says_what_it_needs() -> None:
    off = report("gw-off", "gw mem-off", {C1_JSON: cell(1.0, 2.0)})
    assert recall_cost_targets([off], SCENARIOS) == [
        "(recall-cost targets need the gw-off and gw-on columns)"]


def test_columns_stay_apart_when_a_variant_label_is_long() -> None:
    reports = [report("gw-on", "gw mem-on", {C1_JSON: cell(1.5, 2.0)}),
               report("slowflush-off", "slowflush mem-off", {C1_JSON: cell(0.8, 1.0)}),
               report("slowflush-on", "slowflush mem-on", {C1_JSON: cell(1.4, 2.0)})]
    table = render(reports, [C1_JSON], header="h")
    header = table.splitlines()[2]
    assert header.split() == ["gw", "mem-on", "slowflush", "mem-off", "slowflush", "mem-on"]
    cpu = next(line for line in table.splitlines() if line.startswith("CPU ms/request"))
    assert cpu.split()[-3:] == ["1.50", "0.80", "1.40"]
