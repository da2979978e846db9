"""`swapcheck sweep verify`: each kind of damage to a real results tree is found, named and repaired."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from orchestrator.cli.sweep_verify import verify as verify_command
from orchestrator.plan import make_plan
from orchestrator.spec import parse_spec
from orchestrator.worker import execute_unit
from storage.schemas import UNITS
from storage.store import ResultStore
from storage.verify import damaged_units, repair, verify
from tests.conftest import tiny_spec_text

N_UNITS = 3


def _payloads() -> tuple[list[dict[str, Any]], str, str]:
    spec = parse_spec(tiny_spec_text(seeds=1))
    plan = make_plan(spec)
    return [{**u.to_payload(), "description": u.describe()} for u in plan.units[:N_UNITS]], plan.sweep, spec.sha256


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    payloads, sweep, sha = _payloads()
    for payload in payloads:
        assert execute_unit(payload, str(root), sweep, sha)["status"] == "ok"
    return root


@pytest.fixture
def tree(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(pristine, root)
    return root


def _units() -> list[str]:
    return [p["id"] for p in _payloads()[0]]


def _file(root: Path, unit: str, table: str = "kdepth") -> Path:
    return root / f"table={table}/sweep=tiny/{unit}.parquet"


def _cli(*args: str) -> tuple[int, list[dict[str, Any]]]:
    """Run `swapcheck sweep verify --format json`: the lead's registration if there, else ours."""
    from orchestrator.cli import sweep

    if any(c.name == "verify" for c in sweep.app.registered_commands):
        from orchestrator.cli.main import app

        argv = ["sweep", "verify"]
    else:
        app = typer.Typer()
        app.command("verify")(verify_command)
        app.command("other")(lambda: None)  # two commands: `verify` is a subcommand, as it will be
        argv = ["verify"]
    result = CliRunner().invoke(app, [*argv, *args, "--format", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def _kinds(problems: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return sorted((p["kind"], p["unit_id"]) for p in problems)


def test_clean_tree_exits_0_and_ledger_records_every_file(tree: Path) -> None:
    code, problems = _cli("--results", str(tree), "--sweep", "tiny")
    assert (code, problems) == (0, [])
    assert _cli("--results", str(tree))[0] == 0
    records = ResultStore(tree).ledger_records("tiny")
    assert set(records) == set(_units())
    for unit, row in records.items():
        (rec,) = row["files"]
        data = _file(tree, unit).read_bytes()
        assert rec == {"table": "kdepth", "path": f"table=kdepth/sweep=tiny/{unit}.parquet",
                       "rows": pq.read_table(_file(tree, unit)).num_rows, "bytes": len(data),
                       "sha256": hashlib.sha256(data).hexdigest()}
        assert row["rows"] == rec["rows"] and row["tables"] == ["kdepth"]


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _garbage(p: Path) -> None:
    p.write_bytes(bytes(b ^ 0x5A for b in p.read_bytes()))


def _foreign_schema(p: Path) -> None:
    pq.write_table(pa.table({"unit_id": [p.stem], "something": [1.5]}), p)


def _extra_row(p: Path) -> None:
    t = pq.read_table(p)
    pq.write_table(pa.concat_tables([t, t.slice(0, 1)]), p)


@pytest.mark.parametrize(("damage", "kind"), [
    (_truncate, "truncated"),
    (_garbage, "checksum"),
    (Path.unlink, "missing"),
    (_foreign_schema, "schema"),
    (_extra_row, "rows"),
])
def test_damaged_unit_file_is_named(tree: Path, damage: Any, kind: str) -> None:
    unit = _units()[1]
    damage(_file(tree, unit))
    code, problems = _cli("--results", str(tree), "--sweep", "tiny")
    assert code == 1
    assert _kinds(problems) == [(kind, unit)]
    assert problems[0]["path"] == f"table=kdepth/sweep=tiny/{unit}.parquet" and problems[0]["remedy"] == "recompute"
    assert damaged_units(ResultStore(tree), "tiny") == {unit}


def test_orphan_file(tree: Path) -> None:
    rows = pq.read_table(_file(tree, _units()[0])).to_pylist()
    forged = [{**r, "unit_id": "forged"} for r in rows]
    pq.write_table(pa.Table.from_pylist(forged, schema=pq.read_schema(_file(tree, _units()[0]))),
                   tree / "table=kdepth/sweep=tiny/dup.parquet")
    code, problems = _cli("--results", str(tree))
    assert code == 1 and _kinds(problems) == [("orphan", "forged")]
    assert problems[0]["path"] == "table=kdepth/sweep=tiny/dup.parquet" and problems[0]["remedy"] == "set aside"
    assert damaged_units(ResultStore(tree), "tiny") == set(), "an orphan is not a damaged unit"


def test_duplicate_file_rows_counted_twice(tree: Path) -> None:
    unit = _units()[2]
    shutil.copy(_file(tree, unit), tree / "table=kdepth/sweep=tiny/dup.parquet")
    code, problems = _cli("--results", str(tree), "--sweep", "tiny")
    assert code == 1 and _kinds(problems) == [("duplicate", unit)]
    assert problems[0]["path"] == "table=kdepth/sweep=tiny/dup.parquet"


def test_file_named_by_two_ledger_rows(tree: Path) -> None:
    a, b = _units()[:2]
    store = ResultStore(tree)
    row = store.ledger_records("tiny")[b]
    row["files"] = store.ledger_records("tiny")[a]["files"]
    store.record_unit("tiny", row)
    code, problems = _cli("--results", str(tree))
    # b's own file is now named by no ledger row, and a's file by two.
    assert code == 1 and _kinds(problems) == sorted([("duplicate", a), ("duplicate", b), ("orphan", b)])
    assert damaged_units(store, "tiny") == {a, b}


def test_stale_temporary(tree: Path) -> None:
    part = tree / "table=kdepth/sweep=tiny"
    stale = part / f".{_units()[0]}.parquet.tmp-{'ab' * 16}"
    fresh = part / f".{_units()[1]}.parquet.tmp-{'cd' * 16}"
    stale.write_bytes(b"PAR1 half written")
    fresh.write_bytes(b"PAR1 being written")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    code, problems = _cli("--results", str(tree), "--sweep", "tiny")
    assert code == 1 and _kinds(problems) == [("stale_temporary", None)]
    assert problems[0]["path"] == f"table=kdepth/sweep=tiny/{stale.name}"
    assert ResultStore(tree).remove_stale_temporaries(older_than_s=3600) == [problems[0]["path"]]
    assert not stale.exists() and fresh.exists(), "a young temporary may belong to a live writer"


def _make_legacy(root: Path, unit: str) -> None:
    """Rewrite a unit's ledger file as written before integrity records: no `files` column."""
    p = _file(root, unit, "units")
    t = pq.read_table(p)
    pq.write_table(t.drop_columns(["files"]).cast(pa.schema([f for f in UNITS if f.name != "files"])), p)


def test_legacy_rows_are_unverifiable_not_damaged(tree: Path) -> None:
    legacy, other = _units()[0], _units()[1]
    _make_legacy(tree, legacy)
    assert ResultStore(tree).ledger_records("tiny")[legacy]["files"] is None
    assert ResultStore(tree).done_units("tiny") == set(_units())
    code, problems = _cli("--results", str(tree), "--sweep", "tiny")
    assert code == 0 and _kinds(problems) == [("unverifiable", legacy)]
    _file(tree, legacy).unlink()
    _make_legacy(tree, other)
    _truncate(_file(tree, other))
    code, problems = _cli("--results", str(tree), "--sweep", "tiny")
    assert code == 1 and _kinds(problems) == sorted([("missing", legacy), ("unreadable", other)])


def test_unreadable_ledger_file(tree: Path) -> None:
    unit = _units()[0]
    _truncate(_file(tree, unit, "units"))
    code, problems = _cli("--results", str(tree), "--sweep", "tiny")
    assert code == 1 and _kinds(problems) == [("unreadable", unit)] and problems[0]["table"] == "units"
    store = ResultStore(tree)
    done = repair(store, "tiny", damaged_units(store, "tiny"))
    assert done.units == [unit] and sorted(done.moved) == sorted([f"table=units/sweep=tiny/{unit}.parquet",
                                                                 f"table=kdepth/sweep=tiny/{unit}.parquet"])
    assert store.done_units("tiny") == set(_units()) - {unit} and verify(store, "tiny") == []


def test_ledger_rows_counted_twice(tree: Path) -> None:
    a, b = _units()[:2]
    own = _file(tree, a, "units")
    shutil.copy(own, tree / "table=units/sweep=tiny/forged.parquet")
    code, problems = _cli("--results", str(tree), "--sweep", "tiny")
    assert code == 1 and _kinds(problems) == [("duplicate", a)] and problems[0]["remedy"] == "set aside"
    two = pa.concat_tables([pq.read_table(own), pq.read_table(_file(tree, b, "units"))])
    pq.write_table(two, own)
    code, problems = _cli("--results", str(tree), "--sweep", "tiny")
    assert code == 1 and ("rows", a) in _kinds(problems)
    assert damaged_units(ResultStore(tree), "tiny") == {a}


def test_unknown_results_or_sweep_is_a_usage_error(tree: Path, tmp_path: Path) -> None:
    app = typer.Typer()
    app.command("verify")(verify_command)
    app.command("other")(lambda: None)
    assert CliRunner().invoke(app, ["verify", "--results", str(tmp_path / "nothing")]).exit_code == 2
    assert CliRunner().invoke(app, ["verify", "--results", str(tree), "--sweep", "nope"]).exit_code == 2
    table = CliRunner().invoke(app, ["verify", "--results", str(tree)])
    assert table.exit_code == 0


def test_repair_quarantines_exactly_the_damaged_units(tree: Path) -> None:
    a, b, c = _units()
    _truncate(_file(tree, a))
    _file(tree, b).unlink()
    shutil.copy(_file(tree, c), tree / "table=kdepth/sweep=tiny/dup.parquet")
    untouched = _file(tree, c).read_bytes()
    store = ResultStore(tree)
    problems = verify(store, "tiny")
    damaged = damaged_units(store, "tiny", problems)
    assert damaged == {a, b}
    done = repair(store, "tiny", damaged, problems=problems)
    assert sorted(done.units) == sorted([a, b])
    assert sorted(done.moved) == sorted([f"table=units/sweep=tiny/{a}.parquet", f"table=units/sweep=tiny/{b}.parquet",
                                         f"table=kdepth/sweep=tiny/{a}.parquet", "table=kdepth/sweep=tiny/dup.parquet"])
    for rel in done.moved:  # evidence is kept, not deleted
        assert (tree / done.quarantine / rel).is_file() and not (tree / rel).exists()
    assert store.done_units("tiny") == {c} and _file(tree, c).read_bytes() == untouched
    assert verify(store, "tiny") == []
    # A relaunch recomputes exactly the units without a ledger row.
    payloads, sweep, sha = _payloads()
    for payload in payloads:
        if payload["id"] not in store.done_units(sweep):
            execute_unit(payload, str(tree), sweep, sha)
    assert store.done_units("tiny") == {a, b, c}
    assert _cli("--results", str(tree), "--sweep", "tiny") == (0, [])
