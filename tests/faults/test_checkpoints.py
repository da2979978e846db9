"""Ledger checkpoints (storage.records): what a launch, a relaunch, the catalog, ``sweep verify`` and
``launch --repair`` see before and after one, and faults at every step of writing one (a kill after
each step, a full disk, damaged bytes) with nothing lost, nothing counted twice and no wrong answer.

The sweep is the tests' tiny INT8 sweep, launched in process (tests.conftest.launch_in_process) with
``SWAPCHECK_CHECKPOINT_FROM=1`` so that a launch ends with a checkpoint."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, launch_in_process, tiny_spec_text

SWEEP = "cp"


def _ledger_files(root: Path) -> list[Path]:
    return sorted((root / f"table=units/sweep={SWEEP}").glob("*.parquet"))


def _checkpoints(root: Path) -> list[Path]:
    return sorted((root / f"table=units/sweep={SWEEP}/_checkpoints").glob("*.parquet"))


def _answers(root: Path) -> dict[str, Any]:
    """What a user reads: the units view and the result rows, through the catalog."""
    from storage.catalog import open_catalog

    with open_catalog(str(root)) as cat:
        units = [tuple(r.values()) for r in cat.query("SELECT unit_id, status, damaged FROM units ORDER BY unit_id").to_pylist()]
        rows = [tuple(r.values()) for r in
                cat.query("SELECT unit_id, impl_a, impl_b, k, differing FROM kdepth ORDER BY ALL").to_pylist()]
        return {"units": units, "rows": rows, "warnings": list(cat.warnings)}


def _ledger_rows(root: Path) -> dict[str, dict[str, Any]]:
    from storage.store import ResultStore

    return ResultStore(root).read_ledger(SWEEP).rows


def _problems(root: Path) -> list[Any]:
    from storage.store import ResultStore
    from storage.verify import verify

    return [p for p in verify(ResultStore(root), SWEEP) if p.damage]


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any], dict[str, Any]]]:
    """A finished sweep without a checkpoint (``SWAPCHECK_CHECKPOINT_FROM=0``), its answers and ledger."""
    root = tmp_path_factory.mktemp("cp") / "results"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWAPCHECK_CHECKPOINT_FROM", "0")
        summary = launch_in_process(root, tiny_spec_text(SWEEP))
    assert summary.n_ok == summary.n_units > 4
    assert not _checkpoints(root) and len(_ledger_files(root)) == summary.n_units
    yield root, _answers(root), _ledger_rows(root)


@pytest.fixture
def tree(launched: tuple[Path, dict[str, Any], dict[str, Any]], tmp_path: Path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(launched[0], root, symlinks=True)
    return root


def _checkpoint(root: Path) -> Any:
    from storage.store import ResultStore

    return ResultStore(root).records(SWEEP).checkpoint()


def test_a_checkpoint_replaces_the_ledger_files_and_every_answer_stays(
        launched: tuple[Path, dict[str, Any], dict[str, Any]], tree: Path) -> None:
    _root, answers, ledger = launched
    cp = _checkpoint(tree)
    assert cp is not None and [p.name for p in _checkpoints(tree)] == [cp.rel.rsplit("/", 1)[1]]
    assert _ledger_files(tree) == []  # the small files it replaced are gone
    assert _ledger_rows(tree) == ledger
    assert _answers(tree) == answers
    assert _problems(tree) == []
    t = pq.read_table(tree / cp.rel)
    assert t.num_rows == len(ledger) and sorted(t.column("unit_id").to_pylist()) == t.column("unit_id").to_pylist()
    meta = json.loads(t.schema.metadata[b"swapcheck.checkpoint"])
    assert meta["sweep"] == SWEEP and meta["units"] == len(ledger) and meta["replaced"] == len(ledger)
    # A relaunch reads it and skips every unit.
    summary = launch_in_process(tree, tiny_spec_text(SWEEP))
    assert summary.n_skipped == summary.n_units and summary.n_ok == 0


def test_a_later_ledger_file_supersedes_the_checkpoint_and_the_next_one_merges_it(
        launched: tuple[Path, dict[str, Any], dict[str, Any]], tree: Path) -> None:
    from storage.store import ResultStore

    _checkpoint(tree)
    unit = sorted(launched[2])[0]
    row = {**launched[2][unit], "status": "failed", "error": "planted: a later write of this unit"}
    ResultStore(tree).record_unit(SWEEP, row)
    read = ResultStore(tree).read_ledger(SWEEP)
    assert read.rows[unit]["status"] == "failed" and unit not in read.done()
    assert dict(_answers(tree)["units"] and {u: s for u, s, _d in _answers(tree)["units"]})[unit] == "failed"
    assert len(_answers(tree)["units"]) == len(launched[2])  # once, not twice
    cp2 = _checkpoint(tree)
    assert cp2 is not None and cp2.seq == 2 and len(_checkpoints(tree)) == 1 and _ledger_files(tree) == []
    assert ResultStore(tree).read_ledger(SWEEP).rows[unit]["status"] == "failed"
    # The relaunch recomputes exactly that unit; the launch's checkpoint merges it back.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWAPCHECK_CHECKPOINT_FROM", "1")
        summary = launch_in_process(tree, tiny_spec_text(SWEEP))
    assert summary.n_ok == 1 and summary.n_skipped == summary.n_units - 1
    assert _ledger_files(tree) == [] and _ledger_rows(tree)[unit]["status"] == "ok"
    assert _answers(tree)["rows"] == launched[1]["rows"]


def test_a_launch_writes_a_checkpoint_from_the_threshold_and_a_bad_threshold_exits_2(tmp_path: Path,
                                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.errors import UsageError

    monkeypatch.setenv("SWAPCHECK_CHECKPOINT_FROM", "many")
    with pytest.raises(UsageError, match="SWAPCHECK_CHECKPOINT_FROM='many'"):
        launch_in_process(tmp_path / "r", tiny_spec_text(SWEEP))
    assert not (tmp_path / "r").exists()  # refused before anything was written
    monkeypatch.setenv("SWAPCHECK_CHECKPOINT_FROM", "1000")
    summary = launch_in_process(tmp_path / "r", tiny_spec_text(SWEEP))
    assert not _checkpoints(tmp_path / "r") and len(_ledger_files(tmp_path / "r")) == summary.n_units
    monkeypatch.setenv("SWAPCHECK_CHECKPOINT_FROM", str(summary.n_units))
    launch_in_process(tmp_path / "r", tiny_spec_text(SWEEP))  # nothing to run: the relaunch merges the tail
    assert len(_checkpoints(tmp_path / "r")) == 1 and _ledger_files(tmp_path / "r") == []


KILL = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {repo!r})
    import storage.records as records
    from storage.store import ResultStore
    step, nth = sys.argv[2], int(sys.argv[3])
    calls = {{"n": 0}}
    def hook(at, what):
        if at == step:
            calls["n"] += 1
            if calls["n"] == nth:
                os._exit(137)  # as a SIGKILL: no cleanup, no flush
    records._HOOK = hook
    if step == "staged":
        real = ResultStore._put
        def put(self, path, data):
            if "/_checkpoints/" in path:
                tmp = self._stage(path, data)  # staged and fsynced, never renamed
                os._exit(137)
            return real(self, path, data)
        ResultStore._put = put
    ResultStore(sys.argv[1]).records({sweep!r}).checkpoint()
""")


@pytest.mark.parametrize("step,nth", [("staged", 1), ("published", 1), ("removed", 1), ("removed", 3), ("removed", 10**6)])
def test_a_checkpoint_killed_at_any_step_loses_nothing_and_the_next_one_finishes(
        launched: tuple[Path, dict[str, Any], dict[str, Any]], tree: Path, step: str, nth: int,
        fault_outcome: Any) -> None:
    _root, answers, ledger = launched
    cut_short = tree.parent / "cut_short.py"
    cut_short.write_text(KILL.format(repo=str(REPO), sweep=SWEEP))
    done = subprocess.run([sys.executable, str(cut_short), str(tree), step, str(nth)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    killed = done.returncode == 137
    assert killed or (step, nth) == ("removed", 10**6), done.stderr
    after = _ledger_rows(tree)
    lost = len(set(ledger) - set(after))
    wrong = sum(1 for u in ledger if u in after and after[u] != ledger[u])
    got = _answers(tree)
    duplicated = len(got["units"]) - len({u for u, _s, _d in got["units"]})
    fault_outcome(lost=lost, duplicated=duplicated, silent_wrong=wrong + int(got["rows"] != answers["rows"]),
                  stage=f"checkpoint killed after {step} #{nth}")
    assert lost == 0 and wrong == 0 and duplicated == 0
    assert got["units"] == answers["units"] and got["rows"] == answers["rows"]
    assert _problems(tree) == []
    _checkpoint(tree)  # the next checkpoint finishes what this one left (nothing, when it was not cut short)
    assert len(_checkpoints(tree)) == 1 and _ledger_files(tree) == [] and _ledger_rows(tree) == ledger
    assert not list(tree.rglob(".*.tmp-*")) or step == "staged"  # a killed writer's temporary: swept as any other


def test_a_full_disk_while_checkpointing_removes_nothing_and_the_launch_only_warns(
        launched: tuple[Path, dict[str, Any], dict[str, Any]], tree: Path, monkeypatch: pytest.MonkeyPatch,
        fault_outcome: Any) -> None:
    from storage.errors import StorageFault
    from storage.store import ResultStore

    real = ResultStore._put

    def full(self: ResultStore, path: str, data: Any) -> None:
        if "/_checkpoints/" in path:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, path, data)

    monkeypatch.setattr(ResultStore, "_put", full)
    with pytest.raises(StorageFault, match="No space left"):
        _checkpoint(tree)
    assert len(_ledger_files(tree)) == len(launched[2]) and not _checkpoints(tree)
    monkeypatch.setenv("SWAPCHECK_CHECKPOINT_FROM", "1")
    events: list[tuple[str, dict[str, Any]]] = []
    summary = launch_in_process(tree, tiny_spec_text(SWEEP), on_event=lambda k, i: events.append((k, i)))
    assert summary.n_skipped == summary.n_units
    warned = [i["line"] for k, i in events if k == "message" and "checkpoint" in i.get("line", "")]
    assert warned and "No space left" in warned[0] and "next launch tries again" in warned[0]
    after = _ledger_rows(tree)
    fault_outcome(lost=len(set(launched[2]) - set(after)), duplicated=0,
                  silent_wrong=int(_answers(tree)["rows"] != launched[1]["rows"]), stage="checkpoint on a full disk")
    assert after == launched[2]


def _flip(p: Path, offset: int) -> None:
    data = bytearray(p.read_bytes())
    data[offset % len(data)] ^= 0x01
    p.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["data_page", "footer", "renamed"])
def test_a_damaged_checkpoint_is_never_trusted_and_launch_repair_restores_the_sweep(
        launched: tuple[Path, dict[str, Any], dict[str, Any]], tree: Path, damage: str, fault_outcome: Any) -> None:
    _root, answers, ledger = launched
    cp = _checkpoint(tree)
    path = tree / cp.rel
    if damage == "data_page":
        md = pq.ParquetFile(path).metadata
        col = md.row_group(0).column(5)  # status
        _flip(path, col.data_page_offset + col.total_compressed_size // 2)
    elif damage == "footer":
        _flip(path, path.stat().st_size - 20)
    else:  # other bytes under the name of a checkpoint: a copy of another sweep's, say
        path.rename(path.with_name(f"{cp.seq:010d}-{'0' * 64}.parquet"))
    from storage.store import ResultStore

    read = ResultStore(tree).read_ledger(SWEEP)
    assert read.done() == set() and read.warnings(str(tree)) and "checkpoint" in read.warnings(str(tree))[0]
    got = _answers(tree)
    assert got["rows"] == [] and any("ledger checkpoint" in w for w in got["warnings"])
    problems = _problems(tree)
    kinds = {(p.table, p.kind, p.remedy) for p in problems}
    assert ("units", "checksum", "set aside") in kinds
    assert {p.unit_id for p in problems if p.remedy == "recompute and compare"} == set(ledger)
    events: list[tuple[str, dict[str, Any]]] = []
    summary = launch_in_process(tree, tiny_spec_text(SWEEP), repair=True, on_event=lambda k, i: events.append((k, i)))
    assert summary.n_ok == summary.n_units
    lines = [i["line"] for k, i in events if k == "message"]
    assert any("those files were as committed" in line for line in lines), lines
    after = _answers(tree)
    fault_outcome(lost=len(set(ledger) - {u for u, s, _d in after["units"] if s == "ok"}),
                  duplicated=len(after["units"]) - len({u for u, _s, _d in after["units"]}),
                  silent_wrong=int(after["rows"] != answers["rows"]), stage=f"checkpoint damaged: {damage}")
    assert after["rows"] == answers["rows"] and [(u, s) for u, s, _d in after["units"]] == \
        [(u, s) for u, s, _d in answers["units"]]
    assert _problems(tree) == []


def test_a_checkpoint_row_unlike_the_file_it_replaced_is_named_and_recomputed(
        launched: tuple[Path, dict[str, Any], dict[str, Any]], tree: Path) -> None:
    """A checkpoint rewritten with one row changed but named with its new SHA-256 (so its name is
    right): verify checks each row against the ledger file it replaced."""
    import hashlib

    import pyarrow as pa

    from storage.records import _checkpoint_bytes

    cp = _checkpoint(tree)
    t = pq.read_table(tree / cp.rel)
    meta = json.loads(t.schema.metadata[b"swapcheck.checkpoint"])
    durations = t.column("duration_s").to_pylist()
    durations[0] = (durations[0] or 0.0) + 1.0
    forged = t.set_column(t.schema.get_field_index("duration_s"), "duration_s", pa.array(durations, pa.float64()))
    data = _checkpoint_bytes(forged.replace_schema_metadata(None), meta)
    (tree / cp.rel).unlink()
    (tree / cp.rel).with_name(f"{cp.seq:010d}-{hashlib.sha256(data).hexdigest()}.parquet").write_bytes(data.to_pybytes())
    unit = t.column("unit_id")[0].as_py()
    problems = _problems(tree)
    assert [(p.unit_id, p.kind) for p in problems] == [(unit, "checksum")]
    assert "not the ledger file it replaced" in problems[0].detail
    summary = launch_in_process(tree, tiny_spec_text(SWEEP), repair=True)
    assert summary.n_ok == 1 and _problems(tree) == []


def test_launch_repair_of_a_checkpointed_unit_with_a_damaged_result_file_recomputes_it(
        launched: tuple[Path, dict[str, Any], dict[str, Any]], tree: Path) -> None:
    _checkpoint(tree)
    unit = sorted(launched[2])[1]
    (tree / launched[2][unit]["files"][0]["path"]).write_bytes(b"not parquet")
    assert {p.unit_id for p in _problems(tree)} == {unit}
    summary = launch_in_process(tree, tiny_spec_text(SWEEP), repair=True)
    assert summary.n_ok == 1 and _problems(tree) == []
    assert _answers(tree)["rows"] == launched[1]["rows"] and _ledger_rows(tree)[unit]["status"] == "ok"


def test_the_db_export_reads_the_checkpoint_as_the_catalog_does(
        launched: tuple[Path, dict[str, Any], dict[str, Any]], tree: Path) -> None:
    import duckdb

    from storage.catalog import view_definitions
    from storage.store import ResultStore

    _checkpoint(tree)
    unit = sorted(launched[2])[2]
    ResultStore(tree).record_unit(SWEEP, {**launched[2][unit], "status": "failed", "error": "planted"})
    sql, _warnings = view_definitions(str(tree))
    con = duckdb.connect()
    con.execute(sql)
    got = con.sql("SELECT unit_id, status FROM units ORDER BY unit_id").fetchall()
    assert got == [(u, "failed" if u == unit else s) for u, s, _d in launched[1]["units"]]


def test_file_problem_is_the_one_rule_most_telling_first() -> None:
    from storage.records import file_problem

    rec = {"rows": 3, "bytes": 100, "sha256": "a" * 64}
    assert file_problem(rec, size=100, rows=3, sha256="a" * 64) is None
    assert file_problem(rec) is None  # nothing looked at yet
    assert file_problem(rec, size=90, rows=2, schema_problem="other columns") == ("schema", "other columns")
    assert file_problem(rec, size=90, rows=2)[0] == "rows"
    assert file_problem(rec, size=90)[0] == "truncated" and file_problem(rec, size=101)[0] == "extended"
    kind, detail = file_problem(rec, size=100, sha256="b" * 64)
    assert kind == "checksum" and "bbbbbbbbbbbb" in detail and "aaaaaaaaaaaa" in detail
    assert file_problem({"rows": None, "bytes": None, "sha256": None}, size=5, rows=5, sha256="c") is None  # legacy
