"""The two test tiers (tests/conftest.py ``SLOW``, ``./scripts/test.sh --quick``): every slow entry
names a test that exists, the quick tier still shows every face once, no privacy test is slow, and
the whole suite (CI's) leaves nothing out. No Spark: the test files are read, not run."""

from __future__ import annotations

import ast
import re

import pytest

from conftest import ROOT, SLOW, slow_entry

TESTS = ROOT / "tests"

# One test per face the quick tier must keep (file, test function).
FACES = {
    "Delta through Spark": ("test_pipeline.py", "test_delta_round_trip_records_the_version_read"),
    "Delta through delta-rs": ("test_localdelta_writes.py", "test_a_local_ledger_is_charged_by_delta_rs_with_the_rows_and_decisions_of_spark"),
    "the ledger's charge": ("test_ledger.py", "test_charge_is_written_before_the_data_is_read"),
    "the CLI": ("test_pipeline.py", "test_cli_run_writes_every_output_and_exact_privacy"),
    "dpspark.ml": ("test_attempt_lifecycle.py", "test_every_end_through_dpclustering_fit"),
    "an s3a round trip": ("test_object_store.py", "test_a_pyspark_ml_fit_charges_a_ledger_on_s3a"),
    "a Connect fit": ("test_connect.py", "test_ledgered_fit_is_charged_and_a_fit_over_the_cap_refused"),
}


def functions_of(path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def privacy_tests() -> list[str]:
    """Node ids (without parameters) of the statistical privacy tests and the privacy unit tests:
    every test of the files that hold the mechanisms' and the end-to-end statistical tests, and every
    test elsewhere whose name says it is statistical or that a broken mechanism is caught."""
    whole = {"test_mechanisms.py", "test_privacy_stats_e2e.py", "test_domain_estimate.py", "test_privacy_unit_keys.py"}
    out = []
    for path in sorted(TESTS.glob("test_*.py")):
        for name in sorted(functions_of(path)):
            if path.name in whole or re.search(r"statistical|_is_caught|privacy_map|sensitivity", name):
                out.append(f"tests/{path.name}::{name}")
    return out


@pytest.mark.parametrize("entry", SLOW)
def test_every_slow_entry_names_a_test_that_exists(entry):
    file, _, rest = entry.partition("::")
    assert (TESTS / file).is_file(), entry
    if rest:
        assert rest.split("[")[0] in functions_of(TESTS / file), entry


@pytest.mark.parametrize("face", sorted(FACES))
def test_the_quick_tier_keeps_every_face(face):
    file, name = FACES[face]
    assert name in functions_of(TESTS / file), face
    assert slow_entry(f"tests/{file}::{name}") is None and slow_entry(f"tests/{file}::{name}[x]") is None, face


def test_no_privacy_test_is_in_the_slow_tier():
    found = privacy_tests()
    assert len(found) > 40  # the rule sees the privacy tests at all (it can fail)
    slow_tests = {entry.split("[")[0] for entry in SLOW}  # a whole file, a test, or one parametrization of it
    hit = [t for t in found if t.split("/")[-1] in slow_tests or t.split("/")[-1].split("::")[0] in slow_tests]
    assert hit == []


def test_the_slow_rule_matches_files_tests_and_one_parametrization():
    assert slow_entry("tests/test_cluster.py::test_anything[a]") == "test_cluster.py"
    assert slow_entry("tests/test_ldp.py::test_cli_end_to_end[kmeans]") == "test_ldp.py::test_cli_end_to_end[kmeans]"
    assert slow_entry("tests/test_ldp.py::test_cli_end_to_end[kmedian]") is None
    assert slow_entry("tests/test_attempt_lifecycle.py::test_every_end_through_the_command_line[killed@fitting]") is not None
    assert slow_entry("tests/test_pipeline.py::test_spark_submit_entry_point_2") is None  # a prefix of a name is not a match


def test_the_whole_suite_is_cis_and_only_quick_leaves_the_slow_tier_out():
    script = (ROOT / "scripts" / "test.sh").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in ci and "--quick" not in ci and "-m" not in ci.split("test.sh", 1)[1]
    assert script.count('"not slow"') == 1 and re.search(r'== "--quick" \]\]; then\s+shift\s+tier=\(-m "not slow"\)', script)
