"""The layout rules of ARCHITECTURE.md and the house style.

- Only ``proxy/backends/`` speaks to a storage engine. Everything else talks to the
  contracts (``MemoryStore``, ``LearningQueue``, ``Ledger``) and :mod:`proxy.resources`
  picks the backend.
- No module of ``proxy/`` is over :data:`MAX_MODULE_LINES` lines, and no function over
  :data:`MAX_FUNCTION_LINES`, except the declaration tables in :data:`TABLE_FUNCTIONS`.
- The repository stands on its own: code, tests, benches, docs, scripts, the chart and the
  top-level files (README.md, ARCHITECTURE.md, pyproject.toml, config.yaml…) cite
  ``docs/design.md`` or say the rule in words, never an issue number, a failure-case
  number or a document outside the repository (:data:`OUTSIDE_REFERENCE`). Reading data
  from ``../shared/data`` is allowed: data is read there, never cited as a rule's source.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import proxy

ROOT = Path(proxy.__file__).parent
REPO = ROOT.parent
ENGINE_MODULES = ("sqlite3", "redis", "redisvl", "hiredis")

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# Declaration tables, long because they list things (routes, metrics), not because they
# do many steps: ``create_app``'s route table and the metric declarations.
TABLE_FUNCTIONS = frozenset({("app.py", "create_app"), ("metrics.py", "Metrics.__init__")})

# Each piece is one kind of reference a reader of the repository cannot follow. Built
# from fragments so that this file does not match itself.
_ISSUE = "iss" + "ue"
_REFERENCE_PIECES = (
    r"\b" + "SP" + r"EC\b",  # the product specification's sections
    "\u00a7",  # a section sign: a section of some outside document
    r"\b[Ss]eeds?[\s_]+0\d\d",  # the two source documents, by number
    r"(?<![A-Za-z])[Tt]he[\s_]seeds?\b",
    r"\b[Ss]eed[\s_]+(?:design|doc)",
    rf"\b[{_ISSUE[0].upper()}{_ISSUE[0]}]{_ISSUE[1:]}s?[\s_-]+#?\d+",  # issue numbers
    rf"\b[{_ISSUE[0].upper()}{_ISSUE[0]}]{_ISSUE[1:]}'s\b",  # a possessive: whose targets
    r"\b" + "B" + r"\d{1,2}\b",  # failure-case numbers
    "known" + "-failures",
    r"\.\./" + "shared" + r"/(?!data\b)",  # the shared folder beside the repository
)
OUTSIDE_REFERENCE = re.compile("|".join(f"(?:{piece})" for piece in _REFERENCE_PIECES))
# Test names that carry a number instead of the behaviour they check.
NUMBERED_TEST_NAME = re.compile(
    r"(?i)(?:^|_)(?:b\d{1,2}|" + _ISSUE + r"s?\d*|cases?\d+|seeds?_?0\d\d)(?:_|$)")
TEXT_SUFFIXES = frozenset({".py", ".md", ".js", ".html", ".css", ".lua", ".yaml", ".yml",
                           ".toml", ".txt", ".json", ".cfg", ".ini", ".sh"})
# Third-party files shipped as they are (the console tests' accessibility checker).
VENDORED = "vendor"
# Files at the top of the checkout that a reader (or an operator) reads as documents.
TOP_LEVEL_FILES = ("README.md", "ARCHITECTURE.md", "pyproject.toml", "config.yaml",
                   "Dockerfile", ".ci/run")


def imports_of(path: Path) -> set[str]:
    """Absolute module names ``path`` imports anywhere (function-level imports included)."""
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


def _proxy_modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def _module_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _long_functions(source: str, *, limit: int) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function or method longer than ``limit``
    lines (from ``def`` to its last line), nested ones included."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > limit:
                    found.append((name, lines))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def _outside_references(text: str) -> list[str]:
    """``"<line>: <match>"`` for every reference :data:`OUTSIDE_REFERENCE` finds."""
    return [f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            for m in OUTSIDE_REFERENCE.finditer(text)]


def _cited_files() -> list[Path]:
    files = [REPO / name for name in TOP_LEVEL_FILES]
    for top in ("proxy", "tests", "bench", "docs", "helm"):
        files += [p for p in (REPO / top).rglob("*")
                  if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.suffix == ".tpl")
                  and VENDORED not in p.relative_to(REPO).parts
                  and "__pycache__" not in p.parts]
    # The scripts have no suffix: every file there is a shell script.
    files += [p for p in (REPO / "scripts").iterdir() if p.is_file()]
    return sorted(p for p in files if p.exists())


def _test_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test")]


# --------------------------------------------------------------- storage engines


def test_the_walk_sees_the_core() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _core_files()}
    assert {"app.py", "resources.py", "memory/store.py"} <= names
    assert any(name.startswith("learning/") for name in names)


@pytest.mark.parametrize("path", _core_files(), ids=_module_id)
def test_no_storage_engine_outside_backends(path: Path) -> None:
    bad = sorted(name for name in imports_of(path)
                 if name.split(".")[0] in ENGINE_MODULES)
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: move it under proxy/backends/"


def test_only_resources_picks_a_backend() -> None:
    pickers = sorted(
        p.relative_to(ROOT).as_posix() for p in _core_files()
        if any(name.startswith("proxy.backends") for name in imports_of(p)))
    assert pickers == ["resources.py"]


def test_the_rule_catches_an_engine_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import sqlite3\nfrom redis.asyncio import Redis\n", encoding="utf-8")
    assert {"sqlite3", "redis.asyncio"} <= imports_of(sample)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_each_backend_imports_no_other_backend(backend: str) -> None:
    other = "redis" if backend == "sqlite" else "sqlite"
    for path in (ROOT / "backends" / backend).rglob("*.py"):
        assert not any(n.startswith(f"proxy.backends.{other}") for n in imports_of(path)), path


# ------------------------------------------------------------------------ sizes


def _module_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("path", _proxy_modules(), ids=_module_id)
def test_no_module_is_over_the_line_limit(path: Path) -> None:
    """Every module of proxy/ ends within MAX_MODULE_LINES lines: past that, split it
    along its concepts."""
    lines = _module_lines(path)
    assert lines <= MAX_MODULE_LINES, (
        f"{_module_id(path)} has {lines} lines (limit {MAX_MODULE_LINES}): split it")


def test_the_module_rule_catches_a_long_module(tmp_path: Path) -> None:
    """A sample of MAX_MODULE_LINES + 1 lines is over the limit; one of exactly
    MAX_MODULE_LINES is not."""
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_MODULE_LINES + 1), encoding="utf-8")
    fits = tmp_path / "fits.py"
    fits.write_text("x = 1\n" * MAX_MODULE_LINES, encoding="utf-8")
    assert _module_lines(long) > MAX_MODULE_LINES >= _module_lines(fits)


@pytest.mark.parametrize("path", _proxy_modules(), ids=_module_id)
def test_no_function_is_over_the_line_limit(path: Path) -> None:
    """Every function and method of proxy/ is at most MAX_FUNCTION_LINES lines long, except
    the declaration tables of TABLE_FUNCTIONS."""
    module = _module_id(path)
    long = [(name, lines)
            for name, lines in _long_functions(path.read_text(encoding="utf-8"),
                                               limit=MAX_FUNCTION_LINES)
            if (module, name) not in TABLE_FUNCTIONS]
    assert not long, f"{module}: {long} over {MAX_FUNCTION_LINES} lines: split into steps"


def test_the_table_allow_list_names_functions_that_exist() -> None:
    """Each allowed table is a function of its module, so the allow-list cannot outlive a
    rename and excuse a stranger."""
    for module, name in TABLE_FUNCTIONS:
        source = (ROOT / module).read_text(encoding="utf-8")
        assert name in {n for n, _ in _long_functions(source, limit=0)}, (module, name)


def test_the_function_rule_catches_a_long_function() -> None:
    """An 81-line function and a long method are found by their qualified names; an
    80-line function and a long module-level statement are not."""
    body = "    x = 1\n"
    source = (
        "def long():\n" + body * MAX_FUNCTION_LINES
        + "def fits():\n" + body * (MAX_FUNCTION_LINES - 1)
        + "class C:\n    async def method(self):\n" + ("    " + body) * MAX_FUNCTION_LINES
        + "TABLE = [\n" + "    1,\n" * 200 + "]\n"
    )
    assert _long_functions(source, limit=MAX_FUNCTION_LINES) == [
        ("long", MAX_FUNCTION_LINES + 1), ("C.method", MAX_FUNCTION_LINES + 1)]


# --------------------------------------------------------- references it cannot follow


@pytest.mark.parametrize("path", _cited_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_reference_to_a_document_outside_the_repository(path: Path) -> None:
    """Code, tests, benches and the top-level documents cite docs/design.md (or say the
    rule in words), never an issue, a failure case or an outside document."""
    found = _outside_references(path.read_text(encoding="utf-8"))
    assert not found, (f"{path.relative_to(REPO)} cites what a reader cannot open: {found}; "
                       "cite docs/design.md#<section> or state the rule in words")


def test_the_walk_sees_every_cited_place() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _cited_files()}
    assert {"README.md", "ARCHITECTURE.md", "proxy/app.py", "tests/test_layout.py",
            "bench/locomo_replay.py", "pyproject.toml", "config.yaml", "Dockerfile",
            ".ci/run", "docs/design.md", "scripts/serve", "helm/memory-proxy/values.yaml",
            "helm/memory-proxy/templates/_helpers.tpl"} <= names
    assert not any(VENDORED in Path(n).parts for n in names)


@pytest.mark.parametrize("sample", [
    "the threshold of " + "SP" + "EC \u00a73.3",
    "weights from \u00a76 of the design",
    "batches of five (" + "seed" + " 001)",
    "Seed" + " 000's schema",
    "from the " + "seed" + " design doc",
    "def test_defaults_follow_the" + "_seeds():",
    "see " + _ISSUE + " 13",
    "(" + _ISSUE.capitalize() + " 12: erasure)",
    "the " + _ISSUE + "-16 targets",
    "printed against the " + _ISSUE + "'s targets",
    "retried once (case " + "B" + "04)",
    "isolation (" + "B" + "25)",
    "listed in known" + "-failures.md",
    "see ../" + "shared/tools/local-llm.md",
])
def test_the_reference_rule_catches_a_citation(sample: str) -> None:
    assert _outside_references(sample), sample


@pytest.mark.parametrize("sample", [
    "decay 0.9 per week — docs/design.md#traits",
    "rng = random.Random(seed)",
    "def _seed(identity): ...",
    'LITELLM_SPEC = "litellm[proxy]==1.108.7"',
    "_SPECIAL_USE = frozenset()",
    "--data ../" + "shared/data/locomo-dev.json",
    "# ../" + "shared/data next to the repository",
    "the issue of reserved ids",
    "B2B customers and a B-tree",
])
def test_the_reference_rule_spares_ordinary_text(sample: str) -> None:
    assert not _outside_references(sample), sample


@pytest.mark.parametrize("path", sorted((REPO / "tests").rglob("test_*.py")),
                         ids=lambda p: p.relative_to(REPO).as_posix())
def test_test_names_state_behaviour_not_numbers(path: Path) -> None:
    """A test is named after the behaviour it checks, never after an issue or case."""
    numbered = [n for n in _test_names(path) if NUMBERED_TEST_NAME.search(n)]
    assert not numbered, f"{path.relative_to(REPO)}: rename {numbered} after their behaviour"


@pytest.mark.parametrize(("name", "numbered"), [
    ("test_b16_empty_extraction", True),
    ("test_" + _ISSUE + "13_budget", True),
    ("test_" + _ISSUE + "_12_erasure", True),
    ("test_case33_clear", True),
    ("test_empty_extraction_is_retried", False),
    ("test_tool_calls_are_not_facts", False),
    ("test_seeded_pii_never_survives", False),
])
def test_the_name_rule_catches_a_numbered_test(name: str, numbered: bool) -> None:
    assert bool(NUMBERED_TEST_NAME.search(name)) is numbered


# ------------------------------------------------------------ design.md anchors resolve

DESIGN = REPO / "docs" / "design.md"
DESIGN_CITATION = re.compile(r"docs/design\.md#([A-Za-z0-9_-]+)")


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the ``##`` headings: lower case, punctuation dropped, spaces
    as hyphens."""
    return {re.sub(r"[^\w\- ]", "", line[3:].strip().lower()).replace(" ", "-")
            for line in markdown.splitlines() if line.startswith("## ")}


def test_every_cited_design_section_exists() -> None:
    """Each ``docs/design.md#<anchor>`` cited in code, tests, benches or the README names
    a section the document has."""
    anchors = _anchors(DESIGN.read_text(encoding="utf-8"))
    dangling = sorted(
        f"{path.relative_to(REPO)}: #{m.group(1)}" for path in _cited_files()
        for m in DESIGN_CITATION.finditer(path.read_text(encoding="utf-8"))
        if m.group(1) not in anchors)
    assert not dangling, f"no such section in docs/design.md: {dangling}"


def test_the_anchor_rule_reads_headings_as_github_does() -> None:
    assert _anchors("# Title\n## Memory text is data\n## Learning budgets\n### Sub\n") == {
        "memory-text-is-data", "learning-budgets"}
