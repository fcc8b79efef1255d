"""Shared fixtures: ONE local SparkSession (with real Delta Lake) for the whole test session; and the
two tiers: ``./scripts/test.sh --quick`` (``-m "not slow"``) leaves out the tests named in ``SLOW``;
``./scripts/test.sh`` (CI) runs every test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
DATASETS = ROOT.parent / "shared" / "datasets"

# The slow tier: a file, a test, or one parametrization of it (a node id without "tests/"). What the
# quick tier keeps instead is named on the right: it still shows every face once (Delta through Spark
# and delta-rs, the ledger's charge, the CLI, dpspark.ml, an s3a round trip, a Connect fit) and runs
# every unit and statistical privacy test (tests/test_tiers.py checks both).
SLOW = (
    # JVM processes of their own: a standalone cluster, spark-submit, signals, several drivers at once
    "test_cluster.py",
    "test_pipeline.py::test_spark_submit_entry_point",
    "test_object_store.py::test_drivers_charging_one_s3a_ledger_at_once_spend_exactly_the_cap",
    "test_object_store.py::test_the_same_race_with_deltas_default_s3_store_loses_charges",  # the same race fixture
    "test_scheduling.py::test_cron_line_with_sigterm_mid_fit_then_the_retry",
    "test_scheduling.py::test_a_run_whose_python_workers_cannot_start_charges_nothing",
    "test_connect.py::test_a_server_whose_workers_cannot_start_charges_nothing",
    "test_connect.py::test_a_sigtermd_connect_run_is_recorded_killed_and_its_requests_interrupted",
    "test_connect.py::test_connect_clients_charging_one_ledger_at_once_spend_exactly_the_cap",
    "test_attempt_lifecycle.py::test_every_end_through_the_command_line",  # quick: ...through_dpclustering_fit
    # this README's blocks, run as written (quick: test_readme's static checks)
    "test_readme.py::test_quickstart_demo_ran",
    "test_readme.py::test_running_a_job_block",
    "test_readme.py::test_python_block",  # after the demo's fixture
    # fuzzers and benchmarks' quick modes
    "test_config_fuzz.py",
    "test_where_filter.py::test_random_filters_from_the_grammar_never_raise_on_hostile_rows",
    "test_connect.py::test_random_filters_from_the_grammar_never_raise_on_hostile_rows_through_connect",
    "test_bench_quick.py",
    # whole dpspark processes where an in-process run shows the same face (quick: test_pipeline's
    # CLI run, test_connect's ledgered fit, test_object_store's pyspark.ml fit on s3a)
    "test_object_store.py::test_the_demos_job_daily_with_every_path_on_s3a",
    "test_object_store.py::test_the_dpspark_command_adds_the_s3a_connector_itself",
    "test_object_store.py::test_a_partitioned_table_is_pruned_by_input_where_and_charged_on_its_one_balance",
    "test_connect.py::test_cli_run_with_a_ledger_writes_every_output",
    "test_connect.py::test_ldp_rounds_on_connect_release_what_the_simulation_releases",  # quick: test_ldp's walk
    "test_connect.py::test_cli_run_with_output_table_registers_both_names_on_connect",  # quick: test_output_table
    "test_connect.py::test_a_table_replaced_between_the_check_and_the_fit_releases_nothing",
    "test_analyst_channels.py::test_spark_task_failure_lines_do_not_reach_an_accounted_runs_stderr",
    "test_user_mistakes.py::test_a_healthy_run_logs_no_spark_warnings_and_one_line_per_loop",
    "test_user_mistakes.py::test_the_python_summary_has_cluster_sizes_degenerate_and_a_run_id_param",
    "test_user_mistakes.py::test_force_keeps_the_centers_of_a_table_written_before_the_attempt_column",
    "test_public_inputs.py::test_an_undeclared_table_is_refused_and_set_public_makes_the_same_run_succeed",
    "test_scheduling.py::test_a_week_of_daily_runs",
    "test_scheduling.py::test_a_retry_reuses_the_charge_of_an_attempt_that_never_started_its_fit",
    "test_scheduling.py::test_input_selection_version_timestamp_where_and_catalog_table",
    "test_pipeline.py::test_same_run_id_is_not_run_twice_unless_forced",  # quick: test_small_jobs' retries
    "test_ledger.py::test_failed_run_stays_charged_and_leaves_no_result",  # quick: test_small_jobs' failed running row
    "test_ml.py::test_pipeline_fit_charges_the_ledger_and_round_trips_through_save_load",
    "test_ldp.py::test_simulate_and_ingest_give_the_same_centers_for_the_same_reports",
    "test_ldp.py::test_cli_end_to_end[kmeans]",  # quick: [kmedian]
    "test_localdelta.py::test_ledger_reads_without_spark_equal_sparks",  # quick: test_localdelta_writes
    # Spark passes against their brute-force reference at sizes or settings a smaller case shows too
    "test_maxcover_spark.py::test_spilled_histogram_scores_equal_brute_force",
    "test_maxcover_spark.py::test_histograms_with_more_pairs_than_max_pairs_stay_on_the_executors",
    "test_maxcover_spark.py::test_hash_first_cell_aggregates_equal_the_direct_pass_bit_for_bit[12]",
    "test_maxcover_spark.py::test_hash_first_cell_aggregates_equal_the_direct_pass_bit_for_bit[5]",
    "test_maxcover_spark.py::test_a_groups_pass_gives_every_threshold_the_histogram_of_its_own_pass[1-1-1000000]",
    "test_maxcover_spark.py::test_cli_end_to_end[kmeans-overrides0]",  # quick: [kmedian-...]
    "test_maxcover_spark.py::test_total_charge_equals_epsilon_and_delta[tree]",  # quick: [grid_or_private] ...
    "test_maxcover_spark.py::test_total_charge_equals_epsilon_and_delta[table]",
    "test_maxcover_spark.py::test_total_charge_equals_epsilon_and_delta[grid]",
)


def slow_entry(nodeid: str) -> str | None:
    """The ``SLOW`` entry that puts this test (``tests/test_x.py::test_y[param]``) in the slow tier."""
    name = nodeid.split("/")[-1] if nodeid.startswith("tests/") else nodeid
    for entry in SLOW:
        if name == entry or name.startswith(entry + "::") or ("[" not in entry and name.startswith(entry + "[")):
            return entry
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: the slow tier, left out by ./scripts/test.sh --quick (tests/conftest.py SLOW)")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if slow_entry(item.nodeid) is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def spark():
    from dpspark.session import build_session

    # One partition per core: the tests' tables have tens to thousands of rows, and every extra
    # partition is one more task per stage (and Delta's snapshot state one more per commit read).
    # With the S3A connector: tests/test_object_store.py points s3a:// at a local moto server.
    session = build_session(master="local[2]", app_name="dpspark-tests", testing=True, object_store=True,
                            conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
                                  "spark.databricks.delta.snapshotPartitions": "1"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3(spark):
    """A local S3 (moto's server, ``tests/s3mock.py``) with a bucket ``lake``, and the shared session
    pointed at it. Its JVM started before the server set the AWS variables (processes started later
    inherit them): the same test credentials go to this session as Hadoop settings."""
    from s3mock import S3Server

    server = S3Server()
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in {**server.hadoop_conf(), "fs.s3a.access.key": "testing", "fs.s3a.secret.key": "testing"}.items():
        hadoop.set(key, value)
    server.create_bucket("lake")
    yield server
    server.stop()


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def blobs(n_per: int, centers, scale: float, seed: int) -> np.ndarray:
    """Well-separated Gaussian blobs (test data)."""
    r = np.random.default_rng(seed)
    return np.concatenate([np.asarray(c) + r.normal(0, scale, size=(n_per, len(c))) for c in centers])


@pytest.fixture
def write_delta(spark, tmp_path):
    """Write a pandas DataFrame as a real Delta table under tmp_path; return its path."""
    counter = {"n": 0}

    def _write(pdf, name: str | None = None, partitions: int = 2) -> str:
        counter["n"] += 1
        path = str(tmp_path / (name or f"table{counter['n']}"))
        spark.createDataFrame(pdf).repartition(partitions).write.format("delta").mode("overwrite").save(path)
        return path

    return _write
