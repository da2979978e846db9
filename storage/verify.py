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
``unreadable``      recompute    not readable as Parquet, or a page checksum fails (a legacy file)
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

The ledger files (``table=units/sweep=<s>/<unit_id>.parquet``) are checked like the data: each is
read whole with its page checksums verified and must hold exactly one row, of the unit it is named
after, in the ledger's schema (kinds ``unreadable``, ``schema``, ``rows``, ``wrong_unit``); its bytes
must be exactly what the store writes for that row (``checksum``: a changed byte in a page header,
the footer or its statistics; checked when this pyarrow wrote it, as its unit's result files say);
a file missing while its unit's result files are complete is ``missing``. Each result file of a
unit carries the unit's ledger row in its metadata (``storage.schemas.LEDGER_ROW_KEY``): the ledger
row and its files must agree both ways (``mismatch``). The remedy of a damaged or lost ledger file is
``recompute and compare`` when its unit's result files are all present, look intact and carry the
row, else ``recompute``. Either way the unit is recomputed: a file cannot vouch for itself (issue
#36: a result file rewritten through this very writer, with the genuine ledger row in its metadata
and every value changed, is indistinguishable from the committed one). With ``recompute and
compare`` the files are set aside first and, once the unit is recomputed, compared with its new rows
(:func:`compare_with_aside`, every column but ``RUN_VARYING``): equal, they are confirmed; not
equal, the recomputation stands and the launch says which rows differed.

A duplicate or a second ledger file of a unit under another name (``table=units``) is reported on
the file that is not the unit's own. Call :func:`repair` only while no launch of the sweep is
running: a running unit's files have no ledger row yet and look like orphans.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import PathEscape
from storage.records import COMPACTED_KEY, SweepRecords, file_problem, is_compacted
from storage.schemas import LEDGER_ROW_KEY, TABLES, UNITS, UNMANAGED_TABLES
from storage.store import (
    STALE_AFTER_S,
    FileRecord,
    ResultStore,
    ledger_bytes,
    ledger_row_from_metadata,
    ledger_row_metadata,
    parquet_bytes,
    parse_ledger_file,
    to_table,
    utcnow,
)

__all__ = ["Problem", "Repaired", "damaged_units", "present_sweeps", "quick_check", "rebuild_ledger_row", "repair",
           "verify", "UNMANAGED_TABLES"]

#: Tables written by the launcher rather than by units: never orphans, never recorded in ``files``.

RECOMPUTE, COMPARE, SET_ASIDE, NONE = "recompute", "recompute and compare", "set aside", "none"

#: Columns that say where and how long a unit ran, not what it computed: left out of comparisons.
RUN_VARYING = frozenset({"seconds_a", "seconds_b", "seconds_reference", "host", "pid"})


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
    #: Units whose result files (their ledger file lost or damaged) were set aside to be compared with
    #: their recomputation (:func:`compare_with_aside`).
    compare: list[str] = field(default_factory=list)


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
    """(bytes, table, error): what reading ``rel`` gives (page checksums verified); error is "" when
    it reads as Parquet. The table's schema metadata holds the file's key-value metadata."""
    try:
        data = store.read_bytes(rel)
    except OSError as exc:
        return None, None, f"cannot read: {exc}"
    return (data, *_parse(data))


def _parse(data: bytes) -> tuple[pa.Table | None, str]:
    """The table in ``data`` (every page checksum verified), its schema metadata holding the file's
    key-value metadata; or None and why not."""
    try:
        pf = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
        t = pf.read(use_threads=False)
        return t.replace_schema_metadata({**(t.schema.metadata or {}), **(pf.metadata.metadata or {})}), ""
    except Exception as exc:  # noqa: BLE001 - any decoding error means "not readable as Parquet"
        first = str(exc).split(". ")[0].split("': ", 1)[-1]  # Arrow names the buffer first: drop that
        return None, f"not readable as Parquet: {first[:160]}"


def _created_by(data: bytes) -> str:
    """Which Parquet writer wrote ``data`` (its footer's ``created_by``), "" when unreadable."""
    try:
        return str(pq.ParquetFile(pa.BufferReader(data)).metadata.created_by or "")
    except Exception:  # noqa: BLE001 - an unreadable footer is found by the other checks
        return ""


def _carried(t: pa.Table | None) -> str | None:
    """The ledger row a result file carries in its metadata (``LEDGER_ROW_KEY``), or None."""
    meta = t.schema.metadata if t is not None else None
    value = (meta or {}).get(LEDGER_ROW_KEY.encode())
    return value.decode("utf-8", "replace") if value is not None else None


def _declared(table: str, t: pa.Table) -> pa.Table:
    """``t`` as the store holds it before writing: the declared schema exactly (a list read back from
    Parquet names its items ``element``, the declared schema ``item``), no metadata."""
    return t.replace_schema_metadata(None).cast(TABLES[table])


@functools.cache
def _this_writer() -> str:
    """``created_by`` of the Parquet files this process writes."""
    return _created_by(bytes(ledger_bytes({"unit_id": "u"})))


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


@dataclass
class _Seen:
    """What reading a recorded file showed besides its problem: the units whose rows it holds, the
    ledger row it carries (``LEDGER_ROW_KEY``) and its writer (when it is as committed)."""

    ids: set[str] = field(default_factory=set)
    carried: str | None = None
    writer: str = ""


def _check_record(store: ResultStore, sweep: str, unit: str, rec: dict[str, Any],
                  field: str = "files", seen: _Seen | None = None) -> tuple[Problem | None, set[str]]:
    """The one most telling problem of a recorded file (None when it is as committed), and the units
    whose rows it holds. A record pointing outside its partition is a problem and is never read.
    ``seen`` receives what the file carries when it is as committed."""
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
    found = file_problem(  # the one rule (storage.records), as the catalog applies it
        rec, size=size, rows=t.num_rows if t is not None else None,
        sha256=hashlib.sha256(data).hexdigest() if data is not None else None,
        schema_problem=_compatible(t.schema, declared, exact=True) if t is not None and declared is not None else None)
    if found is not None:
        kind, detail = found
        return problem(kind, detail + (f"; {err}" if err and kind not in ("schema", "rows") else "")), ids
    if err:
        return problem("unreadable", err), ids
    if seen is not None and data is not None:
        seen.ids, seen.carried, seen.writer = ids, _carried(t), _created_by(data)
    return None, ids


def _check_compacted(store: ResultStore, sweep: str, rel: str, members: list[tuple[str, dict[str, Any]]]) -> list[Problem]:
    """A compacted file (storage.records) against the records of the units that name it, read once:
    its size and SHA-256 (the one rule, :func:`storage.records.file_problem`), its schema, the units
    its footer lists (``COMPACTED_KEY``) against the rows it holds per unit, and each naming unit's
    rows. A problem of the file is each naming unit's (recompute); a listed unit that no row names it
    for (superseded since) is not read by anyone and is no problem."""
    table = members[0][1]["table"]

    def each(kind: str, detail: str, units: Iterable[str] | None = None) -> list[Problem]:
        return [Problem(sweep, u, table, rel, kind, detail) for u in sorted(set(units or [u for u, _r in members]))]

    size = store.size(rel)
    if size is None:
        return each("missing", f"no file; {len(members)} unit(s) name this compacted file")
    data, t, err = _read(store, rel)
    declared = TABLES.get(table)
    digest = hashlib.sha256(data).hexdigest() if data is not None else None
    out: list[Problem] = []
    for unit, rec in members:
        found = file_problem(rec, size=size, sha256=digest, schema_problem=_compatible(t.schema, declared, exact=True)
                             if t is not None and declared is not None else None)
        if found is not None:
            out += each(found[0], found[1] + (f"; {err}" if err and found[0] not in ("schema", "rows") else ""), [unit])
    if out:
        return out
    if err or t is None:
        return each("unreadable", err or "not readable")
    try:
        listed = json.loads((t.schema.metadata or {}).get(COMPACTED_KEY.encode(), b"null"))["units"]
        assert isinstance(listed, dict)
    except (ValueError, TypeError, KeyError, AssertionError):
        return each("schema", f"a compacted file whose footer lists no units ({COMPACTED_KEY})")
    per_unit = t.group_by("unit_id").aggregate([("unit_id", "count")])
    counts = dict(zip(per_unit.column("unit_id").to_pylist(), per_unit.column("unit_id_count").to_pylist(), strict=True))
    if counts != listed:
        return each("rows", "the rows it holds per unit are not the ones its footer lists")
    for unit, rec in members:
        if listed.get(unit) != rec["rows"]:
            out += each("rows", f"holds {listed.get(unit, 0)} rows of unit {unit}, the ledger records {rec['rows']}", [unit])
    return out


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


def _planned(store: ResultStore, sweep: str) -> set[str]:
    """The unit ids the sweep's spec record plans (none when there is no readable record)."""
    try:
        record = store.sweep_record(sweep)
    except Exception:  # noqa: BLE001 - a damaged spec record plans nothing here
        return set()
    return set((record or {}).get("unit_ids") or [])


@dataclass
class _Ledger:
    """The ledger files of one sweep as verify sees them."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # unit -> its intact row
    writers: dict[str, str] = field(default_factory=dict)  # unit -> created_by of its ledger file
    damaged: set[str] = field(default_factory=set)  # units whose ledger file is damaged
    where: dict[str, str] = field(default_factory=dict)  # unit -> its row's file when not its own ledger file
    original: dict[str, Any] = field(default_factory=dict)  # compacted unit -> the files its row named at commit


def _ledger(store: ResultStore, sweep: str, problems: list[Problem], tables: list[str] | None = None) -> _Ledger:
    """Each unit's ledger row from its own ledger file, read whole with page checksums verified
    (:func:`storage.store.parse_ledger_file`); problems of the ledger files themselves. ``tables``
    (the result tables of the tree) given: each file's bytes are also checked against what the store
    writes for its row, and a misnamed file is told apart from a unit's damaged one."""
    out = _Ledger()
    strays: list[tuple[str, str]] = []
    planned = _planned(store, sweep) if tables is not None else set()
    for path in store.parquet_files("units", sweep):
        rel = store.relative(path)
        try:
            data = store.read_bytes(rel) if tables is not None else None
            row, damage, writer = parse_ledger_file(pa.BufferReader(data) if data is not None else path, rel)
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(Problem(sweep, rel.rsplit("/", 1)[1][: -len(".parquet")], "units", rel, "unreadable",
                                    f"ledger file: cannot read: {exc}"))
            continue
        if damage is not None:
            name = damage.unit_id
            if damage.kind == "wrong_unit" and damage.holds is not None and not _is_unit(store, sweep, name, planned, tables):
                strays.append((rel, damage.holds))  # a copy under a name that is no unit's
                continue
            out.damaged.add(name)
            problems.append(Problem(sweep, name, "units", rel, damage.kind, f"ledger file {damage.why}"))
            continue
        assert row is not None
        unit = row["unit_id"]
        if data is not None and row["files"] is not None and writer == _this_writer() \
                and bytes(ledger_bytes(row)) != data:
            out.damaged.add(unit)
            problems.append(Problem(sweep, unit, "units", rel, "checksum",
                                    "ledger file: not the bytes the store writes for the row it holds "
                                    "(a changed byte in a page header, the footer or its statistics)"))
            continue
        out.rows[unit] = row
        out.writers[unit] = writer
    _checkpoint(store, sweep, problems, out, check_rows=tables is not None)
    for rel, uid in strays:
        kind = "duplicate" if uid in out.rows else "orphan"
        problems.append(Problem(sweep, uid, "units", rel, kind,
                                f"a ledger row of unit {uid} in a file not named after it" +
                                (" (the unit has its own ledger row: counted twice)" if uid in out.rows else ""), SET_ASIDE))
    return out


def _checkpoint(store: ResultStore, sweep: str, problems: list[Problem], out: _Ledger, check_rows: bool) -> None:
    """The sweep's ledger checkpoint (storage.records) checked like a ledger file: its bytes against
    the SHA-256 its name records, page checksums, schema, one row per unit, its sweep; and (``check_rows``)
    each row against the ledger file it replaced: the bytes this writer makes of the row must have the
    SHA-256 recorded beside it. Its rows of units with no tail file join ``out``. A damaged checkpoint
    is set aside by ``--repair``; its units then have result files and no ledger row (recomputed and
    compared). Files in the checkpoint folder that are no checkpoint are strays; an older checkpoint
    (a checkpoint cut short before it removed it) is a notice."""
    records = SweepRecords(store, sweep)
    found, strays = records.checkpoints()
    for rel in strays:
        problems.append(Problem(sweep, None, "units", rel, "orphan",
                                "a file in the ledger's checkpoint folder whose name is not <seq>-<SHA-256>.parquet", SET_ASIDE))
    for old in found[:-1]:
        problems.append(Problem(sweep, None, "units", old.rel, "superseded",
                                "an older ledger checkpoint (a checkpoint cut short before removing it; the next one does)", NONE))
    if not found:
        return
    cp = found[-1]
    try:
        read = records.read_checkpoint(cp)
    except FileNotFoundError:
        return
    except OSError as exc:
        problems.append(Problem(sweep, None, "units", cp.rel, "unreadable", f"ledger checkpoint: cannot read: {exc}", SET_ASIDE))
        return
    if not read.ok or read.table is None:
        problems.append(Problem(sweep, None, "units", cp.rel, read.kind,
                                f"ledger checkpoint {read.why}; the units only it records have no ledger row", SET_ASIDE))
        return
    superseded = set(out.rows) | out.damaged
    writer = _this_writer() if check_rows else None
    for row in read.table.to_pylist():
        unit = row["unit_id"]
        if unit in superseded:
            continue
        sha, wrote, original = row.pop("replaced_sha256"), row.pop("replaced_writer"), row.pop("original_files")
        committed = row if original is None else {**row, "files": original}  # a compacted unit: as committed
        if writer is not None and wrote == writer and sha and committed["files"] is not None \
                and hashlib.sha256(bytes(ledger_bytes(committed))).hexdigest() != sha:
            out.damaged.add(unit)
            problems.append(Problem(sweep, unit, "units", cp.rel, "checksum",
                                    f"ledger checkpoint: its row of unit {unit} is not the ledger file it replaced "
                                    f"(that file's SHA-256 {sha[:12]}… is recorded beside the row)"))
            continue
        out.rows[unit] = row
        out.writers[unit] = wrote or ""
        out.where[unit] = cp.rel
        if original is not None:
            out.original[unit] = original


def _is_unit(store: ResultStore, sweep: str, name: str, planned: set[str], tables: list[str] | None) -> bool:
    """Whether ``name`` is a unit of ``sweep``: planned by its spec record, or with a result file."""
    return name in planned or any(store.size(_rel(t, sweep, name)) is not None for t in tables or [])


def _row_view(row: dict[str, Any]) -> dict[str, Any]:
    """A ledger row as its files carry it (:func:`storage.store.ledger_row_metadata`), for comparing."""
    view: dict[str, Any] = json.loads(ledger_row_metadata("", row))["row"]
    return view


def _differs(ledger_row: dict[str, Any], carried: str, sweep: str) -> str | None:
    """Where ``ledger_row`` and the row a file carries disagree (None when they agree)."""
    try:
        where, row = ledger_row_from_metadata(carried)
    except ValueError as exc:
        return f"a result file's {LEDGER_ROW_KEY} metadata is not a ledger row ({exc})"
    if where != sweep:
        return f"a result file records sweep {where!r}"
    mine, theirs = _row_view(ledger_row), _row_view(row)
    cols = sorted(c for c in mine if mine[c] != theirs.get(c))
    return f"columns {cols} differ from what its result files recorded at commit" if cols else None


def rebuild_ledger_row(store: ResultStore, sweep: str, unit: str, tables: list[str] | None = None) -> tuple[dict[str, Any] | None, str]:
    """The ledger row of ``unit`` rebuilt from its result files, or (None, why not).

    Each result file a unit commits carries the unit's ledger row (``LEDGER_ROW_KEY``). The row is
    rebuilt only when every file that row lists is present at its own path, inside its partition,
    reads with every page checksum verified, has the declared schema, the listed rows (all of this
    unit), the same carried row as the others, and bytes exactly as the store writes those rows and
    that metadata (so no byte of it changed since commit, footer and statistics included); and when
    no other result file of the unit exists. The rebuilt row is the committed one column for column;
    its ``files`` records get each file's size and SHA-256.
    """
    tables = sorted(set(store.table_partitions()) - UNMANAGED_TABLES) if tables is None else tables
    present: dict[str, bytes] = {}
    for table in tables:
        rel = _rel(table, sweep, unit)
        try:
            store.recorded(sweep, {"table": table, "path": rel})
        except PathEscape as exc:
            return None, str(exc)
        if store.size(rel) is not None:
            try:
                present[rel] = store.read_bytes(rel)
            except OSError as exc:
                return None, f"{rel}: cannot read: {exc}"
    if not present:
        return None, "no result file of the unit carries its ledger row"
    carried: set[str] = set()
    counts: dict[str, int] = {}
    for rel, data in present.items():
        table = rel.split("/", 1)[0].removeprefix("table=")
        t, err = _parse(data)
        if t is None:
            return None, f"{rel}: {err}"
        text = _carried(t)
        if text is None:
            return None, f"{rel} carries no ledger row (written before ledger rows were carried)"
        if _compatible(t.schema, TABLES[table], exact=True) is not None or _unit_ids(t) - {unit} \
                or (t.num_rows and "unit_id" in t.column_names and t.column("unit_id").null_count):
            return None, f"{rel} does not hold rows of unit {unit} in the declared schema"
        if _created_by(data) != _this_writer():
            return None, f"{rel} was written by another Parquet writer ({_created_by(data)}): its bytes cannot be checked"
        if bytes(parquet_bytes(_declared(table, t), {LEDGER_ROW_KEY: text})) != data:
            return None, f"{rel}: not the bytes the store writes for its rows (changed since commit)"
        carried.add(text)
        counts[rel] = t.num_rows
    if len(carried) != 1:
        return None, "the unit's result files carry different ledger rows"
    try:
        where, row = ledger_row_from_metadata(carried.pop())
    except ValueError as exc:
        return None, f"the carried ledger row is not one ({exc})"
    listed = {r.get("path"): r for r in row["files"] if isinstance(r, dict)}
    if where != sweep or row["unit_id"] != unit or row["status"] != "ok":
        return None, f"the carried row is of sweep {where!r}, unit {row['unit_id']!r}, status {row['status']!r}"
    if set(listed) != set(present) or len(listed) != len(row["files"]):
        return None, (f"the carried row lists {sorted(map(str, listed))}, the unit has {sorted(present)}")
    if any(listed[rel].get("rows") != counts[rel] for rel in present):
        return None, "a result file holds another number of rows than its carried row lists"
    row["files"] = [FileRecord(table=str(r["table"]), path=str(r["path"]), rows=int(r["rows"]),
                               bytes=len(present[str(r["path"])]),
                               sha256=hashlib.sha256(present[str(r["path"])]).hexdigest()).as_dict()
                    for r in row["files"]]
    try:
        rebuilt: dict[str, Any] = to_table("units", [row]).to_pylist()[0]
    except (ValueError, TypeError, pa.ArrowException) as exc:
        return None, f"the carried row does not fit the ledger's schema ({exc})"
    return rebuilt, ""


def _verify_sweep(store: ResultStore, sweep: str, tables: list[str]) -> list[Problem]:
    problems: list[Problem] = []
    read = _ledger(store, sweep, problems, tables)
    ledger = read.rows
    named: dict[str, list[str]] = {}  # path -> units whose ledger rows name it
    held: set[tuple[str, str]] = set()  # (table, unit) whose rows a recorded file holds
    escaped: set[str] = set()  # units with a record pointing outside its partition: recomputed
    seen: dict[str, list[tuple[str, _Seen]]] = {}  # unit -> (path, what it carries) of its intact files
    compacted: dict[str, list[tuple[str, dict[str, Any]]]] = {}  # compacted file -> (unit, record) naming it
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
            problems.append(Problem(sweep, unit, "units", _rel("units", sweep, unit), "no_records",
                                    f"ledger row says ok with {row['rows']} rows in {row['tables']} but records no files"))
        for i, rec in enumerate(row["files"]):
            if is_compacted(str(rec["path"])) and _escape(store, sweep, unit, f"files[{i}].path", rec) is None:
                compacted.setdefault(rec["path"], []).append((unit, rec))  # checked once per file, below
                named.setdefault(rec["path"], []).append(unit)
                held.add((rec["table"], unit))
                continue
            what = _Seen()
            p, ids = _check_record(store, sweep, unit, rec, f"files[{i}].path", what)
            problems += [p] if p is not None else []
            if p is not None and p.kind == "path_escape":
                escaped.add(unit)  # not followed: names no file, holds no rows
                continue
            if p is None:
                seen.setdefault(unit, []).append((rec["path"], what))
            named.setdefault(rec["path"], []).append(unit)
            held |= {(rec["table"], u) for u in ids}
    for rel, members in sorted(compacted.items()):
        problems += _check_compacted(store, sweep, rel, members)
    for rel, units in sorted(named.items()):
        if len(units) > 1 and rel not in compacted:
            problems += [Problem(sweep, u, rel.split("/", 1)[0].removeprefix("table="), rel, "duplicate",
                                 f"one file named by the ledger rows of {len(units)} units {sorted(units)}: rows counted twice")
                         for u in sorted(set(units))]
    problems += _cross_check(sweep, read, seen, named)
    bad_ledger = {p.unit_id for p in problems if p.table == "units" and p.remedy == RECOMPUTE} | escaped | read.damaged
    unledgered: dict[str, list[Problem]] = {}  # unit -> orphan problems of its files (no ledger file at all)
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
            orphan = Problem(sweep, holds[0] if len(holds) == 1 else None, table, rel, "orphan",
                             why + (f"; {err}" if err else ""), SET_ASIDE)
            if stem not in ledger and _carried(t) is not None:
                unledgered.setdefault(stem, []).append(orphan)  # its ledger file may be lost: rebuildable?
            else:
                problems.append(orphan)
    for unit, orphans in sorted(unledgered.items()):
        if rebuild_ledger_row(store, sweep, unit, tables)[0] is None:
            problems += orphans  # not the complete files of a committed unit: strays
            continue
        problems.append(Problem(sweep, unit, "units", _rel("units", sweep, unit), "missing",
                                "no ledger file, but the unit's result files are complete",
                                RECOMPUTE))
    problems += _launcher_records(store, sweep)
    return _remedies(store, sweep, tables, problems)


def _launcher_records(store: ResultStore, sweep: str) -> list[Problem]:
    """The records the launcher writes (``sweeps``: the spec record, one row; ``launches``: one row
    per launch) checked like the rest: read with page checksums, the declared schema, the bytes the
    store writes for their rows; a spec record missing from its partition. Remedy: set aside (a
    launch writes the spec record again; a launch record is history)."""
    out = []
    for table in ("sweeps", "launches"):
        files = store.parquet_files(table, sweep)
        if table == "sweeps" and not files and sweep in store.sweep_partitions("sweeps"):
            out.append(Problem(sweep, None, table, _rel(table, sweep, "spec"), "missing",
                               "the sweep's spec record is gone (the next launch writes it again)", SET_ASIDE))
        for path in files:
            rel = store.relative(path)
            data, t, err = _read(store, rel)
            why = err or (_compatible(t.schema, TABLES[table], exact=False) if t is not None else None)
            if not why and t is not None and table == "sweeps" and t.num_rows != 1:
                why = f"holds {t.num_rows} rows, not the one spec record"
            if not why and t is not None and data is not None and _created_by(data) == _this_writer():
                try:
                    same = bytes(parquet_bytes(_declared(table, t))) == data
                except (ValueError, TypeError, pa.ArrowException):
                    same = False
                why = "" if same else "not the bytes the store writes for its rows (a changed byte in a page header, the footer or its statistics)"
            if why:
                out.append(Problem(sweep, None, table, rel, "unreadable" if err else "checksum" if "bytes" in why else "schema",
                                   f"{table} record: {why}", SET_ASIDE))
    return out


def _cross_check(sweep: str, read: _Ledger, seen: dict[str, list[tuple[str, _Seen]]],
                 named: dict[str, list[str]]) -> list[Problem]:
    """Ledger rows against what their intact result files carry: the row (``LEDGER_ROW_KEY``) and the
    writer. A disagreement is the ledger file's problem: the files are as committed (SHA-256)."""
    out = []
    for unit, files in sorted(seen.items()):
        row, rel = read.rows[unit], read.where.get(unit, _rel("units", sweep, unit))
        for path, what in files:
            if len(named.get(path, [])) > 1:
                continue  # a file named by two rows: reported as duplicate
            committed = row if unit not in read.original else {**row, "files": read.original[unit]}
            if what.carried is not None and (why := _differs(committed, what.carried, sweep)) is not None:
                out.append(Problem(sweep, unit, "units", rel, "mismatch", f"ledger row: {why} ({path})"))
                break
            if what.writer and what.writer != read.writers.get(unit, ""):
                out.append(Problem(sweep, unit, "units", rel, "checksum",
                                   f"ledger file written by {read.writers.get(unit, '')!r}, its unit's result files by "
                                   f"{what.writer!r} (one writer commits both): a changed byte in its footer"))
                break
    return out


def _remedies(store: ResultStore, sweep: str, tables: list[str], problems: list[Problem]) -> list[Problem]:
    """A unit whose only damage is its ledger file gets remedy ``recompute and compare`` when its result
    files look as committed and carry its row (:func:`rebuild_ledger_row`); the detail says which
    remedy and why."""
    other = {p.unit_id for p in problems if p.remedy == RECOMPUTE and p.table != "units"}
    out = []
    for p in problems:
        if p.table == "units" and p.remedy == RECOMPUTE and p.unit_id is not None:
            row, why_not = (None, "other files of the unit are damaged too") if p.unit_id in other \
                else rebuild_ledger_row(store, sweep, p.unit_id, tables)
            p = dataclasses.replace(p, remedy=COMPARE, detail=(
                f"{p.detail}; its result files look as committed and carry its ledger row, but without the ledger "
                "entry nothing vouches for their values: `launch --repair` sets them aside, recomputes the unit "
                "and compares")) if row is not None \
                else dataclasses.replace(p, detail=f"{p.detail}; `launch --repair` recomputes the unit "
                                         f"(its files cannot stand in for the ledger row: {why_not})")
        out.append(p)
    return out


def _canonical_rows(t: pa.Table) -> list[str]:
    """Each row of ``t`` but its ``RUN_VARYING`` columns, as exact text (floats by their shortest
    round-trip repr, so -0.0, NaN and every bit of a value count)."""
    keep = [c for c in t.column_names if c not in RUN_VARYING]
    return [json.dumps(r, sort_keys=True, default=repr) for r in t.select(keep).to_pylist()]


def compare_with_aside(store: ResultStore, sweep: str, unit: str, aside: str) -> str | None:
    """None when the unit's committed result rows equal those of its files set aside under ``aside``
    (every column but ``RUN_VARYING``), else what differs, in one line."""
    tables = sorted(set(store.table_partitions()) - UNMANAGED_TABLES)
    diffs = []
    for table in tables:
        rel = _rel(table, sweep, unit)
        now, before = store.size(rel) is not None, store.size(f"{aside}/{rel}") is not None
        if not now and not before:
            continue
        if now != before:
            diffs.append(f"table {table}: {'only the recomputation' if now else 'only the set-aside files'} "
                         "has a file")
            continue
        (_, new, err_new), (_, old, err_old) = _read(store, rel), _read(store, f"{aside}/{rel}")
        if new is None or old is None:
            diffs.append(f"table {table}: unreadable ({err_new or err_old})")
            continue
        a, b = _canonical_rows(old), _canonical_rows(new)
        if a == b:
            continue
        if len(a) != len(b):
            diffs.append(f"table {table}: {len(a)} rows set aside, {len(b)} recomputed")
            continue
        differ = [i for i in range(len(a)) if a[i] != b[i]]
        cols = [c for c in new.column_names if c not in RUN_VARYING  # compared as the rows were (NaN, -0.0)
                and _canonical_rows(old.select([c])) != _canonical_rows(new.select([c]))]
        diffs.append(f"table {table}: {len(differ)} of {len(a)} rows differ (columns {', '.join(cols)})")
    return "; ".join(diffs) or None


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
    before = store.use_read_cache
    store.use_read_cache = False  # every record read whole and checked, never a kept read (storage.readcache)
    try:
        for s in sweeps:
            problems += _verify_sweep(store, s, tables)
    finally:
        store.use_read_cache = before
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
    for unit, row in store.read_ledger(sweep).rows.items():
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
    """The units of ``sweep`` whose committed results are damaged (remedy ``recompute`` or
    ``recompute and compare``: a unit whose ledger file alone is damaged or lost).

    ``problems`` is :func:`verify`'s list when the caller has it already (it is computed otherwise).
    """
    found = verify(store, sweep) if problems is None else problems
    return {p.unit_id for p in found if p.remedy in (RECOMPUTE, COMPARE) and p.sweep == sweep and p.unit_id is not None}


def quarantine_folder(label: str = "") -> str:
    """A new folder under ``_quarantine/`` (``<UTC time>-<id>[-label]``) for files set aside."""
    return f"_quarantine/{utcnow().strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}" + (f"-{label}" if label else "")


def repair(store: ResultStore, sweep: str, units: Iterable[str], *, strays: bool = True,
           problems: Iterable[Problem] | None = None,
           aside: str | None = None) -> Repaired:
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

    A unit whose problems all have remedy ``recompute and compare`` (its ledger file alone is damaged
    or lost) is moved aside the same way and listed in ``Repaired.compare``: once it is recomputed,
    :func:`compare_with_aside` says whether the files set aside held what it computes (nothing is
    rebuilt from files that vouch for themselves).
    A damaged ledger file's records are followed only for its own unit's files (a row of another
    unit in it never moves that unit's files). ``aside``: the folder to move into (default a new
    ``_quarantine/<UTC time>-<id>``); moving a file already moved is a no-op, so a repair cut short
    can be run again with the same ``aside``.
    """
    found = list(verify(store, sweep) if problems is None else problems)
    done = Repaired(quarantine=aside or quarantine_folder())
    # A unit whose row only the ledger checkpoint holds gets its ledger file back first (storage.records),
    # so that it moves aside below like any other and the checkpoint no longer counts it.
    units = sorted(set(units))
    SweepRecords(store, sweep).detach(units)
    tables = sorted(set(store.table_partitions()) - UNMANAGED_TABLES)
    remedies: dict[str, set[str]] = {}
    for p in found:
        if p.sweep == sweep and p.unit_id is not None and p.remedy in (RECOMPUTE, COMPARE):
            remedies.setdefault(p.unit_id, set()).add(p.remedy)

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
        if remedies.get(unit) == {COMPARE}:
            done.compare.append(unit)
        try:
            rows = store.read_table(f"{store.base}/{ledger_file}", schema=UNITS).to_pylist()
        except Exception:  # noqa: BLE001 - absent or unreadable: no recorded files to follow
            rows = []
        if store.size(ledger_file) is not None:
            move(ledger_file)
            done.units.append(unit)
        recorded = []
        for rec in (r for row in rows if row.get("unit_id") == unit for r in row["files"] or []):
            try:  # only a record inside its own partition is followed; the unit is recomputed either way
                rel = store.recorded(sweep, rec)
            except PathEscape:
                continue
            if rel.rsplit("/", 1)[1] == f"{unit}.parquet":  # never another unit's file
                recorded.append(rel)
        for rel in [*recorded, *(_rel(t, sweep, unit) for t in tables)]:
            move(rel)
    for p in found:
        if strays and p.remedy == SET_ASIDE and p.sweep == sweep and p.path is not None:
            move(p.path)
    # A damaged compacted file whose every unit is recomputed now holds nothing anyone reads: aside too.
    damaged_compacted = {p.path for p in found if p.sweep == sweep and p.path is not None and is_compacted(p.path)
                         and p.remedy == RECOMPUTE}
    for rel in sorted(damaged_compacted):
        if {p.unit_id for p in found if p.path == rel} <= set(units):
            move(rel)
    return done
