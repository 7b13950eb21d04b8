"""Processes under test: start pinned to a core, read CPU and memory from ``/proc``, pause.

CPU is ``utime + stime`` (and ``cutime + cstime`` of reaped children) from
``/proc/<pid>/stat`` summed over the process tree (children found through
``/proc/<pid>/task/*/children``), in clock ticks (``SC_CLK_TCK``, 100 Hz: a 10 ms tick, so
runs must cost seconds of CPU for the per-request figure to mean anything). Memory is
``VmRSS`` / ``VmHWM`` from ``/proc/<pid>/status``, summed over the tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError):
                    text = Path(f"/proc/{current}/task/{task}/children").read_text()
                    todo.extend(int(c) for c in text.split())
    return out


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, with reaped children) of ``pid``'s tree."""
    ticks = 0
    for member in tree(pid):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{member}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            # fields[0] is field 3 (state); utime..cstime are fields 14..17.
            ticks += sum(int(v) for v in fields[11:15])
    return ticks / CLOCK_TICKS


async def wait_idle(pid: int, *, share: float = 0.02, window: float = 1.0,
                    within: float = 30.0) -> float:
    """Wait until ``pid``'s tree uses at most ``share`` of a core over ``window`` seconds
    (what a server finishes after its first reply — the MCP SDK's import in a thread, the
    collector's passes — would otherwise land in the first measurement); give up after
    ``within`` seconds. Returns the seconds waited."""
    started = time.perf_counter()
    while True:
        before = cpu_seconds(pid)
        await asyncio.sleep(window)
        waited = time.perf_counter() - started
        if cpu_seconds(pid) - before <= share * window or waited >= within:
            return waited


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of ``pid`` by name: ``main`` for the
    process's own thread, the thread's ``comm`` for the others (threads of one name
    summed; Python 3.11 leaves a thread's ``comm`` the process's, so its threads read as
    one)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
                name = "main" if task == str(pid) else \
                    stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) \
                    / CLOCK_TICKS
    return out


def core_busy_seconds(core: int) -> float:
    """CPU seconds core ``core`` spent busy (not idle / iowait) since boot, ``/proc/stat``."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            values = [int(v) for v in line.split()[1:]]
            return (sum(values[:8]) - values[3] - values[4]) / CLOCK_TICKS
    return 0.0


def status_kb(pid: int, key: str) -> int:
    """A ``kB`` line of ``/proc/<pid>/status`` summed over the tree (``VmRSS``, ``VmHWM``)."""
    total = 0
    for member in tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    total += int(line.split()[1])
                    break
    return total


def fd_count(pid: int) -> int:
    return sum(len(os.listdir(f"/proc/{m}/fd")) for m in tree(pid)
               if os.path.isdir(f"/proc/{m}/fd"))


def thread_count(pid: int) -> int:
    return sum(len(os.listdir(f"/proc/{m}/task")) for m in tree(pid)
               if os.path.isdir(f"/proc/{m}/task"))


@dataclass
class Proc:
    """A started server: its name, port and ``Popen`` handle (log files in ``logs``)."""

    name: str
    port: int
    popen: subprocess.Popen[bytes]
    log: Path
    started_at: float
    paused: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def pause(self) -> None:
        """SIGSTOP the tree so an idle server cannot take CPU from the one measured."""
        if not self.paused and self.alive():
            for member in tree(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused and self.alive():
            for member in tree(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (after SIGCONT), then SIGKILL what is left of the tree."""
        if not self.alive():
            return
        members = tree(self.pid)
        self.resume()
        self.popen.terminate()
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)
        for member in members[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start(name: str, argv: Sequence[str], *, core: int, port: int, logs: Path,
          env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Proc:
    """Start ``argv`` pinned to ``core`` (``taskset -c``), output appended to
    ``logs/<name>.log`` (a restarted server's processes share one log)."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    handle = log.open("ab")
    started = time.perf_counter()
    popen = subprocess.Popen(
        ["taskset", "-c", str(core), *argv], stdout=handle, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, cwd=cwd,
        start_new_session=True,
    )
    handle.close()
    return Proc(name=name, port=port, popen=popen, log=log, started_at=started)
