"""The bytes of the results tree's files, below the store and a sweep's records: tables in their
declared schema (:func:`to_table`), the Parquet bytes the store writes (:func:`parquet_bytes`), a
ledger file's bytes and its parse (:func:`ledger_bytes`, :func:`parse_ledger_file`), what identifies
a file that was read (:func:`local_identity`, :func:`object_identity`), and the threads concurrent
puts use. storage.store (the results tree) and storage.records (one sweep's records) both build on
it; it imports neither.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage.schemas import TABLES, UNITS

#: Tables at least this large in memory are written with zstd; smaller ones uncompressed (zstd's
#: per-column set-up is ~1 ms for a ledger row, more than the whole rest of the write).
COMPRESS_FROM_BYTES = 64 * 1024



_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """Threads for concurrent puts (file writes and fsyncs release the GIL); one pool per process."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="swapcheck-put")
    return _POOL


def _forget_pool() -> None:
    global _POOL
    _POOL = None  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_forget_pool)


#: ``.<final name>.tmp-<32 hex>``: the temporary name of a local atomic put (``ResultStore._put``).
_TEMPORARY = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_table(table: str, rows: pa.Table | Iterable[Mapping[str, Any]],
             constants: Mapping[str, Any] | None = None) -> pa.Table:
    """Rows (dicts) or an Arrow table as the declared schema of ``table``: each column in its
    declared type, a declared column the rows lack filled from ``constants`` (the same value in every
    row, built as an Arrow column) or with nulls.

    Built in the declared schema, not cast to it: dicts are converted with the declared types (all
    columns present, e.g. a ledger row: one conversion, nothing else); an Arrow table already in the
    declared schema is returned as it is, and of any other only the columns whose type differs are
    cast (a cast of a column to its own type costs as much as a real one, per column and per unit).

    Raises ``ValueError`` for columns the table does not declare, and pyarrow's errors
    (``ArrowInvalid``/``ArrowTypeError``: subclasses of ``ValueError``/``TypeError``) for values that
    do not fit.
    """
    schema = TABLES[table]
    if isinstance(rows, pa.Table):
        if rows.schema.equals(schema):
            return rows
    else:
        rows = list(rows)
        names = {k for r in rows for k in r}
        _check_declared(table, names, schema)
        if len(names) == len(schema.names):  # every declared column: converted in the declared schema
            return pa.Table.from_pylist(rows, schema=schema)
        rows = pa.Table.from_pylist(rows, schema=pa.schema([f for f in schema if f.name in names]))
    _check_declared(table, set(rows.column_names), schema)
    constants = constants or {}
    n = rows.num_rows
    given = set(rows.column_names)
    columns = [_in_type(rows.column(f.name), f.type) if f.name in given
               else pa.repeat(pa.scalar(constants[f.name], f.type), n) if f.name in constants
               else pa.nulls(n, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _in_type(column: pa.ChunkedArray, type_: pa.DataType) -> pa.ChunkedArray:
    """``column`` as ``type_``: itself when it already is, else cast."""
    return column if column.type.equals(type_) else column.cast(type_)


def _check_declared(table: str, names: set[str], schema: pa.Schema) -> None:
    extra = names - set(schema.names)
    if extra:
        raise ValueError(f"rows for table {table!r} have undeclared columns {sorted(extra)}")


def _parquet_bytes(table: pa.Table, metadata: Mapping[str, str] | None = None) -> pa.Buffer:
    """The Parquet file of ``table`` in memory (no copy into a Python ``bytes``), with ``metadata``
    added to the file's key-value metadata (not to the stored Arrow schema). Deterministic: the same
    rows and metadata give the same bytes with the same pyarrow (``sweep verify`` relies on it)."""
    buf = pa.BufferOutputStream()
    compression = "zstd" if table.nbytes >= COMPRESS_FROM_BYTES else "none"
    with pq.ParquetWriter(buf, table.schema, compression=compression,
                          write_page_checksum=True,  # page CRCs: readers verify them
                          use_dictionary=list(_dictionary_columns(table.schema))) as writer:
        writer.write_table(table)
        if metadata:
            writer.add_key_value_metadata(dict(metadata))
    data: pa.Buffer = buf.getvalue()
    return data


def parquet_bytes(table: pa.Table, metadata: Mapping[str, str] | None = None) -> pa.Buffer:
    """The bytes the store writes for ``table`` (its declared schema) with ``metadata``."""
    return _parquet_bytes(table, metadata)


def ledger_bytes(row: Mapping[str, Any]) -> pa.Buffer:
    """The ledger file of one ledger row, exactly as the store writes it."""
    return _parquet_bytes(to_table("units", [row]))


def _json_value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def ledger_row_metadata(sweep: str, row: Mapping[str, Any]) -> str:
    """What each result file of a unit carries of its ledger row (``LEDGER_ROW_KEY``): JSON of every
    ``UNITS`` column, ``files`` reduced to table, path and rows (a file cannot hold its own size or
    SHA-256). ``row`` is as :meth:`ResultStore.ledger_records` returns it (Arrow-normalized values)."""
    out = {f.name: _json_value(row.get(f.name)) for f in UNITS if f.name != "files"}
    out["files"] = [{"table": r["table"], "path": r["path"], "rows": r["rows"]} for r in row.get("files") or []]
    return json.dumps({"sweep": sweep, "row": out}, sort_keys=True, separators=(",", ":"))


def ledger_row_from_metadata(text: str | bytes) -> tuple[str, dict[str, Any]]:
    """(sweep, ledger row) from :func:`ledger_row_metadata`'s JSON: timestamps parsed back, ``files``
    as written there (table, path, rows). Raises ``ValueError`` when it is not that JSON."""
    found = json.loads(text)
    if not isinstance(found, dict) or not isinstance(found.get("row"), dict) or not isinstance(found.get("sweep"), str):
        raise ValueError("not a ledger row")
    row: dict[str, Any] = found["row"]
    if set(row) != set(UNITS.names) or not isinstance(row["files"], list):
        raise ValueError("not the columns of a ledger row")
    for f in UNITS:
        if pa.types.is_timestamp(f.type) and row[f.name] is not None:
            row[f.name] = datetime.fromisoformat(row[f.name])
    return found["sweep"], row


def ledger_schema_problem(schema: pa.Schema) -> str | None:
    """None when ``schema`` is the ledger's (``UNITS``), or ``UNITS`` without ``files`` (a ledger file
    written before integrity records existed); else what differs."""
    got = {f.name: f.type for f in schema}
    for want in (UNITS, pa.schema([f for f in UNITS if f.name != "files"])):
        if list(got) == want.names and all(got[f.name].equals(f.type) for f in want):
            return None
    declared = {f.name: f.type for f in UNITS}
    extra = sorted(set(got) - set(declared))
    wrong = sorted(n for n in set(got) & set(declared) if not got[n].equals(declared[n]))
    absent = sorted(set(declared) - set(got) - {"files"})
    parts = [f"undeclared columns {extra}" if extra else "", f"other types in {wrong}" if wrong else "",
             f"missing columns {absent}" if absent else ""]
    return "not the ledger's schema: " + ("; ".join(p for p in parts if p) or "columns in another order")


@dataclass(frozen=True)
class LedgerDamage:
    """A ledger file that is not one intact ledger row of the unit it is named after: never trusted.

    ``unit_id`` is the unit its file name names; ``holds`` the unit id of the one row it holds when
    that is another unit's (``kind`` ``wrong_unit``); ``kind`` is ``unreadable`` (not Parquet, a page
    checksum fails), ``schema``, ``rows`` (not exactly one row) or ``wrong_unit``."""

    unit_id: str
    path: str
    kind: str
    why: str
    holds: str | None = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:200]}"


def parse_ledger_file(source: Any, rel: str) -> tuple[dict[str, Any] | None, LedgerDamage | None, str]:
    """(row, None, created_by) when ``source`` (a path or file the Parquet reader opens, e.g. a
    ``pa.BufferReader``) is one intact ledger row of the unit its name ``rel`` names; else
    (None, damage, created_by or ""). Every page checksum is verified; never raises for the file's
    content (a missing file raises ``FileNotFoundError``). A legacy file's row has ``files`` None."""
    name = rel.rsplit("/", 1)[-1].removesuffix(".parquet")

    def damage(kind: str, why: str, holds: str | None = None) -> LedgerDamage:
        return LedgerDamage(name, rel, kind, why, holds)

    created_by = ""
    try:
        pf = pq.ParquetFile(source, page_checksum_verification=True)
        created_by = str(pf.metadata.created_by or "")
        if (why := ledger_schema_problem(pf.schema_arrow)) is not None:
            return None, damage("schema", why), created_by
        if pf.metadata.num_rows != 1:
            return None, damage("rows", f"holds {pf.metadata.num_rows} rows, not the one row of its unit"), created_by
        rows = pf.read(use_threads=False).to_pylist()
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoding error (a page CRC too) means "damaged", never a traceback
        return None, damage("unreadable", f"not a readable Parquet file: {_first_line(exc)}"), created_by
    if len(rows) != 1:
        return None, damage("rows", f"holds {len(rows)} rows, not the one row of its unit"), created_by
    row = rows[0]
    row.setdefault("files", None)
    if row["unit_id"] != name:
        return None, damage("wrong_unit", f"holds the row of unit {row['unit_id']!r}, not of {name}", row["unit_id"]), created_by
    return row, None, created_by


@functools.lru_cache(maxsize=256)
def _dictionary_columns(schema: pa.Schema) -> tuple[str, ...]:
    """The Parquet leaf columns of ``schema`` (``name``, ``name.list.element``, ``name.field``) that
    are dictionary-encoded: every one but the floating-point ones (module docstring)."""
    def leaves(name: str, t: pa.DataType) -> Iterable[tuple[str, pa.DataType]]:
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            yield from leaves(f"{name}.list.element", t.value_type)
        elif pa.types.is_struct(t):
            for f in t:
                yield from leaves(f"{name}.{f.name}", f.type)
        else:
            yield name, t

    return tuple(path for f in schema for path, t in leaves(f.name, f.type) if not pa.types.is_floating(t))


def _sha256(data: bytes | pa.Buffer) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()



def local_identity(st: os.stat_result) -> list[Any]:
    """What must not have changed since a local file was read for what was read to still be its
    content: any write changes the ctime (no user call can set it back), a replace the inode. The
    one rule of the verified-files cache (storage.catalog) and of :meth:`ResultStore.read_ledger`."""
    return ["local", st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def object_identity(info: pafs.FileInfo) -> list[Any] | None:
    """An object's identity on an object store (size and mtime: pyarrow exposes no ETag); None when
    the listing has neither."""
    if info.size is None or info.mtime_ns is None:
        return None
    return ["object", int(info.size), int(info.mtime_ns)]




# -- this machine's caches of what was read ------------------------------------------------------

#: Kept reads older than this many seconds (since their file was last really read) are not trusted:
#: the file is read and checked again (storage.catalog.VerifiedFiles, storage.readcache).
REHASH_ENV = "SWAPCHECK_REHASH_AFTER_S"
REHASH_DEFAULT_S = 86_400.0


def cache_dir() -> Path | None:
    """``$XDG_CACHE_HOME/swapcheck`` (an absolute ``XDG_CACHE_HOME`` only, as the XDG spec says), else
    ``~/.cache/swapcheck``; None when there is no home directory."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "swapcheck"
    try:
        return Path.home() / ".cache" / "swapcheck"
    except (RuntimeError, KeyError):
        return None


def write_cache_file(path: Path, data: bytes) -> bool:
    """Replace ``path`` (a file of one of this machine's caches) by ``data`` atomically: a private
    temporary beside it, then ``os.replace``, its folder made owner-only if new. A cache is an
    optimisation only: an ``OSError`` leaves no temporary and returns False; never raises."""
    import tempfile

    tmp = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
