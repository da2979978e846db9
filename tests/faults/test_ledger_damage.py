"""Issue #24, item 2: the ledger is verified like the data, recomputed, never a stack dump; issue #36: a
result file never vouches for itself.

A real kdepth sweep (6 units, launched in-process: the worker's own commit path) is computed once;
each case damages ONE ledger file (``table=units/sweep=ledg/<unit>.parquet``) in one way: truncated,
emptied, garbage, one bit or byte flipped at a named place (the magic, a page header, a data page of several columns,
the footer: its schema, created_by, Arrow schema and statistics, its length) or at evenly spread
offsets, a row of another unit, two rows, no row, a foreign or changed schema, a well-formed row
with altered values, a rewrite without page checksums, deleted. Then, per case:

* ``sweep verify`` flags the damaged unit (0 missed), and only it, with remedy ``recompute and
  compare``: the unit's result files look intact and carry its ledger row, but nothing vouches for them;
* the ledger reads never raise: a damaged entry is not done and is named; a file that still parses
  is trusted only when its row is exactly the committed one (no silent wrong row);
* ``repair`` (what ``launch --repair`` runs) sets the unit's files aside under ``_quarantine/``; once
  recomputed, the unit equals the undisturbed run and the files set aside compare equal to it. A
  result file forged through this very writer (the genuine ledger row in its metadata, values changed)
  is recomputed the same way, the true rows served and the difference named.

With Ray: ``launch`` without ``--repair`` over a damaged ledger exits 0, names the file and
``sweep verify`` in one warning and recomputes the unit (results equal to the undisturbed run but
for the timing columns; the recomputed ledger row differs only in its run columns ``VOLATILE``);
``launch --repair`` recomputes and compares. The subprocess checks (exit code, no ``Traceback``) are slow.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.plan import make_plan
from orchestrator.spec import load_spec
from orchestrator.worker import execute_unit
from storage.catalog import read_only_query
from storage.schemas import UNITS
from storage.store import ResultStore
from storage.verify import compare_with_aside, damaged_units, repair, verify
from tests.conftest import REPO, launch_in_process, tiny_spec_text

SWEEP = "ledg"
TIMING = {"seconds_a", "seconds_b"}  # kdepth columns that time the kernels: never equal between runs
#: Ledger columns of a recomputed unit that describe the run, not the result: they legitimately differ.
VOLATILE = {"started_at", "finished_at", "duration_s", "attempts", "host", "pid", "node_id", "files"}
cli = CliRunner()


# -- the undisturbed run --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(spec, results) of one undisturbed run of every unit through the worker's commit path."""
    base = tmp_path_factory.mktemp("ledger")
    spec_path = base / "s.toml"
    spec_path.write_text(tiny_spec_text(name=SWEEP, seeds=1))
    root = base / "results"
    summary = launch_in_process(root, spec_path)
    assert summary.n_ok == summary.n_units == 6, summary.failures
    return spec_path, root


@pytest.fixture
def tree(pristine: tuple[Path, Path], tmp_path: Path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(pristine[1], root)
    return root


def _units(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / f"table=units/sweep={SWEEP}").glob("*.parquet"))


def _ledger_file(root: Path, unit: str) -> Path:
    return root / f"table=units/sweep={SWEEP}/{unit}.parquet"


def _files(root: Path) -> dict[str, str]:
    """Every file of the tree but the quarantine and attempt markers -> SHA-256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and not str(p.relative_to(root)).startswith(("_quarantine", "_state"))}


def _rows(root: Path) -> list[dict[str, Any]]:
    rows = read_only_query(root, f"SELECT * FROM kdepth WHERE sweep = '{SWEEP}' ORDER BY unit_id, impl_a, impl_b, k, scale_mode")
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows.to_pylist()]


def _ledger_rows(root: Path) -> dict[str, dict[str, Any]]:
    return {u: {k: v for k, v in r.items() if k not in VOLATILE} for u, r in ResultStore(root).ledger_records(SWEEP).items()}


# -- the damages ----------------------------------------------------------------------------------

def _flip(p: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(p.read_bytes())
    data[offset % len(data)] ^= mask
    p.write_bytes(bytes(data))


def _footer(data: bytes) -> int:
    """Where the Parquet footer (FileMetaData) starts."""
    return len(data) - 8 - int.from_bytes(data[-8:-4], "little")


def _chunk(p: Path, column: str) -> tuple[int, int]:
    """(first byte, end) of a column chunk: its (dictionary and) data pages."""
    meta = pq.ParquetFile(p).metadata
    names = [meta.row_group(0).column(i).path_in_schema for i in range(meta.num_columns)]
    col = meta.row_group(0).column(names.index(column))
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    return start, start + col.total_compressed_size


def _in_footer(p: Path, needle: bytes, after: int = 0) -> int:
    """An offset inside the last occurrence of ``needle`` in the footer (a statistic, a name)."""
    data = p.read_bytes()
    at = data.rfind(needle, _footer(data))
    assert at >= 0, needle
    return at + min(after, len(needle) - 1)


def _at(where: Callable[[Path, str], int], mask: int = 0x01) -> Callable[[Path, str, str], None]:
    def damage(p: Path, unit: str, _other: str) -> None:
        _flip(p, where(p, unit), mask)
    return damage


def _page_body(column: str) -> Callable[[Path, str], int]:
    return lambda p, _u: _chunk(p, column)[1] - 1  # the last byte of the chunk: its data page's body


def _page_header(column: str) -> Callable[[Path, str], int]:
    return lambda p, _u: pq.ParquetFile(p).metadata.row_group(0).column(
        [c.name for c in pq.ParquetFile(p).schema].index(column)).data_page_offset + 1


def _dictionary_value(column: str, value: Callable[[Path, str], bytes]) -> Callable[[Path, str], int]:
    def where(p: Path, unit: str) -> int:
        start, end = _chunk(p, column)
        at = p.read_bytes().find(value(p, unit), start, end)
        assert at >= 0
        return at + 1
    return where


def _row(p: Path) -> dict[str, Any]:
    return dict(pq.read_table(p).to_pylist()[0])


def _write(p: Path, table: pa.Table, **kwargs: Any) -> None:
    pq.write_table(table, p, **kwargs)


def _truncate(p: Path, _u: str, _o: str) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _truncate_tail(p: Path, _u: str, _o: str) -> None:
    p.write_bytes(p.read_bytes()[:-1])


def _empty(p: Path, _u: str, _o: str) -> None:
    p.write_bytes(b"")


def _magic_only(p: Path, _u: str, _o: str) -> None:
    p.write_bytes(b"PAR1")


def _garbage(p: Path, _u: str, _o: str) -> None:
    p.write_bytes(bytes(b ^ 0x5A for b in p.read_bytes()))


def _random(p: Path, _u: str, _o: str) -> None:
    p.write_bytes(os.urandom(p.stat().st_size))


def _other_unit(p: Path, _u: str, other: str) -> None:
    shutil.copy(p.parent / f"{other}.parquet", p)


def _two_rows_other(p: Path, _u: str, other: str) -> None:
    _write(p, pa.concat_tables([pq.read_table(p), pq.read_table(p.parent / f"{other}.parquet")]))


def _two_rows_own(p: Path, _u: str, _o: str) -> None:
    t = pq.read_table(p)
    _write(p, pa.concat_tables([t, t]))


def _no_row(p: Path, _u: str, _o: str) -> None:
    _write(p, UNITS.empty_table())


def _foreign_schema(p: Path, unit: str, _o: str) -> None:
    _write(p, pa.table({"unit_id": [unit], "status": ["ok"], "something": [1.5]}))


def _extra_column(p: Path, _u: str, _o: str) -> None:
    t = pq.read_table(p)
    _write(p, t.append_column("extra", pa.array([1])))


def _changed_type(p: Path, _u: str, _o: str) -> None:
    t = pq.read_table(p)
    _write(p, t.set_column(t.schema.get_field_index("attempts"), "attempts", t.column("attempts").cast(pa.int64())))


def _forged(**values: Any) -> Callable[[Path, str, str], None]:
    """A well-formed ledger file, written the store's way, whose row differs from the committed one."""
    def damage(p: Path, unit: str, _o: str) -> None:
        row = _row(p)
        row.update({k: v(row) if callable(v) else v for k, v in values.items()})
        ResultStore(p.parents[2]).record_unit(SWEEP, row)
    return damage


def _no_page_checksums(p: Path, _u: str, _o: str) -> None:
    _write(p, pq.read_table(p))  # the same row, another writer's bytes (no CRCs, other encodings)


def _deleted(p: Path, _u: str, _o: str) -> None:
    p.unlink()


def _spread(i: int, n: int = 12) -> Callable[[Path, str, str], None]:
    return _at(lambda p, _u: p.stat().st_size * i // n, 0xFF)


CASES: dict[str, Callable[[Path, str, str], None]] = {
    "truncated-half": _truncate, "truncated-last-byte": _truncate_tail, "zero-length": _empty,
    "magic-only": _magic_only, "garbage": _garbage, "random-bytes": _random,
    "flip-head-magic": _at(lambda p, _u: 0),
    "flip-first-page-header": _at(lambda p, _u: 4),
    "flip-page-header-unit_id": _at(_page_header("unit_id")),
    "flip-page-header-status": _at(_page_header("status")),
    "flip-page-body-unit_id": _at(_page_body("unit_id")),
    "flip-page-body-status": _at(_page_body("status")),
    "flip-page-body-rows": _at(_page_body("rows")),
    "flip-page-body-finished_at": _at(_page_body("finished_at")),
    "flip-page-body-files-sha256": _at(_page_body("files.list.element.sha256")),
    "flip-dictionary-status-ok": _at(_dictionary_value("status", lambda p, u: b"ok")),
    "flip-dictionary-unit_id": _at(_dictionary_value("unit_id", lambda p, u: u.encode())),
    "flip-dictionary-params_json": _at(_dictionary_value("params_json", lambda p, u: _row(p)["params_json"].encode()[:24])),
    "flip-dictionary-sha256": _at(_dictionary_value("files.list.element.sha256",
                                                    lambda p, u: _row(p)["files"][0]["sha256"].encode()[:16])),
    "flip-footer-first-byte": _at(lambda p, _u: _footer(p.read_bytes())),
    "flip-footer-middle": _at(lambda p, _u: (_footer(p.read_bytes()) + p.stat().st_size - 8) // 2),
    "flip-footer-column-name": _at(lambda p, _u: _in_footer(p, b"params_json", 3)),
    "flip-footer-created-by": _at(lambda p, _u: _in_footer(p, b"parquet-cpp-arrow", 5)),
    "flip-footer-created-by-version": _at(lambda p, _u: _in_footer(p, b"version ", 7) + 1),
    "flip-footer-arrow-schema": _at(lambda p, _u: _in_footer(p, b"ARROW:schema") + 40),
    "flip-footer-stats-unit_id": _at(lambda p, u: _in_footer(p, u.encode(), 10)),
    "flip-footer-stats-params_json": _at(lambda p, u: _in_footer(p, _row(p)["params_json"].encode()[:20], 12)),
    "flip-footer-stats-sha256": _at(lambda p, u: _in_footer(p, _row(p)["files"][0]["sha256"].encode()[:20], 4)),
    "flip-footer-stats-status": _at(lambda p, u: _in_footer(p, b"ok", 1)),
    "flip-footer-length": _at(lambda p, _u: p.stat().st_size - 8),
    "flip-tail-magic": _at(lambda p, _u: p.stat().st_size - 1),
    **{f"flip-byte-at-{i}-of-12": _spread(i) for i in range(1, 12)},
    "row-of-another-unit": _other_unit, "two-rows-own-and-other": _two_rows_other, "two-rows-own-twice": _two_rows_own,
    "no-row": _no_row, "foreign-schema": _foreign_schema, "extra-column": _extra_column,
    "changed-type": _changed_type,
    "forged-status-failed": _forged(status="failed"), "forged-rows": _forged(rows=999),
    "forged-sha256": _forged(files=lambda r: [{**f, "sha256": "0" * 64} for f in r["files"]]),
    "forged-spec-sha": _forged(spec_sha256="f" * 64),
    "forged-no-files": _forged(files=[]),
    "rewritten-without-page-checksums": _no_page_checksums,
    "deleted": _deleted,
}
STRUCTURAL = {"unreadable", "schema", "rows", "wrong_unit"}  # damage the ledger reads see themselves
#: Rows rewritten well-formed through the store (tampering, not decay): the reads trust an intact file;
#: verify's cross-check against the row each result file carries finds them.
FORGED = {name for name in CASES if name.startswith("forged-")}
#: A forged SHA-256 makes the (intact) result file disagree with its record: the unit is recomputed.
RECOMPUTED = {"forged-sha256"}


#: The evenly spread byte flips run with the slow set (the named flips cover each region by default).
@pytest.fixture(params=[pytest.param(c, marks=pytest.mark.slow) if c.startswith("flip-byte-at-") else c
                        for c in sorted(CASES)])
def damaged(request: pytest.FixtureRequest, tree: Path) -> tuple[Path, str, str]:
    """(root, damaged unit, case): the first or (every other case) the last unit's ledger file damaged."""
    units = _units(tree)
    unit, other = (units[-1], units[0]) if sorted(CASES).index(request.param) % 2 else (units[0], units[-1])
    CASES[request.param](_ledger_file(tree, unit), unit, other)
    return tree, unit, request.param


# -- verify, reads, repair: in process, no Ray ----------------------------------------------------

def test_there_are_many_cases() -> None:
    assert len(CASES) >= 40


def test_verify_flags_the_unit_reads_never_raise_and_repair_recomputes_and_compares_it(
        pristine: tuple[Path, Path], damaged: tuple[Path, str, str], fault_outcome: Any) -> None:
    root, unit, case = damaged
    clean_files, clean_ledger = _files(pristine[1]), ResultStore(pristine[1]).ledger_records(SWEEP)
    store = ResultStore(root)
    problems = verify(store, SWEEP)
    flagged = [p for p in problems if p.damage]
    assert flagged, f"{case}: verify missed it"
    assert {p.unit_id for p in flagged} == {unit}, (case, flagged)
    remedy = "recompute" if case in RECOMPUTED else "recompute and compare"
    assert all(p.remedy == remedy for p in flagged), flagged
    if case not in RECOMPUTED:
        assert all(p.table == "units" and p.path == f"table=units/sweep={SWEEP}/{unit}.parquet" for p in flagged), flagged
    assert damaged_units(store, SWEEP, problems) == {unit}

    # The reads: never an exception; a damaged entry is not done and named; what is trusted is exact.
    read = store.read_ledger(SWEEP)
    assert set(read.rows) | {d.unit_id for d in read.damaged} >= set(_units(pristine[1])) - {unit}
    silent = 0
    if unit in read.rows:
        silent = int(read.rows[unit] != clean_ledger[unit] and case not in FORGED)
        assert not silent, f"{case}: the ledger reads trust a row that is not the committed one"
    else:
        assert unit not in store.done_units(SWEEP)
        if any(p.kind in STRUCTURAL for p in flagged):
            assert [d.unit_id for d in read.damaged] == [unit]
            (line,) = read.warnings("RES")
            assert f"table=units/sweep={SWEEP}/{unit}.parquet" in line and "swapcheck sweep verify" in line
            assert "--repair" in line
    for u in set(read.rows) - {unit}:
        assert read.rows[u] == clean_ledger[u]

    # launch --repair's repair: the unit set aside, then (what the relaunch does) recomputed and compared.
    done = repair(store, SWEEP, damaged_units(store, SWEEP, problems), problems=problems)
    if case != "deleted":
        assert (root / done.quarantine / f"table=units/sweep={SWEEP}/{unit}.parquet").is_file()  # evidence kept
    assert unit not in store.done_units(SWEEP) and done.compare == ([] if case in RECOMPUTED else [unit])
    _recompute(pristine[0], root, unit)
    assert _rows(root) == _rows(pristine[1]) and _ledger_rows(root) == _ledger_rows(pristine[1])
    if case not in RECOMPUTED:  # the files set aside were as committed: they compare equal
        assert compare_with_aside(store, SWEEP, unit, done.quarantine) is None
    after = {k: v for k, v in _files(root).items() if unit not in k}
    clean_files = {k: v for k, v in clean_files.items() if unit not in k}
    lost = len(set(clean_files) - set(after))
    assert after == clean_files, f"{case}: the tree differs from the undisturbed run after repair"
    assert verify(store, SWEEP) == [] and store.done_units(SWEEP) == set(_units(pristine[1]))
    fault_outcome(lost=lost, duplicated=0, silent_wrong=silent, detected=True, stage="ledger-repair", case=case)


def _recompute(spec_path: Path, root: Path, unit: str) -> None:
    """The one unit ``repair`` set aside, through the worker's commit path. Not a relaunch: the tree is
    then compared with the undisturbed one file for file, and a launch adds a launch record of its own
    (the relaunch itself is the Ray tests' below)."""
    spec = load_spec(spec_path)
    (u,) = [u for u in make_plan(spec).units if u.id == unit]
    assert execute_unit({**u.to_payload(), "description": u.describe()}, str(root), SWEEP, spec.sha256)["status"] == "ok"


def test_a_unit_whose_data_is_damaged_too_is_recomputed_not_compared(tree: Path) -> None:
    """Two faults on one unit: its ledger file and its result file. Nothing to compare with."""
    unit = _units(tree)[0]
    _truncate(_ledger_file(tree, unit), unit, unit)
    _flip(tree / f"table=kdepth/sweep={SWEEP}/{unit}.parquet", -20)  # the result file's footer
    store = ResultStore(tree)
    problems = verify(store, SWEEP)
    assert {p.unit_id for p in problems if p.damage} == {unit}
    assert all(p.remedy == "recompute" for p in problems if p.damage), problems
    done = repair(store, SWEEP, damaged_units(store, SWEEP, problems), problems=problems)
    assert done.compare == [] and done.units == [unit]
    assert sorted(done.moved) == sorted([f"table=units/sweep={SWEEP}/{unit}.parquet",
                                         f"table=kdepth/sweep={SWEEP}/{unit}.parquet"])
    assert unit not in store.done_units(SWEEP) and verify(store, SWEEP) == []


def _forge(tree: Path, unit: str) -> int:
    """Issue #36's forged file: the unit's ledger file deleted, its kdepth result file rewritten through
    the store's own writer with the genuine ledger row in its metadata and ``differing = 999``. Returns
    its row count."""
    from storage.schemas import LEDGER_ROW_KEY, TABLES
    from storage.store import parquet_bytes

    result = tree / f"table=kdepth/sweep={SWEEP}/{unit}.parquet"
    carried = pq.ParquetFile(result).metadata.metadata[LEDGER_ROW_KEY.encode()].decode()
    t = pq.read_table(result).cast(TABLES["kdepth"])
    i = t.column_names.index("differing")
    t = t.set_column(i, "differing", pa.array([999] * t.num_rows, t.schema.field(i).type))
    result.write_bytes(bytes(parquet_bytes(t, {LEDGER_ROW_KEY: carried})))
    _ledger_file(tree, unit).unlink()
    return t.num_rows


def test_a_result_file_forged_through_this_writer_is_recomputed_and_the_truth_served(
        pristine: tuple[Path, Path], tree: Path, fault_outcome: Any) -> None:
    """Verify cannot tell the forged file from a committed one, so it does not trust it: remedy recompute
    and compare; repair sets it aside, the recomputation serves the true rows, the comparison names it."""
    unit = _units(tree)[0]
    n = _forge(tree, unit)
    store = ResultStore(tree)
    problems = verify(store, SWEEP)
    assert [(p.unit_id, p.remedy) for p in problems if p.damage] == [(unit, "recompute and compare")], problems
    forged_sum = read_only_query(tree, f"SELECT sum(differing)::BIGINT AS d FROM kdepth WHERE unit_id = '{unit}'")
    assert forged_sum.to_pylist() == [{"d": None}]  # no ledger entry: not served (the old repair rebuilt one)
    done = repair(store, SWEEP, damaged_units(store, SWEEP, problems), problems=problems)
    assert done.compare == [unit] and unit not in store.done_units(SWEEP)
    _recompute(pristine[0], tree, unit)
    assert _rows(tree) == _rows(pristine[1])  # the true rows
    why = compare_with_aside(store, SWEEP, unit, done.quarantine)
    assert why is not None and f"table kdepth: {n} of {n} rows differ (columns differing)" in why, why
    assert verify(store, SWEEP) == []
    fault_outcome(lost=0, duplicated=0, silent_wrong=0, detected=True, stage="ledger-repair", case="forged-result-file")


@pytest.mark.slow  # a real in-process `launch --repair`
def test_launch_repair_over_a_forged_result_file_serves_the_truth_and_says_so(
        ray_local: object, pristine: tuple[Path, Path], tree: Path) -> None:
    spec, clean = pristine
    unit = _units(tree)[-1]
    n = _forge(tree, unit)
    fixed = _launch(spec, tree, "--repair")
    assert fixed.exit_code == 0, fixed.output
    out = " ".join(fixed.output.split())
    assert f"unit {unit}: the result files that had lost their ledger entry DIFFER from its recomputation " \
           f"(table kdepth: {n} of {n} rows differ (columns differing))" in out, out
    assert _rows(tree) == _rows(clean) and verify(ResultStore(tree), SWEEP) == []


def test_a_row_of_another_unit_never_moves_that_units_files(tree: Path) -> None:
    """repair: the copied row's records are not followed."""
    units = _units(tree)
    a, b = units[0], units[1]
    _other_unit(_ledger_file(tree, a), a, b)
    b_file = tree / f"table=kdepth/sweep={SWEEP}/{b}.parquet"
    before = b_file.read_bytes()
    store = ResultStore(tree)
    done = repair(store, SWEEP, damaged_units(store, SWEEP))
    assert done.units == [a] and b_file.read_bytes() == before and b in store.done_units(SWEEP)


def test_a_result_file_carries_its_units_ledger_row(pristine: tuple[Path, Path]) -> None:
    from storage.schemas import LEDGER_ROW_KEY
    from storage.store import ledger_row_from_metadata

    root = pristine[1]
    for unit, row in ResultStore(root).ledger_records(SWEEP).items():
        meta = pq.ParquetFile(root / f"table=kdepth/sweep={SWEEP}/{unit}.parquet").metadata.metadata
        sweep, carried = ledger_row_from_metadata(meta[LEDGER_ROW_KEY.encode()])
        assert sweep == SWEEP
        assert carried["files"] == [{"table": "kdepth", "path": f"table=kdepth/sweep={SWEEP}/{unit}.parquet",
                                     "rows": row["files"][0]["rows"]}]
        assert {k: v for k, v in carried.items() if k != "files"} == {k: v for k, v in row.items() if k != "files"}


# -- launch over a damaged ledger (Ray) -----------------------------------------------------------

LAUNCH_CASES = ["truncated-half", "row-of-another-unit", "foreign-schema", "flip-page-body-status", "deleted"]


def _launch(spec: Path, root: Path, *extra: str) -> Any:
    return cli.invoke(app, ["sweep", "launch", str(spec), "--results", str(root), "--no-progress", *extra])


@pytest.mark.parametrize("case", [LAUNCH_CASES[0], pytest.param(LAUNCH_CASES[1], marks=pytest.mark.slow)])
def test_launch_over_a_damaged_ledger_warns_and_recomputes_the_unit(ray_local: object, pristine: tuple[Path, Path],
                                                                   tree: Path, case: str) -> None:
    spec, clean = pristine
    unit, other = _units(tree)[0], _units(tree)[-1]
    CASES[case](_ledger_file(tree, unit), unit, other)
    res = _launch(spec, tree)
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output and "1 ok" in res.output, res.output
    warned = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert warned and f"{unit}.parquet" in warned[0] and "sweep verify" in warned[0], res.stderr
    assert _rows(tree) == _rows(clean) and _ledger_rows(tree) == _ledger_rows(clean)
    assert verify(ResultStore(tree), SWEEP) == []


@pytest.mark.slow  # a real in-process `launch` then `launch --repair` per case
@pytest.mark.parametrize("case", LAUNCH_CASES)
def test_launch_repair_recomputes_the_unit_and_confirms_its_old_files(ray_local: object, pristine: tuple[Path, Path],
                                                                      tree: Path, case: str) -> None:
    spec, clean = pristine
    unit, other = _units(tree)[-1], _units(tree)[0]
    CASES[case](_ledger_file(tree, unit), unit, other)
    fixed = _launch(spec, tree, "--repair")
    assert fixed.exit_code == 0, fixed.output
    out = " ".join(fixed.output.split())
    assert "1 ok" in out and "1 recomputed unit(s) equal the result files set aside" in out, out
    assert _rows(tree) == _rows(clean) and _ledger_rows(tree) == _ledger_rows(clean)
    keep = {k: v for k, v in _files(clean).items() if not k.startswith("table=launches") and unit not in k}
    assert {k: v for k, v in _files(tree).items() if not k.startswith("table=launches") and unit not in k} == keep
    assert verify(ResultStore(tree), SWEEP) == []


def _subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # the real CLI in a subprocess: exit codes and stderr as a user sees them
@pytest.mark.parametrize("case", ["truncated-half"])  # the rest: in process, above, and test_campaign.py
def test_cli_launch_and_repair_never_dump_a_stack(pristine: tuple[Path, Path], tree: Path, case: str) -> None:
    spec, clean = pristine
    unit, other = _units(tree)[0], _units(tree)[-1]
    CASES[case](_ledger_file(tree, unit), unit, other)
    found = _subprocess("sweep", "verify", "--results", str(tree), "--sweep", SWEEP)
    assert found.returncode == 1 and "recompute and compare" in " ".join(found.stderr.split()), found
    assert "Traceback" not in found.stderr
    plain = _subprocess("sweep", "launch", str(spec), "--results", str(tree), "--no-progress", "--num-cpus", "1")
    assert plain.returncode == 0 and "Traceback" not in plain.stderr, plain.stderr
    if case != "flip-footer-stats-unit_id":  # a file that still reads is trusted as done (verify finds it)
        assert "warning:" in plain.stderr and "sweep verify" in plain.stderr and "1 ok" in plain.stderr, plain.stderr
    _truncate(_ledger_file(tree, unit), unit, other)  # damaged again, now for --repair
    fixed = _subprocess("sweep", "launch", str(spec), "--results", str(tree), "--no-progress", "--repair", "--num-cpus", "1")
    assert fixed.returncode == 0 and "Traceback" not in fixed.stderr, fixed.stderr
    assert "equal the result files set aside" in " ".join(fixed.stderr.split()), fixed.stderr
    assert _subprocess("sweep", "verify", "--results", str(tree), "--sweep", SWEEP).returncode == 0
    assert _rows(tree) == _rows(clean) and _ledger_rows(tree) == _ledger_rows(clean)
