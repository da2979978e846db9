"""Unit ids and result tables are pinned: a refactor must not turn finished work into new work.

A unit id is a hash of its kind, its canonical parameters and its kind's VERSION; results on disk are
found again by it, and read through the Arrow schemas of ``storage.schemas.TABLES``. Both are recorded
in ``tests/data/pinned_unit_ids.json`` (every sweep spec under ``sweeps/``, planned as ``swapcheck sweep
plan`` plans it, sorted ids per spec; every built-in table, its columns and their types).

A deliberate change (a new VERSION, a new column, a new or edited sweep spec) rewrites the file with
``python -m tests.test_pinned_ids --write`` and says why in its commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

PINNED = REPO / "tests" / "data" / "pinned_unit_ids.json"
SWEEPS = sorted((REPO / "sweeps").glob("*.toml"))


def planned_unit_ids(path: Path) -> list[str]:
    from orchestrator.plan import make_plan
    from orchestrator.spec import load_spec

    return sorted(u.id for u in make_plan(load_spec(path)).units)


def table_columns(schema: Any) -> list[list[str]]:
    return [[field.name, str(field.type)] for field in schema]


def current(table_names: list[str] | None = None) -> dict[str, Any]:
    from storage.schemas import TABLES

    names = sorted(TABLES) if table_names is None else table_names
    return {
        "note": "unit ids of every sweep spec and the columns of every built-in results table; "
                "rewrite with `python -m tests.test_pinned_ids --write` only for a deliberate change",
        "unit_ids": {p.relative_to(REPO).as_posix(): planned_unit_ids(p) for p in SWEEPS},
        "tables": {name: table_columns(TABLES[name]) for name in names if name in TABLES},
    }


def _pinned() -> dict[str, Any]:
    return json.loads(PINNED.read_text())


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_unit_ids_of_every_sweep_spec_are_pinned(path: Path) -> None:
    key = path.relative_to(REPO).as_posix()
    pinned = _pinned()["unit_ids"]
    assert key in pinned, f"{key} is not pinned: run `python -m tests.test_pinned_ids --write`"
    assert planned_unit_ids(path) == pinned[key]


def test_every_pinned_spec_still_exists() -> None:
    assert sorted(_pinned()["unit_ids"]) == [p.relative_to(REPO).as_posix() for p in SWEEPS]


def test_result_table_schemas_are_pinned() -> None:
    # Tests register tables of their own (a toy kind's) into TABLES: the pinned ones must be there,
    # each with the same columns of the same types, in the same order.
    from storage.schemas import TABLES

    pinned = _pinned()["tables"]
    assert sorted(set(pinned) - set(TABLES)) == []
    assert {name: table_columns(TABLES[name]) for name in pinned} == pinned


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_pinned_ids --write")
    PINNED.write_text(json.dumps(current(), indent=1) + "\n")
    print(f"wrote {PINNED.relative_to(REPO)}")
