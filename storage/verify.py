"""Integrity of a results tree: the ledger's file records against the files (``sweep verify``).

Storage code: it reads and moves files of the tree through :class:`storage.store.ResultStore` only.
``swapcheck sweep verify`` (``orchestrator/cli/sweep_verify.py``) parses and renders;
``sweep launch --repair`` (``orchestrator.runner``) calls :func:`damaged_units` and :func:`repair`.

Every ``ok`` ledger row records the unit's result files (``files``: table, path relative to the
results root, rows, bytes, SHA-256 of the bytes written; see ``storage.schemas.FILE_RECORD``).
:func:`verify` checks the tree against those records and lists every :class:`Problem`;
:func:`damaged_units` names the units whose results must be recomputed; :func:`repair` moves their
files and ledger rows, and stray files, aside under ``_quarantine/`` (nothing is deleted) so that a
relaunch (``sweep launch --repair``) recomputes exactly those units.

Problem kinds (``Problem.kind``) and what repair does (``Problem.remedy``):

==================  ===========  =====================================================================
kind                remedy       meaning
==================  ===========  =====================================================================
``missing``         recompute    a recorded file (or a legacy unit's ``<unit_id>.parquet``) is absent
``schema``          recompute    the file reads as Parquet but its columns are not the declared ones
``rows``            recompute    the file's row count differs from the record
``truncated``       recompute    the file is shorter than recorded
``extended``        recompute    the file is longer than recorded
``checksum``        recompute    same size, other bytes (SHA-256 differs)
``unreadable``      recompute    not readable as Parquet (a legacy file, or a ledger file)
``no_records``      recompute    an ``ok`` ledger row names tables/rows but records no files
``path_escape``     recompute    a ledger record's path leaves its partition ``table=<t>/sweep=<s>/``
                                 (``..``, absolute, a URI, a symlink out of the root, another sweep or
                                 table): never read, moved or deleted; the unit is recomputed
``duplicate``       recompute    one file named by two ledger rows (each unit is recomputed)
``path_escape``     set aside    a file listed in a result partition that is a symlink out of the root:
                                 never read; repair moves the link (not its target) aside
``duplicate``       set aside    an unnamed file holding rows of a unit that has its own file
``orphan``          set aside    a ``.parquet`` file under a result partition no ledger row names
``stale_temporary`` set aside    ``.<name>.tmp-<hex>`` older than ``stale_after_s`` (a killed writer)
``unverifiable``    none         an ``ok`` row written before integrity records existed; its
                                 ``<unit_id>.parquet`` files exist and read (a notice, not damage)
==================  ===========  =====================================================================

A duplicate or a second ledger file of a unit under another name (``table=units``) is reported on
the file that is not the unit's own. Call :func:`repair` only while no launch of the sweep is
running: a running unit's files have no ledger row yet and look like orphans.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import PathEscape
from storage.schemas import TABLES, UNITS, UNMANAGED_TABLES
from storage.store import STALE_AFTER_S, ResultStore, utcnow

__all__ = ["Problem", "Repaired", "damaged_units", "present_sweeps", "quick_check", "repair", "verify", "UNMANAGED_TABLES"]

#: Tables written by the launcher rather than by units: never orphans, never recorded in ``files``.

RECOMPUTE, SET_ASIDE, NONE = "recompute", "set aside", "none"


@dataclass(frozen=True)
class Problem:
    """One finding: where (sweep, unit, table, path relative to the root), what, and the remedy."""

    sweep: str
    unit_id: str | None
    table: str | None
    path: str | None
    kind: str
    detail: str
    remedy: str = RECOMPUTE

    @property
    def damage(self) -> bool:
        """False for notices (``unverifiable``): they do not fail ``sweep verify``."""
        return self.remedy != NONE

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Repaired:
    """What :func:`repair` did: the units whose ledger rows it moved, every path it moved (relative to
    the root, under ``quarantine`` now with the same relative path)."""

    units: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    quarantine: str = ""


def _rel(table: str, sweep: str, name: str) -> str:
    return f"table={table}/sweep={sweep}/{name}.parquet"


def _compatible(schema: pa.Schema, declared: pa.Schema, exact: bool) -> str | None:
    """None when ``schema`` is the declared one (``exact``) or fits in it (legacy files); else why not."""
    got = {f.name: f.type for f in schema}
    want = {f.name: f.type for f in declared}
    extra = sorted(set(got) - set(want))
    wrong = sorted(n for n in set(got) & set(want) if not got[n].equals(want[n]))
    absent = sorted(set(want) - set(got)) if exact else []
    if not (extra or wrong or absent):
        return None
    parts = [f"undeclared columns {extra}" if extra else "", f"other types in {wrong}" if wrong else "",
             f"missing columns {absent}" if absent else ""]
    return "not the declared schema: " + "; ".join(p for p in parts if p)


def _read(store: ResultStore, rel: str) -> tuple[bytes | None, pa.Table | None, str]:
    """(bytes, table, error): what reading ``rel`` gives; error is "" when it reads as Parquet."""
    try:
        data = store.read_bytes(rel)
    except OSError as exc:
        return None, None, f"cannot read: {exc}"
    try:
        return data, pq.read_table(pa.BufferReader(data)), ""
    except Exception as exc:  # noqa: BLE001 - any decoding error means "not readable as Parquet"
        first = str(exc).split(". ")[0].split("': ", 1)[-1]  # Arrow names the buffer first: drop that
        return data, None, f"not readable as Parquet: {first[:160]}"


def _unit_ids(t: pa.Table | None) -> set[str]:
    if t is None or "unit_id" not in t.column_names:
        return set()
    return {u for u in t.column("unit_id").to_pylist() if u is not None}


def _escape(store: ResultStore, sweep: str, unit: str, field: str, rec: dict[str, Any]) -> Problem | None:
    """A ``path_escape`` problem when the record ``field`` of ``unit``'s ledger row points outside its
    partition (:meth:`ResultStore.recorded`), else None. The path is not touched."""
    try:
        store.recorded(sweep, rec)
    except PathEscape as exc:
        return Problem(sweep, unit, rec.get("table"), str(rec.get("path")), "path_escape",
                       f"ledger row of unit {unit}, {field}: {exc} (the unit is recomputed)")
    return None


def _check_record(store: ResultStore, sweep: str, unit: str, rec: dict[str, Any],
                  field: str = "files") -> tuple[Problem | None, set[str]]:
    """The one most telling problem of a recorded file (None when it is as committed), and the units
    whose rows it holds. A record pointing outside its partition is a problem and is never read."""
    rel, table = rec["path"], rec["table"]
    if (escaped := _escape(store, sweep, unit, field, rec)) is not None:
        return escaped, set()

    def problem(kind: str, detail: str) -> Problem:
        return Problem(sweep, unit, table, rel, kind, detail)

    size = store.size(rel)
    if size is None:
        return problem("missing", f"no file; the ledger records {rec['rows']} rows, {rec['bytes']} bytes"), set()
    data, t, err = _read(store, rel)
    ids = _unit_ids(t)
    declared = TABLES.get(table)
    if t is not None and declared is not None and (why := _compatible(t.schema, declared, exact=True)):
        return problem("schema", why), ids
    if t is not None and t.num_rows != rec["rows"]:
        return problem("rows", f"{t.num_rows} rows, the ledger records {rec['rows']}"), ids
    if size != rec["bytes"]:
        kind = "truncated" if size < rec["bytes"] else "extended"
        return problem(kind, f"{size} bytes, the ledger records {rec['bytes']}" + (f"; {err}" if err else "")), ids
    if data is not None and hashlib.sha256(data).hexdigest() != rec["sha256"]:
        return problem("checksum", "same size, other bytes (SHA-256 differs)" + (f"; {err}" if err else "")), ids
    if err:
        return problem("unreadable", err), ids
    return None, ids


def _check_legacy(store: ResultStore, sweep: str, unit: str, tables: list[str]) -> list[Problem]:
    """A row written before integrity records: its ``<unit_id>.parquet`` files must exist and read."""
    out = []
    for table in tables:
        rel = _rel(table, sweep, unit)
        if (escaped := _escape(store, sweep, unit, f"tables ({table!r})", {"table": table, "path": rel})) is not None:
            out.append(escaped)
            continue
        if store.size(rel) is None:
            out.append(Problem(sweep, unit, table, rel, "missing", "no file (ledger row written before integrity records)"))
            continue
        _data, t, err = _read(store, rel)
        declared = TABLES.get(table)
        why = _compatible(t.schema, declared, exact=False) if t is not None and declared is not None else None
        if err or why:
            out.append(Problem(sweep, unit, table, rel, "schema" if why else "unreadable", why or err))
    if not out:
        out.append(Problem(sweep, unit, None, _rel("units", sweep, unit), "unverifiable",
                           "written before integrity records: files exist and read; sizes and checksums unknown", NONE))
    return out


def _ledger(store: ResultStore, sweep: str, problems: list[Problem]) -> dict[str, dict[str, Any]]:
    """unit -> ledger row, from each unit's own ledger file; problems of the ledger files themselves."""
    rows: dict[str, dict[str, Any]] = {}
    strays: list[tuple[str, dict[str, Any]]] = []
    for path in store.parquet_files("units", sweep):
        rel = store.relative(path)
        name = rel.rsplit("/", 1)[1][: -len(".parquet")]
        try:
            found = store.read_table(path, schema=UNITS).to_pylist()
        except Exception as exc:  # noqa: BLE001 - an unreadable ledger file is a finding, not a crash
            problems.append(Problem(sweep, name, "units", rel, "unreadable", f"ledger file: {type(exc).__name__}: {exc}"))
            continue
        if len(found) > 1 and any(row["unit_id"] == name for row in found):
            problems.append(Problem(sweep, name, "units", rel, "rows",
                                    f"ledger file holds {len(found)} rows (units {sorted({r['unit_id'] for r in found})}), "
                                    "expected the one row of its unit"))
            continue
        for row in found:
            if row["unit_id"] == name and name not in rows:
                rows[name] = row
            else:
                strays.append((rel, row))
    for rel, row in strays:
        uid = row["unit_id"]
        kind = "duplicate" if uid in rows else "orphan"
        problems.append(Problem(sweep, uid, "units", rel, kind,
                                f"a ledger row of unit {uid} in a file not named after it" +
                                (" (the unit has its own ledger row: counted twice)" if uid in rows else ""), SET_ASIDE))
    return rows


def _verify_sweep(store: ResultStore, sweep: str, tables: list[str]) -> list[Problem]:
    problems: list[Problem] = []
    ledger = _ledger(store, sweep, problems)
    named: dict[str, list[str]] = {}  # path -> units whose ledger rows name it
    held: set[tuple[str, str]] = set()  # (table, unit) whose rows a recorded file holds
    escaped: set[str] = set()  # units with a record pointing outside its partition: recomputed
    for unit, row in sorted(ledger.items()):
        ok = row["status"] == "ok"
        if row["files"] is None:  # legacy row: the file names follow from the unit id
            for t in row["tables"] or []:
                if _escape(store, sweep, unit, "tables", {"table": t, "path": _rel(t, sweep, unit)}) is not None:
                    escaped.add(unit)
                    continue
                named.setdefault(_rel(t, sweep, unit), []).append(unit)
                held.add((t, unit))
            if ok:
                problems += _check_legacy(store, sweep, unit, list(row["tables"] or []))
            continue
        if ok and not row["files"] and (row["tables"] or (row["rows"] or 0) > 0):
            problems.append(Problem(sweep, unit, None, _rel("units", sweep, unit), "no_records",
                                    f"ledger row says ok with {row['rows']} rows in {row['tables']} but records no files"))
        for i, rec in enumerate(row["files"]):
            p, ids = _check_record(store, sweep, unit, rec, f"files[{i}].path")
            problems += [p] if p is not None else []
            if p is not None and p.kind == "path_escape":
                escaped.add(unit)  # not followed: names no file, holds no rows
                continue
            named.setdefault(rec["path"], []).append(unit)
            held |= {(rec["table"], u) for u in ids}
    for rel, units in sorted(named.items()):
        if len(units) > 1:
            problems += [Problem(sweep, u, rel.split("/", 1)[0].removeprefix("table="), rel, "duplicate",
                                 f"one file named by the ledger rows of {len(units)} units {sorted(units)}: rows counted twice")
                         for u in sorted(set(units))]
    bad_ledger = {p.unit_id for p in problems if p.table == "units" and p.remedy == RECOMPUTE} | escaped
    for table in tables:
        for path in store.parquet_files(table, sweep):
            rel = store.relative(path)
            stem = rel.rsplit("/", 1)[1][: -len(".parquet")]
            if rel in named or stem in bad_ledger:
                continue  # named by the ledger, or by a damaged ledger row: that unit is recomputed
            try:
                store.inside(rel)
            except PathEscape as exc:  # a symlink out of the root: not read; repair moves the link aside
                problems.append(Problem(sweep, None, table, rel, "path_escape",
                                        f"a file of the tree that is not a file of the tree: {exc}", SET_ASIDE))
                continue
            _data, t, err = _read(store, rel)
            holds = sorted(_unit_ids(t))
            twice = [u for u in holds if (table, u) in held]
            if twice:
                problems.append(Problem(sweep, twice[0], table, rel, "duplicate",
                                        f"rows of unit(s) {twice} that a recorded file holds too: counted twice", SET_ASIDE))
                continue
            why = (f"ledger row of {stem} says {ledger[stem]['status']}" if stem in ledger
                   else "no ledger row names it (a stray file, or a unit still running)")
            problems.append(Problem(sweep, holds[0] if len(holds) == 1 else None, table, rel, "orphan",
                                    why + (f"; {err}" if err else ""), SET_ASIDE))
    return problems


def present_sweeps(store: ResultStore) -> list[str]:
    """Every sweep with a partition in any table of the tree (sorted): what :func:`verify` checks."""
    return sorted({s for t in store.table_partitions() for s in store.sweep_partitions(t)})


def verify(store: ResultStore, sweep: str | None = None, *, stale_after_s: float = STALE_AFTER_S) -> list[Problem]:
    """Every problem of the results tree (one sweep, or all): ledger records <-> files.

    Read-only. Problems whose ``remedy`` is ``none`` are notices; the tree is sound when no problem
    has ``damage``. Temporary files younger than ``stale_after_s`` may belong to a live writer and
    are not listed.
    """
    sweeps = [sweep] if sweep is not None else present_sweeps(store)
    tables = sorted(set(store.table_partitions()) - UNMANAGED_TABLES)
    problems: list[Problem] = []
    for s in sweeps:
        problems += _verify_sweep(store, s, tables)
    for rel, age in store.temporaries(stale_after_s):
        where = next((part.split("=", 1)[1] for part in rel.split("/") if part.startswith("sweep=")), "")
        if sweep is None or where == sweep:
            table = next((part.split("=", 1)[1] for part in rel.split("/") if part.startswith("table=")), None)
            age_text = f"{age / 60:.0f} minutes old" if age is not None else "age unknown"
            problems.append(Problem(where, None, table, rel, "stale_temporary",
                                    f"temporary file of a killed writer ({age_text})", SET_ASIDE))
    return problems


def quick_check(store: ResultStore, sweep: str) -> list[str]:
    """The finished units of ``sweep`` whose recorded files are missing, of another size than the
    ledger records, or outside their partition: a listing, no file read (what a relaunch that skipped
    every unit can afford to look at; :func:`verify` reads and checks every byte)."""
    suspects: set[str] = set()
    for unit, row in _ledger(store, sweep, []).items():
        if row["status"] != "ok" or not row["files"]:
            continue
        for rec in row["files"]:
            try:
                store.recorded(sweep, rec)
            except PathEscape:
                suspects.add(unit)
                continue
            if store.size(rec["path"]) != rec["bytes"]:
                suspects.add(unit)
    return sorted(suspects)


def damaged_units(store: ResultStore, sweep: str, problems: Iterable[Problem] | None = None) -> set[str]:
    """The units of ``sweep`` whose committed results are damaged (remedy ``recompute``).

    ``problems`` is :func:`verify`'s list when the caller has it already (it is computed otherwise).
    """
    found = verify(store, sweep) if problems is None else problems
    return {p.unit_id for p in found if p.remedy == RECOMPUTE and p.sweep == sweep and p.unit_id is not None}


def repair(store: ResultStore, sweep: str, units: Iterable[str], *, strays: bool = True,
           problems: Iterable[Problem] | None = None) -> Repaired:
    """Move ``units``' ledger rows and result files, and (``strays``) the sweep's stray files, aside.

    Contract, for ``sweep launch --repair``: afterwards none of ``units`` has a ledger row, so a
    launch treats exactly them as pending and recomputes them; other units' files and ledger rows are
    untouched. For each unit the ledger file ``table=units/sweep=<s>/<unit>.parquet`` moves first
    (a crash midway leaves the unit pending, never "ok" with files gone), then its recorded files and
    its ``<unit>.parquet`` in every result table. With ``strays`` the files verify reports with
    remedy ``set aside`` for this sweep (orphans, duplicate copies, stale temporaries, misnamed ledger
    files) move too, so the catalog no longer counts their rows. Every move goes to
    ``_quarantine/<UTC time>-<id>/<same relative path>``; nothing is deleted. Call it only while no
    launch of the sweep is running (a running unit's files look like orphans).
    """
    found = list(verify(store, sweep) if problems is None else problems) if strays else []
    done = Repaired(quarantine=f"_quarantine/{utcnow().strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}")
    tables = sorted(set(store.table_partitions()) - UNMANAGED_TABLES)

    def move(rel: str) -> None:
        try:  # a path that leaves the root is never followed; a link inside it is moved as the link
            store.inside(rel, follow=False)
        except PathEscape:
            return
        if rel not in done.moved and store.size(rel) is not None:
            store.move(rel, f"{done.quarantine}/{rel}")
            done.moved.append(rel)

    for unit in sorted(set(units)):
        ledger_file = _rel("units", sweep, unit)
        try:
            rows = store.read_table(f"{store.base}/{ledger_file}", schema=UNITS).to_pylist()
        except Exception:  # noqa: BLE001 - absent or unreadable: no recorded files to follow
            rows = []
        if store.size(ledger_file) is not None:
            move(ledger_file)
            done.units.append(unit)
        recorded = []
        for rec in (r for row in rows for r in row["files"] or []):
            try:  # only a record inside its own partition is followed; the unit is recomputed either way
                recorded.append(store.recorded(sweep, rec))
            except PathEscape:
                continue
        for rel in [*recorded, *(_rel(t, sweep, unit) for t in tables)]:
            move(rel)
    for p in found:
        if p.remedy == SET_ASIDE and p.sweep == sweep and p.path is not None:
            move(p.path)
    return done
