"""bench_scale's whole-process mode (issue 15) and the benchmark harness's process tools: no Spark (fast).

The end-to-end smokes of ``bench_scale.py --quick`` and ``--whole --quick`` are in test_bench_quick.py.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import bench_harness as bh  # noqa: E402
import bench_scale as bs  # noqa: E402

from dpspark.config import validate  # noqa: E402


@pytest.mark.parametrize("d", [2, 50])
@pytest.mark.parametrize("job", bs.FAMILIES)
def test_family_configs_validate_without_a_ledger(job, d, monkeypatch):
    monkeypatch.delenv("DPSPARK_LEDGER", raising=False)
    raw = bs.family_config(job, "/tmp/points", d, "/tmp/out", tiny=False)
    cfg = validate(yaml.safe_load(yaml.safe_dump(raw)))  # as the child reads it
    assert cfg.privacy.ledger is None and cfg.output.report
    assert cfg.algorithm.name == job and cfg.algorithm.k == bs.K and cfg.domain.dim == d
    assert cfg.input.features == tuple(f"x{j}" for j in range(d))
    assert cfg.domain.lower == (-bs.BOX,) * d and cfg.domain.upper == (bs.BOX,) * d
    assert cfg.spark.master == bs.MASTER and dict(cfg.spark.conf) == bs.SPARK_CONF
    assert cfg.privacy.delta == (bs.DELTA if job in ("auto", "maxcover") else 0.0)


def test_family_config_tiny_and_unknown():
    assert bs.family_config("maxcover", "/t", 2, "/o", tiny=True)["algorithm"]["candidate_count"] == 200
    assert bs.family_config("dplloyd", "/t", 2, "/o", tiny=False)["algorithm"]["iterations"] == 12
    with pytest.raises(ValueError):
        bs.family_config("mllib", "/t", 2, "/o")


def test_child_env_has_no_deployment_ledger(monkeypatch):
    monkeypatch.setenv("DPSPARK_LEDGER", "/somewhere/ledger")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")
    env = bh.child_env()
    assert "DPSPARK_LEDGER" not in env and "PYSPARK_GATEWAY_PORT" not in env


def test_mllib_command_is_the_issue_job():
    cmd = bh.mllib_command("/t", "/o", bs.K, seed=3)
    assert cmd[1].endswith("mllib_job.py")
    args = dict(zip(cmd[2::2], cmd[3::2]))
    assert args["--k"] == "10" and args["--max-iter"] == "20" and float(args["--tol"]) == 0.0
    assert args["--master"] == bs.MASTER and args["--input"] == "/t" and args["--seed"] == "3"
    assert args["--conf"] == "spark.sql.shuffle.partitions=4"


def test_whole_sequence_alternates():
    assert bs.whole_sequence(["auto", "maxcover", "mllib"], 2) == ["auto", "mllib", "maxcover", "mllib"] * 2
    assert bs.whole_sequence(["auto", "dplloyd"], 1) == ["auto", "dplloyd"]
    assert bs.whole_sequence(["mllib"], 2) == ["mllib", "mllib"]


def _row(job, wall, fit=float("nan"), error=""):
    return {"job": job, "wall_whole_s": wall, "fit_s": fit, "error": error}


def test_pair_with_mllib_uses_the_neighbouring_runs():
    rows = [_row("auto", 30.0, 10.0), _row("mllib", 20.0, 8.0), _row("maxcover", 60.0, 40.0), _row("mllib", 40.0, 12.0),
            _row("dplloyd", 10.0), _row("mllib", 99.0, error="exit 1")]
    bs.pair_with_mllib(rows)
    assert rows[0]["mllib_whole_s"] == 20.0 and rows[0]["ratio_whole"] == 1.5 and rows[0]["ratio_fit"] == 10.0 / 8.0
    assert rows[2]["mllib_whole_s"] == 30.0 and rows[2]["ratio_whole"] == 2.0 and rows[2]["ratio_fit"] == 4.0
    assert rows[4]["mllib_whole_s"] == 40.0 and rows[4]["ratio_whole"] == 0.25  # the failed run after it is left out
    assert "ratio_fit" not in rows[4]  # no fit time of its own
    assert "ratio_whole" not in rows[1]


def test_parse_steps_reads_the_top_level_steps_only():
    log = "\n".join([
        "[dpspark] 12:00:00 start Spark session ...",
        "[dpspark] 12:00:01 start Spark session done in 9.00s",
        "[dpspark] 12:00:01 pre-flight checks ...",
        "[dpspark] 12:00:01 pre-flight checks done in 0.50s",
        "[dpspark] 12:00:02 read input table (schema and version) ...",
        "[dpspark] 12:00:02 read input table (schema and version) done in 1.25s",
        "[dpspark] 12:00:02 maxcover: fit ...",
        "[dpspark] 12:00:03 maxcover: 961 candidates, 18 thresholds, 14 picks per threshold",
        "[dpspark] 12:00:03 maxcover pass: signature histogram, threshold 1/9 ...",
        "[dpspark] 12:00:05 maxcover pass: signature histogram, threshold 1/9 done in 2.00s",
        "[dpspark] 12:00:09 maxcover: fit done in 6.00s",
        "[dpspark] 12:00:10 write centers table ...",
        "[dpspark] 12:00:10 write centers table done in 1.00s",
        "[dpspark] 12:00:11 a new runner step ...",
        "[dpspark] 12:00:11 a new runner step done in 0.75s",
        "[dpspark] 12:00:12 a new runner step ...",
        "[dpspark] 12:00:12 a new runner step done in 0.25s",
        "26/12/01 00:57:54 WARN Utils: something else done in 3.00s",
    ])
    steps = bh.parse_steps(log, "maxcover: fit")
    assert steps == {"start Spark session": 9.0, "pre-flight checks": 0.5, "read input table (schema and version)": 1.25,
                     "FIT": 6.0, "write centers table": 1.0, "a new runner step": 1.0}
    assert "FIT" not in bh.parse_steps(log, "auto: fit")  # another family's fit line is not this run's
    mllib = "\n".join(["[mllib_job] 12:00:00 start Spark session ...", "[mllib_job] 12:00:07 start Spark session done in 7.00s",
                       "[mllib_job] 12:00:07 fit ...", "[mllib_job] 12:00:19 fit done in 12.00s"])
    assert bh.parse_steps(mllib, "fit") == {"start Spark session": 7.0, "FIT": 12.0}
    cells = bs._step_cells(json.dumps({**steps, "START": 2.0, "END": 0.5, "OUTSIDE": 0.25}))
    assert cells[0] == "2.0" and cells[-2:] == ["0.5", "0.2"] and "a new runner step 1.0" in cells


def test_maxcover_extras_limit_and_fallbacks():
    # the limit is r + 1 plus the passes counted besides the thresholds' and the snap: private cells,
    # their hashes (d >= 4), the tree, grid_or_private's row count, the last Lloyd step
    op = {"spark_passes": 14, "passes_by_kind": {"candidate cells": 1, "signature histogram": 12, "snap": 1},
          "fallback_thresholds": [], "histogram_sizes": [3, 40, 900]}
    assert bs.maxcover_extras(op) == {"passes_limit": 14, "fallback_thresholds": "", "max_histogram": 900, "histogram_jobs": ""}
    op["passes_by_kind"] = {"signature histogram": 12, "snap": 1}  # a public grid
    assert bs.maxcover_extras(op)["passes_limit"] == 13
    op["passes_by_kind"] = {"count": 1, "candidate cell hashes": 1, "candidate cells": 1, "signature histogram": 12,
                            "snap": 1, "lloyd": 1}
    assert bs.maxcover_extras(op)["passes_limit"] == 17
    op["passes_by_kind"] = {"tree": 1, "signature histogram": 12, "snap": 1, "lloyd": 1}
    assert bs.maxcover_extras(op)["passes_limit"] == 15
    op = {"passes_by_kind": {"signature histogram": 12, "pick scores (fallback)": 4}, "fallback_thresholds": [7, 9],
          "histogram_sizes": [5, -1, -1], "histogram_jobs": 12}
    extras = bs.maxcover_extras(op)
    assert extras == {"passes_limit": 13, "fallback_thresholds": "7 9", "max_histogram": 5, "histogram_jobs": 12}
    assert bs._fallback_cell(extras) == "7 9 (12 histogram jobs)"
    assert bs.maxcover_extras({}) == {"passes_limit": "", "fallback_thresholds": "", "max_histogram": "",
                                      "histogram_jobs": ""}
    # r is the number of thresholds: groups and covered thresholds need fewer histogram passes
    op = {"passes_by_kind": {"tree": 1, "signature histogram": 4, "snap": 1, "lloyd": 1},
          "histogram_sizes": [9, 40, 900, 30, 0, 0]}
    assert bs.maxcover_extras(op)["passes_limit"] == 6 + 1 + 2
    assert bs._passes_cell({"spark_passes": 77, "passes_limit": 14}) == "77 / 14 OVER"
    assert bs._passes_cell({"spark_passes": 14, "passes_limit": 14}) == "14 / 14"


def test_merge_whole_replaces_cells():
    old = [{"n": 10, "d": 2, "job": "auto", "seq": 0}, {"n": 10, "d": 2, "job": "mllib", "seq": 1},
           {"n": 10, "d": 50, "job": "auto", "seq": 0}]
    new = [{"n": 10, "d": 2, "job": "maxcover", "seq": 0}]
    merged = bs._merge_whole(old, new)
    assert [(r["d"], r["job"]) for r in merged] == [(2, "maxcover"), (50, "auto")]


def test_merge_whole_adds_to_cells():
    old = [{"n": 10, "d": 2, "job": "auto", "seq": 0}, {"n": 10, "d": 2, "job": "mllib", "seq": 1},
           {"n": 10, "d": 50, "job": "auto", "seq": 0}]
    new = [{"n": 10, "d": 2, "job": "maxcover", "seq": 0}, {"n": 10, "d": 2, "job": "mllib", "seq": 1},
           {"n": 20, "d": 2, "job": "maxcover", "seq": 0}]
    merged = bs._merge_whole(old, new, add=True)
    assert [(r["n"], r["d"], r["job"], r["seq"]) for r in merged] == [
        (10, 2, "auto", 0), (10, 2, "mllib", 1), (10, 2, "maxcover", 2), (10, 2, "mllib", 3),
        (20, 2, "maxcover", 0), (10, 50, "auto", 0)]
    assert new[0]["seq"] == 0  # the caller's rows are not changed
    with pytest.raises(SystemExit):
        bs.main(["--whole", "--add-to-cells", "--out", "/nonexistent"])


def test_slope():
    assert math.isclose(bs.fit_slope([1e6, 1e7], [10.0, 100.0]), 1.0)
    assert math.isnan(bs.fit_slope([1e6, 1e6], [10.0, 12.0]))


def test_process_phases_split_the_wall_time():
    steps = {"pre-flight checks": 1.0, "read input table (schema and version)": 2.0, "FIT": 10.0,
             "write centers table": 3.0}
    ph = bh.process_phases(30.0, steps, first_mark=8.0, last_mark=26.0)
    assert ph == {"START": 8.0, "END": 4.0, "OUTSIDE": 2.0}  # 30 - 16 covered - 8 - 4
    mllib = {"start Spark session": 5.0, "read input table (schema)": 1.0, "FIT": 9.0, "write centers table": 2.0,
             "stop Spark session": 1.0}
    assert bh.process_phases(20.0, mllib, first_mark=1.5, last_mark=19.5) == {"START": 1.5, "END": 0.5, "OUTSIDE": 0.0}
    ph = bh.process_phases(30.0, steps, first_mark=None, last_mark=None)
    assert math.isnan(ph["START"]) and math.isnan(ph["END"]) and ph["OUTSIDE"] == 14.0


def test_step_line_pattern():
    m = bh.STEP_LINE.match("[dpspark] 12:00:01 pre-flight checks ...")
    assert m and m.group(1) == "pre-flight checks" and m.group(2) == "..."
    m = bh.STEP_LINE.match("[mllib_job] 12:00:09 write centers table done in 0.52s")
    assert m and m.group(1) == "write centers table" and m.group(3) == "0.52"
    assert not bh.STEP_LINE.match("[dpspark] 12:00:03 maxcover: 961 candidates, 18 thresholds, 14 picks per threshold")


def test_run_process_times_marks_and_exit_code(tmp_path):
    script = ("import sys, time\n"
              "time.sleep(0.3)\n"
              "print('[dpspark] 12:00:00 pre-flight checks ...', file=sys.stderr, flush=True)\n"
              "time.sleep(0.3)\n"
              "print('[dpspark] 12:00:01 pre-flight checks done in 0.30s', file=sys.stderr, flush=True)\n"
              "print('{\"status\": \"failed\", \"error\": \"boom\"}')\n"
              "sys.exit(3)\n")
    proc = bh.run_process([sys.executable, "-c", script], tmp_path, bh.child_env(), timeout=60)
    assert proc["exit_code"] == 3 and not proc["timed_out"]
    assert 0.2 < proc["first_mark"] < proc["last_mark"] <= proc["wall"]
    assert proc["last_mark"] - proc["first_mark"] > 0.2
    assert "pre-flight checks done" in proc["stderr"] and bh.last_json_line(proc["stdout"])["error"] == "boom"
    assert proc["py_peak_mb"] > 0  # sampled while it slept


def test_run_process_stops_a_process_past_its_timeout(tmp_path):
    proc = bh.run_process([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, bh.child_env(), timeout=0.5)
    assert proc["timed_out"] and proc["exit_code"] != 0 and proc["wall"] < 30


def test_step_durations_sum_every_done_line():
    log = "\n".join(["[dpspark] 12:00:00 maxcover: fit ...", "[dpspark] 12:00:01 pass 1 done in 0.50s",
                     "[dpspark] 12:00:02 pass 1 done in 0.25s", "[dpspark] 12:00:03 maxcover: fit done in 3.00s",
                     "something else done in 9.00s"])
    assert bh.step_durations(log) == {"pass 1": 0.75, "maxcover: fit": 3.0}


def test_csv_round_trip_types_and_blanks(tmp_path):
    path = tmp_path / "t.csv"
    bh.write_csv(path, [{"n": 3, "x": 1.5, "s": "a", "extra": 1}, {"n": "", "x": "", "s": ""}], ["n", "x", "s"])
    bh.append_csv(path, {"n": 4, "x": "oops", "s": "b"}, ["n", "x", "s"])
    rows = bh.read_csv(path, ints=("n",), floats=("x",))
    assert [r["n"] for r in rows] == [3, "", 4] and rows[0]["x"] == 1.5 and rows[0]["s"] == "a"
    assert math.isnan(rows[1]["x"]) and math.isnan(rows[2]["x"]) and "extra" not in rows[0]
    assert bh.read_csv(tmp_path / "missing.csv") == []
    assert bh.fmt("") == "-" and bh.fmt(float("nan"), missing="") == "" and bh.fmt(2.345, "{:.2f}") == "2.35"
    assert bh.fmt("7 9") == "7 9"


def test_command_line_and_stable_seed():
    assert bh.command_line("bench_x.py", ["--quick", "--out", "/tmp/o"]) == "python scripts/bench_x.py --quick --out /tmp/o"
    assert bh.command_line("bench_x.py", []) == "python scripts/bench_x.py"
    assert bh.stable_seed("a", 1) == bh.stable_seed("a", "1") != bh.stable_seed("a", 2)
