"""The import rules of DESIGN.md's "Layout", asserted on the source (every import, also inside
functions): the privacy core knows no algorithm, families know no command line or config layer,
post-processing draws no noise, the fitted model knows no family, the ldp client needs no Spark,
and no module reaches itself through its imports (no import circles: one family never imports
another's steps back, what two modules both need lives below both)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "dpspark"
FAMILIES = ("auto", "maxcover", "dplloyd", "ldp")
TOP_LAYER = ("dpspark.config", "dpspark.cli", "dpspark.runner", "dpspark.ml")


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)  # `from dpspark import config`
    return out


def modules_under(sub: str) -> list[Path]:
    target = PACKAGE / sub
    return sorted(target.rglob("*.py")) if target.is_dir() else [target]


def within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(files, forbidden) -> list[str]:
    return sorted(f"{f.relative_to(ROOT)} imports {m}" for f in files for m in imported_modules(f) if within(m, forbidden))


@pytest.mark.parametrize("family", FAMILIES)
def test_families_import_no_command_line_or_config_layer(family):
    assert violations(modules_under(family), TOP_LAYER) == []


def test_the_privacy_core_imports_no_family_and_no_command_line():
    forbidden = [f"dpspark.{f}" for f in FAMILIES] + list(TOP_LAYER) + ["jobs", "dpspark.solvers", "dpspark.model"]
    assert violations(modules_under("privacy"), forbidden) == []


def test_post_processing_draws_no_noise():
    assert violations(modules_under("solvers.py"), ["dpspark.privacy"]) == []


def test_the_model_imports_no_family():
    assert violations(modules_under("model.py"), [f"dpspark.{f}" for f in FAMILIES] + list(TOP_LAYER)) == []


def test_the_ldp_client_needs_no_spark():
    assert violations(modules_under("ldp/client.py"), ["pyspark", "py4j", "dpspark.tables", "dpspark.session"]) == []


def test_the_checker_sees_imports_inside_functions(tmp_path):
    """The rule checker must be able to fail: an import inside a function counts."""
    probe = ROOT / "dpspark" / "maxcover" / "_layout_probe.py"
    probe.write_text("def f():\n    from dpspark.config import check_number\n    from ..cli import main\n")
    try:
        found = violations([probe], TOP_LAYER)
    finally:
        probe.unlink()
    assert found == ["dpspark/maxcover/_layout_probe.py imports dpspark.cli", "dpspark/maxcover/_layout_probe.py imports dpspark.cli.main",
                     "dpspark/maxcover/_layout_probe.py imports dpspark.config", "dpspark/maxcover/_layout_probe.py imports dpspark.config.check_number"]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package_dir: Path, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a name resolves to its longest module prefix, so
    ``from dpspark.auto import tree`` is an edge to ``dpspark.auto.tree``), and the packages Python
    runs first (``dpspark.auto``'s ``__init__``). A module's edges to its own enclosing packages are
    left out: Python has already started those when it runs the module."""
    paths = {module_name(p, root): p for p in sorted(package_dir.rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in paths.items():
        found = {resolve(m) for m in imported_modules(path, root)} - {None, name}
        found |= {a for m in found for a in (m[:i] for i, ch in enumerate(m) if ch == ".") if a in paths}
        graph[name] = {m for m in found if not name.startswith(m + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that reach each other through imports (strongly connected components of
    more than one module, Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_module_reaches_itself_through_its_imports():
    assert circles(import_graph(PACKAGE)) == []


def test_the_circle_check_sees_a_circle_through_a_package_and_a_relative_import(tmp_path):
    """The circle checker must be able to fail: a -> b.c (through the package b, whose __init__
    imports d) -> d -> a (relative, inside a function); a module importing its own package is fine."""
    pkg = tmp_path / "demo"
    (pkg / "b").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from demo.b.c import thing\n")
    (pkg / "b" / "__init__.py").write_text("from demo.b import d\n")
    (pkg / "b" / "c.py").write_text("from demo.b import d\nthing = 1\n")
    (pkg / "b" / "d.py").write_text("def f():\n    from .. import a\n")
    (pkg / "e.py").write_text("from demo import e2\n")
    (pkg / "e2.py").write_text("from demo import errors\n")
    graph = import_graph(pkg, tmp_path)
    assert graph["demo.a"] == {"demo.b", "demo.b.c"} and graph["demo.b.d"] == {"demo.a"}
    assert circles(graph) == [["demo.a", "demo.b", "demo.b.c", "demo.b.d"]]


def test_the_shared_steps_import_no_family_and_families_import_no_other_family():
    """What two families share lives in ``dpspark/steps/`` (or below); ``auto``, whose d <= 3 route is
    maxcover, may build maxcover's estimator, and no other family reaches into another."""
    family_prefixes = [f"dpspark.{f}" for f in FAMILIES]
    assert violations(modules_under("steps"), family_prefixes + list(TOP_LAYER)) == []
    for family in FAMILIES:
        others = [p for p in family_prefixes if p != f"dpspark.{family}" and (family, p) != ("auto", "dpspark.maxcover")]
        assert violations(modules_under(family), others) == [], family
