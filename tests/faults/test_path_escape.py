"""Issue #24, item 1: a ledger record whose path leaves its partition is never followed.

A real kdepth sweep is launched once; each case rewrites one unit's ledger row so that its
``files[0].path`` points elsewhere (``..`` out of the root, an absolute path, a URI, another sweep,
another table, a symlink out of the root), with a victim file there holding known bytes (a valid
Parquet file with exactly the recorded rows, bytes and SHA-256: the hardest case, which reading it
would call clean). Then: ``sweep verify`` names the unit, the field and the path and exits 1;
``report units`` / the catalog warn and do not count it; ``sweep launch --repair`` leaves the victim
where it is, byte for byte, and restores results bit-identical to the undisturbed run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.catalog import read_only_query
from storage.errors import PathEscape
from storage.store import ResultStore
from storage.verify import damaged_units, repair, verify
from tests.conftest import tiny_spec_text

SWEEP = "esc"
TIMING = {"seconds_a", "seconds_b"}
cli = CliRunner()


def _rows(results: Path) -> list[dict[str, Any]]:
    rows = read_only_query(results, f"SELECT * FROM kdepth WHERE sweep = '{SWEEP}' ORDER BY unit_id, impl_a, impl_b").to_pylist()
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _files(root: Path) -> dict[str, str]:
    """Every file under ``root`` (links as links) -> SHA-256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def launched(ray_local: object, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(spec, results) of one undisturbed launch."""
    base = tmp_path_factory.mktemp("escape")
    spec = base / "s.toml"
    spec.write_text(tiny_spec_text(name=SWEEP, seeds=1))
    results = base / "results"
    res = cli.invoke(app, ["sweep", "launch", str(spec), "--results", str(results), "--no-progress"])
    assert res.exit_code == 0, res.output
    return spec, results


@pytest.fixture
def tree(launched: tuple[Path, Path], tmp_path: Path) -> Path:
    root = tmp_path / "a" / "results"  # ../../victim is tmp_path/victim: inside this test's folder
    shutil.copytree(launched[1], root)
    return root


def _unit(root: Path, i: int = 0) -> str:
    return sorted(p.stem for p in (root / f"table=units/sweep={SWEEP}").glob("*.parquet"))[i]


def _tamper(root: Path, unit: str, path: str) -> None:
    """Rewrite ``unit``'s ledger row: its kdepth record now names ``path`` (rows, bytes, SHA-256 kept)."""
    store = ResultStore(root)
    row = store.ledger_records(SWEEP)[unit]
    row["files"] = [{**r, "path": path} if r["table"] == "kdepth" else r for r in row["files"]]
    store.record_unit(SWEEP, row)


def _victim_outside(root: Path, unit: str) -> tuple[str, Path]:
    """``../../victim/victim.parquet``: a copy of the unit's own file, outside the root."""
    victim = root.parent.parent / "victim" / "victim.parquet"
    victim.parent.mkdir()
    shutil.copy(root / f"table=kdepth/sweep={SWEEP}/{unit}.parquet", victim)
    return "../../victim/victim.parquet", victim


def _absolute(root: Path, unit: str) -> tuple[str, Path]:
    _rel, victim = _victim_outside(root, unit)
    return str(victim), victim


def _uri(root: Path, unit: str) -> tuple[str, Path]:
    _rel, victim = _victim_outside(root, unit)
    return f"file://{victim}", victim


def _other_sweep(root: Path, unit: str) -> tuple[str, Path]:
    victim = root / f"table=kdepth/sweep=other/{unit}.parquet"
    victim.parent.mkdir(parents=True)
    shutil.copy(root / f"table=kdepth/sweep={SWEEP}/{unit}.parquet", victim)
    return f"table=kdepth/sweep=other/{unit}.parquet", victim


def _other_table(root: Path, unit: str) -> tuple[str, Path]:
    """Another unit's ledger file: following the record would move it (losing that unit)."""
    other = _unit(root, 1)
    return f"table=units/sweep={SWEEP}/{other}.parquet", root / f"table=units/sweep={SWEEP}/{other}.parquet"


def _symlink(root: Path, unit: str) -> tuple[str, Path]:
    _rel, victim = _victim_outside(root, unit)
    link = root / f"table=kdepth/sweep={SWEEP}/link.parquet"
    link.symlink_to(victim)
    return f"table=kdepth/sweep={SWEEP}/link.parquet", victim


CASES: dict[str, Callable[[Path, str], tuple[str, Path]]] = {
    "dotdot": _victim_outside, "absolute": _absolute, "uri": _uri,
    "other-sweep": _other_sweep, "other-table": _other_table, "symlink": _symlink,
}


@pytest.fixture(params=sorted(CASES))
def tampered(request: pytest.FixtureRequest, tree: Path) -> tuple[Path, str, str, Path, bytes]:
    """(root, unit, recorded path, victim, victim's bytes)."""
    unit = _unit(tree)
    path, victim = CASES[request.param](tree, unit)
    _tamper(tree, unit, path)
    return tree, unit, path, victim, victim.read_bytes()


def test_inside_refuses_every_escape(tree: Path, tmp_path: Path) -> None:
    store = ResultStore(tree)
    assert store.inside("table=kdepth/sweep=esc/u.parquet") == "table=kdepth/sweep=esc/u.parquet"
    (tree / "out").symlink_to(tmp_path)
    for bad in ["../../victim/victim.parquet", "/etc/passwd", "s3://other-bucket/x.parquet", "file:///etc/passwd",
                "C:/x.parquet", "table=kdepth/../../x", "table=kdepth//x", "./x", "", "a\0b", "out/x.parquet"]:
        with pytest.raises(PathEscape):
            store.inside(bad)
    with pytest.raises(PathEscape):
        store.recorded(SWEEP, {"table": "kdepth", "path": "table=kdepth/sweep=other/u.parquet"})
    with pytest.raises(PathEscape):
        store.recorded(SWEEP, {"table": "units", "path": f"table=units/sweep={SWEEP}/u.parquet"})
    with pytest.raises(PathEscape):  # the store never follows an escaping relpath either
        store.read_bytes("../../victim/victim.parquet")


def test_verify_names_the_unit_the_field_and_the_path(tampered: tuple[Path, str, str, Path, bytes]) -> None:
    root, unit, path, victim, data = tampered
    res = cli.invoke(app, ["sweep", "verify", "--results", str(root), "--sweep", SWEEP, "--format", "json"])
    assert res.exit_code == 1, res.output
    escapes = [p for p in json.loads(res.stdout) if p["kind"] == "path_escape" and p["unit_id"] == unit]
    assert len(escapes) == 1, res.stdout
    assert escapes[0]["path"] == path and escapes[0]["remedy"] == "recompute"
    assert f"unit {unit}" in escapes[0]["detail"] and "files[0].path" in escapes[0]["detail"]
    assert path in escapes[0]["detail"]
    assert damaged_units(ResultStore(root), SWEEP) == {unit}
    assert victim.read_bytes() == data
    table = cli.invoke(app, ["sweep", "verify", "--results", str(root), "--sweep", SWEEP])
    assert table.exit_code == 1 and "path_escape" in table.output


def test_verify_never_reads_the_victim(tampered: tuple[Path, str, str, Path, bytes],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    root, _unit_id, _path, victim, _data = tampered
    store = ResultStore(root)
    seen: list[str] = []
    read = store._read_bytes

    def spy(p: str) -> bytes:
        seen.append(p)
        return read(p)

    monkeypatch.setattr(store, "_read_bytes", spy)
    verify(store, SWEEP)
    reads = sum(os.path.realpath(p) == str(victim.resolve()) for p in seen)
    # Another unit's ledger file (other-table) is read once, as that unit's own ledger file (verify
    # checks each one, #24 item 2), never a second time as the file the escaping record names.
    assert reads == (1 if victim.parent.name == f"sweep={SWEEP}" and "table=units" in str(victim) else 0)


def test_catalog_warns_and_does_not_count(launched: tuple[Path, Path],
                                          tampered: tuple[Path, str, str, Path, bytes]) -> None:
    root, unit, path, _victim, _data = tampered
    clean = _rows(launched[1])
    res = cli.invoke(app, ["report", "units", "--results", str(root), "--format", "json"])
    assert res.exit_code == 0, res.output
    warned = [line for line in res.stderr.splitlines() if line.startswith("warning:") and "path_escape" in line]
    assert warned and all(unit in line and path in line for line in warned), res.stderr
    got = _rows(root)
    assert len(got) == len(clean) - sum(r["unit_id"] == unit for r in clean)
    assert all(r["unit_id"] != unit for r in got)
    damaged = read_only_query(root, "SELECT unit_id FROM units WHERE damaged").to_pylist()
    assert [r["unit_id"] for r in damaged] == [unit]


def test_repair_api_never_moves_the_victim(tampered: tuple[Path, str, str, Path, bytes]) -> None:
    root, unit, _path, victim, data = tampered
    store = ResultStore(root)
    problems = verify(store, SWEEP)
    done = repair(store, SWEEP, damaged_units(store, SWEEP, problems), problems=problems)
    assert done.units == [unit]
    assert all(".." not in m.split("/") and not m.startswith("/") for m in done.moved)
    assert victim.is_file() and not victim.is_symlink() and victim.read_bytes() == data


@pytest.mark.slow  # a real `launch --repair` per case; verify, catalog and the repair API run in the default set
def test_launch_repair_restores_bit_identical_results(launched: tuple[Path, Path],
                                                      tampered: tuple[Path, str, str, Path, bytes]) -> None:
    spec, clean_root = launched
    root, unit, _path, victim, data = tampered
    outside = _files(root.parent.parent / "victim") if (root.parent.parent / "victim").exists() else {}
    fixed = cli.invoke(app, ["sweep", "launch", str(spec), "--results", str(root), "--no-progress", "--repair"])
    assert fixed.exit_code == 0, fixed.output
    assert "1 ok" in fixed.output
    assert victim.is_file() and victim.read_bytes() == data  # same place, same bytes
    if outside:
        assert _files(root.parent.parent / "victim") == outside
    assert not list(root.rglob("victim.parquet"))  # nothing from outside was brought in
    assert cli.invoke(app, ["sweep", "verify", "--results", str(root), "--sweep", SWEEP]).exit_code == 0
    assert _rows(root) == _rows(clean_root)
    assert unit in ResultStore(root).done_units(SWEEP)
