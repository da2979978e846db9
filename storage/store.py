"""The results tree: atomic Parquet writes, the unit ledger and attempt markers.

Layout under the results root (a local path, a shared file system mounted on every node, or an
object store URI such as ``s3://bucket/prefix``)::

    table=<table>/sweep=<sweep>/<unit_id>.parquet   result rows of one unit (kdepth, ...)
    table=units/sweep=<sweep>/<unit_id>.parquet     the ledger entry of one unit, written LAST
    table=sweeps/sweep=<sweep>/spec.parquet         the spec text and hash, written once
    table=launches/sweep=<sweep>/<launch_id>.parquet provenance of each launch
    _state/attempts/sweep=<sweep>/<unit_id>/*.attempt one marker per execution attempt (an empty
                                                    file named by what it records; older trees
                                                    hold *.json markers, read the same)
    _state/code-changed/sweep=<sweep>.json          the journal of an edited kernel's units being set
                                                    aside (orchestrator.runner.retire_changed_code)
    _state/verified-files.key                       the secret that signs readers' verified-files caches
                                                    (storage.store.ensure_cache_key)

Local and object stores are the same code: every access goes through a ``pyarrow.fs.FileSystem``
(``LocalFileSystem`` for a path; for a URI :func:`storage.filesystems.filesystem_from_uri`: pyarrow's
filesystem with every network wait bounded, or exit 2 for a URI swapcheck does not open). They differ in one place only,
how a file is put whole: on a local file system it is written under a temporary name in its final
directory, fsynced and renamed into place; on an object store one put is already atomic. Either way
a reader never sees a partial file. Result files are named by unit id, so running a unit twice
replaces its file instead of adding rows: no fault can produce a duplicate row. A unit is done when
its ledger entry says ``ok``; the ledger entry is written after the unit's result files.

Integrity: :meth:`ResultStore.write` hashes exactly the bytes it puts and returns a
:class:`FileRecord` (table, path relative to the root, rows, bytes, SHA-256); the worker stores the
records of a unit's result files in its ledger row (column ``files``), so ``swapcheck sweep verify``
can check every committed file against what was written. A writer killed between creating its
temporary file and renaming it leaves ``.<name>.tmp-<hex>`` behind: :meth:`ResultStore.temporaries`
lists them, :meth:`ResultStore.remove_stale_temporaries` removes old ones.

Cost (a tiny unit is dominated by it): :meth:`ResultStore.commit_unit` writes a unit's result files
and its ledger file with their ``fsync`` calls running concurrently (the file system commits them in
one journal commit) and still renames the ledger file last. Units finishing together in one worker
share one *group commit* (:meth:`ResultStore.stage_unit`, then :meth:`ResultStore.commit_units`):
every file of the batch is written under its temporary name without an fsync, ONE barrier
(``syncfs(2)`` of the file system, :func:`_syncfs`; per-file fsyncs where it is unavailable or the
batch is small) makes them all durable, then the result files are renamed into place and only then
the ledger files; on an object store the ledger puts start after every result put succeeded. Tables
are built in their declared schema (:func:`to_table` casts only a column whose type differs; a
ledger row is one conversion, no cast). An attempt marker is an empty file whose
name carries what it records, created in one step, so it has no bytes that could be half-written and
needs no fsync. Small tables are written without compression (zstd's set-up per column costs more
than it saves below ``COMPRESS_FROM_BYTES``); every file keeps its page checksums. Floating-point
columns are written without a dictionary (margins and logits rarely repeat: a dictionary there only
costs a hash of every value before Parquet falls back to plain pages; without it 3M ``teacher_forced``
rows serialize in about 0.53 s instead of 0.64 s and take 2% less space). The ledger of a sweep is
read as one dataset (one scan over its files, columns projected).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import platform
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage.errors import PathEscape, StorageError, StorageFault
from storage.files import (  # noqa: F401 - re-exported: the store's names, as before storage.files existed
    _TEMPORARY,
    COMPRESS_FROM_BYTES,
    LedgerDamage,
    _dictionary_columns,
    _first_line,
    _parquet_bytes,
    _pool,
    _sha256,
    ledger_bytes,
    ledger_row_from_metadata,
    ledger_row_metadata,
    ledger_schema_problem,
    local_identity,
    object_identity,
    parquet_bytes,
    parse_ledger_file,
    to_table,
    utcnow,
)
from storage.filesystems import filesystem_from_uri
from storage.records import LedgerRead, SweepRecords
from storage.schemas import LEDGER_ROW_KEY, TABLES, UNITS, UNMANAGED_TABLES

__all__ = ["COMPRESS_FROM_BYTES", "local_identity", "object_identity", "STALE_AFTER_S", "SYNCFS_FILE_SYSTEMS", "SYNCFS_FROM_FILES", "SYNCFS_MAX_DIRTY_BYTES",
           "FileRecord", "LedgerDamage", "LedgerRead",
           "ResultStore", "StagedUnit", "is_uri",
           "ledger_bytes", "ledger_row_from_metadata", "ledger_row_metadata", "ledger_schema_problem", "open_store",
           "parquet_bytes", "parse_ledger_file", "to_table", "utcnow"]

#: A group commit of at least this many files makes them durable with one ``syncfs`` of their file
#: system (:meth:`ResultStore.commit_units`); fewer are fsynced one by one, concurrently (measured on
#: ext4: 128 small files, one syncfs ~2-3 ms against ~17 ms of concurrent fsyncs; 2 files, the
#: other way round).
SYNCFS_FROM_FILES = 8

#: Columns of the ledger that :meth:`ResultStore.ledger` returns.
LEDGER_COLUMNS = ["unit_id", "status", "attempts", "error"]

#: A temporary file older than this (seconds) belongs to no live writer: a killed writer left it.
STALE_AFTER_S = 3600.0


def is_uri(results: str | Path) -> bool:
    """``s3://bucket/prefix``, ``gs://...``, ``file:///path``: a pyarrow filesystem URI, not a local path."""
    return "://" in str(results)


def _marker_name(time_ns: int, host: str, pid: int, node_id: str | None) -> str:
    """An attempt marker's name carries what it records: ``<time ns>_<pid>_<node id or ->_<host>.attempt``."""
    return f"{time_ns}_{pid}_{node_id or '-'}_{host}.attempt"


def _marker(name: str, read: Callable[[], bytes]) -> dict[str, Any]:
    """What an attempt marker records: from its name (``.attempt``) or its JSON (older ``.json`` markers)."""
    if name.endswith(".json"):
        found: dict[str, Any] = json.loads(read())
        return found
    ns, pid, node, host = name[: -len(".attempt")].split("_", 3)
    return {"host": host, "pid": int(pid), "node_id": None if node == "-" else node,
            "started_at": datetime.fromtimestamp(int(ns) / 1e9, UTC).isoformat()}


@functools.cache
def hostname() -> str:
    """This machine's name (looked up once per process)."""
    return socket.gethostname()


def _is_marker(path: str) -> bool:
    return path.endswith((".attempt", ".json")) and not _TEMPORARY.match(path.rsplit("/", 1)[-1])


#: ``scheme:`` at the start of a path: a URI (``s3://``, ``file:``), or a drive (``C:``).
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _lexical_escape(path: object, under: str) -> str | None:
    """Why ``path`` is not a normalized relative path inside ``under`` (see ResultStore.inside), or None."""
    if not isinstance(path, str) or not path:
        return "is empty or not a path"
    if "\0" in path:
        return "holds a NUL character"
    if "://" in path or _SCHEME.match(path):
        return "is a URI (another scheme, bucket or drive), not a path under the results root"
    if path.startswith(("/", "\\")):
        return "is absolute, not relative to the results root"
    parts = path.split("/")
    if ".." in parts:
        return "has a '..' component: it leaves the results root"
    if any(p in ("", ".") for p in parts):
        return "is not normalized (an empty or '.' component)"
    if under and not path.startswith(under.rstrip("/") + "/"):
        return f"is outside {under.rstrip('/')}/, where the record must point"
    return None


@dataclass(frozen=True)
class FileRecord:
    """One written result file, as the ledger records it (``storage.schemas.FILE_RECORD``).

    ``path`` is relative to the results root (``table=<t>/sweep=<s>/<name>.parquet``); ``bytes`` and
    ``sha256`` are of exactly the bytes that were put; ``rows`` is the file's row count.
    """

    table: str
    path: str
    rows: int
    bytes: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StagedUnit:
    """One unit serialized in memory for a group commit (:meth:`ResultStore.commit_units`): its result
    files and its ledger file as (path relative to the root, bytes), and the records of its result
    files as its ledger row holds them."""

    unit_id: str
    results: tuple[tuple[str, pa.Buffer], ...]
    records: tuple[FileRecord, ...]
    ledger: tuple[str, pa.Buffer]

    @property
    def nbytes(self) -> int:
        return int(sum(data.size for _rel, data in self.results) + self.ledger[1].size)


def _ledger_file(ledger: pa.Table, records: Iterable[FileRecord]) -> pa.Buffer:
    """The ledger file of a one-row ``UNITS`` table with its ``files`` set to ``records``: the same
    bytes as :func:`ledger_bytes` of that row (only the one column is built again)."""
    column = pa.array([[r.as_dict() for r in records]], _FILES.type)
    return _parquet_bytes(ledger.set_column(_FILES_INDEX, _FILES, column))


_FILES = UNITS.field("files")
_FILES_INDEX = UNITS.get_field_index("files")


#: File systems whose ``syncfs(2)`` writes back and commits every dirty file of the file system (a
#: network or FUSE file system may only hand the data to its client or server process: there a
#: group commit fsyncs each file instead).
SYNCFS_FILE_SYSTEMS = frozenset({"ext4", "ext3", "xfs", "btrfs", "f2fs", "tmpfs", "overlay"})


#: A group commit's ``syncfs`` writes back every dirty page of the file system, other processes'
#: included: with more than this much dirty or under write-back on the machine (``/proc/meminfo``)
#: the batch fsyncs its own files instead, whose cost does not grow with other writers'.
SYNCFS_MAX_DIRTY_BYTES = 64 * 2**20


def _dirty_bytes() -> int:
    """Bytes the machine holds dirty or under write-back (``/proc/meminfo``); 2**62 where unknown."""
    total = 0
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith((b"Dirty:", b"Writeback:")):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 2**62
    return total


@functools.cache
def _file_system(dev: int) -> str:
    """The type of the file system mounted from device ``dev`` (``st_dev``), from
    ``/proc/self/mountinfo``; "" where it cannot be told."""
    want = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 2 and fields[2] == want and " - " in line:
                    return line.split(" - ", 1)[1].split()[0]
    except OSError:
        pass
    return ""


def _fsync_path(path: str) -> tuple[str, OSError | None]:
    """fsync the file ``path`` (its data and size): (path, the error or None)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return path, exc
    return path, None


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs(2)`` where it reports write-back errors (Linux 5.8 and later: before that it
    returned 0 whatever happened), else None (a group commit then fsyncs each file)."""
    if not sys.platform.startswith("linux"):
        return None
    release = re.match(r"(\d+)\.(\d+)", platform.release())
    if release is None or (int(release[1]), int(release[2])) < (5, 8):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    found: Callable[[int], int] = fn
    return found


#: The results tree's secret that signs readers' verified-files caches (storage.catalog.VerifiedFiles).
CACHE_KEY = "_state/verified-files.key"


def cache_key(store: ResultStore) -> bytes | None:
    """The results tree's signing secret (:func:`ensure_cache_key` writes it), or None."""
    try:
        text = store.read_bytes(CACHE_KEY).decode("ascii").strip()
        return bytes.fromhex(text) if len(text) == 64 else None
    except (OSError, UnicodeDecodeError, ValueError, StorageError):
        return None


def ensure_cache_key(store: ResultStore) -> None:
    """Write the results tree's verified-files signing secret (storage.catalog.VerifiedFiles) when it has
    none: 32 random bytes, hex, readable by the owner only on a local tree (a reader without it hashes
    every file). Called by writers of the tree (here, so a launch needs no DuckDB); a racing writer's
    secret may win (entries signed with the other are then hashed again once)."""
    import secrets

    if cache_key(store) is not None:
        return
    store.put_bytes(CACHE_KEY, (secrets.token_hex(32) + "\n").encode())
    if store.local:  # base: the local path, also of a file:// results URI
        os.chmod(f"{store.base}/{CACHE_KEY}", 0o600)


class ResultStore:
    """Reads and writes one results root, a local directory or a pyarrow filesystem URI.

    ``root`` names the tree in messages; every access goes through ``fs`` at ``base`` (an absolute
    local path, or the path inside the URI's filesystem, e.g. ``bucket/prefix``).
    """

    def __init__(self, root: str | Path) -> None:
        self.fs: pafs.FileSystem
        if is_uri(root):
            self.uri: str | None = str(root).rstrip("/")
            self.fs, path = filesystem_from_uri(self.uri)  # every network wait bounded (storage/filesystems.py)
            self.base = path.rstrip("/")
            self.root = Path(self.base)
        else:
            self.uri = None
            self.fs = pafs.LocalFileSystem()
            self.root = Path(root)
            self.base = Path(os.path.abspath(root)).as_posix()
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        #: path -> (identity, what :func:`parse_ledger_file` found): a ledger file this store read and
        #: that has not changed since is not read again (:meth:`read_ledger`).
        self._ledger_seen: dict[str, tuple[list[Any], Any]] = {}
        #: Whether records may come from what this machine read and checked before (storage.readcache);
        #: ``sweep verify`` turns it off and reads every byte.
        self.use_read_cache = True
        self._read_cache: Any = None
        #: paths whose entry in ``_ledger_seen`` came from the read cache (not read by this store)
        self._kept: set[str] = set()
        #: directory -> its resolved path, only inside :meth:`resolving` (None: resolve every time).
        self._dirs: dict[str, str] | None = None

    # -- paths -------------------------------------------------------------------------------------
    def _p(self, *parts: str) -> str:
        return "/".join([self.base, *parts])

    def partition(self, table: str, sweep: str) -> Path:
        """Where a partition's files are (for messages; read them through ``parquet_files``)."""
        return self.root / f"table={table}" / f"sweep={sweep}"

    def _partition(self, table: str, sweep: str) -> str:
        return self._p(f"table={table}", f"sweep={sweep}")

    def _attempts(self, sweep: str, *unit_id: str) -> str:
        return self._p("_state", "attempts", f"sweep={sweep}", *unit_id)

    # -- the file system ---------------------------------------------------------------------------
    def _put(self, path: str, data: bytes | pa.Buffer) -> None:
        """Write ``path`` whole and atomically: the one place local and object stores differ."""
        tmp = self._stage(path, data)
        try:
            self._publish(path, data, tmp)
            tmp = None
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)

    def _stage(self, path: str, data: bytes | pa.Buffer, sync: bool = True) -> str | None:
        """Local: write ``data`` under a temporary name in ``path``'s directory, flush it and (``sync``)
        fsync it; return the temporary. Object store: nothing to do before the one put (returns None).
        A group commit stages without ``sync`` and makes the whole batch durable at once (:meth:`commit_units`)."""
        if not self.local:
            return None
        parent, name = path.rsplit("/", 1)
        tmp = f"{parent}/.{name}.tmp-{uuid.uuid4().hex}"
        fh = self._create(tmp, "wb")
        try:
            with fh:
                fh.write(memoryview(data))
                if sync:
                    fh.flush()
                    os.fsync(fh.fileno())
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return tmp

    def _create(self, path: str, mode: str) -> Any:
        """A new local file opened with ``mode``, its directory made if it does not exist yet (the
        usual case, a directory that exists, needs no mkdir call)."""
        try:
            return open(path, mode)  # noqa: SIM115 - the caller closes it
        except FileNotFoundError:
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            return open(path, mode)  # noqa: SIM115 - the caller closes it

    def _publish(self, path: str, data: bytes | pa.Buffer, tmp: str | None) -> None:
        """Make a staged file visible whole: rename the temporary (local) or the one put (object store)."""
        if tmp is not None:
            os.replace(tmp, path)
            return
        self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(path) as out:  # one put: atomic on an object store
            out.write(data)

    def inside(self, path: object, under: str = "", *, follow: bool = True) -> str:
        """``path`` (relative to the root, as a record names it) when it stays inside the root, and
        inside ``under`` (a folder relative to the root) if given; else raises :class:`PathEscape`.

        The one check every path read from a record (a ledger row's ``files``, an artifact path, any
        ``relpath`` the methods below take) goes through before it is joined to the root. Refused: an
        empty path, a NUL, a URI (``s3://other-bucket/...``: another scheme or bucket), an absolute
        path, a ``..``, ``.`` or empty component (the store writes only normalized paths), a path
        outside ``under``; locally also a path whose directories or file resolve (symlinks) outside
        the root or ``under``; with ``follow=False`` the file itself may be a symlink (a rename moves
        the link, never its target). Nothing is read, created or followed to check it.
        """
        why = _lexical_escape(path, under)
        if why is None and self.local:
            why = self._link_escape(str(path), under, follow)
        if why is not None:
            raise PathEscape(path, why)
        return str(path)

    @contextmanager
    def resolving(self) -> Iterator[None]:
        """Within this block, each directory's resolved path is looked up once (:meth:`inside`): one
        pass over a tree (a catalog's bind) checks thousands of files in a few partitions. Each file's
        own link is still checked every time."""
        self._dirs = {}
        try:
            yield
        finally:
            self._dirs = None

    def _real_dir(self, folder: str) -> str:
        memo = self._dirs
        if memo is None:
            return os.path.realpath(folder)
        real = memo.get(folder)
        if real is None:
            real = memo[folder] = os.path.realpath(folder)
        return real

    def _link_escape(self, path: str, under: str, follow: bool = True) -> str | None:
        """Why the local file ``path`` resolves outside the root or ``under`` (symlinks), or None."""
        parent, name = f"{self.base}/{path}".rsplit("/", 1)
        real = f"{self._real_dir(parent)}/{name}"
        if follow and os.path.islink(real):
            real = os.path.realpath(real)
        fences = [(self.base, "the results root")] + ([(f"{self.base}/{under}", under.rstrip("/") + "/")] if under else [])
        for folder, what in fences:
            if not real.startswith(self._real_dir(folder).rstrip("/") + "/"):
                return f"resolves through a symlink to {real}, outside {what}"
        return None

    def recorded(self, sweep: str, record: Mapping[str, Any]) -> str:
        """The path of a ledger ``files`` record of ``sweep`` (``{"table", "path", ...}``), checked by
        :meth:`inside`: it must be a result file of the record's own partition,
        ``table=<table>/sweep=<sweep>/<name>.parquet``, of a result table. Raises :class:`PathEscape`."""
        table, path = record.get("table"), record.get("path")
        if table not in TABLES or table in UNMANAGED_TABLES:
            raise PathEscape(path, f"is recorded for table {table!r}, not a result table")
        rel = self.inside(path, f"table={table}/sweep={sweep}")
        if rel.count("/") != 2 or not rel.endswith(".parquet"):
            raise PathEscape(path, f"is not a result file of its partition table={table}/sweep={sweep}/<name>.parquet")
        return rel

    def _where(self, relpath: str) -> str:
        """A path under the root as messages name it."""
        return f"{self.uri}/{relpath}" if self.uri is not None else str(self.root / relpath)

    def _files(self, path: str, recursive: bool = False) -> list[pafs.FileInfo]:
        """The files under ``path`` (none if it does not exist), sorted by path."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=recursive))
        except (FileNotFoundError, NotADirectoryError, OSError):
            return []
        return sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path)

    def _is_file(self, path: str) -> bool:
        return bool(self.fs.get_file_info(path).type == pafs.FileType.File)

    def _read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as fh:
            data: bytes = fh.read()
        return data

    # -- writes ------------------------------------------------------------------------------------
    def write(self, table: str, sweep: str, name: str, rows: pa.Table | Iterable[Mapping[str, Any]]) -> FileRecord:
        """Write one file of ``table`` (rows cast to its declared schema) atomically; return its record.

        The SHA-256 is of exactly the bytes put (serialized in memory first). The row count is
        ``.rows`` of the record. Raises ``ValueError`` for rows that do not fit the schema (nothing
        written) and ``OSError`` when the file system refuses the write.
        """
        rel, data, rows_n = self._serialize(table, sweep, name, rows)
        put = _pool().submit(self._put, self._p(rel), data)  # the hash below runs while the file is written
        try:
            record = FileRecord(table=table, path=rel, rows=rows_n, bytes=data.size, sha256=_sha256(data))
        finally:
            put.exception()  # wait for the put whatever happened here
        put.result()
        return record

    def _serialize(self, table: str, sweep: str, name: str,
                   rows: pa.Table | Iterable[Mapping[str, Any]]) -> tuple[str, pa.Buffer, int]:
        """(path relative to the root, the Parquet bytes, the row count) of one file of ``table``."""
        t = to_table(table, rows)
        return f"table={table}/sweep={sweep}/{name}.parquet", _parquet_bytes(t), int(t.num_rows)

    def _unit_files(self, sweep: str, unit_id: str, tables: Mapping[str, pa.Table | Iterable[Mapping[str, Any]]],
                    ledger_row: Callable[[list[FileRecord]], Mapping[str, Any]]
                    ) -> tuple[dict[str, tuple[str, pa.Buffer, int]], pa.Table]:
        """A unit's result files serialized, each carrying the unit's ledger row: ``{table: (path
        relative to the root, bytes, rows)}``, and the ledger row as a one-row table of ``UNITS``
        whose ``files`` are the planned records (:meth:`commit_unit` says why; :func:`_ledger_file`
        puts the real ones in)."""
        arrow = {table: to_table(table, rows) for table, rows in tables.items()}
        rels = {table: f"table={table}/sweep={sweep}/{unit_id}.parquet" for table in arrow}
        planned = [FileRecord(table=table, path=rels[table], rows=int(t.num_rows), bytes=0, sha256="")
                   for table, t in arrow.items()]
        # Built in the ledger's schema (every column given: no cast); its values as the file will hold them.
        ledger = to_table("units", [{**ledger_row(planned), "files": [r.as_dict() for r in planned]}])
        metadata = {LEDGER_ROW_KEY: ledger_row_metadata(sweep, ledger.to_pylist()[0])}
        return {table: (rels[table], _parquet_bytes(t, metadata), int(t.num_rows)) for table, t in arrow.items()}, ledger

    def commit_unit(self, sweep: str, unit_id: str, tables: Mapping[str, pa.Table | Iterable[Mapping[str, Any]]],
                    ledger_row: Callable[[list[FileRecord]], Mapping[str, Any]]) -> list[FileRecord]:
        """Write a unit's result files, then its ledger row naming them (``ledger_row(records)``).

        The same guarantees as :meth:`write` of each file followed by :meth:`record_unit`, at about
        one fsync's latency instead of one per file: the result files are put concurrently (each
        whole, by :meth:`_put`) while the ledger file is written and fsynced under its temporary name,
        and the ledger file is renamed into place only after every result file is. A result file
        that cannot be written raises :class:`StorageFault` naming it and leaves no ledger file; a
        ledger file that cannot be written raises naming it, after the result files are in place
        (the unit stays pending: no ledger row names them). Rows that do not fit a table's schema,
        or a ledger row that does not fit the ledger's, raise ``ValueError`` before anything is written.

        Each result file carries the unit's ledger row in its key-value metadata (``LEDGER_ROW_KEY``,
        :func:`ledger_row_metadata`), so ``launch --repair`` can rebuild a lost or damaged ledger file
        from the files. Hence ``ledger_row`` is called once, before the files are serialized, with
        records whose ``bytes`` are 0 and ``sha256`` empty (table, path and rows are final); the
        ledger row's ``files`` are then the real records.

        A unit committed alone (a batch of one) takes this path; several units finishing together in
        one worker share one durable commit (:meth:`stage_unit`, :meth:`commit_units`).
        """
        staged, ledger = self._unit_files(sweep, unit_id, tables, ledger_row)
        puts: list[Future[None]] = [_pool().submit(self._put, self._p(rel), data) for rel, data, _n in staged.values()]
        ledger_rel = f"table=units/sweep={sweep}/{unit_id}.parquet"
        tmp: str | None = None
        ledger_error: OSError | None = None
        try:
            # While the result files are written: their hashes, the ledger row, the ledger file.
            records = [FileRecord(table=table, path=rel, rows=n, bytes=data.size, sha256=_sha256(data))
                       for table, (rel, data, n) in staged.items()]
            ledger_data = _ledger_file(ledger, records)
            try:
                tmp = self._stage(self._p(ledger_rel), ledger_data)
            except OSError as exc:
                ledger_error = exc
            failed = []
            for (rel, _data, _n), put in zip(staged.values(), puts, strict=True):
                try:
                    put.result()
                except OSError as exc:
                    failed.append((rel, exc))
            if failed:
                rel, first = failed[0]
                raise StorageFault(self._where(rel), f"{type(first).__name__}: {first}") from first
            try:
                if ledger_error is not None:
                    raise ledger_error
                self._publish(self._p(ledger_rel), ledger_data, tmp)
                tmp = None
            except OSError as exc:
                raise StorageFault(self._where(ledger_rel), f"{type(exc).__name__}: {exc}") from exc
        finally:
            for put in puts:  # no put outlives the call, whatever raised
                put.exception()
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
        return records

    def stage_unit(self, sweep: str, unit_id: str, tables: Mapping[str, pa.Table | Iterable[Mapping[str, Any]]],
                   ledger_row: Callable[[list[FileRecord]], Mapping[str, Any]]) -> StagedUnit:
        """A unit's result files and ledger file serialized in memory, nothing written: one member of
        a group commit (:meth:`commit_units`). The files, their records and the ledger row are exactly
        what :meth:`commit_unit` writes for the same arguments. Raises ``ValueError`` as it does."""
        staged, ledger = self._unit_files(sweep, unit_id, tables, ledger_row)
        records = tuple(FileRecord(table=table, path=rel, rows=n, bytes=data.size, sha256=_sha256(data))
                        for table, (rel, data, n) in staged.items())
        return StagedUnit(unit_id=unit_id, results=tuple((rel, data) for rel, data, _n in staged.values()),
                          records=records,
                          ledger=(f"table=units/sweep={sweep}/{unit_id}.parquet", _ledger_file(ledger, records)))

    def commit_units(self, units: Sequence[StagedUnit]) -> None:
        """Commit staged units together (a group commit): one durability barrier for the batch.

        Locally: every result file and every ledger file of the batch is written under its temporary
        name without an fsync; then ONE barrier makes them all durable (``syncfs(2)`` of each file
        system they are on, :func:`_syncfs`, where it is one of :data:`SYNCFS_FILE_SYSTEMS` and the
        machine holds little dirty data, else an fsync of each file; where ``syncfs`` is unavailable, or for fewer than
        :data:`SYNCFS_FROM_FILES` files, each temporary is fsynced as it is written instead); then
        every result file is renamed into place, and only then the ledger files. On an object store
        (each put atomic): the result puts run concurrently, and the ledger puts start only after
        every result put has succeeded. So no unit's ledger file is ever visible before all its result
        files are, as with :meth:`commit_unit`.

        A fault raises :class:`StorageFault` naming the first file (in batch order) that failed, and
        no ledger file of the batch is published after it: a result file that cannot be written or
        renamed (put) publishes no ledger file at all; a ledger file that cannot be written publishes
        the result files and no ledger file; a ledger rename (put) that fails stops the renames (puts)
        after it, and those before it stay committed. Temporaries are removed whatever happened.
        """
        if not units:
            return
        results = [f for u in units for f in u.results]
        ledgers = [u.ledger for u in units]
        if self.local:
            self._commit_local(results, ledgers)
        else:
            self._commit_puts(results, ledgers)

    def _commit_local(self, results: list[tuple[str, pa.Buffer]], ledgers: list[tuple[str, pa.Buffer]]) -> None:
        files = results + ledgers
        barrier = _syncfs() if len(files) >= SYNCFS_FROM_FILES else None
        tmps: dict[int, str] = {}

        def stage(i: int) -> tuple[int, OSError | None]:
            rel, data = files[i]
            try:
                tmp = self._stage(self._p(rel), data, sync=barrier is None)
            except OSError as exc:
                return i, exc
            if tmp is not None:
                tmps[i] = tmp
            return i, None

        def publish(i: int) -> None:
            rel = files[i][0]
            try:
                os.replace(tmps[i], self._p(rel))
            except OSError as exc:
                raise StorageFault(self._where(rel), f"{type(exc).__name__}: {exc}") from exc
            del tmps[i]

        try:
            staged = list(_pool().map(stage, range(len(files)))) if len(files) > 1 else [stage(0)]
            faults = [(i, exc) for i, exc in staged if exc is not None]
            first = faults[0] if faults else None
            if first is not None and first[0] < len(results):
                raise StorageFault(self._where(files[first[0]][0]), f"{type(first[1]).__name__}: {first[1]}") from first[1]
            if barrier is not None:
                self._barrier(barrier, list(tmps.values()))
            for i in range(len(results)):
                publish(i)
            if first is not None:
                raise StorageFault(self._where(files[first[0]][0]), f"{type(first[1]).__name__}: {first[1]}") from first[1]
            for i in range(len(results), len(files)):
                publish(i)
        finally:
            for tmp in tmps.values():
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _barrier(self, syncfs: Callable[[int], int], paths: list[str]) -> None:
        """Make the files ``paths`` durable: one ``syncfs`` per file system they are on, where that
        file system is one whose ``syncfs`` is known to persist data (:data:`SYNCFS_FILE_SYSTEMS`);
        on any other (NFS, FUSE, ...), and whenever the machine holds more than
        :data:`SYNCFS_MAX_DIRTY_BYTES` not yet written back (``syncfs`` would wait for all of it,
        other processes' writes included), each file is fsynced instead, concurrently."""
        devices: dict[int, tuple[str, list[str]]] = {}
        for path in paths:
            parent = path.rsplit("/", 1)[0]
            try:
                dev = os.stat(parent).st_dev
            except OSError as exc:
                raise StorageFault(parent, f"{type(exc).__name__}: {exc}") from exc
            devices.setdefault(dev, (parent, []))[1].append(path)
        crowded = _dirty_bytes() > SYNCFS_MAX_DIRTY_BYTES
        for dev, (folder, files) in devices.items():
            if crowded or _file_system(dev) not in SYNCFS_FILE_SYSTEMS:
                failed = [(f, exc) for f, exc in _pool().map(_fsync_path, files) if exc is not None]
                if failed:
                    raise StorageFault(failed[0][0], f"fsync: {type(failed[0][1]).__name__}: {failed[0][1]}")
                continue
            fd = os.open(folder, os.O_RDONLY)
            try:
                if syncfs(fd) != 0:
                    err = ctypes.get_errno()
                    raise StorageFault(folder, f"syncfs: OSError: [Errno {err}] {os.strerror(err)}")
            finally:
                os.close(fd)

    def _commit_puts(self, results: list[tuple[str, pa.Buffer]], ledgers: list[tuple[str, pa.Buffer]]) -> None:
        """:meth:`commit_units` on an object store: the result puts, then (all succeeded) the ledger puts."""
        stop = threading.Event()

        def put(rel: str, data: pa.Buffer) -> bool:
            if stop.is_set():  # a put of this stage failed: start no more
                return False
            try:
                self._put(self._p(rel), data)
            except BaseException:
                stop.set()
                raise
            return True

        for stage in (results, ledgers):
            futures = [_pool().submit(put, rel, data) for rel, data in stage]
            errors = [(rel, f.exception()) for (rel, _data), f in zip(stage, futures, strict=True)]
            for rel, exc in errors:
                if isinstance(exc, OSError):
                    raise StorageFault(self._where(rel), f"{type(exc).__name__}: {exc}") from exc
                if exc is not None:
                    raise exc

    def mark_attempt(self, sweep: str, unit_id: str, node_id: str | None = None) -> int:
        """Record that an execution of ``unit_id`` started here; return the attempt number.

        The marker is an empty file whose name records host, pid, node and start time: created in
        one step (exclusively, locally; one put on an object store), it has no bytes that could be
        half-written, so it needs neither a temporary nor an fsync.
        """
        folder = self._attempts(sweep, unit_id)
        path = f"{folder}/{_marker_name(time.time_ns(), hostname(), os.getpid(), node_id)}"
        if self.local:
            self._create(path, "xb").close()  # an empty file
        else:
            self._publish(path, b"", None)
        return self.attempts(sweep, unit_id)

    def record_unit(self, sweep: str, record: Mapping[str, Any]) -> None:
        """Commit a unit's ledger entry (replacing an earlier one: the ledger has one row per unit)."""
        self.write("units", sweep, str(record["unit_id"]), [record])

    def put_bytes(self, relpath: str, data: bytes) -> str:
        """A file under the results root (reports, artifacts), written atomically; returns where it is."""
        self._put(self._p(self.inside(relpath)), data)
        return f"{self.uri}/{relpath}" if self.uri is not None else str(self.root / relpath)

    def write_text(self, relpath: str, text: str) -> str:
        return self.put_bytes(relpath, text.encode())

    def move(self, relpath: str, dest_relpath: str) -> None:
        """Move a file to another path under the root (a rename locally; copy + delete on object stores).
        Locally a symlink is moved as the link (its target is not touched)."""
        dest = self._p(self.inside(dest_relpath, follow=False))
        source = self._p(self.inside(relpath, follow=False))
        self.fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
        self.fs.move(source, dest)

    def remove(self, relpath: str) -> None:
        """Delete one file under the root (absent: nothing to do)."""
        path = self._p(self.inside(relpath, follow=False))
        if self._is_file(path):
            self.fs.delete_file(path)

    # -- files by path relative to the root (what ledger records name) ----------------------------
    def relative(self, path: str) -> str:
        """The path of ``path`` (as :meth:`parquet_files` returns it) relative to the root."""
        return path[len(self.base) + 1:] if path.startswith(self.base + "/") else path

    def size(self, relpath: str) -> int | None:
        """The size in bytes of a file under the root, or None if there is no file there (a symlink's
        target is stat'ed, never read)."""
        info = self.fs.get_file_info(self._p(self.inside(relpath, follow=False)))
        return int(info.size) if info.type == pafs.FileType.File and info.size is not None else None

    def read_bytes(self, relpath: str) -> bytes:
        return self._read_bytes(self._p(self.inside(relpath)))

    def table_partitions(self) -> list[str]:
        """The tables that have a ``table=<table>`` directory under the root (sorted)."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError, OSError):
            return []
        return sorted(i.base_name.split("=", 1)[1] for i in infos
                      if i.type == pafs.FileType.Directory and i.base_name.startswith("table="))

    def temporaries(self, older_than_s: float = 0.0) -> list[tuple[str, float | None]]:
        """Temporary files a killed writer left (``.<name>.tmp-<hex>``) older than ``older_than_s``:
        (path relative to the root, age in seconds or None where the store keeps no mtime), sorted."""
        now = time.time()
        out: list[tuple[str, float | None]] = []
        for info in self._files(self.base, recursive=True):
            if not _TEMPORARY.match(info.base_name) or "/_quarantine/" in info.path:
                continue
            age = now - info.mtime.timestamp() if info.mtime is not None else None
            if age is None or age >= older_than_s:
                out.append((self.relative(info.path), age))
        return out

    def remove_stale_temporaries(self, older_than_s: float = STALE_AFTER_S) -> list[str]:
        """Delete temporary files older than ``older_than_s`` (no live writer owns them: a write
        takes seconds); return their paths relative to the root. Call it before a launch."""
        removed = []
        for rel, _age in self.temporaries(older_than_s):
            try:
                self.fs.delete_file(self._p(rel))
            except FileNotFoundError:  # another process removed it first
                continue
            removed.append(rel)
        return removed

    # -- reads -------------------------------------------------------------------------------------
    def attempt_markers(self, sweep: str) -> list[dict[str, Any]]:
        """Every attempt marker of a sweep, with its unit id (which unit started where, and when)."""
        return [{**_marker(i.base_name, functools.partial(self._read_bytes, i.path)), "unit_id": i.path.rsplit("/", 2)[-2]}
                for i in self._files(self._attempts(sweep), recursive=True) if _is_marker(i.path)]

    def attempts(self, sweep: str, unit_id: str) -> int:
        return sum(1 for i in self._files(self._attempts(sweep, unit_id)) if _is_marker(i.path))

    def records(self, sweep: str) -> SweepRecords:
        """The owner of ``sweep``'s records (:class:`storage.records.SweepRecords`)."""
        return SweepRecords(self, sweep)

    def read_ledger(self, sweep: str) -> LedgerRead:
        """The ledger of ``sweep``: its checkpoint plus its tail (:meth:`storage.records.SweepRecords.read_ledger`)."""
        return SweepRecords(self, sweep).read_ledger()

    def ledger(self, sweep: str) -> dict[str, dict[str, Any]]:
        """unit_id -> ledger row (``unit_id``, ``status``, ``attempts``, ``error``), for every unit of
        ``sweep`` that has an intact ledger file (:meth:`read_ledger`)."""
        return {u: {c: row[c] for c in LEDGER_COLUMNS} for u, row in self.read_ledger(sweep).rows.items()}

    def ledger_records(self, sweep: str) -> dict[str, dict[str, Any]]:
        """unit_id -> the whole ledger row (every ``UNITS`` column, ``files`` included: a list of
        :class:`FileRecord` dicts, None in rows written before integrity records existed), for every
        unit of ``sweep`` that has an intact ledger file (:meth:`read_ledger`)."""
        return self.read_ledger(sweep).rows

    def done_units(self, sweep: str) -> set[str]:
        """The units of ``sweep`` whose intact ledger row says ``ok`` (:meth:`read_ledger`)."""
        return self.read_ledger(sweep).done()

    @property
    def read_cache(self) -> Any:
        """This store's :class:`storage.readcache.ReadCache` (made on first use), or None when
        :attr:`use_read_cache` is off."""
        if not self.use_read_cache:
            return None
        if self._read_cache is None:
            from storage.readcache import ReadCache

            self._read_cache = ReadCache(self, lambda: cache_key(self))
        return self._read_cache

    def sweep_record(self, sweep: str) -> dict[str, Any] | None:
        """The sweep's spec record (:meth:`storage.records.SweepRecords.spec_record`)."""
        return SweepRecords(self, sweep).spec_record()

    def read_unit(self, table: str, sweep: str, unit_id: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
        """The rows of one unit in ``table``: its file ``table=<table>/sweep=<sweep>/<unit_id>.parquet``,
        or, once its sweep is compacted (storage.records), its rows of the compacted file its ledger
        row names ([] if it has none)."""
        p = f"{self._partition(table, sweep)}/{unit_id}.parquet"
        if not self._is_file(p):
            from storage.records import is_compacted

            row = self.read_ledger(sweep).row(unit_id)
            rel = next((str(r["path"]) for r in (row or {}).get("files") or [] if r["table"] == table), "")
            if not is_compacted(rel):
                return []
            import pyarrow.compute as pc

            t = self.read_table(self._p(self.inside(rel, f"table={table}/sweep={sweep}")))
            t = t.filter(pc.equal(t.column("unit_id"), unit_id))
            found: list[dict[str, Any]] = (t.select(columns) if columns else t).to_pylist()
            return found
        rows: list[dict[str, Any]] = self.read_table(p, columns=columns).to_pylist()
        return rows

    def parquet_files(self, table: str, sweep: str) -> list[str]:
        """The Parquet files of one partition, as paths ``read_table`` accepts."""
        return [i.path for i in self._files(self._partition(table, sweep)) if i.path.endswith(".parquet")]

    def read_table(self, path: str, **kwargs: Any) -> pa.Table:
        """``pq.read_table`` through the store's file system, every page checksum verified."""
        if self.local and not os.path.isabs(path):
            path = os.path.abspath(path)
        kwargs.setdefault("page_checksum_verification", True)
        return pq.read_table(path, filesystem=self.fs, **kwargs)

    def sweep_partitions(self, table: str) -> list[str]:
        """The sweeps that have a partition ``table=<table>/sweep=<sweep>`` (sorted)."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self._p(f"table={table}"), allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError, OSError):
            return []
        return sorted(i.base_name.split("=", 1)[1] for i in infos if i.base_name.startswith("sweep="))

    def sweeps(self) -> list[str]:
        """The sweeps that have a spec record partition."""
        return self.sweep_partitions("sweeps")

    def exists(self) -> bool:
        if self.fs.get_file_info(self.base).type == pafs.FileType.Directory:
            return True
        return bool(self._files(self.base, recursive=True)[:1])


def open_store(results: str | Path) -> ResultStore:
    """The store for ``--results``: a local directory, or any pyarrow filesystem URI."""
    return ResultStore(results)
