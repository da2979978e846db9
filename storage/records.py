"""One sweep's records, one owner: the ledger (its checkpoint and its tail), the rule for a file
against its record, the sweep's claim (its spec record), its pre-registrations and its launches.

Every reader and writer of a sweep's bookkeeping goes through :class:`SweepRecords`: the store's
``read_ledger`` / ``done_units``, the catalog's binder, ``sweep verify`` and ``launch --repair``, the
runner (claim, lost launches, the committed count, checkpoints) and the pre-registration.

**The ledger is a log with checkpoints**, the way Delta Lake keeps ``_delta_log`` readable. A unit's
commit writes its ledger file ``table=units/sweep=<s>/<unit_id>.parquet`` (the *tail*: one small file
per unit, the durable commit of issue #4, unchanged). A checkpoint merges the ledger into one file,

    table=units/sweep=<s>/_checkpoints/<seq, 10 digits>-<SHA-256 of its bytes>.parquet

holding one row per unit (every ``UNITS`` column, plus ``replaced_sha256`` and ``replaced_writer``: the
SHA-256 and the Parquet writer of the ledger file the row came from). Its name is its record: a
reader hashes the bytes and compares them with the name before it trusts a row (an object store's
LIST returns the name, so nothing else needs to be read or kept consistent). Writing one
(:meth:`SweepRecords.checkpoint`, under the sweep's launch lock):

1. read the ledger (the current checkpoint plus the tail, every file verified);
2. write the merged rows to the next sequence number: staged, fsynced, renamed into place, and the
   directory fsynced -- durable before anything is removed;
3. remove each tail file it replaced, only if it is still the file that was read (its identity:
   size, mtime, ctime, inode; a rewrite since then keeps it, and it stays newer than the checkpoint);
4. remove the checkpoints before it.

A crash between any two steps loses nothing: before 2 the old state stands; after 2 a tail file and
the checkpoint hold the same row (a tail file always wins over a checkpoint row: it is the later
write); older checkpoints are ignored by readers (only the highest sequence number counts) and
removed by the next checkpoint. A damaged tail file is never merged nor removed: it stays for
``sweep verify`` to name, and its unit's checkpoint row (if any) is left out of the next checkpoint,
since the damaged file is a later write of that unit. A checkpoint whose bytes are not its name's
SHA-256, that fails a page checksum, has another schema, holds a unit twice or belongs to another
sweep is never trusted: its units count as not done (a launch recomputes them; ``sweep verify``
names it, and ``launch --repair`` sets it aside, recomputes its units and compares them with their
result files set aside, as for any lost ledger file). A relaunch and a catalog open read the
checkpoint (one file) plus the tail; a launch writes a checkpoint when it ends with at least
:data:`CHECKPOINT_FROM` tail files (``SWAPCHECK_CHECKPOINT_FROM``). :meth:`SweepRecords.detach` turns
chosen units' checkpoint rows back into tail files (the exact bytes they replaced) before
``launch --repair`` moves them aside.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage.errors import DamagedRecord, StorageError, StorageFault
from storage.files import (
    _TEMPORARY,
    LedgerDamage,
    _pool,
    ledger_bytes,
    local_identity,
    object_identity,
    parquet_bytes,
    parse_ledger_file,
    to_table,
    utcnow,
)
from storage.schemas import SWEEPS, UNITS
from swapcheck_common.env import count_from_env

if TYPE_CHECKING:
    from storage.store import ResultStore

__all__ = ["CHECKPOINT_FROM", "CHECKPOINTS", "CHECKPOINT_SCHEMA", "COMPACTED_KEY", "COMPACT_FROM", "COMPACT_ROWS",
           "Checkpoint", "CheckpointRead", "LedgerDamage", "LedgerRead", "SweepRecords", "checkpoint_from",
           "compact_settings", "compacted_units", "file_problem", "is_compacted"]

#: Where a sweep's checkpoints are, under its ledger partition ``table=units/sweep=<s>/``.
CHECKPOINTS = "_checkpoints"
#: A launch that ends with at least this many ledger files in the tail writes a checkpoint
#: (``SWAPCHECK_CHECKPOINT_FROM``; 0 turns checkpoints off).
CHECKPOINT_FROM = 1000
#: The checkpoint's columns: the ledger's, where each row came from, and (a compacted unit) the files
#: its row named when it was committed.
CHECKPOINT_SCHEMA = (UNITS.append(pa.field("replaced_sha256", pa.string())).append(pa.field("replaced_writer", pa.string()))
                     .append(pa.field("original_files", UNITS.field("files").type)))
#: The checkpoint's columns before compaction existed (read as if ``original_files`` were all null).
_CHECKPOINT_V1 = pa.schema(list(CHECKPOINT_SCHEMA)[:-1])
#: A finished sweep's result partition with at least this many unit files is compacted
#: (``SWAPCHECK_COMPACT_FROM``; 0: never) into files of at least :data:`COMPACT_ROWS` rows
#: (``SWAPCHECK_COMPACT_ROWS``), the last one holding the rest.
COMPACT_FROM = 1000
COMPACT_ROWS = 100_000
#: The key-value metadata a compacted file carries: JSON ``{"sweep", "table", "units": {unit_id: rows}}``.
COMPACTED_KEY = "swapcheck.compacted"
_COMPACTED = re.compile(r"^c-[0-9a-f]{20}\.parquet$")


def is_compacted(path: str) -> bool:
    """Whether ``path`` names a compacted result file (``c-<20 hex>.parquet``: the rows of many units)."""
    return bool(_COMPACTED.match(path.rsplit("/", 1)[-1]))


def compact_settings() -> tuple[int, int]:
    """(``SWAPCHECK_COMPACT_FROM``, ``SWAPCHECK_COMPACT_ROWS``); a bad value raises ``ValueError``."""
    return (count_from_env("SWAPCHECK_COMPACT_FROM", COMPACT_FROM, 0, 10**9, ValueError, "unit files (0: never)"),
            count_from_env("SWAPCHECK_COMPACT_ROWS", COMPACT_ROWS, 1, 10**12, ValueError, "rows"))
#: The key-value metadata a checkpoint carries (JSON: sweep, seq, units, replaced, created_at).
CHECKPOINT_KEY = "swapcheck.checkpoint"
_NAME = re.compile(r"^(\d{10})-([0-9a-f]{64})\.parquet$")


def checkpoint_from() -> int:
    """``SWAPCHECK_CHECKPOINT_FROM`` (default :data:`CHECKPOINT_FROM`); a bad value raises ``ValueError``."""
    return count_from_env("SWAPCHECK_CHECKPOINT_FROM", CHECKPOINT_FROM, 0, 10**9, ValueError, "ledger files (0: never)")


# -- the one rule for a file against its record -----------------------------------------------------

def file_problem(record: Mapping[str, Any], *, size: int | None = None, sha256: str | None = None,
                 rows: int | None = None, schema_problem: str | None = None) -> tuple[str, str] | None:
    """(kind, detail) of the first way a file differs from its ledger ``record`` (``rows``, ``bytes``,
    ``sha256``), given whatever of it has been looked at (None: not looked at), else None.

    The one rule for catalog and verify, most telling first: ``schema`` (its columns are not the
    table's), ``rows`` (another row count), ``truncated`` / ``extended`` (fewer or more bytes),
    ``checksum`` (as many bytes, other ones)."""
    if schema_problem:
        return "schema", schema_problem
    if rows is not None and record.get("rows") is not None and rows != record["rows"]:
        return "rows", f"{rows} rows, the ledger recorded {record['rows']}"
    if size is not None and record.get("bytes") is not None and size != record["bytes"]:
        return ("truncated" if size < record["bytes"] else "extended"), f"{size} bytes, the ledger recorded {record['bytes']}"
    if sha256 is not None and record.get("sha256") and sha256 != record["sha256"]:
        return "checksum", (f"same size, other bytes (SHA-256 {sha256[:12]}…, the ledger recorded "
                            f"{str(record['sha256'])[:12]}…: rewritten or corrupted)")
    return None


# -- what a read of the ledger finds ------------------------------------------------------------------

@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint file: its path relative to the results root, sequence number and SHA-256."""

    rel: str
    seq: int
    sha256: str


@dataclass
class CheckpointRead:
    """The sweep's current checkpoint as read: intact (``ok``: its bytes are the ones its name records,
    so every page decodes as written) or the problem (``kind``, ``why``). ``keys`` holds each row's
    ``unit_id`` and ``status`` (decoded at once: all a skip-check needs); :attr:`table` every column
    (``CHECKPOINT_SCHEMA``), decoded on first use. ``created_by`` is its Parquet writer."""

    checkpoint: Checkpoint
    kind: str = ""
    why: str = ""
    created_by: str = ""
    identity: list[Any] | None = None
    keys: pa.Table | None = None
    file: pq.ParquetFile | None = None
    #: The keys came from what this machine read and checked before (storage.readcache): the file
    #: itself is read (and its bytes checked again) only when a column beyond the keys is needed.
    from_cache: bool = False
    loader: Callable[[], pq.ParquetFile] | None = None

    @property
    def ok(self) -> bool:
        return self.keys is not None

    def columns(self, names: list[str]) -> pa.Table:
        """``names`` of every row (an intact checkpoint's), decoded now: only those columns (the whole
        :attr:`table` when it is decoded already). A read whose keys came from the read cache reads
        and checks the file's bytes first (``loader``)."""
        if "table" in self.__dict__ and self.__dict__["table"] is not None:
            return self.__dict__["table"].select(names)
        if self.file is None and self.loader is not None:
            self.file = self.loader()
        if self.file is None:
            raise ValueError(f"{self.checkpoint.rel}: not an intact checkpoint ({self.why})")
        return self.file.read(columns=names, use_threads=False).replace_schema_metadata(None)

    @cached_property
    def table(self) -> pa.Table | None:
        if self.file is None and self.loader is not None:
            self.file = self.loader()
        if self.file is None:
            return None
        t = self.file.read(use_threads=False).replace_schema_metadata(None)
        if "original_files" not in t.column_names:  # a checkpoint written before compaction existed
            t = t.append_column(CHECKPOINT_SCHEMA.field("original_files"),
                                pa.nulls(t.num_rows, CHECKPOINT_SCHEMA.field("original_files").type))
        return t


@dataclass
class LedgerRead:
    """The ledger of one sweep as read: the current checkpoint's rows that no tail file supersedes
    (``base``, Arrow), each intact tail file's row (``tail``), and the tail files that are damaged.

    ``rows`` merges both (unit id -> row, built on first use: a relaunch needs only :meth:`done`,
    which stays in Arrow). ``writers`` maps a unit to the Parquet writer of its ledger file (for a
    checkpoint row: of the file it replaced)."""

    sweep: str
    tail: dict[str, dict[str, Any]]
    damaged: list[LedgerDamage]
    tail_writers: dict[str, str] = field(default_factory=dict)
    #: unit -> the SHA-256 of its tail file's bytes (what a checkpoint records as ``replaced_sha256``)
    tail_sha: dict[str, str] = field(default_factory=dict)
    checkpoint: CheckpointRead | None = None
    #: Units whose tail file (intact or damaged) supersedes their checkpoint row.
    superseded: set[str] = field(default_factory=set)
    #: path -> identity of each intact tail file as read (what a checkpoint may replace).
    tail_files: dict[str, list[Any] | None] = field(default_factory=dict)

    def state(self) -> tuple[Any, ...] | None:
        """What this read saw, as identities: the checkpoint (its name holds its SHA-256, and its
        identity) and each tail file's identity. Two reads with equal states read the same bytes, so
        whatever was computed from one holds for the other; None when a file has no identity or is
        damaged (nothing may then be reused)."""
        if self.damaged or any(ident is None for ident in self.tail_files.values()):
            return None
        cp = self.checkpoint
        if cp is not None and cp.identity is None:
            return None
        head = (cp.checkpoint.rel, tuple(cp.identity or ())) if cp is not None else None
        return head, tuple(sorted((p, tuple(i or ())) for p, i in self.tail_files.items()))

    def _live(self, t: pa.Table) -> pa.Table:
        if not self.superseded or not t.num_rows:
            return t
        return t.filter(pc.invert(pc.is_in(t.column("unit_id"), pa.array(sorted(self.superseded), pa.string()))))

    @cached_property
    def base(self) -> pa.Table | None:
        """The checkpoint's rows (every column) of units with no tail file; None: no intact checkpoint."""
        cp = self.checkpoint
        return self._live(cp.table) if cp is not None and cp.ok and cp.table is not None else None

    @cached_property
    def base_keys(self) -> pa.Table | None:
        """``unit_id`` and ``status`` of :attr:`base`'s rows (no other column decoded)."""
        cp = self.checkpoint
        return self._live(cp.keys) if cp is not None and cp.keys is not None else None

    @cached_property
    def rows(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        if self.base is not None and self.base.num_rows:
            for row in self.base.select(UNITS.names).to_pylist():
                out[row["unit_id"]] = row
        out.update(self.tail)
        return out

    @cached_property
    def writers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.base is not None and self.base.num_rows:
            out = dict(zip(self.base.column("unit_id").to_pylist(), self.base.column("replaced_writer").to_pylist(),
                           strict=True))
        out.update(self.tail_writers)
        return out

    def row(self, unit: str) -> dict[str, Any] | None:
        """``unit``'s intact ledger row, or None (one row decoded, not the whole ledger)."""
        if unit in self.tail:
            return self.tail[unit]
        base = self.base
        if base is None or unit in self.superseded:
            return None
        found = base.filter(pc.equal(base.column("unit_id"), unit)).select(UNITS.names).to_pylist()
        return found[0] if found else None

    def rows_of(self, units: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The intact ledger rows of ``units`` (one pass over the checkpoint's rows, not one per unit)."""
        want = set(units)
        out = {u: self.tail[u] for u in want if u in self.tail}
        base = self.base
        if base is not None and base.num_rows and want - set(out):
            picked = base.filter(pc.is_in(base.column("unit_id"), pa.array(sorted(want - set(out)), pa.string())))
            out.update({r["unit_id"]: r for r in picked.select(UNITS.names).to_pylist()})
        return out

    def done_ids(self) -> pa.Array:
        """The units whose intact ledger row says ``ok``, as one Arrow string array (the checkpoint's
        never become Python strings: a relaunch matches them against its plan in Arrow)."""
        tail = pa.array([u for u, row in self.tail.items() if row.get("status") == "ok"], pa.string())
        keys = self.base_keys
        if keys is None or not keys.num_rows:
            return tail
        base = keys.filter(pc.equal(keys.column("status"), "ok")).column("unit_id").combine_chunks()
        return pa.concat_arrays([base, tail]) if len(tail) else base

    def done(self) -> set[str]:
        """The units whose intact ledger row says ``ok``."""
        out = {u for u, row in self.tail.items() if row.get("status") == "ok"}
        keys = self.base_keys
        if keys is not None and keys.num_rows:
            out.update(keys.filter(pc.equal(keys.column("status"), "ok")).column("unit_id").to_pylist())
        return out

    def statuses(self, units: set[str] | None = None) -> list[str | None]:
        """The status of each unit with an intact row (of ``units`` only, when given)."""
        out = [row.get("status") for u, row in self.tail.items() if units is None or u in units]
        keys = self.base_keys
        if keys is not None and keys.num_rows:
            b = keys if units is None else keys.filter(pc.is_in(keys.column("unit_id"), pa.array(sorted(units), pa.string())))
            out += b.column("status").to_pylist()
        return out

    def __len__(self) -> int:
        return len(self.tail) + (self.base_keys.num_rows if self.base_keys is not None else 0)

    def warnings(self, results: str, most: int = 10) -> list[str]:
        """One line per damaged ledger file (at most ``most``, then a count) and one for a damaged
        checkpoint: what a launch prints."""
        remedy = (f"Run `swapcheck sweep verify --results {results} --sweep {self.sweep}`, then "
                  "`swapcheck sweep launch --repair`")
        lines = []
        cp = self.checkpoint
        if cp is not None and not cp.ok:
            lines.append(f"ledger checkpoint {cp.checkpoint.rel} is damaged ({cp.why}); the units only it records are "
                         f"not counted as done. {remedy} (it recomputes them and compares them with their files)")
        lines += [f"ledger file {d.path} is damaged ({d.why}); unit {d.unit_id} is not counted as done. "
                  f"{remedy} (it rebuilds the row from the unit's files, or recomputes the unit)"
                  for d in self.damaged[:most]]
        if len(self.damaged) > most:
            lines.append(f"... and {len(self.damaged) - most} more damaged ledger files of sweep {self.sweep}")
        return lines


def _distinct(ids: pa.Array) -> bool:
    """Whether ``ids`` holds no value twice: a checkpoint is written sorted by unit id, so strictly
    increasing ids (one comparison per neighbour, in Arrow) prove it; anything else is counted."""
    if len(ids) < 2 or pc.all(pc.less(ids.slice(0, len(ids) - 1), ids.slice(1))).as_py():
        return True
    return bool(pc.count_distinct(ids).as_py() == len(ids))


# -- the owner --------------------------------------------------------------------------------------

class SweepRecords:
    """The records of one sweep of one results store (see the module docstring)."""

    def __init__(self, store: ResultStore, sweep: str) -> None:
        self.store = store
        self.sweep = sweep

    # -- paths -----------------------------------------------------------------------------------
    @property
    def ledger_dir(self) -> str:
        return f"table=units/sweep={self.sweep}"

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.ledger_dir}/{CHECKPOINTS}"

    def ledger_file(self, unit: str) -> str:
        return f"{self.ledger_dir}/{unit}.parquet"

    # -- checkpoints -------------------------------------------------------------------------------
    def checkpoints(self) -> tuple[list[Checkpoint], list[str]]:
        """(the checkpoint files, oldest first; every other file in the checkpoint folder but a
        writer's temporary): a listing, nothing read."""
        found, strays = [], []
        for info in self.store._files(self.store._p(self.checkpoint_dir)):
            m = _NAME.match(info.base_name)
            if m is not None:
                found.append(Checkpoint(f"{self.checkpoint_dir}/{info.base_name}", int(m.group(1)), m.group(2)))
            elif not _TEMPORARY.match(info.base_name):
                strays.append(f"{self.checkpoint_dir}/{info.base_name}")
        return sorted(found, key=lambda c: c.seq), strays

    def current_checkpoint(self) -> Checkpoint | None:
        found = self.checkpoints()[0]
        return found[-1] if found else None

    def read_checkpoint(self, cp: Checkpoint) -> CheckpointRead:
        """``cp`` read and checked whole: its bytes against the SHA-256 its name records, every page
        checksum, the schema, one row per unit, the sweep its metadata names. Never raises for the
        file's content (a storage fault raises ``OSError``; a file gone, ``FileNotFoundError``)."""
        store = self.store
        path = store._p(cp.rel)
        ident = self._identity(path)
        before: CheckpointRead | None = self._seen(path, ident)
        if before is not None:
            return before
        kept = store.read_cache
        hit = kept.get(cp.rel, ident, "checkpoint-keys") if kept is not None else None
        if hit is not None and ident is not None:  # read and checked whole before, unchanged since (storage.readcache)
            out = CheckpointRead(cp, identity=ident, keys=hit[0], created_by=str(hit[1].get("created_by", "")),
                                 from_cache=True, loader=lambda: self._checked_file(cp, path))
            self._remember(path, ident, out, kept=True)
            return out
        out = CheckpointRead(cp, identity=ident)
        data = store._read_bytes(path)
        digest = hashlib.sha256(data).hexdigest()
        if digest != cp.sha256:
            out.kind, out.why = "checksum", (f"its bytes are not the ones its name records (SHA-256 {digest[:12]}…, "
                                             f"named {cp.sha256[:12]}…: rewritten or corrupted)")
        else:
            try:
                pf = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
                out.created_by = str(pf.metadata.created_by or "")
                meta = json.loads((pf.schema_arrow.metadata or {}).get(CHECKPOINT_KEY.encode(), b"{}"))
                if not any(pf.schema_arrow.equals(sch, check_metadata=False) for sch in (CHECKPOINT_SCHEMA, _CHECKPOINT_V1)):
                    out.kind, out.why = "schema", f"columns {pf.schema_arrow.names}, a checkpoint has {CHECKPOINT_SCHEMA.names}"
                elif meta.get("sweep") != self.sweep:
                    out.kind, out.why = "wrong_sweep", f"records sweep {meta.get('sweep')!r}, it lies under sweep {self.sweep!r}"
                else:
                    keys = pf.read(columns=["unit_id", "status"], use_threads=False).replace_schema_metadata(None)
                    ids = keys.column("unit_id").combine_chunks()
                    if ids.null_count or not _distinct(ids):
                        out.kind, out.why = "duplicate", "holds a unit twice (or a row without a unit id)"
                    else:
                        out.keys, out.file = keys, pf
            except Exception as exc:  # noqa: BLE001 - any decoding error (a page CRC too) means "damaged"
                out.kind, out.why = "unreadable", f"not a readable Parquet file: {type(exc).__name__}: {str(exc).strip()[:160]}"
        if ident is not None:
            self._remember(path, ident, out, kept=False)
            if out.ok and kept is not None and out.keys is not None:
                kept.put(cp.rel, ident, "checkpoint-keys", out.keys, {"created_by": out.created_by})
        return out

    def _checked_file(self, cp: Checkpoint, path: str) -> pq.ParquetFile:
        """``cp``'s bytes, read now and checked against the SHA-256 its name records, for a read whose
        keys came from the read cache; a mismatch (its bytes changed under an unchanged identity) is
        a :class:`StorageError` naming it and what to run."""
        data = self.store._read_bytes(path)
        digest = hashlib.sha256(data).hexdigest()
        if digest != cp.sha256:
            raise StorageError(f"ledger checkpoint {self.store._where(cp.rel)}: its bytes are not the ones its name "
                               f"records (SHA-256 {digest[:12]}…) though its identity is unchanged; run `swapcheck "
                               "sweep verify`, then `swapcheck sweep launch --repair`")
        return pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)

    def _seen(self, path: str, ident: list[Any] | None) -> Any:
        """What this store read of ``path`` before, if its identity is still ``ident``; a read that came
        from the read cache counts only while the store may use it (``sweep verify`` reads every byte)."""
        store = self.store
        before = store._ledger_seen.get(path)
        if ident is None or before is None or before[0] != ident:
            return None
        if path in store._kept and store.read_cache is None:
            return None
        return before[1]

    def _remember(self, path: str, ident: list[Any], value: Any, *, kept: bool) -> None:
        """Remember ``value`` as what ``path`` held at identity ``ident`` (``kept``: from the read cache)."""
        self.store._ledger_seen[path] = (ident, value)
        (self.store._kept.add if kept else self.store._kept.discard)(path)

    def _identity(self, path: str) -> list[Any] | None:
        if self.store.local:
            try:
                return local_identity(os.stat(path))
            except FileNotFoundError:
                return None
        return object_identity(self.store.fs.get_file_info(path))

    # -- the ledger ---------------------------------------------------------------------------------
    def read_ledger(self) -> LedgerRead:
        """The ledger of the sweep: the current checkpoint (:meth:`read_checkpoint`) and every tail
        file, each read whole, its page checksums verified (:func:`storage.store.parse_ledger_file`).
        A tail file that is unreadable, fails a page checksum, has a foreign schema, holds other than
        exactly one row, or holds a row whose ``unit_id`` is not its file name is a damaged entry
        (``LedgerRead.damaged``): its unit counts as not done, so a launch recomputes it (rewriting
        the file), and nothing here raises over it. Tail files are read concurrently (a storage
        fault still raises ``OSError``).

        Within one store object, a file read before whose identity has not changed since (locally
        size, mtime, ctime, inode and device, taken before its bytes are read: any write changes the
        ctime, a replace the inode; on an object store size and mtime) is not read again: a launch
        reads the ledger before it takes the sweep's lock and again under it, and the second read
        costs a ``stat`` per file. A new store object reads every file."""
        store = self.store
        infos = [i for i in store._files(store._p(self.ledger_dir)) if i.path.endswith(".parquet")]
        seen = store._ledger_seen

        Found = tuple[dict[str, Any] | None, LedgerDamage | None, str]

        def copy(found: Found) -> Found:
            return (dict(found[0]) if found[0] is not None else None, found[1], found[2])

        def one(item: tuple[pafs.FileInfo, list[Any] | None]) -> tuple[str, list[Any] | None, Found, str] | None:
            info, ident = item
            try:
                with store.fs.open_input_file(info.path) as fh:
                    data = fh.read_buffer()  # read once: parsed, and hashed for a checkpoint's replaced_sha256
            except FileNotFoundError:  # removed between the listing and the read: no entry
                seen.pop(info.path, None)
                return None
            found = parse_ledger_file(pa.BufferReader(data), store.relative(info.path))
            digest = hashlib.sha256(data).hexdigest()
            if ident is not None:
                seen[info.path] = (ident, (copy(found), digest))
            return info.path, ident, found, digest

        parsed: list[tuple[str, list[Any] | None, Found, str] | None] = []
        todo = []
        for info in infos:  # identities first (a stat each), then only changed or new files are read
            ident = self._identity(info.path) if store.local else object_identity(info)
            before = seen.get(info.path)
            if ident is not None and before is not None and before[0] == ident:
                parsed.append((info.path, ident, copy(before[1][0]), before[1][1]))
            else:
                todo.append((info, ident))
        parsed += list(_pool().map(one, todo)) if len(todo) > 1 else [one(t) for t in todo]
        out = LedgerRead(self.sweep, {}, [])
        for item in parsed:
            if item is None:
                continue
            path, ident, (row, damage, created_by), digest = item
            if damage is not None:
                out.damaged.append(damage)
            elif row is not None:
                out.tail[row["unit_id"]] = row
                out.tail_writers[row["unit_id"]] = created_by
                out.tail_sha[row["unit_id"]] = digest
                out.tail_files[store.relative(path)] = ident
        cp = self.current_checkpoint()
        if cp is not None:
            try:
                out.checkpoint = self.read_checkpoint(cp)
            except FileNotFoundError:  # replaced by a newer checkpoint meanwhile: read again
                return self.read_ledger()
            out.superseded = set(out.tail) | {d.unit_id for d in out.damaged}
        return out

    def done(self) -> set[str]:
        return self.read_ledger().done()

    def checkpoint(self, min_tail: int = 1, *, leave_out: Iterable[str] = ()) -> Checkpoint | None:
        """Merge the ledger into a new checkpoint and remove the files it replaces (module docstring),
        when the tail holds at least ``min_tail`` intact files (or ``leave_out`` names a unit). Units
        in ``leave_out`` are left out of it (:meth:`detach`). Returns the checkpoint written, or None.
        Call it only under the sweep's launch lock. A storage fault raises ``StorageFault`` naming the
        file, with nothing removed."""
        read = self.read_ledger()
        leave = set(leave_out)
        if len(read.tail_files) < max(min_tail, 1) and not leave:
            return None
        parts = []
        if read.base is not None and read.base.num_rows:
            parts.append(read.base)
        if read.tail:
            tail_rows = []
            for unit in sorted(read.tail):
                row = read.tail[unit]
                tail_rows.append({**row, "replaced_sha256": read.tail_sha[unit],
                                  "replaced_writer": read.tail_writers.get(unit, "")})
            t = to_table("units", [{k: v for k, v in r.items() if k in UNITS.names} for r in tail_rows])
            t = t.append_column("replaced_sha256", pa.array([r["replaced_sha256"] for r in tail_rows], pa.string()))
            t = t.append_column("replaced_writer", pa.array([r["replaced_writer"] for r in tail_rows], pa.string()))
            t = t.append_column("original_files", pa.nulls(len(tail_rows), CHECKPOINT_SCHEMA.field("original_files").type))
            parts.append(t)
        merged = pa.concat_tables([p.cast(CHECKPOINT_SCHEMA) for p in parts]) if parts else CHECKPOINT_SCHEMA.empty_table()
        if leave and merged.num_rows:
            merged = merged.filter(pc.invert(pc.is_in(merged.column("unit_id"), pa.array(sorted(leave), pa.string()))))
        return self._write_checkpoint(merged.sort_by("unit_id"), read)

    def _write_checkpoint(self, merged: pa.Table, read: LedgerRead) -> Checkpoint:
        """Write ``merged`` (``CHECKPOINT_SCHEMA``, sorted) as the next checkpoint, then remove the tail
        files of ``read`` it replaced and the checkpoints before it (module docstring)."""
        store = self.store
        before, _strays = self.checkpoints()
        seq = (before[-1].seq + 1) if before else 1
        meta = {"sweep": self.sweep, "seq": seq, "units": merged.num_rows, "replaced": len(read.tail_files),
                "created_at": utcnow()}
        data = _checkpoint_bytes(merged, meta)
        cp = Checkpoint(f"{self.checkpoint_dir}/{seq:010d}-{hashlib.sha256(data).hexdigest()}.parquet", seq,
                        hashlib.sha256(data).hexdigest())
        try:
            store._put(store._p(cp.rel), data)
            self._sync_dir(store._p(self.checkpoint_dir))
        except OSError as exc:
            raise StorageFault(store._where(cp.rel), f"{type(exc).__name__}: {exc}") from exc
        _HOOK("published", cp)
        for rel, ident in sorted(read.tail_files.items()):  # only files unchanged since they were read
            path = store._p(rel)
            if store.local and self._identity(path) != ident:
                continue
            try:
                store.fs.delete_file(path)
            except FileNotFoundError:
                pass
            store._ledger_seen.pop(path, None)
            _HOOK("removed", rel)
        for old in before:
            try:
                store.fs.delete_file(store._p(old.rel))
            except FileNotFoundError:
                pass
        return cp

    def detach(self, units: Iterable[str]) -> list[str]:
        """Give each of ``units`` whose row only the checkpoint holds its ledger file back (the exact
        bytes it replaced, when they are the bytes this writer makes of the row; else the row written
        anew), then a checkpoint without them: afterwards their rows are tail files that
        ``launch --repair`` moves aside like any other. Returns the units detached. Under the lock."""
        read = self.read_ledger()
        if read.base is None or not read.base.num_rows:
            return []
        want = set(units)
        rows = read.base.filter(pc.is_in(read.base.column("unit_id"), pa.array(sorted(want), pa.string()))).to_pylist()
        if not rows:
            return []
        for row in rows:
            self.store._put(self.store._p(self.ledger_file(row["unit_id"])),
                            ledger_bytes({k: v for k, v in row.items() if k in UNITS.names}))
        detached = [r["unit_id"] for r in rows]
        self.checkpoint(leave_out=detached)
        return detached

    # -- compaction --------------------------------------------------------------------------------
    def compact(self, tables: Iterable[str], min_files: int = COMPACT_FROM, target_rows: int = COMPACT_ROWS) -> list[str]:
        """Merge each of ``tables``' partitions of this finished sweep into compacted files (``c-<20
        hex>.parquet``, at least ``target_rows`` rows each but the last, units in id order), when it
        holds at least ``min_files`` unit files; returns the compacted files written. Call it under the
        launch lock, when every unit is committed (module docstring of storage.records, "Compaction").

        Only a clean ledger is compacted (an intact checkpoint, no tail left after merging it, no
        damaged file): a unit file whose bytes are not its record's is left where it is, for
        ``sweep verify``. Each compacted file is written whole and durable first; then one checkpoint
        names it in the rows of its units (``original_files`` keeps what each row named before); only
        then are the unit files removed. A compaction cut short is finished by the next one (the
        names are the content's: a rerun writes the same files), and leaves nothing counted twice:
        readers read only the files the ledger names."""
        if min_files <= 0:
            return []
        store = self.store
        small: dict[str, list[str]] = {}  # table -> the unit files of its partition (a listing, nothing read)
        compacted: set[str] = set()  # tables whose partition holds a compacted file
        for table in sorted(set(tables)):
            names = [p.rsplit("/", 1)[1] for p in store.parquet_files(table, self.sweep)]
            small[table] = [n[: -len(".parquet")] for n in names if not is_compacted(n)]
            if len(small[table]) < len(names):
                compacted.add(table)
        eligible = [t for t in sorted(small) if len(small[t]) >= min_files]
        leftover = {t: small[t] for t in sorted(compacted) if small[t]}  # a compaction cut short, or recomputed units
        if not eligible and not leftover:
            return []  # a finished sweep's relaunch: a listing per partition, nothing more
        self.checkpoint(1)  # the tail first
        read = self.read_ledger()
        cp = read.checkpoint
        if read.tail or read.damaged or cp is None or not cp.ok or read.base is None:
            return []
        if leftover:
            self._remove_compacted_originals(read, leftover)
        if not eligible:
            return []
        rows = read.base.to_pylist()
        tables = eligible
        written: list[str] = []
        new_files: dict[str, dict[str, dict[str, Any]]] = {}  # unit -> table -> its new file record
        for table in sorted(set(tables)):
            own = [(r["unit_id"], rec) for r in rows if r["status"] == "ok" for rec in r["files"] or []
                   if rec["table"] == table and rec["path"] == f"table={table}/sweep={self.sweep}/{r['unit_id']}.parquet"]
            if len(own) < min_files:
                continue
            chunk: list[tuple[str, dict[str, Any]]] = []
            n = 0
            for i, (unit, rec) in enumerate(own):
                chunk.append((unit, rec))
                n += int(rec["rows"] or 0)
                if n >= target_rows or i == len(own) - 1:
                    rel = self._compact_chunk(table, chunk, new_files)
                    if rel is not None:
                        written.append(rel)
                    chunk, n = [], 0
        if not new_files:
            return written
        base = read.base
        files = base.column("files").to_pylist()
        original = base.column("original_files").to_pylist()
        for i, unit in enumerate(base.column("unit_id").to_pylist()):
            if unit in new_files:
                original[i] = original[i] if original[i] is not None else files[i]
                files[i] = [new_files[unit].get(rec["table"], rec) for rec in files[i] or []]
        t = base.set_column(base.schema.get_field_index("files"), "files", pa.array(files, UNITS.field("files").type))
        t = t.set_column(t.schema.get_field_index("original_files"), "original_files",
                         pa.array(original, CHECKPOINT_SCHEMA.field("original_files").type))
        self._write_checkpoint(t, LedgerRead(self.sweep, {}, []))
        _HOOK("compacted", written)
        for unit, by_table in sorted(new_files.items()):  # the unit files the checkpoint no longer names
            for table in by_table:
                try:
                    store.fs.delete_file(store._p(f"table={table}/sweep={self.sweep}/{unit}.parquet"))
                except FileNotFoundError:
                    continue
        return written

    def _compact_chunk(self, table: str, chunk: list[tuple[str, dict[str, Any]]],
                       new_files: dict[str, dict[str, dict[str, Any]]]) -> str | None:
        """One compacted file of ``chunk``'s unit files (each checked against its record first; one
        that differs is left out); its record for each unit goes to ``new_files``."""
        store = self.store
        parts, members = [], {}
        for unit, rec in chunk:
            try:
                data = store._read_bytes(store._p(rec["path"]))
            except FileNotFoundError:
                continue
            if hashlib.sha256(data).hexdigest() != rec["sha256"] or len(data) != rec["bytes"]:
                continue  # not as committed: sweep verify names it; never merged
            t = pq.read_table(pa.BufferReader(data), page_checksum_verification=True)
            if t.num_rows != rec["rows"]:
                continue
            parts.append(to_table(table, t.replace_schema_metadata(None)))
            members[unit] = int(t.num_rows)
        if not members:
            return None
        meta = json.dumps({"sweep": self.sweep, "table": table, "units": members}, sort_keys=True, separators=(",", ":"))
        name = hashlib.sha256(json.dumps([table, sorted((u, r["sha256"]) for u, r in chunk if u in members)]).encode())
        rel = f"table={table}/sweep={self.sweep}/c-{name.hexdigest()[:20]}.parquet"
        data = parquet_bytes(pa.concat_tables(parts), {COMPACTED_KEY: meta})
        try:
            store._put(store._p(rel), data)
        except OSError as exc:
            raise StorageFault(store._where(rel), f"{type(exc).__name__}: {exc}") from exc
        _HOOK("chunk", rel)
        digest = hashlib.sha256(data).hexdigest()
        for unit, n in members.items():
            new_files.setdefault(unit, {})[table] = {"table": table, "path": rel, "rows": n, "bytes": data.size,
                                                     "sha256": digest}
        return rel

    def _remove_compacted_originals(self, read: LedgerRead, small: Mapping[str, list[str]]) -> None:
        """Remove each unit file (of ``small``: table -> unit file names) whose unit's row names a
        compacted file of its table instead: a compaction's last step, finished here when it was cut
        short. A unit file its unit's row still names (a unit recomputed since) stays."""
        store = self.store
        rows = read.rows_of(u for names in small.values() for u in names)
        for table, names in small.items():
            for unit in names:
                row = rows.get(unit)
                rec = next((r for r in (row or {}).get("files") or [] if r["table"] == table), None)
                if rec is not None and is_compacted(str(rec["path"])):
                    try:
                        store.fs.delete_file(store._p(f"table={table}/sweep={self.sweep}/{unit}.parquet"))
                    except FileNotFoundError:
                        continue

    def _sync_dir(self, folder: str) -> None:
        """Make a rename in ``folder`` durable (local file systems; an object store's put already is)."""
        if not self.store.local:
            return
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- the claim ---------------------------------------------------------------------------------
    def spec_table(self) -> pa.Table | None:
        """The sweep's spec record as read (one row), None when it has none; :class:`DamagedRecord`
        (naming the file) when its file is unreadable, fails a page checksum, has another schema or
        holds other than one row. Within one store object it is read again only once its identity
        changed."""
        store = self.store
        rel = f"table=sweeps/sweep={self.sweep}/spec.parquet"
        p = store._p(rel)
        ident = self._identity(p)
        if ident is None if store.local else not store._is_file(p):
            return None
        before: pa.Table | None = self._seen(p, ident)  # read before by this store and unchanged since
        if before is not None:
            return before
        kept = store.read_cache
        hit = kept.get(rel, ident, "spec-record") if kept is not None else None
        if hit is not None and ident is not None:  # read and checked before, unchanged since (storage.readcache)
            self._remember(p, ident, hit[0], kept=True)
            return hit[0]
        try:
            t = store.read_table(p)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise DamagedRecord(store._where(rel), f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from None
        if not SWEEPS.equals(t.schema) and not all(f.name in t.schema.names for f in SWEEPS):
            raise DamagedRecord(store._where(rel), f"columns {t.schema.names}, the spec record has {SWEEPS.names}")
        if t.num_rows != 1:
            raise DamagedRecord(store._where(rel), f"{t.num_rows} rows, the spec record is one row")
        if ident is not None:
            self._remember(p, ident, t, kept=False)
            if kept is not None:
                kept.put(rel, ident, "spec-record", t)
        return t

    def spec_record(self) -> dict[str, Any] | None:
        """The sweep's spec record as a dict (:meth:`spec_table`)."""
        t = self.spec_table()
        if t is None:
            return None
        row: dict[str, Any] = t.to_pylist()[0]
        return row

    def claimed_ids(self) -> pa.Array | None:
        """The unit ids the spec record claims, in plan order, as one Arrow array (no Python string
        per unit): a relaunch compares them with its plan's (:meth:`spec_table`'s errors)."""
        t = self.spec_table()
        if t is None:
            return None
        ids = t.column("unit_ids").combine_chunks()
        return ids.flatten() if ids[0].is_valid else pa.array([], pa.string())

    def claim(self, *, spec_sha256: str, question: str, spec_path: str, spec_toml: str, unit_ids: list[str]) -> bool:
        """Write the sweep's spec record (which plan the partition holds) unless it has one; whether
        it was written."""
        if self.spec_table() is not None:
            return False
        self.store.write("sweeps", self.sweep, "spec", [{
            "spec_sha256": spec_sha256, "question": question, "spec_path": spec_path, "spec_toml": spec_toml,
            "n_units": len(unit_ids), "unit_ids": unit_ids, "created_at": utcnow()}])
        return True

    # -- pre-registrations -------------------------------------------------------------------------
    def registrations(self) -> list[dict[str, Any]]:
        """The sweep's registered prediction files (path, sha256, amends, text, ...), oldest first."""
        store = self.store
        rows = [r for p in store.parquet_files("preregistrations", self.sweep) for r in store.read_table(p).to_pylist()]
        return sorted(rows, key=lambda r: r["registered_at"])

    def register(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Record prediction files (one file each, named by the first 20 hex digits of its SHA-256)."""
        for row in rows:
            self.store.write("preregistrations", self.sweep, str(row["sha256"])[:20], [row])

    # -- launches ----------------------------------------------------------------------------------
    def mark_lost_launches(self, warn: Callable[[str], None] = lambda line: None) -> list[str]:
        """Launches recorded as running whose launcher is gone (call it holding the lock): marked
        ``lost``; returns their ids. A damaged launch record is left as it is, with a warning."""
        store = self.store
        lost = []
        for path in store.parquet_files("launches", self.sweep):
            try:
                rows = store.read_table(path).to_pylist()
            except (pa.ArrowException, ValueError) as exc:
                # Provenance, not results: left where it is for `sweep verify` to report and `launch
                # --repair` to set aside; the launch goes on, and says so.
                warn(f"launch record {store.relative(path)} is damaged ({type(exc).__name__}); left as it is: "
                     f"`swapcheck sweep verify` names it, `swapcheck sweep launch --repair` sets it aside")
                continue
            for row in rows:
                if row.get("status") == "running":
                    row.update(status="lost")
                    store.write("launches", self.sweep, str(row["launch_id"]), [row])
                    lost.append(str(row["launch_id"]))
        return lost

    def record_launch(self, row: Mapping[str, Any]) -> None:
        """Write (or replace) one launch's record."""
        self.store.write("launches", self.sweep, str(row["launch_id"]), [row])

    # -- counts ------------------------------------------------------------------------------------
    def committed(self, units: set[str]) -> tuple[int, int]:
        """(units of ``units`` with an intact ledger row, how many of those did not end ``ok``)."""
        statuses = self.read_ledger().statuses(units)
        return len(statuses), sum(1 for s in statuses if s != "ok")


def compacted_units(store: ResultStore, rel: str) -> tuple[dict[str, int] | None, str]:
    """The units a compacted file holds (unit -> rows, from its footer's :data:`COMPACTED_KEY`), or
    (None, why not). One footer read."""
    try:
        with store.fs.open_input_file(store._p(rel)) as fh:
            meta = pq.read_metadata(fh).metadata or {}
        found = json.loads(meta.get(COMPACTED_KEY.encode(), b"null"))
    except FileNotFoundError:
        return None, "missing (deleted?)"
    except Exception as exc:  # noqa: BLE001 - an unreadable footer is damage, never a traceback
        return None, f"not a readable Parquet file ({type(exc).__name__})"
    units = found.get("units") if isinstance(found, dict) else None
    if not isinstance(units, dict) or not all(isinstance(v, int) for v in units.values()):
        return None, f"carries no list of its units ({COMPACTED_KEY})"
    return units, ""




def _checkpoint_bytes(table: pa.Table, meta: Mapping[str, Any]) -> pa.Buffer:
    """A checkpoint's bytes: zstd, page checksums, the metadata under :data:`CHECKPOINT_KEY`."""
    meta_json = json.dumps({k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in meta.items()}, sort_keys=True)
    t = table.replace_schema_metadata({CHECKPOINT_KEY: meta_json})
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, compression="zstd", write_page_checksum=True, row_group_size=1 << 20)
    return sink.getvalue()


def _no_hook(step: str, what: Any) -> None:
    return None


#: Called after each step of a checkpoint (``published``, ``removed``) and of a compaction (``chunk``: one
#: compacted file durable; ``compacted``: the checkpoint naming them): the fault suite kills there.
_HOOK: Callable[[str, Any], None] = _no_hook
