"""The layout rule of issue 9 / ARCHITECTURE.md: only ``proxy/backends/`` speaks to a
storage engine. Everything else talks to the contracts (``MemoryStore``,
``LearningQueue``, ``Ledger``) and :mod:`proxy.resources` picks the backend."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import proxy

ROOT = Path(proxy.__file__).parent
ENGINE_MODULES = ("sqlite3", "redis", "redisvl", "hiredis")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _core_files() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if "backends" not in p.relative_to(ROOT).parts]


def test_the_walk_sees_the_core() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _core_files()}
    assert {"app.py", "resources.py", "memory/store.py", "learning/worker.py"} <= names


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_storage_engine_outside_backends(path: Path) -> None:
    bad = sorted(name for name in _imports(path)
                 if name.split(".")[0] in ENGINE_MODULES)
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: move it under proxy/backends/"


def test_only_resources_picks_a_backend() -> None:
    pickers = sorted(
        p.relative_to(ROOT).as_posix() for p in _core_files()
        if any(name.startswith("proxy.backends") for name in _imports(p)))
    assert pickers == ["resources.py"]


def test_the_rule_catches_an_engine_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import sqlite3\nfrom redis.asyncio import Redis\n", encoding="utf-8")
    assert {"sqlite3", "redis.asyncio"} <= _imports(sample)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_each_backend_imports_no_other_backend(backend: str) -> None:
    other = "redis" if backend == "sqlite" else "sqlite"
    for path in (ROOT / "backends" / backend).rglob("*.py"):
        assert not any(n.startswith(f"proxy.backends.{other}") for n in _imports(path)), path
