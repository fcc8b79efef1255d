"""README.md for users: under 15 kB, and every command block in it is run as written by some test.

Each fenced block of README.md is either configuration (``yaml``, or ``text`` for listings) or a
command block marked by the HTML comment on the line before it:

- ``<!-- readme-run: quickstart -->``: ``./scripts/demo.sh`` is run here, in a scratch copy of the
  project (scripts/, conf/, jobs/, pyproject.toml, and symlinks to the project's .venv and .cache,
  so scripts/setup.sh finds everything installed and reinstalls nothing); ``./scripts/test.sh``
  is what CI runs (.ci/run calls it), checked here, not run (it would run this test again);
- ``<!-- readme-run: job -->``: each line runs through bash in the same scratch copy after the demo,
  exit code 0 unless the line says ``# exits N``;
- ``<!-- readme-run: python -->``: the block runs as a script with the project's Python in the
  scratch copy (it starts its own session with ``get_session()``), beside the demo;
- ``<!-- cluster-commands ... -->``: run by tests/test_cluster.py; checked here to be the block that
  test parses.

A shell or Python block without a marker fails ``test_every_command_block_is_marked``, so no
command block goes untested. The config reference (the yaml block under "## Config reference") is
parsed and validated by ``dpspark.config.validate`` once per family, and must name every config key.

Cost: the demo (three JVM starts), two ``dpspark`` commands and one Python session; about 2-3
minutes on a quiet 2-core machine (more when the machine is shared).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dpspark import config as config_mod
from dpspark.errors import ConfigError

from conftest import ROOT

README = ROOT / "README.md"
MAX_BYTES = 15_000
RUN_MARK = re.compile(r"^<!-- readme-run: ([a-z][a-z0-9-]*) -->$")
CLUSTER_MARK = "<!-- cluster-commands: tests/test_cluster.py runs this block as written -->"
# The blocks each test below runs (a marker not listed here fails test_every_command_block_is_marked).
RUN_BLOCKS = {"quickstart", "job", "python"}
UNMARKED_OK = {"yaml", "text"}  # configuration and listings, never commands
QUICKSTART = ("./scripts/demo.sh    # runs the main job on a small bundled demo table, local mode\n"
              "./scripts/test.sh    # runs the test suite; .ci/run calls this\n")


@dataclasses.dataclass
class Block:
    lang: str
    marker: str | None  # the readme-run name, "cluster", or None
    body: str
    line: int  # 1-based line of the opening fence


def fenced_blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, with its language and the marker on the line before it."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = re.match(r"^```\s*([A-Za-z0-9_+-]*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        assert j < len(lines), f"README.md line {i + 1}: fenced block never closed"
        before = next((lines[b].strip() for b in range(i - 1, -1, -1) if lines[b].strip()), "")
        found = RUN_MARK.match(before)
        marker = found.group(1) if found else ("cluster" if before == CLUSTER_MARK else None)
        blocks.append(Block(opening.group(1).lower(), marker, "\n".join(lines[i + 1:j]) + "\n", i + 1))
        i = j + 1
    return blocks


def marking_problems(text: str) -> list[str]:
    """Command blocks no test runs: unmarked non-config blocks, unknown or repeated markers."""
    problems, seen = [], set()
    for b in fenced_blocks(text):
        if b.marker is None:
            if b.lang not in UNMARKED_OK:
                problems.append(f"line {b.line}: ```{b.lang} block has no readme-run marker (no test runs it)")
            continue
        if b.marker != "cluster" and b.marker not in RUN_BLOCKS:
            problems.append(f"line {b.line}: marker {b.marker!r} is run by no test (known: {sorted(RUN_BLOCKS)})")
        if b.marker in seen:
            problems.append(f"line {b.line}: marker {b.marker!r} used twice")
        seen.add(b.marker)
    missing = (RUN_BLOCKS | {"cluster"}) - seen
    if missing:
        problems.append(f"no block marked {sorted(missing)}")
    return problems


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def block(marker: str) -> Block:
    found = [b for b in fenced_blocks(readme_text()) if b.marker == marker]
    assert len(found) == 1, f"README.md: expected one block marked {marker!r}, found {len(found)}"
    return found[0]


def command_lines(body: str) -> list[str]:
    """Shell lines of a block (continuations joined; blank and comment-only lines dropped)."""
    out, current = [], ""
    for line in body.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        out.append((current + line).strip())
        current = ""
    return out


def expected_exit(line: str) -> int:
    """0, unless the README's line says ``# exits N``."""
    found = re.search(r"#.*\bexits (\d+)\b", line)
    return int(found.group(1)) if found else 0


# ---------------------------------------------------------------------------------------------
# Static checks (no Spark)


def test_readme_is_under_15_kB():
    size = len(README.read_bytes())
    assert size < MAX_BYTES, f"README.md is {size} bytes; keep it under {MAX_BYTES} (long material goes to docs/)"


def test_every_command_block_is_marked():
    assert marking_problems(readme_text()) == []
    # The check can fail: an unmarked shell block, an unknown marker, a missing block are caught.
    extra = readme_text() + "\n```bash\n.venv/bin/dpspark run --config conf/demo.yaml\n```\n"
    assert any("no readme-run marker" in p for p in marking_problems(extra))
    assert any("run by no test" in p for p in marking_problems(
        readme_text() + "\n<!-- readme-run: nobody -->\n```sh\nls\n```\n"))
    assert any("no block marked ['python']" in p for p in marking_problems(
        readme_text().replace("<!-- readme-run: python -->", "")))


def test_links_to_docs_exist():
    """Every relative Markdown link of the README and of docs/*.md points at a file that ships."""
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            assert (doc.parent / target).is_file(), f"{doc.relative_to(ROOT)} links to missing {target}"


def test_no_work_item_names_in_docs_headings():
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        headings = [l for l in doc.read_text(encoding="utf-8").splitlines() if l.startswith("#") and not l.startswith("#!")]
        bad = [h for h in headings if re.search(r"\(issues? \d+", h)]
        assert not bad, f"{doc.relative_to(ROOT)}: headings name work items: {bad}"


def test_quickstart_block_is_the_two_promised_commands_and_ci_runs_the_tests():
    assert block("quickstart").body == QUICKSTART
    ci = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert "./scripts/test.sh" in ci, ".ci/run must call ./scripts/test.sh (the README's test command)"


def test_cluster_block_is_the_one_test_cluster_runs():
    import test_cluster as cluster_test  # tests/test_cluster.py: its README parser and marker

    assert cluster_test.README_MARK == CLUSTER_MARK
    b = block("cluster")
    assert b.lang == "bash"
    assert cluster_test.readme_commands() == command_lines(b.body)


# ---------------------------------------------------------------------------------------------
# The config reference


def config_reference() -> dict:
    text = readme_text()
    assert "\n## Config reference\n" in text
    section = text.split("\n## Config reference\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in fenced_blocks(section) if b.lang == "yaml"]
    assert len(blocks) == 1, "the Config reference section holds one yaml block"
    return yaml.safe_load(blocks[0].body), blocks[0].body


# The README's comment on privacy.delta (two lines: the default, auto's upper bound, then each family).
DELTA_COMMENT = re.compile(r"^  delta: .*# in \[0, 1\), default 0; auto: an upper bound, it may spend 0;\n"
                           r" +# maxcover needs > 0, dplloyd 0, ldp ignores it$", re.M)


def family_keys(name: str) -> tuple[str, ...]:
    return tuple(importlib.import_module(config_mod.FAMILIES[name]).KEYS)


def named(body: str, key: str) -> bool:
    """The block names ``key``: as a YAML key, commented out (``# key:``), or in a comment."""
    return re.search(rf"(^|[\s#,(]){re.escape(key)}\b", body, re.M) is not None


def test_config_reference_names_every_key(monkeypatch):
    raw, body = config_reference()
    assert set(raw) <= set(config_mod.TOP_KEYS), sorted(set(raw) - set(config_mod.TOP_KEYS))
    sections = {"input": config_mod.InputConfig, "domain": config_mod.DomainConfig,
                "privacy": config_mod.PrivacyConfig, "output": config_mod.OutputConfig,
                "spark": config_mod.SparkConfig}
    for top in config_mod.TOP_KEYS:
        assert named(body, top), f"config reference lacks the top-level key {top!r}"
    for section, cls in sections.items():
        for f in dataclasses.fields(cls):
            assert named(body, f.name), f"config reference lacks {section}.{f.name}"
    for family in sorted(config_mod.FAMILIES):
        assert re.search(rf"name: .*\b{family}\b", body), f"algorithm.name's comment lacks {family!r}"
        for key in family_keys(family):
            assert named(body, key), f"config reference lacks algorithm.{key} ({family})"
    algorithm_keys = set(raw["algorithm"]) - {"name", "objective", "k"}
    every_family_key = set().union(*(family_keys(f) for f in config_mod.FAMILIES))
    assert algorithm_keys <= every_family_key, sorted(algorithm_keys - every_family_key)
    # The check can fail: a key the config does not know is caught.
    assert not named(body, "no_such_key")


@pytest.mark.parametrize("family", sorted(config_mod.FAMILIES))
def test_config_reference_validates_for_each_family(family, monkeypatch):
    """The block, with algorithm.name set to each family and only that family's keys, is accepted by
    dpspark.config.validate, and the README's comment on privacy.delta holds: default 0; auto takes
    no family key and accepts both 0 and the block's 1e-6 (an upper bound: its plan may spend less);
    maxcover needs > 0 (the block's 1e-6), dplloyd 0 (refuses the block's 1e-6), ldp ignores it."""
    from dpspark.runner import estimator_class

    monkeypatch.delenv(config_mod.LEDGER_ENV, raising=False)
    raw, body = config_reference()
    assert DELTA_COMMENT.search(body), "the README's comment on privacy.delta changed: update it and this test"
    assert raw["algorithm"]["name"] == config_mod.DEFAULT_ALGORITHM == "auto"
    mine = copy.deepcopy(raw)
    keep = {"name", "objective", "k", *family_keys(family)}
    mine["algorithm"] = {k: v for k, v in raw["algorithm"].items() if k in keep}
    mine["algorithm"]["name"] = family
    no_delta = copy.deepcopy(mine)
    no_delta["privacy"].pop("delta")
    assert raw["privacy"]["delta"] > 0
    if family == "dplloyd":
        with pytest.raises(ConfigError, match="delta"):
            config_mod.validate(mine)
        mine = no_delta
    cfg = config_mod.validate(mine)
    assert cfg.algorithm.name == family and cfg.seed is None
    if family == "maxcover":
        with pytest.raises(ConfigError, match="delta"):
            config_mod.validate(no_delta)
    else:
        assert config_mod.validate(no_delta).privacy.delta == 0.0
    if family == "auto":
        assert family_keys("auto") == ()
        # delta is an upper bound: the plan never spends more, and with delta 0 spends none.
        eps, delta = estimator_class("auto").from_config(cfg).privacy_plan()
        assert eps == cfg.privacy.epsilon and delta <= cfg.privacy.delta
        assert estimator_class("auto").from_config(config_mod.validate(no_delta)).privacy_plan() == (eps, 0.0)
    # A key of another family is refused (so the validation above is not vacuous).
    other = next(k for f in sorted(config_mod.FAMILIES) if f != family for k in family_keys(f) if k not in keep)
    with pytest.raises(ConfigError):
        config_mod.validate({**mine, "algorithm": {**mine["algorithm"], other: raw["algorithm"].get(other) or 1}})


# ---------------------------------------------------------------------------------------------
# Running the blocks, in a scratch copy of the project


def scratch_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYSPARK_") and k not in ("SPARK_HOME", config_mod.LEDGER_ENV, "DPSPARK_MASTER")}
    env.setdefault("DPSPARK_IVY_DIR", str(ROOT / ".cache" / "ivy"))
    return env


def bash(line: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=scratch_env(), text=True, capture_output=True,
                          timeout=timeout)


@dataclasses.dataclass
class Scratch:
    root: Path
    python_block: subprocess.Popen  # the README's Python block, started beside the demo


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A copy of what the README's commands need, with the project's .venv and .cache linked in,
    after the quickstart's ``./scripts/demo.sh`` ran there as written. The Python block (which needs
    nothing from the demo) runs meanwhile, in the same directory: one JVM start less to wait for."""
    stamp = ROOT / ".venv" / ".dpspark-installed"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not stamp.is_file() or stamp.read_text().strip() != want:
        # setup.sh would reinstall (pip install -e) from the scratch copy into the project's .venv
        pytest.fail("the project's .venv is not set up for this pyproject.toml: run ./scripts/setup.sh first")
    root = tmp_path_factory.mktemp("readme")
    for name in ("scripts", "conf", "jobs"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / ".venv").symlink_to(ROOT / ".venv")
    (root / ".cache").symlink_to(ROOT / ".cache")
    lines = command_lines(block("quickstart").body)
    demo = [l for l in lines if l.startswith("./scripts/demo.sh")]
    assert len(demo) == 1 and set(lines) - set(demo) == {l for l in lines if l.startswith("./scripts/test.sh")}

    (root / "readme_python_block.py").write_text(block("python").body)
    with open(root / "python_block.out", "w") as out, open(root / "python_block.err", "w") as err:
        python_block = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "readme_python_block.py"],
                                        cwd=root, env=scratch_env(), text=True, stdout=out, stderr=err)
    try:
        proc = bash(demo[0], root)
        assert proc.returncode == expected_exit(demo[0]) == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "succeeded" in proc.stdout and "released centers" in proc.stdout, proc.stdout[-3000:]
        assert (root / ".venv").resolve() == (ROOT / ".venv").resolve()  # still the project's, not replaced
        yield Scratch(root, python_block)
    finally:
        if python_block.poll() is None:  # only if a test failed before waiting for it
            python_block.kill()
            python_block.wait()


def test_quickstart_demo_ran(scratch):
    summary = json.loads((scratch.root / "out" / "demo" / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["private"] is True
    assert len(summary["centers"]) == 5
    # The demo runs the default, auto; in 2 dimensions with delta > 0 it chooses maxcover on a grid.
    assert summary["algorithm"] == "auto" and summary["parameters"]["chosen"] == "maxcover"
    assert summary["parameters"]["why"] and summary["delta_spent"] == pytest.approx(1e-6)


def test_running_a_job_block(scratch):
    lines = command_lines(block("job").body)
    assert lines and all(l.startswith(".venv/bin/dpspark ") for l in lines)
    outputs = {}
    for line in lines:
        proc = bash(line, scratch.root)
        assert proc.returncode == expected_exit(line), f"{line}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        outputs[line] = proc.stdout
    runs = [l for l in lines if " run " in l]
    assert runs, "the job block runs a job"
    for line in runs:
        if "--json" in line:
            status = json.loads(outputs[line].strip().splitlines()[-1])
            assert status["status"] == "succeeded" and status["exit_code"] == 0, status
            run_id = re.search(r"--run-id (\S+)", line)
            if run_id:
                assert status["run_id"] == run_id.group(1)
    shows = [l for l in lines if " ledger show " in l]
    for line in shows:  # the run the block made is in the ledger
        for run in runs:
            run_id = re.search(r"--run-id (\S+)", run)
            if run_id:
                assert run_id.group(1) in outputs[line] and "charged" in outputs[line], outputs[line]


def test_python_block(scratch):
    code = scratch.python_block.wait(timeout=900)
    out = (scratch.root / "python_block.out").read_text()
    err = (scratch.root / "python_block.err").read_text()
    assert code == 0, out[-3000:] + err[-3000:]
    assert (scratch.root / "out" / "pipeline-model").is_dir() and (scratch.root / "out" / "dp-model").is_dir()
    assert "epsilonSpent=1" in out, out[-3000:]
