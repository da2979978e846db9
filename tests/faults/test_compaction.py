"""Compaction of a finished sweep's result files (storage.records, ``SweepRecords.compact``): every
answer the same before and after (the catalog, ``swapcheck db``, ``read_unit``), ``sweep verify``
clean; a unit superseded after compaction, a damaged compacted file, a kill at each step, a full disk:
nothing lost, nothing counted twice, no wrong answer.

The sweep is the tests' tiny INT8 sweep (12 units of 3 rows), launched in process with
``SWAPCHECK_COMPACT_FROM=0``, then compacted into files of at least 10 rows (3 compacted files of 4 units)."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, launch_in_process, tiny_spec_text

SWEEP = "cpt"
ROWS = 10


def _answers(root: Path) -> dict[str, Any]:
    from storage.catalog import open_catalog

    with open_catalog(str(root)) as cat:
        units = [tuple(r.values()) for r in cat.query("SELECT unit_id, status, damaged FROM units ORDER BY unit_id").to_pylist()]
        rows = [tuple(r.values()) for r in cat.query(
            "SELECT unit_id, impl_a, impl_b, k, seed, scale_mode, differing, max_spacing FROM kdepth ORDER BY ALL").to_pylist()]
        return {"units": units, "rows": rows, "warnings": list(cat.warnings)}


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / f"table=kdepth/sweep={SWEEP}").glob("*.parquet"))


def _problems(root: Path) -> list[Any]:
    from storage.store import ResultStore
    from storage.verify import verify

    return [p for p in verify(ResultStore(root), SWEEP) if p.damage]


def _compact(root: Path) -> list[str]:
    from storage.store import ResultStore

    written: list[str] = ResultStore(root).records(SWEEP).compact(["kdepth"], 1, ROWS)
    return written


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("cpt") / "results"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWAPCHECK_COMPACT_FROM", "0")
        summary = launch_in_process(root, tiny_spec_text(SWEEP))
    assert summary.n_ok == summary.n_units == 12
    yield root, _answers(root)


@pytest.fixture
def tree(launched: tuple[Path, dict[str, Any]], tmp_path: Path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(launched[0], root, symlinks=True)
    return root


def test_compaction_keeps_every_answer_and_leaves_a_few_files(launched: tuple[Path, dict[str, Any]], tree: Path) -> None:
    import duckdb

    from storage.catalog import view_definitions
    from storage.records import is_compacted
    from storage.store import ResultStore

    _root, answers = launched
    unit = answers["units"][0][0]
    before = ResultStore(tree).read_unit("kdepth", SWEEP, unit)
    written = _compact(tree)
    assert len(written) == 3 and all(is_compacted(w) for w in written)
    assert _files(tree) == sorted(w.rsplit("/", 1)[1] for w in written)  # the 12 unit files are gone
    assert _answers(tree) == answers
    assert _problems(tree) == []
    assert ResultStore(tree).read_unit("kdepth", SWEEP, unit) == before
    sql, _warnings = view_definitions(str(tree))
    con = duckdb.connect()
    con.execute(sql)
    assert con.sql("SELECT count(*) FROM kdepth").fetchall() == [(len(answers["rows"]),)]
    assert _compact(tree) == []  # nothing left to compact
    summary = launch_in_process(tree, tiny_spec_text(SWEEP))  # a relaunch finds every unit done
    assert summary.n_skipped == summary.n_units


def test_a_launch_that_finishes_its_sweep_compacts_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPCHECK_COMPACT_FROM", "1")
    monkeypatch.setenv("SWAPCHECK_COMPACT_ROWS", str(ROWS))
    launch_in_process(tmp_path / "r", tiny_spec_text(SWEEP), budget_s=1e-9)  # stopped early: not finished
    assert not any(n.startswith("c-") for n in _files(tmp_path / "r"))
    launch_in_process(tmp_path / "r", tiny_spec_text(SWEEP))
    assert _files(tmp_path / "r") and all(n.startswith("c-") for n in _files(tmp_path / "r"))
    assert _problems(tmp_path / "r") == []
    monkeypatch.setenv("SWAPCHECK_COMPACT_ROWS", "lots")
    from orchestrator.errors import UsageError

    with pytest.raises(UsageError, match="SWAPCHECK_COMPACT_ROWS='lots'"):
        launch_in_process(tmp_path / "r", tiny_spec_text(SWEEP))


def test_a_unit_superseded_after_compaction_is_read_from_its_new_file_only(
        launched: tuple[Path, dict[str, Any]], tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.store import ResultStore

    _root, answers = launched
    _compact(tree)
    unit = answers["units"][3][0]
    row = ResultStore(tree).read_ledger(SWEEP).row(unit)
    assert row is not None
    ResultStore(tree).record_unit(SWEEP, {**row, "status": "failed", "error": "planted: recomputed later"})
    got = _answers(tree)
    assert [r for r in got["rows"] if r[0] == unit] == []  # its old rows in the compacted file are not read
    assert [r for r in got["rows"] if r[0] != unit] == [r for r in answers["rows"] if r[0] != unit]
    assert _problems(tree) == []
    monkeypatch.setenv("SWAPCHECK_COMPACT_FROM", "0")
    summary = launch_in_process(tree, tiny_spec_text(SWEEP))
    assert summary.n_ok == 1
    assert _answers(tree)["rows"] == answers["rows"]  # its rows once: the new file's, not the stale ones
    assert _problems(tree) == []


def _flip(p: Path, offset: int) -> None:
    data = bytearray(p.read_bytes())
    data[offset % len(data)] ^= 0x01
    p.write_bytes(bytes(data))


def test_a_damaged_compacted_file_marks_its_units_and_launch_repair_restores_them(
        launched: tuple[Path, dict[str, Any], ], tree: Path, monkeypatch: pytest.MonkeyPatch, fault_outcome: Any) -> None:
    import pyarrow.parquet as pq

    _root, answers = launched
    written = _compact(tree)
    victim = tree / written[1]
    held = set(pq.read_table(victim).column("unit_id").to_pylist())
    md = pq.ParquetFile(victim).metadata
    col = md.row_group(0).column(md.schema.names.index("differing"))
    _flip(victim, col.data_page_offset + col.total_compressed_size // 2)
    got = _answers(tree)
    assert {u for u, _s, d in got["units"] if d} == held
    assert {r[0] for r in got["rows"]} == {r[0] for r in answers["rows"]} - held
    assert any(written[1] in w for w in got["warnings"])
    problems = _problems(tree)
    assert {p.unit_id for p in problems} == held and {p.path for p in problems} == {written[1]}
    monkeypatch.setenv("SWAPCHECK_COMPACT_FROM", "0")
    summary = launch_in_process(tree, tiny_spec_text(SWEEP), repair=True)
    assert summary.n_ok == len(held)
    after = _answers(tree)
    fault_outcome(lost=len({r[0] for r in answers["rows"]} - {r[0] for r in after["rows"]}),
                  duplicated=len(after["rows"]) - len(set(after["rows"])),
                  silent_wrong=int(after["rows"] != answers["rows"]), stage="a compacted file damaged")
    assert after["rows"] == answers["rows"] and after["warnings"] == []
    assert _problems(tree) == [] and not victim.exists()  # set aside, not deleted
    assert list((tree / "_quarantine").rglob(victim.name))


KILL = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {repo!r})
    import storage.records as records
    from storage.store import ResultStore
    step = sys.argv[2]
    def hook(at, what):
        if at == step:
            os._exit(137)
    records._HOOK = hook
    ResultStore(sys.argv[1]).records({sweep!r}).compact(["kdepth"], 1, {rows})
""")


@pytest.mark.parametrize("step", ["chunk", "compacted"])
def test_a_compaction_killed_midway_loses_nothing_and_the_next_launch_finishes_it(
        launched: tuple[Path, dict[str, Any]], tree: Path, step: str, monkeypatch: pytest.MonkeyPatch,
        fault_outcome: Any) -> None:
    _root, answers = launched
    script = tree.parent / "cut_short.py"
    script.write_text(KILL.format(repo=str(REPO), sweep=SWEEP, rows=ROWS))
    done = subprocess.run([sys.executable, str(script), str(tree), step], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 137, done.stderr
    got = _answers(tree)
    fault_outcome(lost=len({r[0] for r in answers["rows"]} - {r[0] for r in got["rows"]}),
                  duplicated=len(got["rows"]) - len(answers["rows"]),
                  silent_wrong=int(got["rows"] != answers["rows"]), stage=f"compaction killed after {step}")
    assert got["rows"] == answers["rows"] and got["units"] == answers["units"]  # the leftovers are never read
    monkeypatch.setenv("SWAPCHECK_COMPACT_FROM", "1")
    monkeypatch.setenv("SWAPCHECK_COMPACT_ROWS", str(ROWS))
    summary = launch_in_process(tree, tiny_spec_text(SWEEP))  # the finished sweep's relaunch finishes it
    assert summary.n_skipped == summary.n_units
    assert all(n.startswith("c-") for n in _files(tree)) and len(_files(tree)) == 3
    assert _answers(tree) == answers and _problems(tree) == []


def test_a_full_disk_while_compacting_removes_nothing(launched: tuple[Path, dict[str, Any]], tree: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.errors import StorageFault
    from storage.store import ResultStore

    real = ResultStore._put

    def full(self: ResultStore, path: str, data: Any) -> None:
        if "/c-" in path:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, path, data)

    monkeypatch.setattr(ResultStore, "_put", full)
    with pytest.raises(StorageFault, match="No space left"):
        _compact(tree)
    assert not any(n.startswith("c-") for n in _files(tree)) and len(_files(tree)) == 12
    assert _answers(tree)["rows"] == launched[1]["rows"] and _problems(tree) == []
