"""The results tree: atomic Parquet writes, the unit ledger and attempt markers.

Layout under the results root (a local path or a shared file system mounted on every node)::

    table=<table>/sweep=<sweep>/<unit_id>.parquet   result rows of one unit (kdepth, ...)
    table=units/sweep=<sweep>/<unit_id>.parquet     the ledger entry of one unit, written LAST
    table=sweeps/sweep=<sweep>/spec.parquet         the spec text and hash, written once
    table=launches/sweep=<sweep>/<launch_id>.parquet provenance of each launch
    _state/attempts/sweep=<sweep>/<unit_id>/*.json  one marker per execution attempt

Every file is written under a temporary name in its final directory and renamed into place, so a
reader never sees a partial file. Result files are named by unit id, so running a unit twice replaces
its file instead of adding rows: no fault can produce a duplicate row. A unit is done when its ledger
entry says ``ok``; the ledger entry is written after the unit's result files.
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
import pyarrow.parquet as pq

from storage.schemas import TABLES, UNITS


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


def atomic_write_parquet(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` atomically: temporary file, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh, compression="zstd")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


class ResultStore:
    """Reads and writes one results root."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # -- paths -------------------------------------------------------------------------------------
    def partition(self, table: str, sweep: str) -> Path:
        return self.root / f"table={table}" / f"sweep={sweep}"

    def attempts_dir(self, sweep: str, unit_id: str) -> Path:
        return self.root / "_state" / "attempts" / f"sweep={sweep}" / unit_id

    # -- writes ------------------------------------------------------------------------------------
    def write(self, table: str, sweep: str, name: str, rows: pa.Table | Iterable[Mapping[str, Any]]) -> int:
        t = to_table(table, rows)
        atomic_write_parquet(t, self.partition(table, sweep) / f"{name}.parquet")
        return t.num_rows

    def mark_attempt(self, sweep: str, unit_id: str, node_id: str | None = None) -> int:
        """Record that an execution of ``unit_id`` started here; return the attempt number."""
        d = self.attempts_dir(sweep, unit_id)
        d.mkdir(parents=True, exist_ok=True)
        marker = {"host": socket.gethostname(), "pid": os.getpid(), "node_id": node_id,
                  "started_at": utcnow().isoformat()}
        name = f"{time.time_ns()}-{socket.gethostname()}-{os.getpid()}.json"
        tmp = d / f".{name}.tmp"
        tmp.write_text(json.dumps(marker))
        os.replace(tmp, d / name)
        return self.attempts(sweep, unit_id)

    def attempt_markers(self, sweep: str) -> list[dict[str, Any]]:
        """Every attempt marker of a sweep, with its unit id (which unit started where, and when)."""
        root = self.root / "_state" / "attempts" / f"sweep={sweep}"
        if not root.is_dir():
            return []
        return [{**json.loads(p.read_text()), "unit_id": p.parent.name} for p in sorted(root.glob("*/*.json"))]

    def attempts(self, sweep: str, unit_id: str) -> int:
        d = self.attempts_dir(sweep, unit_id)
        return sum(1 for p in d.glob("*.json")) if d.is_dir() else 0

    def record_unit(self, sweep: str, record: Mapping[str, Any]) -> None:
        """Commit a unit's ledger entry (replacing an earlier one: the ledger has one row per unit)."""
        self.write("units", sweep, str(record["unit_id"]), [record])

    # -- reads -------------------------------------------------------------------------------------
    def ledger(self, sweep: str) -> dict[str, dict[str, Any]]:
        """unit_id -> ledger row, for every unit of ``sweep`` that has one."""
        d = self.partition("units", sweep)
        if not d.is_dir():
            return {}
        out: dict[str, dict[str, Any]] = {}
        for p in sorted(d.glob("*.parquet")):
            for row in pq.read_table(p, columns=["unit_id", "status", "attempts", "error"], schema=UNITS).to_pylist():
                out[row["unit_id"]] = row
        return out

    def done_units(self, sweep: str) -> set[str]:
        return {u for u, row in self.ledger(sweep).items() if row["status"] == "ok"}

    def sweep_record(self, sweep: str) -> dict[str, Any] | None:
        p = self.partition("sweeps", sweep) / "spec.parquet"
        if not p.exists():
            return None
        rows = pq.read_table(p).to_pylist()
        return rows[0] if rows else None

    def parquet_files(self, table: str, sweep: str) -> list[str]:
        d = self.partition(table, sweep)
        return sorted(str(p) for p in d.glob("*.parquet")) if d.is_dir() else []

    def read_table(self, path: str, **kwargs: Any) -> pa.Table:
        return pq.read_table(path, **kwargs)

    def put_bytes(self, relpath: str, data: bytes) -> str:
        """A file under the results root (reports, artifacts), written atomically; returns where it is."""
        path = self.root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return str(path)

    def write_text(self, relpath: str, text: str) -> str:
        return self.put_bytes(relpath, text.encode())

    def exists(self) -> bool:
        return self.root.is_dir()

    def sweeps(self) -> list[str]:
        d = self.root / "table=sweeps"
        if not d.is_dir():
            return []
        return sorted(p.name.split("=", 1)[1] for p in d.iterdir() if p.name.startswith("sweep="))


def is_uri(results: str | Path) -> bool:
    """``s3://bucket/prefix``, ``gs://...``, ``file:///path``: a pyarrow filesystem URI, not a local path."""
    return "://" in str(results)


class ObjectStore(ResultStore):
    """The results tree on any pyarrow filesystem (``--results s3://bucket/prefix``, ``gs://``, ``file://``).

    Objects are written whole with one put (atomic on object stores), named by unit id as on a local
    disk, so a unit written twice still has one file; the ledger and attempt markers work the same way.
    """

    def __init__(self, uri: str):
        import pyarrow.fs as pafs

        self.uri = str(uri).rstrip("/")
        self.fs, path = pafs.FileSystem.from_uri(self.uri)
        self.base = path.rstrip("/")
        self.root = Path(self.base)  # for messages; every access goes through self.fs

    def _p(self, *parts: str) -> str:
        return "/".join([self.base, *parts])

    def _put(self, path: str, data: bytes) -> None:
        self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def _files(self, path: str, recursive: bool = False) -> list[Any]:
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=recursive))
        except (FileNotFoundError, OSError):
            return []
        return [i for i in infos if i.type == pafs.FileType.File]

    def write(self, table: str, sweep: str, name: str, rows: pa.Table | Iterable[Mapping[str, Any]]) -> int:
        t = to_table(table, rows)
        buf = pa.BufferOutputStream()
        pq.write_table(t, buf, compression="zstd")
        self._put(self._p(f"table={table}", f"sweep={sweep}", f"{name}.parquet"), buf.getvalue().to_pybytes())
        return t.num_rows

    def put_bytes(self, relpath: str, data: bytes) -> str:
        self._put(self._p(relpath), data)
        return f"{self.uri}/{relpath}"

    def mark_attempt(self, sweep: str, unit_id: str, node_id: str | None = None) -> int:
        marker = {"host": socket.gethostname(), "pid": os.getpid(), "node_id": node_id, "started_at": utcnow().isoformat()}
        name = f"{time.time_ns()}-{socket.gethostname()}-{os.getpid()}.json"
        self._put(self._p("_state", "attempts", f"sweep={sweep}", unit_id, name), json.dumps(marker).encode())
        return self.attempts(sweep, unit_id)

    def attempts(self, sweep: str, unit_id: str) -> int:
        return sum(1 for i in self._files(self._p("_state", "attempts", f"sweep={sweep}", unit_id)) if i.path.endswith(".json"))

    def attempt_markers(self, sweep: str) -> list[dict[str, Any]]:
        out = []
        for i in self._files(self._p("_state", "attempts", f"sweep={sweep}"), recursive=True):
            with self.fs.open_input_stream(i.path) as fh:
                out.append({**json.loads(fh.read()), "unit_id": i.path.rsplit("/", 2)[-2]})
        return out

    def parquet_files(self, table: str, sweep: str) -> list[str]:
        return sorted(i.path for i in self._files(self._p(f"table={table}", f"sweep={sweep}")) if i.path.endswith(".parquet"))

    def read_table(self, path: str, **kwargs: Any) -> pa.Table:
        return pq.read_table(path, filesystem=self.fs, **kwargs)

    def ledger(self, sweep: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for p in self.parquet_files("units", sweep):
            for row in self.read_table(p, columns=["unit_id", "status", "attempts", "error"], schema=UNITS).to_pylist():
                out[row["unit_id"]] = row
        return out

    def sweep_record(self, sweep: str) -> dict[str, Any] | None:
        files = self.parquet_files("sweeps", sweep)
        rows = self.read_table(files[0]).to_pylist() if files else []
        return rows[0] if rows else None

    def sweeps(self) -> list[str]:
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self._p("table=sweeps"), allow_not_found=True))
        except (FileNotFoundError, OSError):
            return []
        return sorted(i.base_name.split("=", 1)[1] for i in infos if i.base_name.startswith("sweep="))

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.base).type == pafs.FileType.Directory or bool(self._files(self.base, True)[:1])


def open_store(results: str | Path) -> ResultStore:
    """The store for ``--results``: a local directory, or any pyarrow filesystem URI."""
    return ObjectStore(str(results)) if is_uri(results) else ResultStore(results)
