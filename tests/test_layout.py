"""The import rules of DESIGN.md's "Layout", asserted on the source (every import, also inside
functions): the privacy core knows no algorithm, families know no command line or config layer,
post-processing draws no noise, the fitted model knows no family, the ldp client needs no Spark."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "dpspark"
FAMILIES = ("auto", "maxcover", "dplloyd", "ldp")
TOP_LAYER = ("dpspark.config", "dpspark.cli", "dpspark.runner", "dpspark.ml")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
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
