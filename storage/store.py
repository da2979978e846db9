"""The results tree: atomic Parquet writes, the unit ledger and attempt markers.

Layout under the results root (a local path, a shared file system mounted on every node, or an
object store URI such as ``s3://bucket/prefix``)::

    table=<table>/sweep=<sweep>/<unit_id>.parquet   result rows of one unit (kdepth, ...)
    table=units/sweep=<sweep>/<unit_id>.parquet     the ledger entry of one unit, written LAST
    table=sweeps/sweep=<sweep>/spec.parquet         the spec text and hash, written once
    table=launches/sweep=<sweep>/<launch_id>.parquet provenance of each launch
    _state/attempts/sweep=<sweep>/<unit_id>/*.json  one marker per execution attempt

Local and object stores are the same code: every access goes through a ``pyarrow.fs.FileSystem``
(``LocalFileSystem`` for a path, ``FileSystem.from_uri`` for a URI). They differ in one place only,
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
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage.schemas import TABLES, UNITS

__all__ = ["STALE_AFTER_S", "FileRecord", "ResultStore", "is_uri", "open_store", "to_table", "utcnow"]

#: A temporary file older than this (seconds) belongs to no live writer: a killed writer left it.
STALE_AFTER_S = 3600.0

#: ``.<final name>.tmp-<32 hex>``: the temporary name of a local atomic put (``ResultStore._put``).
_TEMPORARY = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_table(table: str, rows: pa.Table | Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts) or an Arrow table, cast to the declared schema of ``table``."""
    schema = TABLES[table]
    if isinstance(rows, pa.Table):
        return rows.select(schema.names).cast(schema)
    rows = list(rows)
    extra = {k for r in rows for k in r} - set(schema.names)
    if extra:
        raise ValueError(f"rows for table {table!r} have undeclared columns {sorted(extra)}")
    return pa.Table.from_pylist(rows, schema=schema)


def is_uri(results: str | Path) -> bool:
    """``s3://bucket/prefix``, ``gs://...``, ``file:///path``: a pyarrow filesystem URI, not a local path."""
    return "://" in str(results)


def _parquet_bytes(table: pa.Table) -> bytes:
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, compression="zstd", write_page_checksum=True)  # page CRCs: readers verify them
    data: bytes = buf.getvalue().to_pybytes()
    return data


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


class ResultStore:
    """Reads and writes one results root, a local directory or a pyarrow filesystem URI.

    ``root`` names the tree in messages; every access goes through ``fs`` at ``base`` (an absolute
    local path, or the path inside the URI's filesystem, e.g. ``bucket/prefix``).
    """

    def __init__(self, root: str | Path) -> None:
        self.fs: pafs.FileSystem
        if is_uri(root):
            self.uri: str | None = str(root).rstrip("/")
            self.fs, path = pafs.FileSystem.from_uri(self.uri)
            self.base = path.rstrip("/")
            self.root = Path(self.base)
        else:
            self.uri = None
            self.fs = pafs.LocalFileSystem()
            self.root = Path(root)
            self.base = Path(os.path.abspath(root)).as_posix()
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

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
    def _put(self, path: str, data: bytes) -> None:
        """Write ``path`` whole and atomically: the one place local and object stores differ."""
        parent = path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        if not self.local:
            with self.fs.open_output_stream(path) as out:  # one put: atomic on an object store
                out.write(data)
            return
        # Local: temporary name in the final directory, flush + fsync, rename into place.
        tmp = f"{parent}/.{path.rsplit('/', 1)[1]}.tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

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
        t = to_table(table, rows)
        data = _parquet_bytes(t)
        rel = f"table={table}/sweep={sweep}/{name}.parquet"
        self._put(self._p(rel), data)
        return FileRecord(table=table, path=rel, rows=int(t.num_rows), bytes=len(data),
                          sha256=hashlib.sha256(data).hexdigest())

    def mark_attempt(self, sweep: str, unit_id: str, node_id: str | None = None) -> int:
        """Record that an execution of ``unit_id`` started here; return the attempt number."""
        marker = {"host": socket.gethostname(), "pid": os.getpid(), "node_id": node_id,
                  "started_at": utcnow().isoformat()}
        name = f"{time.time_ns()}-{socket.gethostname()}-{os.getpid()}.json"
        self._put(f"{self._attempts(sweep, unit_id)}/{name}", json.dumps(marker).encode())
        return self.attempts(sweep, unit_id)

    def record_unit(self, sweep: str, record: Mapping[str, Any]) -> None:
        """Commit a unit's ledger entry (replacing an earlier one: the ledger has one row per unit)."""
        self.write("units", sweep, str(record["unit_id"]), [record])

    def put_bytes(self, relpath: str, data: bytes) -> str:
        """A file under the results root (reports, artifacts), written atomically; returns where it is."""
        self._put(self._p(relpath), data)
        return f"{self.uri}/{relpath}" if self.uri is not None else str(self.root / relpath)

    def write_text(self, relpath: str, text: str) -> str:
        return self.put_bytes(relpath, text.encode())

    def move(self, relpath: str, dest_relpath: str) -> None:
        """Move a file to another path under the root (a rename locally; copy + delete on object stores)."""
        dest = self._p(dest_relpath)
        self.fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
        self.fs.move(self._p(relpath), dest)

    # -- files by path relative to the root (what ledger records name) ----------------------------
    def relative(self, path: str) -> str:
        """The path of ``path`` (as :meth:`parquet_files` returns it) relative to the root."""
        return path[len(self.base) + 1:] if path.startswith(self.base + "/") else path

    def size(self, relpath: str) -> int | None:
        """The size in bytes of a file under the root, or None if there is no file there."""
        info = self.fs.get_file_info(self._p(relpath))
        return int(info.size) if info.type == pafs.FileType.File and info.size is not None else None

    def read_bytes(self, relpath: str) -> bytes:
        return self._read_bytes(self._p(relpath))

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
        return [{**json.loads(self._read_bytes(i.path)), "unit_id": i.path.rsplit("/", 2)[-2]}
                for i in self._files(self._attempts(sweep), recursive=True) if i.path.endswith(".json")]

    def attempts(self, sweep: str, unit_id: str) -> int:
        return sum(1 for i in self._files(self._attempts(sweep, unit_id)) if i.path.endswith(".json"))

    def ledger(self, sweep: str) -> dict[str, dict[str, Any]]:
        """unit_id -> ledger row, for every unit of ``sweep`` that has one."""
        out: dict[str, dict[str, Any]] = {}
        for p in self.parquet_files("units", sweep):
            for row in self.read_table(p, columns=["unit_id", "status", "attempts", "error"], schema=UNITS).to_pylist():
                out[row["unit_id"]] = row
        return out

    def ledger_records(self, sweep: str) -> dict[str, dict[str, Any]]:
        """unit_id -> the whole ledger row (every ``UNITS`` column, ``files`` included: a list of
        :class:`FileRecord` dicts, None in rows written before integrity records existed)."""
        out: dict[str, dict[str, Any]] = {}
        for p in self.parquet_files("units", sweep):
            for row in self.read_table(p, schema=UNITS).to_pylist():
                out[row["unit_id"]] = row
        return out

    def done_units(self, sweep: str) -> set[str]:
        return {u for u, row in self.ledger(sweep).items() if row["status"] == "ok"}

    def sweep_record(self, sweep: str) -> dict[str, Any] | None:
        p = f"{self._partition('sweeps', sweep)}/spec.parquet"
        if not self._is_file(p):
            return None
        rows = self.read_table(p).to_pylist()
        return rows[0] if rows else None

    def read_unit(self, table: str, sweep: str, unit_id: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
        """The rows of one unit's file ``table=<table>/sweep=<sweep>/<unit_id>.parquet`` ([] if absent)."""
        p = f"{self._partition(table, sweep)}/{unit_id}.parquet"
        if not self._is_file(p):
            return []
        rows: list[dict[str, Any]] = self.read_table(p, columns=columns).to_pylist()
        return rows

    def parquet_files(self, table: str, sweep: str) -> list[str]:
        """The Parquet files of one partition, as paths ``read_table`` accepts."""
        return [i.path for i in self._files(self._partition(table, sweep)) if i.path.endswith(".parquet")]

    def read_table(self, path: str, **kwargs: Any) -> pa.Table:
        if self.local and not os.path.isabs(path):
            path = os.path.abspath(path)
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
