"""Sampling profiles of a server under the benchmark load (py-spy, from PyPI).

``--profile gw-on`` records each measured scenario of that target with ``py-spy record
--format raw`` (collapsed stacks, 250 Hz, the sampler pinned to the client
core), writes them to the run directory and prints where the time goes: the functions with
the most samples on top of the stack (self) and the project's functions by inclusive
samples. Profiled runs are perturbed (a little): take table figures from a run without it.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

RATE = 250


def py_spy() -> str:
    """The py-spy executable, installed into this virtualenv from PyPI when missing."""
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    found = shutil.which("py-spy")
    if found:
        return found
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "py-spy"], check=True)
    return str(here)


@contextlib.contextmanager
def recording(pid: int, output: Path, *, core: int) -> Iterator[None]:
    """Sample ``pid`` while the block runs; collapsed stacks go to ``output``."""
    proc = subprocess.Popen(
        ["taskset", "-c", str(core), py_spy(), "record", "--pid", str(pid), "--rate",
         str(RATE), "--format", "raw", "--gil", "--output", str(output)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        proc.send_signal(2)  # SIGINT: py-spy writes the file and exits
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def summarize(path: Path, *, top: int = 25, project: str = "proxy/") -> str:
    """Self and inclusive sample shares from a collapsed-stack file."""
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        self_counts[_short(frames[-1])] += count
        for frame in {_short(f) for f in frames}:
            inclusive[frame] += count
    if not total:
        return f"{path.name}: no samples"
    lines = [f"{path.name}: {total} samples"]
    lines.append("  self (top of stack):")
    lines += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in self_counts.most_common(top)]
    lines.append(f"  inclusive, {project} functions:")
    ours = [(f, n) for f, n in inclusive.most_common() if project in f][:top]
    lines += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in ours]
    return "\n".join(lines)


def _short(frame: str) -> str:
    """``fn (path/to/site-packages/pkg/mod.py:12)`` → ``fn (pkg/mod.py)``."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "python3.11/", "wt-perf-bench/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{name} ({where})" if where else name
