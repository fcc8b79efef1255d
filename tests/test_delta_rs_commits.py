"""delta-rs commits as the ledger's charge makes them (issue 54, item 5b): a stale snapshot never rebases.

A LOCAL ledger is charged by delta-rs (``Ledger._charge_without_spark``): the balance row is read from
one snapshot, the budget is checked on it, and the new totals are committed by
``localdelta.update_row`` (``DeltaTable.update`` with ``max_commit_retries=0``) as the version right
after that snapshot or not at all. If delta-rs ever let a commit from an old snapshot land on top of
a newer version (a retry that rebases it, or an update that reads the latest version itself), a
charge checked against the old totals would be added to the new ones and the cap could be overspent.
These tests pin that behaviour of the installed ``deltalake``; pyproject.toml's version range for it
points here. They need no Spark: the other writer is delta-rs too (tests/test_localdelta_writes.py
has the same race with Spark as the other writer)."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from dpspark import localdelta
from dpspark.privacy.ledger import SCHEMA, SINGLE_WRITER_ENV, Ledger, _balance_id

KEY = "/in"
ENTRY = _balance_id(KEY)


def new_ledger(path: str, cap: float = 1.0) -> None:
    """A ledger (the ledger's schema, a plain protocol: one delta-rs writes) holding one balance row."""
    balance = dict(entry_id=ENTRY, kind="balance", input_path=KEY, epsilon=0.0, delta=0.0, status="total",
                   updated_at=datetime.now(timezone.utc), guarantee="central", cap_epsilon=cap, cap_delta=0.0)
    assert localdelta.create_table(path, [balance], SCHEMA)
    assert localdelta.writable_table(path).version() == 0


def spent(path: str) -> float:
    (row,) = localdelta.read_rows(path, {"kind": ["balance"]})
    return row["epsilon"]


def operations(path: str) -> list[str]:
    """Every commit of the table, oldest first, by its operation (``WRITE``: the ledger's creation here, and
    an append; ``UPDATE``: a charge)."""
    return [h["operation"] for h in sorted(localdelta.open_table(path).history(), key=lambda h: h["version"])]


class UpdateSpy:
    """Records each ``DeltaTable.update`` call (its commit properties) and what it raised."""

    def __init__(self, monkeypatch):
        self.calls = []
        original = DeltaTable.update

        def update(table, *args, **kwargs):
            call = {"read_version": table.version(), "properties": kwargs.get("commit_properties"), "raised": None}
            self.calls.append(call)
            try:
                return original(table, *args, **kwargs)
            except Exception as exc:
                call["raised"] = exc
                raise

        monkeypatch.setattr(DeltaTable, "update", update)


@pytest.mark.parametrize("other", ["charge", "event"])
def test_a_commit_from_a_stale_snapshot_fails_and_the_table_keeps_only_the_other_writers_change(
        tmp_path, monkeypatch, other):
    """The other writer commits after the snapshot was opened: a charge (an UPDATE of the same row) or
    an event (a blind append of another row). The stale snapshot's update fails with delta-rs's
    conflict error, writes nothing, and ``update_row`` says so (False: decide again)."""
    path = str(tmp_path / "ledger")
    new_ledger(path)
    stale = localdelta.writable_table(path)  # the snapshot a charge decides on: version 0, nothing spent
    if other == "charge":
        assert localdelta.update_row(localdelta.writable_table(path), path, "entry_id", ENTRY,
                                     {"epsilon": 0.75, "delta": 0.0, "updated_at": datetime.now(timezone.utc)}) is True
    else:
        event = dict(entry_id="run:other:started:0", kind="run", input_path=KEY, run_id="other", epsilon=0.0,
                     delta=0.0, status="started", updated_at=datetime.now(timezone.utc))
        assert localdelta.append_rows(path, [event], tuple(f.split()[0] for f in SCHEMA.split(", ")))
    after_other = localdelta.open_table(path).version()
    assert after_other == 1 and stale.version() == 0
    spy = UpdateSpy(monkeypatch)
    # exactly the charge's commit: localdelta.update_row on the snapshot the charge decided on
    written = localdelta.update_row(stale, path, "entry_id", ENTRY,
                                    {"epsilon": 0.5, "delta": 0.0, "updated_at": datetime.now(timezone.utc)})
    assert written is False
    (call,) = spy.calls
    assert call["read_version"] == 0 and call["properties"].max_commit_retries == 0
    assert isinstance(call["raised"], CommitFailedError), call["raised"]
    # nothing of the stale commit landed: the table is the other writer's version, and only its change
    assert localdelta.open_table(path).version() == after_other
    assert operations(path) == ["WRITE", "UPDATE" if other == "charge" else "WRITE"]
    assert spent(path) == (0.75 if other == "charge" else 0.0)
    stale_txn = call["properties"].custom_metadata["dpspark_txn"]  # the id update_row gave the stale commit
    assert not any(stale_txn in json.dumps(h) for h in localdelta.open_table(path).history())


def test_the_same_snapshot_commits_once(tmp_path):
    """Two charges decided on one snapshot: the first commits its version, the second (the same read
    version) fails, whichever order they come in; the balance holds the first one's totals only."""
    path = str(tmp_path / "ledger")
    new_ledger(path)
    first, second = localdelta.writable_table(path), localdelta.writable_table(path)
    assert first.version() == second.version() == 0
    assert localdelta.update_row(second, path, "entry_id", ENTRY, {"epsilon": 0.25, "delta": 0.0}) is True
    assert localdelta.update_row(first, path, "entry_id", ENTRY, {"epsilon": 0.5, "delta": 0.0}) is False
    assert spent(path) == 0.25 and operations(path) == ["WRITE", "UPDATE"]


def test_a_charge_decided_on_a_stale_snapshot_is_decided_again_on_the_new_version(tmp_path, monkeypatch):
    """Through the ledger: ``refuses`` reads the snapshot the charge first decides on (0 of 1.0 spent, 0.5
    fits); another driver charges 0.75 meanwhile; the charge's commit from that snapshot fails, and
    decided again on the new version it is refused (0.25 left), with nothing written."""
    monkeypatch.setenv(SINGLE_WRITER_ENV, "1")  # one machine, local disk: delta-rs's commits are exclusive
    path = str(tmp_path / "ledger")
    new_ledger(path)
    ledger = Ledger(None, path)
    assert ledger.refuses(KEY, 0.5, 0.0) is None  # within the budget on this snapshot: the charge decides
    assert Ledger(None, path)._charge_without_spark(KEY, 0.75, 0.0, None, None, "central")[0] is True
    results = []
    original = localdelta.update_row

    def update_row(table, *args, **kwargs):
        results.append((table.version(), original(table, *args, **kwargs)))
        return results[-1][1]

    monkeypatch.setattr(localdelta, "update_row", update_row)
    charged, totals = ledger._charge_without_spark(KEY, 0.5, 0.0, None, None, "central")
    assert results == [(0, False)]  # the stale snapshot's commit failed; the new version refuses: no second commit
    assert charged is False and totals.spent_epsilon == 0.75
    assert spent(path) == 0.75 and operations(path) == ["WRITE", "UPDATE"]
