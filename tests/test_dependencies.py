"""Every third-party module the gateway imports is installed by what the install asks for:
``pip install .`` (what ``scripts/serve`` runs) brings every module outside the optional
parts, and each extra brings what its own modules import. An import missing from
``pyproject.toml`` passes every test that runs with the test extras and fails only for a
user: a function-level import (the Porter stemmer of the recall index) then turns a
feature off in the serving install with nothing but a warning in the log."""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.test_layout import imports_of

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# The modules that only an extra's install may import (pyproject.toml's comments on each).
EXTRA_MODULES = {
    "redis": ("proxy/backends/redis/",),
    "embeddings": ("proxy/memory/embed_local.py",),
    "static": ("proxy/memory/embed_static.py",),
}


def installed_by(requirements: Iterable[str]) -> set[str]:
    """The distributions ``requirements`` install, with everything they require in turn
    (each requirement's extras and markers honoured; read from the installed metadata)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": extra})
                                         for extra in (*req.extras, "")):
                todo.append(sub)
    return seen


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of the modules ``path`` imports anywhere (functions included),
    without the standard library and the project's own."""
    names = {name.partition(".")[0] for name in imports_of(path)}
    return {n for n in names
            if n not in sys.stdlib_module_names and n not in ("proxy", "__future__")}


def missing(base: list[str], extras: dict[str, list[str]]) -> dict[str, set[str]]:
    """``{file: modules}`` the install would not bring: outside :data:`EXTRA_MODULES`
    from ``base`` alone, inside them from ``base`` and their extra."""
    providers = metadata.packages_distributions()
    base_set = installed_by(base)
    with_extra = {extra: base_set | installed_by(extras[extra]) for extra in EXTRA_MODULES}
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "proxy").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        have = next((with_extra[extra] for extra, prefixes in EXTRA_MODULES.items()
                     if rel.startswith(prefixes)), base_set)
        lacking = {module for module in third_party_imports(path)
                   if not {canonicalize_name(d) for d in providers.get(module, [module])}
                   & have}
        if lacking:
            out[rel] = lacking
    return out


def test_the_serving_install_brings_every_module_the_gateway_imports() -> None:
    assert missing(PROJECT["dependencies"], PROJECT["optional-dependencies"]) == {}


def test_each_extra_brings_what_its_modules_import() -> None:
    """Without the extras' own requirements, exactly their modules lack something."""
    extras: dict[str, list[str]] = {name: [] for name in EXTRA_MODULES}
    lacking = missing(PROJECT["dependencies"], extras)
    assert lacking["proxy/backends/redis/store.py"] >= {"redis", "redisvl"}
    assert lacking["proxy/memory/embed_local.py"] >= {"sentence_transformers"}
    assert lacking["proxy/memory/embed_static.py"] == {"model2vec"}
    assert all(path.startswith(sum(EXTRA_MODULES.values(), ())) for path in lacking)


def test_a_requirement_left_out_is_found_in_a_function_level_import() -> None:
    """The stemmer is imported inside a function, on first use: without its line in the
    dependencies, the module that imports it is named."""
    base = [r for r in PROJECT["dependencies"]
            if canonicalize_name(Requirement(r).name) != "snowballstemmer"]
    assert len(base) == len(PROJECT["dependencies"]) - 1
    lacking = missing(base, PROJECT["optional-dependencies"])
    assert lacking == {"proxy/memory/text.py": {"snowballstemmer"}}
