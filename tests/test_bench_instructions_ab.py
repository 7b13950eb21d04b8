"""The instruction-count A/B's reading of callgrind: dump files by dump and thread, the
instructions each counted, and the table's estimate, budget and verdict."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.instructions_ab import dump_totals, dumps_by_thread, render
from bench.setting_ab import Readings

DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 4242
cmd:  python -c pass
part: 1

desc: I1 cache:
positions: line
events: Ir
summary: 1234567

fn=(1) main
0 1234567

totals: 1234567
"""


def test_a_dump_gives_its_instruction_total(tmp_path: Path) -> None:
    path = tmp_path / "callgrind.out.3-01"
    path.write_text(DUMP)
    assert dump_totals(path) == 1234567
    several = tmp_path / "with-cache.out"
    several.write_text(DUMP.replace("events: Ir", "events: Ir Dr Dw")
                       .replace("totals: 1234567", "totals: 1200 30 40"))
    assert dump_totals(several) == 1200


def test_a_file_that_is_no_dump_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "not-a-dump"
    path.write_text("events: Ir\n")
    with pytest.raises(ValueError, match="not a callgrind dump"):
        dump_totals(path)
    other = tmp_path / "no-ir"
    other.write_text("events: Dr\ntotals: 5\n")
    with pytest.raises(ValueError, match="no Ir"):
        dump_totals(other)


def test_a_dumps_files_are_found_by_thread_and_no_other_dumps(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    for name in ("callgrind.out.1-01", "callgrind.out.2-01", "callgrind.out.2-03",
                 "callgrind.out.12-01", "callgrind.out-01", "other.out.2-01"):
        (tmp_path / name).write_text(DUMP)
    found = dumps_by_thread(out, 2)
    assert found == {1: tmp_path / "callgrind.out.2-01", 3: tmp_path / "callgrind.out.2-03"}
    assert dumps_by_thread(out, 5) == {}


VALGRIND, CONTROL = shutil.which("valgrind"), shutil.which("callgrind_control")


@pytest.mark.skipif(VALGRIND is None or CONTROL is None,
                    reason="Debian's valgrind is not installed")
def test_a_real_dump_counts_the_work_of_each_thread(tmp_path: Path) -> None:
    """A process under callgrind with a thread that loops 200,000 times more than the
    main thread: dumped while both wait, the thread's file counts more instructions."""
    out = tmp_path / "callgrind.out"
    program = (
        "import sys, threading, time\n"
        "def spin(n):\n"
        "    x = 0\n"
        "    for i in range(n): x += i\n"
        "t = threading.Thread(target=spin, args=(200_000,)); t.start(); t.join()\n"
        "spin(1000)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    with subprocess.Popen(
            [str(VALGRIND), "--tool=callgrind", "--cache-sim=no", "--separate-threads=yes",
             f"--callgrind-out-file={out}", sys.executable, "-c", program],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        try:
            assert child.stdout.readline().strip() == b"ready"
            subprocess.run([str(CONTROL), "-d", str(child.pid)], check=True,
                           capture_output=True, timeout=120)
        finally:
            child.stdin.close()
            child.wait(120)
    threads = dumps_by_thread(out, 1)
    assert set(threads) == {1, 2}
    main, spinner = dump_totals(threads[1]), dump_totals(threads[2])
    assert main > 1_000_000  # the interpreter's start-up
    # 200,000 loop turns of several bytecodes, each many machine instructions
    assert spinner > 5_000_000


def test_the_table_estimates_milliseconds_from_the_share_and_the_native_cpu() -> None:
    counts = {"json": Readings(on=[3_600_000, 3_610_000], off=[3_400_000, 3_410_000],
                             on_main=[3_000_000, 3_010_000], off_main=[2_850_000, 2_860_000]),
              "stream": Readings(on=[5_000_000, 5_000_000], off=[4_500_000, 4_500_000],
                               on_main=[4_000_000, 4_000_000],
                               off_main=[3_600_000, 3_600_000])}
    lines = render("memory.record_injections", counts, {"json": 1.2, "stream": 2.0},
                   bound_ms=0.1, bound_share=0.03)
    json_line = next(line for line in lines if line.startswith("json"))
    # +200k of 3,605k = 5.55 % × 1.2 ms = 0.067 ms, under the 0.1 ms bound
    fields = json_line.split()
    assert fields[1:4] == ["3605.0", "3405.0", "+200.0"]
    assert fields[-4:] == ["1.200", "+0.067", "0.100", "within"]
    stream = next(line for line in lines if line.startswith("stream"))
    # +500k of 5,000k = 10 % × 2.0 ms = 0.2 ms, over max(0.1, 3 % × 2.0 = 0.06)
    assert stream.split()[-3:] == ["+0.200", "0.100", "over"]
    wide = render("s", {"json": Readings(on=[3_600_000, 3_900_000], off=[3_500_000] * 2,
                                         on_main=[3_000_000] * 2, off_main=[2_900_000] * 2)},
                  {"json": 1.2}, bound_ms=0.1, bound_share=0.03)
    # +100k and +400k: the interval holds the budget (0.1 ms ≈ 312k instructions)
    assert next(line for line in wide if line.startswith("json")).endswith("unresolved")
    split = next(line for line in lines if line.startswith("  json") and "main" in line)
    assert "main +150.0" in split
    assert split.endswith("others +50.0")
    assert "  json: pairs (true/false k) 3600.0/3400.0 3610.0/3410.0" in lines
