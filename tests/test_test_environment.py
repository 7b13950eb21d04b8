"""Plain ``python -m pytest`` needs no environment of its own: ``tests/conftest.py`` sets
what ``scripts/test`` exports (no download of litellm's model cost map, litellm on httpx
rather than its aiohttp transport, Hugging Face offline) before anything imports litellm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "DISABLE_AIOHTTP_TRANSPORT": "True",
           "HF_HUB_OFFLINE": "1"}


def test_the_suite_runs_offline() -> None:
    """Inside the test session the variables hold the values scripts/test gives them."""
    assert {name: os.environ.get(name) for name in OFFLINE} == OFFLINE


@pytest.mark.slow
def test_a_fresh_process_gets_the_variables_from_conftest() -> None:
    """A process started without the variables gets them from tests/conftest.py (what
    pytest imports first) before litellm is imported, and litellm then imports offline."""
    env = {name: value for name, value in os.environ.items() if name not in OFFLINE}
    env["PYTHONPATH"] = str(ROOT)
    script = ("import os, sys, orjson\n"
              "import tests.conftest\n"
              "assert 'litellm' not in sys.modules\n"
              "import litellm\n"
              f"print(orjson.dumps({{n: os.environ.get(n) for n in {sorted(OFFLINE)!r}}})"
              ".decode())\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert orjson.loads(done.stdout.strip().splitlines()[-1]) == OFFLINE
