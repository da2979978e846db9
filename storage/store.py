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
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage.schemas import TABLES, UNITS

__all__ = ["ResultStore", "is_uri", "open_store", "to_table", "utcnow"]


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
    pq.write_table(table, buf, compression="zstd")
    data: bytes = buf.getvalue().to_pybytes()
    return data


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
    def write(self, table: str, sweep: str, name: str, rows: pa.Table | Iterable[Mapping[str, Any]]) -> int:
        """Write one file of ``table`` (rows cast to its declared schema); return the row count."""
        t = to_table(table, rows)
        self._put(f"{self._partition(table, sweep)}/{name}.parquet", _parquet_bytes(t))
        return int(t.num_rows)

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
