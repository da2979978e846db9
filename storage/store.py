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

    def sweeps(self) -> list[str]:
        d = self.root / "table=sweeps"
        if not d.is_dir():
            return []
        return sorted(p.name.split("=", 1)[1] for p in d.iterdir() if p.name.startswith("sweep="))
