"""Plain ``python -m pytest`` needs no environment of its own: ``tests/conftest.py`` sets
what ``scripts/test`` exports (no download of litellm's model cost map, litellm on httpx
rather than its aiohttp transport, Hugging Face offline) before anything imports litellm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "DISABLE_AIOHTTP_TRANSPORT": "True",
           "HF_HUB_OFFLINE": "1"}


def test_the_suite_runs_offline() -> None:
    """Inside the test session the variables hold the values scripts/test gives them."""
    assert {name: os.environ.get(name) for name in OFFLINE} == OFFLINE


@pytest.mark.slow
def test_a_litellm_transport_test_passes_without_the_variables() -> None:
    """A fresh shell without the variables runs a test of the litellm transport (and its
    relay twin) to a pass."""
    env = {name: value for name, value in os.environ.items() if name not in OFFLINE}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/routes/test_chat_stream_rules.py", "-k", "test_unrequested_usage_is_stripped"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout
