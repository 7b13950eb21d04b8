"""Aggregation and the printed table (pure: measurements in, text out)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Scenario:
    """Concurrency and kind: ``json`` (non-streaming), ``stream`` (the upstream sends
    the whole stream in one burst) or ``paced`` (streaming, events spaced out)."""

    concurrency: int
    kind: str

    @property
    def stream(self) -> bool:
        return self.kind != "json"

    @property
    def name(self) -> str:
        return f"c={self.concurrency} {self.kind}"


@dataclass
class Cell:
    """Every round of one (target, scenario), pooled."""

    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    cpu: float = 0.0  # seconds of CPU of the measured process tree
    requests: int = 0
    wall: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    memory_status: Counter[str] = field(default_factory=Counter)
    aborted: int = 0
    foreign: float = 0.0  # CPU seconds other processes took on the server's core

    @property
    def foreign_share(self) -> float:
        return self.foreign / self.wall if self.wall else math.nan

    @property
    def rps(self) -> float:
        return self.requests / self.wall if self.wall else math.nan

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu / self.requests if self.requests else math.nan


@dataclass
class TargetReport:
    key: str
    label: str
    cells: dict[Scenario, Cell] = field(default_factory=dict)
    startup: float = math.nan  # seconds, process start → first good reply
    idle_rss_kb: int = 0
    peak_rss_kb: int = 0
    note: str = ""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def added(target: Cell, direct: Cell, q: float) -> float:
    """Target TTFT percentile minus the direct call's, in ms."""
    return 1000 * (percentile(target.ttft, q) - percentile(direct.ttft, q))


def _f(value: float, digits: int = 1) -> str:
    return "—" if math.isnan(value) else f"{value:.{digits}f}"


def render(reports: Sequence[TargetReport], scenarios: Sequence[Scenario],
           *, header: str) -> str:
    """One table: a row per figure, a column per target, then mem-on ÷ LiteLLM."""
    by_key = {r.key: r for r in reports}
    direct = by_key.get("direct")
    columns = list(reports)
    on, lite = by_key.get("gw-on"), by_key.get("litellm")
    width = max(15, *(len(c.label) + 2 for c in columns))  # a variant's label can be long
    lines = [header, ""]

    def row(label: str, values: Sequence[str], ratio: str = "") -> None:
        cells = "".join(f"{v:>{width}}" for v in values)
        lines.append(f"{label:<34}{cells}{ratio:>{width + 2}}".rstrip())

    def ratio(pick: Callable[[TargetReport], float], fmt: str) -> str:
        if on is None or lite is None:
            return ""
        a, b = pick(on), pick(lite)
        return fmt.format(a / b) if b and not math.isnan(a / b) else "—"

    def cell_ratio(s: Scenario, pick: Callable[[Cell], float], fmt: str) -> str:
        if on is None or lite is None or s not in on.cells or s not in lite.cells:
            return ""
        return ratio(lambda r: pick(r.cells[s]), fmt)

    row("", [c.label for c in columns], "mem-on÷LiteLLM" if on and lite else "")
    lines.append("-" * (34 + width * len(columns) + (width + 2 if on and lite else 0)))
    for s in scenarios:
        values = []
        for c in columns:
            cell = c.cells.get(s)
            if cell is None or not cell.ttft:
                values.append("—")
            elif c.key == "direct" or direct is None or s not in direct.cells:
                values.append(f"({_f(1000 * percentile(cell.ttft, 50), 2)}/"
                              f"{_f(1000 * percentile(cell.ttft, 99), 2)})")
            else:
                base = direct.cells[s]
                values.append(f"{_f(added(cell, base, 50), 2)}/{_f(added(cell, base, 99), 2)}")
        row(f"added TTFT p50/p99 ms  {s.name}", values)
    for s in scenarios:
        row(f"requests/s             {s.name}",
            [_f(c.cells[s].rps, 0) if s in c.cells else "—" for c in columns],
            cell_ratio(s, lambda cell: cell.rps, "×{:.1f}"))
    for s in scenarios:
        row(f"CPU ms/request         {s.name}",
            [_f(c.cells[s].cpu_ms, 2) if s in c.cells else "—" for c in columns],
            cell_ratio(s, lambda cell: cell.cpu_ms, "{:.2f}"))
    row("other processes on our cores %",
        [_f(100 * sum(cell.foreign for cell in c.cells.values())
            / max(1e-9, sum(cell.wall for cell in c.cells.values())), 0) for c in columns])
    row("requests measured (all scenarios)",
        [str(sum(cell.requests for cell in c.cells.values())) for c in columns])
    row("errors", [str(sum(sum(cell.errors.values()) for cell in c.cells.values()))
                   for c in columns])
    row("memory injected (share of replies)", [_injected(c) for c in columns])
    row("startup to first reply s", [_f(c.startup, 2) for c in columns],
        ratio(lambda r: r.startup, "{:.2f}"))
    row("idle RSS MB (after first reply)", [_f(c.idle_rss_kb / 1024) for c in columns],
        ratio(lambda r: r.idle_rss_kb, "{:.2f}"))
    row("peak RSS MB (VmHWM)", [_f(c.peak_rss_kb / 1024) for c in columns],
        ratio(lambda r: r.peak_rss_kb, "{:.2f}"))
    notes = [f"  {c.label}: {c.note}" for c in columns if c.note]
    errors = [f"  {c.label} {s.name}: {dict(cell.errors)}" for c in columns
              for s, cell in c.cells.items() if cell.errors]
    if errors:
        lines += ["", "errors by kind:", *errors]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def _injected(report: TargetReport) -> str:
    statuses: Counter[str] = Counter()
    for cell in report.cells.values():
        statuses.update(cell.memory_status)
    total = sum(statuses.values())
    if not total or set(statuses) == {"-"}:
        return "—"
    return f"{100 * statuses['injected'] / total:.0f}%"


def targets(reports: Sequence[TargetReport], scenarios: Sequence[Scenario]) -> list[str]:
    """The gateway's targets, each with its figure and met / NOT met."""
    by_key = {r.key: r for r in reports}
    on, lite, direct = by_key.get("gw-on"), by_key.get("litellm"), by_key.get("direct")
    out: list[str] = []
    if on is None or direct is None:
        return ["(targets need the direct and gw-on columns)"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    for s in scenarios:
        if s.concurrency == 1 and s in on.cells and s in direct.cells:
            value = added(on.cells[s], direct.cells[s], 50)
            out.append(f"added TTFT p50 ≤ 3 ms, {s.name} (mem-on): {value:6.2f} ms  "
                       f"{verdict(value <= 3)}")
    for s in scenarios:
        if s.concurrency > 1 and s.stream and s in on.cells and s in direct.cells:
            value = added(on.cells[s], direct.cells[s], 99)
            note = "" if s.kind == "paced" else " (burst: a saturated closed loop, see doc)"
            out.append(f"added TTFT p99 ≤ 15 ms, {s.name} (mem-on): {value:6.2f} ms  "
                       f"{verdict(value <= 15)}{note}")
    if lite is None:
        return [*out, "(LiteLLM targets need the litellm column)"]
    for kind in ("json", "stream"):
        pairs = [(s, on.cells[s], lite.cells[s]) for s in scenarios
                 if s.kind == kind and s in on.cells and s in lite.cells]
        if not pairs:
            continue
        ratios = [a.cpu_ms / b.cpu_ms for _, a, b in pairs]
        shown = ", ".join(f"{s.name}: {a.cpu_ms:.2f} vs {b.cpu_ms:.2f} ms (×{r:.2f})"
                          for (s, a, b), r in zip(pairs, ratios, strict=True))
        out.append(f"CPU/request ≤ ¼ LiteLLM, {kind:<6}: {shown}  {verdict(max(ratios) <= 0.25)}")
        loaded = [(s, a, b) for s, a, b in pairs if s.concurrency > 1]
        if loaded:
            s, a, b = loaded[-1]
            out.append(f"requests/s ≥ 4× LiteLLM on one core, {s.name}: {a.rps:.0f} vs "
                       f"{b.rps:.0f} (×{a.rps / b.rps:.1f})  {verdict(a.rps >= 4 * b.rps)}")
    out.append(f"startup to first reply ≤ ½ LiteLLM: {on.startup:.2f} s vs {lite.startup:.2f} s"
               f"  {verdict(on.startup <= lite.startup / 2)}")
    rss_ok = on.idle_rss_kb <= lite.idle_rss_kb / 2
    out.append(f"idle RSS ≤ ½ LiteLLM: {on.idle_rss_kb / 1024:.0f} MB vs "
               f"{lite.idle_rss_kb / 1024:.0f} MB  {verdict(rss_ok)}")
    return out


def hot_path_targets(reports: Sequence[TargetReport],
                     scenarios: Sequence[Scenario]) -> list[str]:
    """The hot-path targets with their figures and met / NOT met: memory on with
    keyword recall (500 memories) ≤ 1.0 ms CPU per request and ≤ 1.0 ms added TTFT p50 at
    c=1, paced streams at c=32 ≤ 15 ms added TTFT p99; with embeddings (local, static)
    ≤ 3 ms CPU per request and every reply at c=32 injected (none ``degraded``)."""
    by_key = {r.key: r for r in reports}
    on, direct = by_key.get("gw-on"), by_key.get("direct")
    if on is None or direct is None:
        return ["(targets need the direct and gw-on columns)"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    out: list[str] = []
    for s in scenarios:
        cell = on.cells.get(s)
        if cell is None or s not in direct.cells:
            continue
        if s.concurrency == 1:
            out.append(f"mem-on CPU/request <= 1.0 ms, {s.name}: {cell.cpu_ms:6.2f} ms  "
                       f"{verdict(cell.cpu_ms <= 1.0)}")
            value = added(cell, direct.cells[s], 50)
            out.append(f"mem-on added TTFT p50 <= 1.0 ms, {s.name}: {value:6.2f} ms  "
                       f"{verdict(value <= 1.0)}")
        elif s.kind == "paced":
            value = added(cell, direct.cells[s], 99)
            # A difference of two p99s is noisy: a direct p99 above the gateway's is an
            # outlier of the baseline, never a gateway that answers before its upstream.
            ok = "inconclusive (direct p99 is the larger)" if value < 0 else verdict(value <= 15)
            out.append(f"mem-on added TTFT p99 <= 15 ms, {s.name}: {value:6.2f} ms "
                       f"({1000 * percentile(cell.ttft, 99):.1f} vs direct "
                       f"{1000 * percentile(direct.cells[s].ttft, 99):.1f} ms)  {ok}")
    for key in ("gw-emb", "gw-static", *(k for k in by_key if k.endswith("-static")
                                         and k != "gw-static")):
        report = by_key.get(key)
        if report is None:
            continue
        for s in scenarios:
            cell = report.cells.get(s)
            if cell is None:
                continue
            if s.concurrency == 1:
                out.append(f"{report.label} CPU/request <= 3 ms, {s.name}: "
                           f"{cell.cpu_ms:6.2f} ms  {verdict(cell.cpu_ms <= 3.0)}")
            else:
                total = sum(cell.memory_status.values())
                degraded = cell.memory_status.get("degraded", 0)
                out.append(f"{report.label} no degraded replies, {s.name}: {degraded} of "
                           f"{total}  {verdict(total > 0 and degraded == 0)}")
    return out


def recall_cost_targets(reports: Sequence[TargetReport],
                        scenarios: Sequence[Scenario]) -> list[str]:
    """The recall-cost targets, each figure against memory off in the same run, with
    met / NOT met: keyword recall (``gw-on``) CPU per request ≤ 1.5× ``gw-off`` at c=1
    json and stream, and its added TTFT p50 at c=1 json ≤ memory off's + 0.5 ms; static
    embeddings (``gw-static``) ≤ 2× ``gw-off`` at c=1 json and, at c>1, no ``degraded``
    reply in paced streams and ≤ 1 % in the saturated json and stream scenarios; paced
    c>1 added TTFT p99 of keyword recall ≤ memory off's + 15 ms; and each variant's
    memory-off column (``NAME-off``) against ours: ``gw-off`` no more than 3 % above it."""
    by_key = {r.key: r for r in reports}
    off, on, static, direct = (by_key.get(k) for k in ("gw-off", "gw-on", "gw-static", "direct"))
    if off is None or on is None:
        return ["(recall-cost targets need the gw-off and gw-on columns)"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    def both(report: TargetReport | None, s: Scenario) -> tuple[Cell, Cell] | None:
        if report is None or s not in report.cells or s not in off.cells:
            return None
        return report.cells[s], off.cells[s]

    out: list[str] = []
    for s in scenarios:
        pair = both(on, s)
        if pair is None:
            continue
        cell, base = pair
        if s.concurrency == 1:
            ratio = cell.cpu_ms / base.cpu_ms
            out.append(f"mem-on CPU/request <= 1.5x mem-off, {s.name}: {cell.cpu_ms:.2f} vs "
                       f"{base.cpu_ms:.2f} ms (x{ratio:.2f})  {verdict(ratio <= 1.5)}")
            if s.kind == "json":
                extra = 1000 * (percentile(cell.ttft, 50) - percentile(base.ttft, 50))
                out.append(f"mem-on TTFT p50 <= mem-off + 0.5 ms, {s.name}: {extra:+.2f} ms  "
                           f"{verdict(extra <= 0.5)}")
        elif s.kind == "paced" and direct is not None and s in direct.cells:
            gap = added(cell, direct.cells[s], 99) - added(base, direct.cells[s], 99)
            out.append(f"mem-on added TTFT p99 <= mem-off's + 15 ms, {s.name}: {gap:+.2f} ms "
                       f"({1000 * percentile(cell.ttft, 99):.1f} vs "
                       f"{1000 * percentile(base.ttft, 99):.1f} ms)  {verdict(gap <= 15)}")
    for s in scenarios:
        pair = both(static, s)
        if pair is None:
            continue
        cell, base = pair
        if s.concurrency == 1 and s.kind == "json":
            ratio = cell.cpu_ms / base.cpu_ms
            out.append(f"static CPU/request <= 2x mem-off, {s.name}: {cell.cpu_ms:.2f} vs "
                       f"{base.cpu_ms:.2f} ms (x{ratio:.2f})  {verdict(ratio <= 2)}")
        elif s.concurrency > 1:
            total = sum(cell.memory_status.values())
            degraded = cell.memory_status.get("degraded", 0)
            bound = 0.0 if s.kind == "paced" else 0.01
            ok = total > 0 and degraded <= bound * total
            out.append(f"static degraded <= {100 * bound:.0f} %, {s.name}: {degraded} of "
                       f"{total}  {verdict(ok)}")
    for key, report in by_key.items():
        if not key.endswith("-off") or key == "gw-off":
            continue
        for s in scenarios:
            pair = both(report, s)
            if pair is None:
                continue
            theirs, ours = pair
            change = ours.cpu_ms / theirs.cpu_ms - 1
            out.append(f"mem-off within 3 % of {report.label}, {s.name}: {ours.cpu_ms:.2f} vs "
                       f"{theirs.cpu_ms:.2f} ms ({100 * change:+.1f} %)  {verdict(change <= 0.03)}")
    return out


def embedding_cost(reports: Sequence[TargetReport],
                   scenarios: Sequence[Scenario]) -> list[str]:
    """What local-embedding recall adds over keyword recall, per scenario: added TTFT
    p50/p99 and CPU per request of ``gw-emb`` minus ``gw-on`` (empty without both)."""
    by_key = {r.key: r for r in reports}
    on, emb = by_key.get("gw-on"), by_key.get("gw-emb")
    if on is None or emb is None:
        return []
    out = []
    for s in scenarios:
        a, b = emb.cells.get(s), on.cells.get(s)
        if a is None or b is None or not a.ttft or not b.ttft:
            continue
        out.append(f"{s.name:<11} TTFT p50 {added(a, b, 50):+.2f} ms, p99 "
                   f"{added(a, b, 99):+.2f} ms; CPU {a.cpu_ms - b.cpu_ms:+.2f} ms/request; "
                   f"{a.rps:.0f} vs {b.rps:.0f} requests/s")
    out.append(f"startup {emb.startup:.2f} vs {on.startup:.2f} s; idle RSS "
               f"{emb.idle_rss_kb / 1024:.0f} vs {on.idle_rss_kb / 1024:.0f} MB")
    return out


def compress(series: Sequence[float], *, points: int = 12, digits: int = 1) -> str:
    """``points`` evenly spaced values of ``series`` (first and last included)."""
    if not series:
        return "—"
    if len(series) <= points:
        picked = list(series)
    else:
        step = (len(series) - 1) / (points - 1)
        picked = [series[round(i * step)] for i in range(points)]
    return " ".join(f"{v:.{digits}f}" for v in picked)
