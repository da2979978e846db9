"""The fault campaign: every single-file fault a results tree can suffer, each measured end to end.

One real kdepth sweep (6 units) is launched once. Each case copies its tree, does one thing to one
file — damages a unit's data file or its ledger file (deleted, truncated, extended, garbage, one bit
flipped in the header, a data page, a footer statistic or the footer length, swapped for another
unit's file) or adds a file nobody committed (a ghost sweep, an orphan, a misnamed ledger copy, a
file of another table, a link out of the root, a stale temporary) — and then measures what a user
would get:

* **reads**: the rows ``kdepth`` and ``units`` show for the sweep equal the undisturbed run's, or a
  warning names the file or its unit (or the command fails loudly). A changed answer without either
  is a *silent wrong answer*; the count of those must be 0.
* **verify**: ``sweep verify`` names the file or its unit (every case but the ones that change no
  file a reader could take for a result).
* **relaunch** (slow set): a plain ``sweep launch`` never dumps a stack; ``sweep launch --repair``
  exits 0 and leaves rows bit-identical to the undisturbed run (timing columns aside), ``sweep
  verify`` clean, every unit ``ok``. Rows lost and rows duplicated are counted, not assumed.

Each measured case is recorded with ``fault_outcome`` (tests/faults/conftest.py); ``tools/fault_report.py``
tallies the records into the table of docs/reliability.md.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.conftest import tiny_spec_text

SWEEP = "camp"
TIMING = {"seconds_a", "seconds_b"}
cli = CliRunner()


# -- the undisturbed run ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def launched(ray_local: object, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(spec, results) of one undisturbed launch."""
    base = tmp_path_factory.mktemp("campaign")
    spec = base / "s.toml"
    spec.write_text(tiny_spec_text(name=SWEEP, seeds=1))
    results = base / "results"
    res = cli.invoke(app, ["sweep", "launch", str(spec), "--results", str(results), "--no-progress"])
    assert res.exit_code == 0, res.output
    return spec, results


def _key(row: dict[str, Any], skip: frozenset[str] = frozenset()) -> tuple[Any, ...]:
    return tuple(sorted((k, repr(v)) for k, v in row.items() if k not in TIMING | skip))


def _read(root: Path, where: str = "true", skip: frozenset[str] = frozenset()
          ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[str]]:
    """(kdepth rows, units rows (sweep, unit, status, damaged) and spec records, warnings) as a reader sees them: every
    row of every sweep (a stray sweep's rows count), plus, per unit, the count of a query filtered on
    ``unit_id`` (which row-group statistics could prune)."""
    from storage.catalog import Catalog

    with Catalog(root) as cat:
        kd = [_key(r) for r in cat.query(f"SELECT * FROM kdepth WHERE {where}").to_pylist()]
        units = cat.query(f"SELECT sweep, unit_id, status, damaged FROM units WHERE {where}").to_pylist()
        for u in sorted({r["unit_id"] for r in units}):
            n = cat.query(f"SELECT count(*) AS n FROM kdepth WHERE unit_id = $u AND {where}", u=u).column("n")[0].as_py()
            kd.append((("pruned-count", u), ("n", n)))
        sweeps = [_key(r, skip) for r in cat.query(f"SELECT * FROM sweeps WHERE {where}").to_pylist()]
        return kd, [_key(r) for r in units] + sweeps, list(cat.warnings)


@pytest.fixture(scope="module")
def clean(launched: tuple[Path, Path]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    kd, units, warnings = _read(launched[1])
    assert not warnings and len(units) == 6 + 1 and kd
    return kd, units


# -- the faults -------------------------------------------------------------------------------------

def _unit(root: Path, i: int) -> str:
    return sorted(p.stem for p in (root / f"table=units/sweep={SWEEP}").glob("*.parquet"))[i]


def _path(root: Path, table: str, unit: str) -> Path:
    return root / f"table={table}/sweep={SWEEP}/{unit}.parquet"


def _flip(p: Path, offset: int) -> None:
    data = bytearray(p.read_bytes())
    data[offset % len(data)] ^= 0x01
    p.write_bytes(bytes(data))


def _footer_start(p: Path) -> int:
    data = p.read_bytes()
    return len(data) - 8 - int.from_bytes(data[-8:-4], "little")


def _flip_statistic(p: Path) -> None:
    """One bit of the unit id as a footer statistic records it (min/max of ``unit_id``)."""
    data = p.read_bytes()
    start = _footer_start(p)
    needle = p.stem.encode()
    at = data.find(needle, start)
    assert at >= 0, "the footer records no unit_id statistic"
    _flip(p, at + len(needle) - 1)


def _flip_data_page(p: Path) -> None:
    """One bit inside the first row group's column data (between the magic and the footer)."""
    md = pq.ParquetFile(p).metadata
    col = md.row_group(0).column(0)
    _flip(p, col.data_page_offset + col.total_compressed_size // 2)


DAMAGE: dict[str, Callable[[Path], None]] = {
    "deleted": lambda p: p.unlink(),
    "truncated-half": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "truncated-empty": lambda p: p.write_bytes(b""),
    "truncated-tail": lambda p: p.write_bytes(p.read_bytes()[:-3]),
    "extended": lambda p: p.write_bytes(p.read_bytes() + b"\0" * 16),
    "garbage": lambda p: p.write_bytes(os.urandom(p.stat().st_size)),
    "flip-header": lambda p: _flip(p, 5),
    "flip-data-page": _flip_data_page,
    "flip-last-page": lambda p: _flip(p, _footer_start(p) - 2),
    "flip-statistic": _flip_statistic,
    "flip-footer-middle": lambda p: _flip(p, (_footer_start(p) + p.stat().st_size) // 2),
    "flip-footer-length": lambda p: _flip(p, p.stat().st_size - 7),
    "flip-end-magic": lambda p: _flip(p, p.stat().st_size - 2),
}


def _damage(table: str, how: str, which: int) -> Callable[[Path], tuple[str, str]]:
    def apply(root: Path) -> tuple[str, str]:
        unit = _unit(root, which)
        p = _path(root, table, unit)
        DAMAGE[how](p)
        return str(p.relative_to(root)), unit
    return apply


def _swap(table: str) -> Callable[[Path], tuple[str, str]]:
    """The unit's file replaced by another unit's (a valid file of the right schema, the wrong rows)."""
    def apply(root: Path) -> tuple[str, str]:
        unit, other = _unit(root, 0), _unit(root, 1)
        shutil.copy(_path(root, table, other), _path(root, table, unit))
        return str(_path(root, table, unit).relative_to(root)), unit
    return apply


def _stray(rel: str, source_table: str = "kdepth") -> Callable[[Path], tuple[str, str]]:
    """A copy of unit 0's file (of ``source_table``) at ``rel`` (``{unit}`` is unit 0's id)."""
    def apply(root: Path) -> tuple[str, str]:
        unit = _unit(root, 0)
        dest = root / rel.format(unit=unit)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(_path(root, source_table, unit), dest)
        return str(dest.relative_to(root)), unit
    return apply


def _link_out(root: Path) -> tuple[str, str]:
    unit = _unit(root, 0)
    outside = root.parent / "outside.parquet"
    shutil.copy(_path(root, "kdepth", unit), outside)
    link = root / f"table=kdepth/sweep={SWEEP}/link.parquet"
    link.symlink_to(outside)
    return str(link.relative_to(root)), unit


def _stale_temporary(root: Path) -> tuple[str, str]:
    unit = _unit(root, 0)
    tmp = root / f"table=kdepth/sweep={SWEEP}/.{unit}.parquet.tmp-1234"
    shutil.copy(_path(root, "kdepth", unit), tmp)
    old = os.stat(tmp).st_mtime - 7200
    os.utime(tmp, (old, old))
    return str(tmp.relative_to(root)), unit


def _sweep_file(table: str, how: str) -> Callable[[Path], tuple[str, str]]:
    """The sweep's spec record (``sweeps``) or its launch record (``launches``), damaged."""
    def apply(root: Path) -> tuple[str, str]:
        p = sorted((root / f"table={table}/sweep={SWEEP}").glob("*.parquet"))[0]
        DAMAGE[how](p)
        return str(p.relative_to(root)), SWEEP
    return apply


def _ledger_edit(field: str, change: Callable[[dict[str, Any], Path], None]) -> Callable[[Path], tuple[str, str]]:
    """Unit 0's ledger row rewritten through the store (a valid file, valid checksums) with one field
    changed: the ledger no longer agrees with the files it names."""
    def apply(root: Path) -> tuple[str, str]:
        from storage.store import ResultStore

        unit = _unit(root, 0)
        store = ResultStore(root)
        row = store.ledger_records(SWEEP)[unit]
        change(row, root)
        store.record_unit(SWEEP, row)
        return str(_path(root, "units", unit).relative_to(root)), unit
    return apply


def _kdepth_record(row: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in row["files"] if r["table"] == "kdepth")


LEDGER_EDITS: dict[str, Callable[[dict[str, Any], Path], None]] = {
    "status-failed": lambda row, root: row.update(status="failed", error="forged"),
    "sha256": lambda row, root: _kdepth_record(row).update(sha256="0" * 64),
    "rows": lambda row, root: _kdepth_record(row).update(rows=_kdepth_record(row)["rows"] + 1),
    "bytes": lambda row, root: _kdepth_record(row).update(bytes=_kdepth_record(row)["bytes"] - 1),
    "record-dropped": lambda row, root: row.update(files=[r for r in row["files"] if r["table"] != "kdepth"]),
    "record-doubled": lambda row, root: row.update(files=[*row["files"], _kdepth_record(row)]),
    "another-units-file": lambda row, root: _kdepth_record(row).update(
        path=str(_path(root, "kdepth", _unit(root, 1)).relative_to(root))),
}

CASES: dict[str, Callable[[Path], tuple[str, str]]] = {
    **{f"ledger-edit-{name}": _ledger_edit(name, edit) for name, edit in LEDGER_EDITS.items()},
    **{f"{table}-{how}": _sweep_file(table, how) for table in ("sweeps", "launches")
       for how in ("deleted", "garbage", "truncated-half", "flip-data-page", "flip-statistic")},
    "attempts-deleted": lambda root: (shutil.rmtree(root / "_state/attempts"), ("_state/attempts", SWEEP))[1],
    "lock-garbage": lambda root: ((root / f"_state/locks/sweep={SWEEP}.lock").write_bytes(os.urandom(64)),
                                  (f"_state/locks/sweep={SWEEP}.lock", SWEEP))[1],
    **{f"{table}-{how}-{'first' if which == 0 else 'last'}": _damage(table, how, which)
       for table in ("kdepth", "units") for how in DAMAGE for which in (0, -1)},
    "kdepth-swapped": _swap("kdepth"),
    "units-swapped": _swap("units"),
    "stray-ghost-sweep": _stray("table=kdepth/sweep=ghost/x.parquet"),
    "stray-orphan": _stray(f"table=kdepth/sweep={SWEEP}/x.parquet"),
    "stray-second-copy": _stray(f"table=kdepth/sweep={SWEEP}/{{unit}}-copy.parquet"),
    "stray-ledger-copy": _stray(f"table=units/sweep={SWEEP}/copy.parquet", "units"),
    "stray-ledger-ghost-sweep": _stray("table=units/sweep=ghost/{unit}.parquet", "units"),
    "stray-other-table": _stray(f"table=replay/sweep={SWEEP}/{{unit}}.parquet"),
    "stray-link-out": _link_out,
    "stray-stale-temporary": _stale_temporary,
}
#: Cases that leave every file a reader could take for a result as it was: nothing for verify to name
#: beyond a notice (a stale temporary is reported as one, and removed by the next launch).
QUIET = {"stray-stale-temporary", "attempts-deleted", "lock-garbage", "launches-deleted"}


#: The second copy of each damage (the last unit's file rather than the first's) runs with the slow
#: set: it differs only in which unit.
DEFAULT_PARAMS = [pytest.param(c, marks=pytest.mark.slow) if c.endswith("-last") else c for c in sorted(CASES)]


@pytest.fixture(params=DEFAULT_PARAMS)
def faulted(request: pytest.FixtureRequest, launched: tuple[Path, Path], tmp_path: Path) -> tuple[str, Path, str, str]:
    """(case, root, the file the fault touched, its unit), on a fresh copy of the undisturbed tree."""
    root = tmp_path / "results"
    shutil.copytree(launched[1], root, symlinks=True)
    rel, unit = CASES[request.param](root)
    return request.param, root, rel, unit


def _named(text: str, rel: str, unit: str) -> bool:
    return rel in text or unit in text


# -- reads and verify (the default set) -----------------------------------------------------------

def test_reads_are_right_or_say_what_they_skipped(faulted: tuple[str, Path, str, str], clean: Any,
                                                   fault_outcome: Any) -> None:
    """Never a changed answer without a warning naming the file or its unit (or a loud failure)."""
    from swapcheck_common.errors import InputError

    case, root, rel, unit = faulted
    try:
        kd, units, warnings = _read(root)
    except (InputError, OSError) as exc:  # a loud refusal (exit 2/3 at the CLI) is no silent answer
        fault_outcome(lost=0, duplicated=0, silent_wrong=0, stage="read", refused=str(exc)[:200])
        return
    changed = Counter(kd) != Counter(clean[0]) or Counter(units) != Counter(clean[1])
    warned = any(_named(w, rel, unit) for w in warnings)
    silent = changed and not warned
    fault_outcome(lost=0, duplicated=0, silent_wrong=int(silent), stage="read", changed=changed, warned=warned)
    assert not silent, f"{case}: the sweep's rows changed and no warning names {rel} or {unit}: {warnings}"
    # Rows a reader sees are never more than the run committed: nothing counted twice.
    real = [r for r in kd if r[0][0] != "pruned-count"]
    assert not (Counter(real) - Counter(clean[0])), f"{case}: rows the undisturbed run does not have"


@pytest.mark.parametrize("faulted", [pytest.param(c, marks=pytest.mark.slow) if c.startswith(("kdepth-", "units-"))
                                     else c for c in sorted(CASES)], indirect=True)
def test_verify_names_the_file_or_its_unit(faulted: tuple[str, Path, str, str]) -> None:
    """Every case; the single-file damages of data and ledger files with the slow set (test_verify.py and
    test_ledger_damage.py check those by default)."""
    from storage.store import ResultStore
    from storage.verify import verify

    case, root, rel, unit = faulted
    problems = verify(ResultStore(root))
    named = [p for p in problems if (p.path or "") == rel or p.unit_id == unit or rel in (p.detail or "")]
    if case in QUIET:
        assert not any(p.damage for p in problems), problems
        return
    assert named, f"{case}: sweep verify does not name {rel} or unit {unit}: {problems}"


# -- relaunch and repair (the slow set) -----------------------------------------------------------

#: The relaunch stage runs every case but the second copy of each damage (the last unit's file):
#: that copy differs from the first only in which unit, which reads and verify cover.
RELAUNCH = sorted(c for c in CASES if not c.endswith("-last"))


@pytest.mark.slow  # two real launches per case (about 1 s each); reads and verify run in the default set
@pytest.mark.parametrize("faulted", RELAUNCH, indirect=True)
def test_launch_never_dumps_a_stack_and_repair_restores_the_run(launched: tuple[Path, Path], clean: Any,
                                                                faulted: tuple[str, Path, str, str],
                                                                fault_outcome: Any) -> None:
    from storage.store import ResultStore
    from storage.verify import verify

    spec = launched[0]
    case, root, _rel, _unit_id = faulted
    plain = cli.invoke(app, ["sweep", "launch", str(spec), "--results", str(root), "--no-progress"])
    assert plain.exception is None or isinstance(plain.exception, SystemExit), f"{case}: {plain.exception!r}"
    assert "Traceback" not in plain.output, plain.output
    fixed = cli.invoke(app, ["sweep", "launch", str(spec), "--results", str(root), "--no-progress", "--repair"])
    assert fixed.exception is None or isinstance(fixed.exception, SystemExit), f"{case}: {fixed.exception!r}"
    assert "Traceback" not in fixed.output, fixed.output
    # The sweep repaired, against the undisturbed run: a stray of another sweep (a ghost partition) is
    # that sweep's to clean up, and stays a warning, never counted. A spec record written anew by
    # --repair (its own was damaged or gone) holds the same spec and plan, and the repair's time.
    scope, skip = f"sweep = '{SWEEP}'", frozenset({"created_at"})
    base = _read(launched[1], scope, skip)
    kd, units, warnings = _read(root, scope, skip)
    warnings = [w for w in warnings if "ghost" not in w]  # the ghost sweep's strays: never read, still named
    clean = (base[0], base[1])
    lost = sum((Counter(clean[0]) - Counter(kd)).values()) + sum((Counter(clean[1]) - Counter(units)).values())
    duplicated = sum((Counter(kd) - Counter(clean[0])).values()) + sum((Counter(units) - Counter(clean[1])).values())
    problems = [p for p in verify(ResultStore(root), SWEEP) if p.damage]
    fault_outcome(lost=lost, duplicated=duplicated, silent_wrong=0, stage="repair",
                  exit_plain=plain.exit_code, exit_repair=fixed.exit_code, damage_after=len(problems))
    assert fixed.exit_code == 0, f"{case}: {fixed.output}"
    assert (lost, duplicated) == (0, 0), f"{case}: {lost} rows lost, {duplicated} duplicated"
    assert not warnings, warnings
    assert not problems, problems
