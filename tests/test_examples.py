"""Every example config that ships validates, and every config path the docs name ships."""

from __future__ import annotations

import re

import pytest

from dpspark.config import load_config

from conftest import ROOT

CONFS = sorted((ROOT / "conf").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFS, ids=lambda p: p.name)
def test_example_config_validates(path):
    cfg = load_config(str(path))
    assert cfg.seed is None  # examples never fix the seed


def test_every_config_the_docs_name_ships():
    names = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *CONFS]:
        names |= set(re.findall(r"conf/[A-Za-z0-9_.\-]+\.yaml", doc.read_text(encoding="utf-8")))
    names.discard("conf/prod.yaml")  # the user's own production config: a placeholder in the spark-submit line
    assert names and all((ROOT / n).is_file() for n in names), sorted(n for n in names if not (ROOT / n).is_file())
    assert {"conf/demo.yaml", "conf/dplloyd.yaml", "conf/ldp-simulate.yaml", "conf/ldp-ingest.yaml"} <= {f"conf/{p.name}" for p in CONFS}
