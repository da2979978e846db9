"""DuckDB views over the Parquet tree, named queries, and a read-only query entry point.

Each table of ``storage.schemas.TABLES`` is a view with the same name (``kdepth``, ``units``,
``sweeps``, ``launches``, ...) plus its ``sweep`` partition column; a table with no files yet is an
empty view with the declared columns, so queries never fail for lack of results.

A command opens one :class:`Catalog` (one read-only DuckDB connection, the views created once) and
asks it every question it has; ``read_only_query`` and ``run_named`` are one-shot conveniences
(open, run one query, close) built on it.

**What a view reads.** Opening a catalog lists each table's partitions once and reads the ledger
(``units``). A result table's view is bound to exactly the files that ``ok`` ledger rows name (their
``files`` records; for rows written before those existed, ``<unit_id>.parquet`` of each table in
``tables``), each checked cheaply first: it exists, its size is the recorded ``bytes``, its Parquet
footer is readable, its row count is the recorded ``rows`` and its schema fits the declared one.
A file that fails is skipped and its unit marked: the ``units`` view adds ``damaged`` (bool) and
``damage`` (the first problem) to the ledger columns; a unit whose ledger file itself is unreadable
is a row with only ``unit_id``, ``sweep``, ``status = 'damaged'`` and those two.
A record whose path leaves its partition ``table=<t>/sweep=<s>/`` (``..``, absolute, a URI, a
symlink out of the root, another sweep or table: ``ResultStore.recorded``) is never bound: a
warning, and its unit is marked damaged. A file no ``ok`` ledger row names (an orphan) is not read. Every problem is one line of
:attr:`Catalog.warnings` naming the file and ``swapcheck sweep verify``; nothing is read silently.
Each file's bytes are identified by the SHA-256 its ledger record holds (hashed, unless the
:class:`VerifiedFiles` cache says this exact file matched before), so footer statistics are never
trusted over bytes the ledger did not record. The partitions of a sweep with no ledger are one
warning each and never read. The ledger and the tables that are not a unit's results (``sweeps``,
``launches``, ``preregistrations``: only a sweep's ``spec.parquet``, and the others only of sweeps
with one, each file holding the one record its name says) are read whole at open, their bytes read
once, as are result files of legacy ledger rows (no SHA-256): no statistic of theirs is used, and a
file replaced meanwhile is seen whole before or after.

**What a later open costs.** The :class:`VerifiedFiles` cache vouches for a file whose identity
is unchanged since it passed every check (within ``SWAPCHECK_REHASH_AFTER_S``): no hash, no footer,
and for a ledger file no read (its row is in the entry). So a later open stats each file once.

**How views scan.** A local tree (:func:`native_scan`) is scanned by DuckDB's own Parquet reader:
one ``read_parquet`` per sweep over an explicit list of the verified files (``hive_partitioning =
false``; ``sweep`` a constant of its branch, so a filter on it prunes whole branches), the files'
footers cached for the connection's life. DuckDB checks no page CRC, so after every query the
catalog stats each bound file again and discards the result if any changed since it was verified
(:meth:`Catalog._unchanged`). An object store, or a root whose path holds a glob character (DuckDB
would expand it), is scanned through pyarrow datasets with page CRCs verified, registered with the
connection: DuckDB itself opens no file there.

**Read-only by construction.** The connection's allowed paths are exactly the verified result files
(none on the pyarrow route) and its one directory is a private spill directory (fresh, mode 0700,
under ``$SWAPCHECK_SPILL_DIR`` or the system's temporary directory, removed on close), so that a
query larger than memory spills instead of failing; then ``enable_external_access = false`` (COPY,
EXPORT, ATTACH, INSTALL/LOAD, ``read_*``/``glob`` and every other file system route fail with a
Permission Error on every other path) and ``lock_configuration = true`` (no SET/PRAGMA/RESET can undo
it). An allowed path can be written by a COPY; what refuses that, and every other write, is the
allow-list user SQL passes, taken from DuckDB's own parse (``duckdb.extract_statements``): SELECT
(DESCRIBE, SHOW and SUMMARIZE parse as SELECT) and EXPLAIN
of a SELECT, never EXPLAIN ANALYZE (which runs its statement).
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage.errors import PathEscape, QueryError, StorageError
from storage.files import REHASH_DEFAULT_S, REHASH_ENV, cache_dir, write_cache_file
from storage.records import file_problem, is_compacted
from storage.schemas import TABLES, UNITS, UNMANAGED_TABLES
from storage.schemas import fingerprint as schemas_fingerprint
from storage.store import (
    CACHE_KEY,
    ResultStore,
    cache_key,
    local_identity,
    object_identity,
    open_store,
)
from swapcheck_common.env import seconds_from_env

if TYPE_CHECKING:
    import pyarrow.dataset as pads

__all__ = [
    "UNMANAGED_TABLES",
    "Catalog",
    "QueryError",
    "check_read_only",
    "connect",
    "lock_down",
    "named_queries",
    "named_query",
    "open_catalog",
    "query_names",
    "QueryLimits",
    "guarded",
    "read_only_query",
    "run_named",
    "view_definitions",
    "write_views",
]

#: Statement kinds ``swapcheck query`` accepts: reading only (DESCRIBE, SHOW, SUMMARIZE parse as SELECT;
#: EXPLAIN only of a SELECT and never ANALYZE, checked separately).
READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}


#: Columns the ``units`` view adds to the ledger: whether a committed unit's files are damaged, and why.
DAMAGE_COLUMNS = [pa.field("damaged", pa.bool_()), pa.field("damage", pa.string())]

#: ``$name`` placeholders of a named query (after comments and string literals are removed).
_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_COMMENTS_AND_STRINGS = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'", re.DOTALL)
_ANALYZE = {"ANALYZE", "ANALYSE"}
_T = TypeVar("_T")
_R = TypeVar("_R")


def _arrow(result: Any, most_mb: float = 0.0) -> pa.Table:
    """The result as an Arrow table (DuckDB 2 calls it ``to_arrow_table``, 1.x ``fetch_arrow_table``).
    ``most_mb`` (0: no limit): read batch by batch, and a result larger than that many megabytes
    raises :class:`QueryError` before the rest is read."""
    if result is None:  # a statement without a result set
        return pa.table({})
    if most_mb:
        stream = getattr(result, "to_arrow_reader", None) or getattr(result, "fetch_record_batch", None)
        reader = stream(65_536) if stream is not None else result.arrow()
        if isinstance(reader, pa.Table):
            reader = reader.to_reader()
        batches, size = [], 0
        for batch in reader:
            size += batch.nbytes
            if size > most_mb * 2**20:
                raise QueryError(f"the result is larger than {most_mb:,.0f} MB ({QUERY_RESULT_ENV}): aggregate, "
                                 "filter or add a LIMIT, or raise the limit")
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)
    fetch = getattr(result, "to_arrow_table", None) or result.arrow
    table = fetch()
    return table if isinstance(table, pa.Table) else table.read_all()


#: Limits of one query of a catalog (:func:`guarded`): wall seconds, the process's resident memory,
#: and (``swapcheck query``) the size of the result.
QUERY_TIMEOUT_ENV = "SWAPCHECK_QUERY_TIMEOUT_S"
QUERY_MEMORY_ENV = "SWAPCHECK_QUERY_MEMORY_MB"
QUERY_RESULT_ENV = "SWAPCHECK_QUERY_RESULT_MB"
#: ``swapcheck query``'s own defaults (reports have no time limit unless the variable sets one).
QUERY_TIMEOUT_DEFAULT_S = 900.0
QUERY_RESULT_DEFAULT_MB = 1024.0


def _physical_mb() -> float:
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):
        return 0.0


def _rss_mb() -> float | None:
    """This process's resident memory (Linux ``/proc/self/statm``), None where it cannot be read."""
    import os

    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class QueryLimits:
    """Wall seconds (0: none) and resident megabytes (0: none) one query may take, and the result's
    megabytes (0: none). :meth:`from_env` reads the variables, each checked (exit 2 naming it)."""

    timeout_s: float = 0.0
    memory_mb: float = 0.0
    result_mb: float = 0.0

    @classmethod
    def from_env(cls, timeout_s: float = 0.0, result_mb: float = 0.0) -> QueryLimits:
        """The limits set by the environment, else the defaults given (memory: three quarters of the
        machine's physical memory, above DuckDB's own half (:func:`default_memory_limit`), which does not
        count what pyarrow and Python hold: stopped with a message before the kernel's OOM killer)."""
        year = 365 * 86_400.0
        return cls(seconds_from_env(QUERY_TIMEOUT_ENV, timeout_s, 0.0, year, StorageError, unit="seconds (0: no limit)"),
                   seconds_from_env(QUERY_MEMORY_ENV, round(_physical_mb() * 0.75), 0.0, 2.0**40, StorageError,
                                    unit="megabytes (0: no limit)"),
                   seconds_from_env(QUERY_RESULT_ENV, result_mb, 0.0, 2.0**40, StorageError,
                                    unit="megabytes (0: no limit)"))


def guarded(con: duckdb.DuckDBPyConnection, work: Callable[[], _T], limits: QueryLimits) -> _T:
    """``work()`` (DuckDB calls on ``con``) on a thread of its own while this one watches: past
    ``limits.timeout_s`` seconds or ``limits.memory_mb`` of resident memory the query is interrupted
    (``con.interrupt()``) and fails with :class:`QueryError` naming the limit and its variable. This
    thread stays in Python meanwhile, so a signal's handler runs at once (a query had answered
    SIGTERM after 4 min 24 s, with a stack dump): the query is interrupted and the exception the
    handler raised (``Terminated``) propagates; if DuckDB does not stop within 2 s (one long string
    operation cannot be interrupted midway) it is marked ``hard`` so that the CLI exits at once."""
    import threading

    out: list[_T] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:  # noqa: BLE001 - handed to the watching thread
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="swapcheck-query", daemon=True).start()
    start = time.monotonic()
    why = None
    try:
        while not done.wait(0.05):
            if why is not None:
                continue
            if limits.timeout_s and time.monotonic() - start > limits.timeout_s:
                why = f"ran past its time limit of {limits.timeout_s:g} s ({QUERY_TIMEOUT_ENV})"
            elif limits.memory_mb and (_rss_mb() or 0.0) > limits.memory_mb:
                why = (f"took the process past its memory limit of {limits.memory_mb:,.0f} MB of resident memory "
                       f"({QUERY_MEMORY_ENV})")
            if why is not None:
                con.interrupt()
    except BaseException as exc:  # a signal's handler raised here: stop the query, then propagate it
        con.interrupt()
        if not done.wait(2.0):
            exc.hard = True  # type: ignore[attr-defined]
        raise
    if failed:
        if why is not None:
            raise QueryError(f"the query {why}; it was interrupted and nothing was returned. Aggregate, filter or "
                             "add a LIMIT, or raise the limit") from None
        raise failed[0]
    return out[0]


def sql_params(sql: str) -> list[str]:
    """The ``$name`` placeholders ``sql`` uses, in order of first use (comments and strings ignored)."""
    return list(dict.fromkeys(_PARAM.findall(_COMMENTS_AND_STRINGS.sub(" ", sql))))


# -- binding the views: which files each table reads ---------------------------------------------------

def _compatible(found: pa.DataType, declared: pa.DataType) -> bool:
    """Whether a column stored as ``found`` reads as ``declared`` without changing its meaning."""
    if found.equals(declared) or pa.types.is_null(found):
        return True
    same_family = (pa.types.is_integer, pa.types.is_floating, pa.types.is_timestamp, pa.types.is_boolean)
    if any(f(found) and f(declared) for f in same_family):
        return True
    if (pa.types.is_string(found) or pa.types.is_large_string(found)) and pa.types.is_string(declared):
        return True
    if pa.types.is_list(declared) and (pa.types.is_list(found) or pa.types.is_large_list(found)):
        return _compatible(found.value_type, declared.value_type)
    if pa.types.is_struct(declared) and pa.types.is_struct(found):
        names = {declared.field(i).name: declared.field(i).type for i in range(declared.num_fields)}
        return all(found.field(i).name in names and _compatible(found.field(i).type, names[found.field(i).name])
                   for i in range(found.num_fields))
    return False


def schema_problem(found: pa.Schema, declared: pa.Schema) -> str | None:
    """Why a file's schema is not ``declared``'s (a foreign file), or None if it reads as that table.

    A file may lack declared columns (older files: they read as NULL) but must hold at least one,
    and every column it has must be declared, with a compatible type.
    """
    types = {f.name: f.type for f in declared}
    foreign = [f"{f.name} ({f.type})" for f in found if f.name not in types]
    if foreign:
        return f"foreign schema: undeclared column(s) {', '.join(foreign)}"
    wrong = [f"{f.name} is {f.type}, declared {types[f.name]}" for f in found if not _compatible(f.type, types[f.name])]
    if wrong:
        return f"foreign schema: {'; '.join(wrong)}"
    if "unit_id" in types and "unit_id" not in found.names:
        return "foreign schema: no unit_id column"
    if not found.names:
        return "foreign schema: no columns"
    return None


@dataclass(frozen=True)
class _Want:
    """One file a view should read: where, its table and sweep, and what the ledger knows of it."""

    rel: str  # relative to the results root
    table: str
    sweep: str
    unit: tuple[str, str] | None = None  # (sweep, unit_id) of the ok ledger row naming it
    rows: int | None = None
    size: int | None = None
    sha256: str | None = None  # the ledger's; None: a legacy row, or a table no ledger row names
    #: a compacted file (storage.records): the units whose ok rows name it (``unit`` is then None)
    members: tuple[str, ...] = ()

    @property
    def stem(self) -> str:
        return self.rel.rsplit("/", 1)[1][: -len(".parquet")]


@dataclass
class _Bound:
    """What a catalog binds: each table's files, what was read at open, the ledger, the warnings."""

    #: table -> the files its view reads: the verified result files, the counted ledger files (``units``),
    #: the checked files of the other tables (``swapcheck db`` names them all).
    files: dict[str, list[_Want]] = field(default_factory=dict)
    #: table -> rows read whole at open (bytes read once, parsed from memory): ``units`` and the other
    #: tables no ledger row names, and the files of a result table that no SHA-256 identifies (legacy rows).
    memory: dict[str, pa.Table] = field(default_factory=dict)
    #: every counted ledger row of a ledger file (the tail): UNITS + sweep. A checkpoint's rows are not
    #: read at open: the ``units`` view scans each checkpoint (``checkpoints``) at query time.
    ledger: pa.Table | None = None
    lost: list[dict[str, Any]] = field(default_factory=list)  # units whose ledger file is unreadable
    damaged: dict[tuple[str, str], str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    sweeps: set[str] = field(default_factory=set)  # sweeps with a ledger or a spec record
    #: each sweep's ledger checkpoint bound (storage.records), and the units whose tail file supersedes its row
    checkpoints: list[tuple[_Want, list[str]]] = field(default_factory=list)
    #: checkpoint rel -> its read (storage.records.CheckpointRead): columns decoded only when needed
    checkpoint_reads: dict[str, Any] = field(default_factory=dict)
    #: a bound compacted file -> the units it holds that no ok row names it for (superseded since): not read
    stale: dict[str, list[str]] = field(default_factory=dict)
    hashed: int = 0  # files hashed at open (not found in the verified-files cache)
    native: bool = False  # the result views scan with DuckDB's own reader (:func:`native_scan`)
    #: rel -> the identity a bound file had when it was verified (checked again after every query of a
    #: natively scanned view), and whether its schema is exactly its table's declared one.
    identity: dict[str, list[Any] | None] = field(default_factory=dict)
    exact: dict[str, bool] = field(default_factory=dict)


def _parallel(fn: Callable[[_T], _R], items: list[_T], threads: bool = True) -> list[_R]:
    """``fn`` over ``items`` in order; on threads when there are many (hashing, remote reads and
    Parquet decoding release the GIL)."""
    if not threads or len(items) < 16:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(fn, items))


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t`` with exactly ``schema``'s columns, in order (absent ones NULL); raises when one cannot be cast."""
    return pa.Table.from_arrays(
        [t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(len(t), f.type) for f in schema],
        schema=schema)


def _concat(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """``parts`` (files read whole, each checked by :func:`schema_problem`) as one table of ``schema``."""
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)  # each of ``schema`` already (:meth:`_Binder._read`)


# -- the verified-files cache ------------------------------------------------------------------------

class VerifiedFiles:
    """Which files of one results root were hashed and matched the ledger's SHA-256, and under what
    identity: locally (size, mtime_ns, ctime_ns, inode, device), on an object store (size, mtime_ns:
    pyarrow's file systems expose no ETag). A file whose identity is unchanged since it matched need
    not be hashed again; any write changes the ctime (which no user call can set back) and a replace
    the inode, so a rewrite with mtime and size restored is still hashed again.

    One JSON file per results root under :func:`cache_dir` (``verified/<key>.v<format>-<schemas>.json``, the key a hash
    of the root, which the file does not name), outside the results tree, written atomically
    (temporary, then ``os.replace``). It is an optimisation only: unreadable or unwritable (a
    read-only home), it is ignored and every file is hashed; it never makes a file trusted that the
    ledger does not name with that SHA-256.

    An entry also records what the full check of that file found: its row count (the ledger's, which
    it held), and whether its Parquet schema is exactly its table's declared one (``exact``: scanned
    as is; else with columns matched by name). A file whose identity, SHA-256 and recorded rows all
    match an entry is bound without opening it (no hash, no footer read): the checks cost one
    ``stat`` per file. The file is keyed by the declared schemas too (``schemas``), so a swapcheck
    whose tables changed checks every file again.

    Each entry is signed (``mac``: HMAC-SHA256 of its path and contents) with a secret kept beside the
    results (``_state/verified-files.key``, 32 random bytes, written by the first open that can write
    there). An entry written by anyone without that secret -- e.g. a forged one giving a changed file's
    identity with the ledger's SHA-256 (issue #36: ``query`` then served the changed rows) -- does not
    verify and is ignored with one warning; its file is hashed. The secret is written by the writers
    of the tree (``sweep launch``: :func:`storage.store.ensure_cache_key`), never by a reader; where there is none
    (a tree no launch of this version wrote) or it cannot be read, the cache is not used: every file
    is hashed.
    """

    KEY = CACHE_KEY

    VERSION = 3  # 3: entries signed (mac); a v2 cache of an older swapcheck is not read (no false alarm)
    #: Entries older than this many seconds (since their file was last really read) are not trusted:
    #: the file is hashed and checked again, so bit rot under an unchanged identity is found within a
    #: day by reads too (``sweep verify`` finds it at once). 0: every file is hashed at every open.
    REHASH_ENV = REHASH_ENV
    REHASH_DEFAULT_S = REHASH_DEFAULT_S

    def __init__(self, store: ResultStore) -> None:
        import os

        self.store = store
        root = os.path.realpath(store.base) if store.local else f"{type(store.fs).__name__}:{store.base}"
        key = hashlib.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        folder = cache_dir()
        # One file per cache format and declared schemas too, so that two swapcheck versions sharing a
        # home directory do not discard each other's entries at every open.
        name = f"{key}.v{self.VERSION}-{_SCHEMAS_KEY[:8]}.json"
        self.path = folder / "verified" / name if folder is not None else None
        self._key = self.secret(store) if self.path is not None else None
        if self._key is None:
            self.path = None  # no secret: nothing could be trusted, so nothing is kept
        self.forged = 0  # entries whose signature did not verify (counted as they are met)
        self._old = self._load()
        self._new: dict[str, dict[str, Any]] = {}
        self._now = time.time_ns()
        self._fresh_ns = self._now - int(seconds_from_env(self.REHASH_ENV, self.REHASH_DEFAULT_S, 0.0,
                                                          10 * 365 * 86_400.0, StorageError) * 1e9)
        self._lock = __import__("threading").Lock()
        #: rel -> whether its old entry's signature verified (each checked once per open)
        self._checked: dict[str, bool] = {}

    def _load(self) -> dict[str, Any]:
        """The cache's entries; {} when it is absent (or its directory unusable), of another format,
        or not parseable -- the last also sets :attr:`problem` (one warning for the reader: every file
        is hashed this time, and the open rewrites it)."""
        import json

        self.problem: str | None = None
        if self.path is None:
            return {}
        try:
            raw = self.path.read_bytes()
        except OSError:  # absent, or no usable cache directory (a read-only home): quietly none
            return {}
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser's stack
            self.problem = f"not valid JSON ({type(exc).__name__})"
            return {}
        if not isinstance(data, dict) or data.get("version") != self.VERSION or data.get("schemas") != _SCHEMAS_KEY:
            if not isinstance(data, dict):
                self.problem = "not a JSON object"
            return {}
        files = data.get("files")
        if not isinstance(files, dict):
            self.problem = "its files entry is not an object"
            return {}
        return files

    @classmethod
    def secret(cls, store: ResultStore) -> bytes | None:
        """The results tree's signing secret (:func:`ensure_cache_key` writes it), or None."""
        return cache_key(store)

    def _mac(self, rel: str, entry: dict[str, Any]) -> str:
        import hmac
        import json

        assert self._key is not None
        body = json.dumps([rel, {k: v for k, v in entry.items() if k != "mac"}], sort_keys=True,
                          separators=(",", ":"), default=str)
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()

    def identity(self, rel: str, info: pafs.FileInfo | None) -> list[Any] | None:
        """What must not have changed since a file was hashed for that hash to still be its content."""
        import os

        if self.store.local:
            try:
                st = os.stat(f"{self.store.base}/{rel}")
            except OSError:
                return None
            return local_identity(st)
        return None if info is None else object_identity(info)

    def known(self, rel: str, identity: list[Any] | None, sha256: str, rows: int | None) -> bool | None:
        """Whether ``rel`` passed every check with ``sha256`` and ``rows`` and has not changed since (same
        identity): None if not (check it), else whether its schema is exactly the declared one."""
        entry = self._entry(rel, identity)
        if entry is None or entry.get("sha256") != sha256 or entry.get("rows") != rows:
            return None
        return bool(entry.get("exact"))

    def _entry(self, rel: str, identity: list[Any] | None) -> dict[str, Any] | None:
        """``rel``'s entry if its identity is ``identity`` and it is fresh (read within the rehash age).
        Its signature is checked once per open (the answer is kept for ``rel`` and that identity)."""
        import hmac

        entry = self._old.get(rel)
        if identity is None or self._key is None or not isinstance(entry, dict) or entry.get("identity") != identity:
            return None
        checked = self._checked.get(rel)
        if checked is None:
            mac = entry.get("mac")
            checked = self._checked[rel] = isinstance(mac, str) and hmac.compare_digest(mac, self._mac(rel, entry))
            if not checked:
                with self._lock:
                    self.forged += 1
        if not checked:
            return None
        read_ns = entry.get("read_ns")
        return entry if isinstance(read_ns, int) and self._fresh_ns <= read_ns <= self._now else None

    def add(self, rel: str, identity: list[Any] | None, sha256: str, rows: int | None, exact: bool) -> None:
        """Keep ``rel``'s entry (``read_ns``: when its bytes were last really read, kept from an entry
        that vouched for it; that entry is kept as it is, signature included, when it says the same)."""
        if identity is not None and self._key is not None:
            entry = {"identity": identity, "sha256": sha256, "rows": rows, "exact": exact,
                     "read_ns": self._read_ns(rel, identity)}
            old = self._entry(rel, identity)
            if old is not None and {k: v for k, v in old.items() if k != "mac"} == entry:
                entry = old  # signed already: no second signature for the same content
            else:
                entry["mac"] = self._mac(rel, entry)
            with self._lock:
                self._new[rel] = entry

    def _read_ns(self, rel: str, identity: list[Any]) -> int:
        entry = self._entry(rel, identity)
        return int(entry["read_ns"]) if entry is not None else self._now

    def ledger_row(self, rel: str, identity: list[Any] | None) -> dict[str, Any] | None:
        """The row a ledger file held when it was read and counted, if it has not changed since."""
        entry = self._entry(rel, identity)
        row = entry.get("ledger") if entry is not None else None
        return _row_from_json(row) if isinstance(row, dict) else None

    def add_ledger(self, rel: str, identity: list[Any] | None, row: dict[str, Any]) -> None:
        if identity is not None and self._key is not None:
            entry = {"identity": identity, "ledger": _row_to_json(row), "read_ns": self._read_ns(rel, identity)}
            entry["mac"] = self._mac(rel, entry)
            with self._lock:
                self._new[rel] = entry

    def save(self) -> None:
        """Keep what this open verified (files no longer bound are dropped); never raises."""
        import json

        if self.path is None or self._new == self._old:
            return
        # an optimisation only: unwritten, the next command hashes again
        write_cache_file(self.path, json.dumps({"version": self.VERSION, "schemas": _SCHEMAS_KEY, "files": self._new},
                                               separators=(",", ":")).encode())


#: The declared schemas the verified-files cache was checked against (a cache of other schemas is ignored).
_SCHEMAS_KEY = schemas_fingerprint()[:32]


_TIMESTAMPS = frozenset(f.name for f in UNITS if pa.types.is_timestamp(f.type))


def _row_to_json(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if k in _TIMESTAMPS and v is not None else v for k, v in row.items()}


def _row_from_json(row: dict[str, Any]) -> dict[str, Any] | None:
    from datetime import datetime

    if set(row) != set(UNITS.names) | {"sweep"}:
        return None
    try:
        return {k: datetime.fromisoformat(v) if k in _TIMESTAMPS and v is not None else v for k, v in row.items()}
    except (TypeError, ValueError):
        return None


# -- binding the views ------------------------------------------------------------------------------

#: table -> what the file name of each file of that table (no ledger row names them) must equal:
#: the column whose value (its first 20 characters for a pre-registration's hash) is the file's name.
_NAMED_BY = {"units": "unit_id", "launches": "launch_id", "preregistrations": "sha256"}


class _Binder:
    """One pass over a results tree: list partitions once, read the ledger, check and identify each file."""

    def __init__(self, store: ResultStore, label: str) -> None:
        self.store = store
        self.verify = f"run `swapcheck sweep verify --results {label}`"
        self.out = _Bound()
        self.cache = VerifiedFiles(store)
        if self.cache.problem:
            self.out.warnings.append(f"the verified-files cache {self.cache.path} is ignored: {self.cache.problem}; "
                                     "every file is hashed this time, and the cache is rewritten")
        self.infos: dict[str, pafs.FileInfo] = {}
        self._compacted_rows: dict[tuple[str, str], int | None] = {}  # (compacted file, unit) -> its record's rows
        #: compacted file -> (its units, each unit's recorded rows), bound in Arrow (:meth:`_compacted_wants`)
        self._compacted_members: dict[str, tuple[pa.Array, pa.Array]] = {}
        #: checkpoints whose sweep was bound in Arrow: their binding is kept if every file passes (:meth:`bind`)
        self._to_keep: list[tuple[_Want, list[_Want]]] = []
        #: compacted file -> (its checkpoint, its stale units) when its binding was kept (:meth:`_kept_binding`)
        self._kept: dict[str, tuple[_Want, list[str]]] = {}

    def _abs(self, rel: str) -> str:
        return f"{self.store.base}/{rel}"

    def _listing(self) -> dict[str, dict[str, list[str]]]:
        """table -> sweep -> the relative paths of its Parquet files (each table listed once; their
        :class:`pyarrow.fs.FileInfo` kept in ``self.infos``)."""
        out: dict[str, dict[str, list[str]]] = {}
        for table in TABLES:
            out[table] = {}
            for sweep in self.store.sweep_partitions(table):
                rel_dir = f"table={table}/sweep={sweep}"
                try:
                    infos = self.store.fs.get_file_info(pafs.FileSelector(self._abs(rel_dir), allow_not_found=True))
                except OSError:
                    infos = []
                files = out[table][sweep] = []
                for i in infos:
                    if i.type == pafs.FileType.File and i.base_name.endswith(".parquet") and not i.base_name.startswith("."):
                        files.append(f"{rel_dir}/{i.base_name}")
                        self.infos[files[-1]] = i
        return out

    def _warn(self, rel: str, problem: str, consequence: str) -> None:
        self.out.warnings.append(f"{rel}: {problem}; {consequence}; {self.verify}")

    def _hash(self, rel: str) -> tuple[str, list[Any] | None]:
        """The SHA-256 of ``rel``'s bytes, and its identity while they were read (None if it changed)."""
        import hashlib
        import os

        if self.store.local:
            with open(self._abs(rel), "rb") as fh:
                before = local_identity(os.fstat(fh.fileno()))
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
                after = local_identity(os.fstat(fh.fileno()))
            return digest, before if before == after else None
        h = hashlib.sha256()
        with self.store.fs.open_input_stream(self._abs(rel)) as stream:
            while chunk := stream.read(1 << 20):
                h.update(chunk)
        return h.hexdigest(), self.cache.identity(rel, self.infos.get(rel))

    def _identify(self, w: _Want) -> tuple[str | None, list[Any] | None]:
        """Hash ``w``: why its bytes are not the ones the ledger recorded (or None), and its identity
        while they were read (to cache, and to check again after each query). The verified-files
        cache was consulted before (:meth:`_check`): a file it vouches for never gets here."""
        assert w.sha256 is not None
        digest, identity = self._hash(w.rel)
        with self.cache._lock:
            self.out.hashed += 1
        if (found := file_problem({"sha256": w.sha256}, sha256=digest)):
            return f"its bytes are not the ones the ledger recorded: {found[1]}", None
        if identity is None and self.store.local:
            return "changed while it was being hashed (a writer is replacing it?)", None
        return None, identity

    def _read(self, w: _Want, whole: bool) -> tuple[str | None, pa.Table | None, bool]:
        """Why ``w`` must not be read (footer, rows, schema, name), or None; when ``whole``, all its
        rows (with ``sweep``), from its bytes read once: a file replaced meanwhile is read either
        whole before or whole after, never a footer of one and pages of the other; and whether its
        schema is exactly the declared one (scanned as is, else with its columns matched by name)."""
        try:
            with self.store.fs.open_input_file(self._abs(w.rel)) as fh:
                pf = pq.ParquetFile(pa.BufferReader(fh.read_buffer()) if whole else fh, page_checksum_verification=True)
                declared = TABLES[w.table]
                exact = pf.schema_arrow.equals(declared, check_metadata=False)
                problem = schema_problem(pf.schema_arrow, declared)
                if (found := file_problem({"rows": w.rows}, rows=pf.metadata.num_rows)):
                    return f"holds {found[1]}", None, False
                if not whole or problem is not None:
                    return problem, None, exact
                t = pf.read(use_threads=False)
            t = t.append_column("sweep", pa.array([w.sweep] * len(t), pa.string()))
            full = declared.append(pa.field("sweep", pa.string()))
            if not t.schema.equals(full):  # an older file: cast here, where failing is this file's problem
                t = _conform(t, full)
        except FileNotFoundError:
            return "missing (deleted?)", None, False
        except Exception as exc:  # noqa: BLE001 - any unreadable file is damage, never a traceback
            return f"not a readable Parquet file ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})", None, False
        return None, t, exact

    def _check(self, wants: list[_Want], whole: bool | None = None) -> list[tuple[_Want, pa.Table | None]]:
        """The files of ``wants`` that pass the checks, each with its rows when read whole (``whole``;
        None: those no SHA-256 identifies); a warning, and a damaged unit, for each other.

        The checks, cheapest first: listed, the recorded size, the verified-files cache (an entry
        for this exact file, SHA-256 and row count: done), else the recorded SHA-256, then footer,
        row count and schema. A bound file's identity and exactness go to ``identity`` / ``exact``.
        """
        def check(w: _Want) -> tuple[str | None, pa.Table | None]:
            info = self.infos.get(w.rel)
            if info is None:
                return "missing (deleted?)", None
            if (found := file_problem({"bytes": w.size}, size=int(info.size) if info.size is not None else None)):
                return f"is {found[1]}", None  # the one rule (storage.records), as verify applies it
            identity = None
            if w.sha256 is not None:
                try:
                    problem, identity = self._identify(w)
                except FileNotFoundError:
                    return "missing (deleted?)", None
                except OSError as exc:
                    return f"unreadable ({type(exc).__name__}: {exc})", None
                if problem is not None:
                    return problem, None
            problem, rows, exact = self._read(w, whole if whole is not None else w.sha256 is None)
            if problem is None:
                if w.sha256 is not None:
                    self.cache.add(w.rel, identity, w.sha256, w.rows, exact)
                self._bound(w, identity, exact)
            return problem, rows

        def cached(w: _Want) -> bool:
            """Whether the verified-files cache vouches for ``w`` (one stat: no thread needed)."""
            info = self.infos.get(w.rel)
            if (w.sha256 is None or info is None
                    or (w.size is not None and info.size is not None and int(info.size) != w.size)):
                return False
            identity = self.cache.identity(w.rel, info)
            exact = self.cache.known(w.rel, identity, w.sha256, w.rows)
            if exact is None:
                return False
            self.cache.add(w.rel, identity, w.sha256, w.rows, exact)
            self._bound(w, identity, exact)
            return True

        quick = {w.rel for w in wants if cached(w)}
        rest = [w for w in wants if w.rel not in quick]
        checked = dict(zip([w.rel for w in rest], _parallel(check, rest), strict=True))
        good = []
        for w in wants:
            p, rows = checked.get(w.rel, (None, None))
            if p is None:
                good.append((w, rows))
                continue
            if w.unit is not None:
                self.out.damaged.setdefault(w.unit, f"{w.rel}: {p}")
                self._warn(w.rel, p, f"skipped, unit {w.unit[1]} of sweep {w.unit[0]} is marked damaged")
            elif members := self._units_of(w):
                for u in members:
                    self.out.damaged.setdefault((w.sweep, u), f"{w.rel}: {p}")
                self._warn(w.rel, p, f"skipped, its {len(members)} unit(s) of sweep {w.sweep} are marked damaged")
            else:
                self._warn(w.rel, p, "skipped")
        return good

    def _bound(self, w: _Want, identity: list[Any] | None, exact: bool) -> None:
        with self.cache._lock:
            self.out.identity[w.rel] = identity
            self.out.exact[w.rel] = exact

    def _named(self, w: _Want, t: pa.Table) -> str | None:
        """Why a file no ledger row names is not the one record its name says (a copy, a misnamed
        file), or None: exactly one row, whose ``unit_id`` / ``launch_id`` / hash is the file's name."""
        if w.table == "sweeps":
            if w.stem != "spec":
                return "is not a sweep's spec record (spec.parquet)"
        elif w.table in _NAMED_BY:
            column = _NAMED_BY[w.table]
            value = t.column(column)[0].as_py() if len(t) == 1 else None
            value = value[:20] if w.table == "preregistrations" and isinstance(value, str) else value
            if len(t) == 1 and value == w.stem:
                return None
            found = f"{len(t)} rows" if len(t) != 1 else f"{column} {str(value)[:80]!r}"
            return f"holds {found}, not the one record its file name says (a copy or a misnamed file?)"
        return None if len(t) == 1 else f"holds {len(t)} rows, not one"

    def _read_ledger(self, listing: dict[str, list[str]]) -> None:
        """Read every ledger file whole; a damaged one is a warning and a ``damaged`` row of its unit
        (``units`` shows the unit even though its row is lost); a readable one counts only when it
        holds exactly one row, of the unit its file name says (else a warning: never counted).

        A ledger file counted before and unchanged since (its identity, :class:`VerifiedFiles`) is
        not read again: its row comes from the cache. Every other one is read and checked whole,
        its identity taken before its bytes are read (a file changed meanwhile no longer matches it)."""
        wants = [_Want(rel, "units", sweep, (sweep, rel.rsplit("/", 1)[1][: -len(".parquet")]))
                 for sweep, files in listing.items() for rel in files]
        full = UNITS.append(pa.field("sweep", pa.string()))
        cached: list[tuple[_Want, dict[str, Any]]] = []
        identities: dict[str, list[Any] | None] = {}
        for w in wants:
            identity = identities[w.rel] = self.cache.identity(w.rel, self.infos.get(w.rel))
            row = self.cache.ledger_row(w.rel, identity)
            if row is not None:
                self.cache.add_ledger(w.rel, identity, row)
                cached.append((w, row))
        known = {w.rel for w, _ in cached}
        good = self._check([w for w in wants if w.rel not in known], whole=True)
        counted = []
        for w, t in good:
            assert t is not None
            problem = self._named(w, t)
            if problem is None:
                counted.append((w, t))
                self.cache.add_ledger(w.rel, identities.get(w.rel), t.to_pylist()[0])
            else:
                self._warn(w.rel, problem, "not counted")
        self.out.files["units"] = [w for w, _ in cached] + [w for w, _ in counted]
        parts = [t for _, t in counted]
        if cached:
            parts.insert(0, pa.Table.from_pylist([row for _, row in cached], schema=full))
        read = known | {w.rel for w, _ in good}
        self.out.lost = [{"unit_id": w.unit[1], "status": "damaged", "sweep": w.sweep}
                         for w in wants if w.rel not in read and w.unit is not None]
        self._checkpoints(listing, wants)
        self.out.ledger = _concat(parts, full)

    def _checkpoints(self, listing: dict[str, list[str]], wants: list[_Want]) -> None:
        """Each sweep's ledger checkpoint (storage.records), checked (its bytes against the SHA-256 its
        name records, or a kept read of it, storage.readcache) but not decoded: the ``units`` view
        scans its rows of the units no tail file names (a tail file, intact or not, is the later
        write) at query time, and :meth:`_expected` decodes the columns it binds only when no kept
        binding serves. A damaged checkpoint is a warning, and its units are not counted."""
        from storage.records import SweepRecords

        tail: dict[str, set[str]] = {}
        for w in wants:
            if w.unit is not None:
                tail.setdefault(w.sweep, set()).add(w.unit[1])
        for sweep in sorted(listing):
            records = SweepRecords(self.store, sweep)
            cp = records.current_checkpoint()
            if cp is None:
                continue
            try:
                read = records.read_checkpoint(cp)
            except OSError as exc:
                self._warn(cp.rel, f"ledger checkpoint: unreadable ({type(exc).__name__}: {exc})",
                           "the units only it records are not counted")
                continue
            if not read.ok or read.keys is None:
                self._warn(cp.rel, f"ledger checkpoint: {read.why}", "the units only it records are not counted")
                continue
            superseded = sorted(tail.get(sweep, set()))
            self.out.checkpoints.append((_Want(cp.rel, "units", sweep, None, read.keys.num_rows, None, cp.sha256),
                                         superseded))
            self.out.checkpoint_reads[cp.rel] = read
            self.out.identity[cp.rel] = read.identity

    def _checkpoint_rows(self, w: _Want, superseded: list[str], columns: list[str]) -> pa.Table:
        """``columns`` of the checkpoint ``w``'s rows that no tail file supersedes, with ``sweep``."""
        read = self.out.checkpoint_reads[w.rel]
        t = read.columns(columns)
        if superseded:
            t = t.filter(pc.invert(pc.is_in(t.column("unit_id"), pa.array(superseded, pa.string()))))
        return t.append_column("sweep", pa.array([w.sweep] * len(t), pa.string()))

    def _expected(self) -> dict[str, list[_Want]]:
        """table -> the files ``ok`` ledger rows name (legacy rows: ``<unit_id>.parquet`` per table)."""
        out: dict[str, list[_Want]] = {t: [] for t in TABLES if t not in UNMANAGED_TABLES}
        compacted: dict[tuple[str, str], list[tuple[tuple[str, str], dict[str, Any]]]] = {}
        passed: set[tuple[str, Any, str]] = set()  # compacted files whose recorded path passed the check

        def first_sweep(rel: str) -> str:
            return rel.split("/", 2)[1].removeprefix("sweep=")

        assert self.out.ledger is not None
        columns = ["unit_id", "status", "tables", "files", "sweep"]
        parts = [self.out.ledger.select(columns)]
        with_tail = set(pc.unique(parts[0].column("sweep")).to_pylist()) if parts[0].num_rows else set()
        for cpw, superseded in self.out.checkpoints:
            if cpw.sweep not in with_tail:  # every unit of the sweep in its checkpoint: kept, or bound in Arrow
                kept = self._kept_binding(cpw)
                if kept is not None:
                    for w in kept:
                        out[w.table].append(w)
                    continue
                rows = self._checkpoint_rows(cpw, superseded, columns[:-1])
                wants = self._compacted_wants(cpw.sweep, rows.filter(pc.equal(rows.column("status"), "ok")))
                if wants is not None:
                    for w in wants:
                        out[w.table].append(w)
                    self._to_keep.append((cpw, wants))
                    continue
                parts.append(rows)
            else:
                parts.append(self._checkpoint_rows(cpw, superseded, columns[:-1]))
        # The tail, and checkpoints that are not one compacted sweep's alone: row by row.
        ledger = pa.concat_tables(parts)
        for row in ledger.filter(pc.equal(ledger.column("status"), "ok")).to_pylist():
            unit = (row["sweep"], row["unit_id"])
            records = row["files"]
            if records is None:
                records = [{"table": tb, "path": f"table={tb}/sweep={row['sweep']}/{row['unit_id']}.parquet",
                            "rows": None, "bytes": None, "sha256": None} for tb in row["tables"] or []]
            for i, rec in enumerate(records):
                table, rel = rec.get("table"), str(rec.get("path") or "")
                try:  # the one check of a recorded path (storage.store.ResultStore.recorded): never followed
                    key = (row["sweep"], table, rel)
                    if key not in passed:  # a compacted file is named by every one of its units: checked once
                        self.store.recorded(row["sweep"], rec)
                        if is_compacted(rel):
                            passed.add(key)
                except PathEscape as exc:
                    self.out.damaged.setdefault(unit, f"{rel}: path_escape: {exc.why}")
                    field_name = f"files[{i}].path" if row["files"] is not None else "tables"
                    self._warn(rel or "(empty path)", f"ledger row of unit {unit[1]}, {field_name}: path_escape: {exc}",
                               f"not read, unit {unit[1]} of sweep {unit[0]} is marked damaged")
                    continue
                if is_compacted(rel):
                    compacted.setdefault((table, rel), []).append((unit, rec))
                    self._compacted_rows[(rel, unit[1])] = rec.get("rows")
                    continue
                out[table].append(_Want(rel, table, row["sweep"], unit, rec.get("rows"), rec.get("bytes"),
                                        rec.get("sha256") or None))
        for (table, rel), named in compacted.items():  # one want per compacted file, named by all its units
            first = named[0][1]
            agree: list[str] = []
            for u, r in named:
                if r.get("bytes") == first.get("bytes") and r.get("sha256") == first.get("sha256"):
                    agree.append(u[1])
                    continue
                self.out.damaged.setdefault(u, f"{rel}: its record's size or SHA-256 is not the other units'")
                self._warn(rel, f"ledger row of unit {u[1]} records other bytes for this compacted file than its "
                           "other units' rows", f"not read for unit {u[1]}, which is marked damaged")
            out[table].append(_Want(rel, table, first_sweep(rel), None, None, first.get("bytes"), first.get("sha256") or None,
                                    tuple(agree)))
        return out

    _KEPT = "catalog-binding"

    def _kept_binding(self, cpw: _Want) -> list[_Want] | None:
        """The wants of checkpoint ``cpw``'s sweep as a catalog bound them before (storage.readcache),
        when the checkpoint and every compacted file it names keep the identity they had then (so
        the same bytes: the same records, the same members, the same stale units). None: bind it."""
        kept = self.store.read_cache
        hit = kept.get(cpw.rel, self.out.identity.get(cpw.rel), self._KEPT) if kept is not None else None
        if hit is None:
            return None
        files = hit[1].get("files")
        if not isinstance(files, list) or not files:
            return None
        wants = []
        for f in files:
            rel = str(f.get("rel", ""))
            identity = self.cache.identity(rel, self.infos.get(rel)) if rel in self.infos else None
            if identity is None or identity != f.get("identity"):
                return None
            wants.append(_Want(rel, str(f["table"]), str(f["sweep"]), None, None, f.get("bytes"), f.get("sha256") or None))
        for w, f in zip(wants, files, strict=True):
            self._kept[w.rel] = (cpw, [str(u) for u in f.get("stale") or []])
        return wants

    def _keep_bindings(self) -> None:
        """Keep the binding of each sweep bound in Arrow whose every compacted file passed every check
        (and no unit of which is damaged): the next open of the unchanged files reuses it."""
        kept = self.store.read_cache
        if kept is None:
            return
        bound = {w.rel for ws in self.out.files.values() for w in ws}
        for cpw, wants in self._to_keep:
            if any(w.rel not in bound or self.out.identity.get(w.rel) is None for w in wants) or \
                    any(k[0] == cpw.sweep for k in self.out.damaged):
                continue
            files = [{"table": w.table, "rel": w.rel, "sweep": w.sweep, "bytes": w.size, "sha256": w.sha256,
                      "identity": self.out.identity[w.rel], "stale": self.out.stale.get(w.rel, [])} for w in wants]
            kept.put(cpw.rel, self.out.identity.get(cpw.rel), self._KEPT, pa.table({"n": [len(files)]}), {"files": files})

    def _units_of(self, w: _Want) -> tuple[str, ...]:
        """The units whose ok rows name ``w`` (a compacted file bound in Arrow: listed now; one whose
        binding was kept: decoded from the checkpoint now), to name them damaged."""
        if w.rel in self._compacted_members:
            return tuple(self._compacted_members[w.rel][0].to_pylist())
        if w.members or w.rel not in self._kept:
            return w.members
        cpw, _stale = self._kept[w.rel]
        superseded = next((s for c, s in self.out.checkpoints if c.rel == cpw.rel), [])
        rows = self._checkpoint_rows(cpw, superseded, ["unit_id", "status", "files"])
        rows = rows.filter(pc.equal(rows.column("status"), "ok"))
        files = rows.column("files").combine_chunks()
        flat = pc.list_flatten(files)
        parent = pc.list_parent_indices(files)
        hit = pc.equal(flat.field("path"), w.rel)
        return tuple(rows.column("unit_id").combine_chunks().take(parent.filter(hit)).to_pylist())

    def _compacted_wants(self, sweep: str, rows: pa.Table) -> list[_Want] | None:
        """The wants of a compacted sweep's ``ok`` ledger rows, in Arrow (no Python object per unit
        but its id in each file's ``members``): when every row names only compacted files, every file's
        recorded path passes the one check (``ResultStore.recorded``) and every row naming a file
        records the same size and SHA-256 for it. Else None: :meth:`_expected`'s row-by-row pass
        handles the sweep (it names each problem)."""
        import numpy as np

        if not rows.num_rows:
            return []
        files = rows.column("files").combine_chunks()
        if files.null_count:
            return None
        flat = pc.list_flatten(files)
        parent = pc.list_parent_indices(files).to_numpy()
        counts = np.bincount(parent, minlength=rows.num_rows) if len(parent) else np.zeros(rows.num_rows, np.int64)
        if (counts == 0).any():  # a row naming no file: the row-by-row pass says what it means
            return None
        paths = flat.field("path")
        if paths.null_count or not all(is_compacted(p) for p in pc.unique(paths).to_pylist()):
            return None  # each distinct path once: a compacted sweep names a few files
        records = pa.table({"table": flat.field("table"), "path": paths, "rows": flat.field("rows"),
                            "bytes": flat.field("bytes"), "sha256": flat.field("sha256"),
                            "unit": rows.column("unit_id").combine_chunks().take(pa.array(parent))})
        keys = records.group_by(["table", "path"], use_threads=False).aggregate(
            [("bytes", "count_distinct"), ("sha256", "count_distinct"), ("bytes", "min"), ("sha256", "min")])
        if pc.any(pc.not_equal(keys.column("bytes_count_distinct"), 1)).as_py() or \
                pc.any(pc.not_equal(keys.column("sha256_count_distinct"), 1)).as_py():
            return None  # a file recorded with other bytes by some unit: damage, named row by row
        encoded = pc.dictionary_encode(paths)  # each record's file as a small integer: one hash per record
        if len(encoded.dictionary) != keys.num_rows:
            return None  # a path recorded under two tables: named row by row
        code = {p: i for i, p in enumerate(encoded.dictionary.to_pylist())}
        wants = []
        for key in keys.select(["table", "path", "bytes_min", "sha256_min"]).to_pylist():
            try:
                self.store.recorded(sweep, {"table": key["table"], "path": key["path"]})
            except PathEscape:
                return None
            rel = str(key["path"])
            mine = pc.equal(encoded.indices, code[rel])
            # Its units stay in Arrow (``members`` empty): checked against its footer in Arrow
            # (:meth:`_members`), listed in Python only to name them damaged (:meth:`_units_of`).
            self._compacted_members[rel] = (records.column("unit").filter(mine).combine_chunks(),
                                            records.column("rows").filter(mine).combine_chunks())
            wants.append(_Want(rel, str(key["table"]), rel.split("/", 2)[1].removeprefix("sweep="), None, None,
                               key["bytes_min"], key["sha256_min"] or None))
        return wants

    def _unmanaged(self, table: str, listing: dict[str, list[str]], specs: set[str]) -> None:
        """A table no ledger row names (spec records, launches, pre-registrations): read whole at open;
        only a sweep's ``spec.parquet`` in ``sweeps``; elsewhere only the partitions of sweeps with a
        spec record (``specs``), and only files holding the one record their name says."""
        wants: list[_Want] = []
        for sweep, files in sorted(listing.items()):
            if table != "sweeps" and sweep not in specs:
                if files:
                    self._warn(f"table={table}/sweep={sweep}/", f"{len(files)} file(s) of a sweep with no spec record "
                               f"(table=sweeps/sweep={sweep}/spec.parquet)", "not read")
                continue
            wants.extend(_Want(rel, table, sweep) for rel in files)
        parts, files_ok = [], []
        for w, t in self._check(wants, whole=True):
            assert t is not None
            problem = self._named(w, t)
            if problem is not None:
                self._warn(w.rel, problem, "not read")
                continue
            parts.append(t)
            files_ok.append(w)
        self.out.files[table] = files_ok
        self.out.memory[table] = _concat(parts, TABLES[table].append(pa.field("sweep", pa.string())))

    def _members(self, good: list[tuple[_Want, pa.Table | None]]) -> list[tuple[_Want, pa.Table | None]]:
        """Each bound compacted file against the units its footer lists (storage.records.compacted_units,
        one footer read): every unit naming it must be listed with the rows its record says (else the
        file is not read and its units are marked damaged); listed units no ok row names it for are
        ``stale`` (their rows are not read)."""
        from storage.records import compacted_units

        out = []
        for w, t in good:
            if w.rel in self._kept:  # its footer was checked against the same records before: kept
                stale = self._kept[w.rel][1]
                if stale:
                    self.out.stale[w.rel] = stale
                out.append((w, t))
                continue
            if not w.members and w.rel not in self._compacted_members:
                out.append((w, t))
                continue
            units, why = compacted_units(self.store, w.rel)
            if units is not None and w.rel in self._compacted_members:  # bound in Arrow: checked in Arrow
                members, rows = self._compacted_members[w.rel]
                held = pa.array(list(units), pa.string())
                at = pc.index_in(members, value_set=held)
                held_rows = pa.array(list(units.values()), pa.int64()).take(at)
                bad = pc.or_kleene(pc.is_null(at), pc.fill_null(pc.not_equal(rows.cast(pa.int64()), held_rows), False))
                wrong = members.filter(bad).slice(0, 1).to_pylist()
                why = f"does not hold the rows its units' records say (e.g. unit {wrong[0]})" if wrong else ""
            elif units is not None:
                recorded = self._compacted_rows
                wrong = [u for u in w.members
                         if u not in units or recorded.get((w.rel, u)) not in (None, units[u])]
                why = f"does not hold the rows its units' records say (e.g. unit {wrong[0]})" if wrong else ""
            if why:
                members = self._units_of(w)
                for u in members:
                    self.out.damaged.setdefault((w.sweep, u), f"{w.rel}: {why}")
                self._warn(w.rel, why, f"skipped, its {len(members)} unit(s) of sweep {w.sweep} are marked damaged")
                continue
            assert units is not None
            if w.rel in self._compacted_members:
                held = pa.array(list(units), pa.string())
                stale = sorted(held.filter(pc.invert(pc.is_in(held, value_set=self._compacted_members[w.rel][0]))).to_pylist())
            else:
                stale = sorted(set(units) - set(w.members))
            if stale:
                self.out.stale[w.rel] = stale
            out.append((w, t))
        return out

    def bind(self) -> _Bound:
        listing = self._listing()
        self._read_ledger(listing["units"])
        ledgered = set(listing["units"])  # sweeps that have a ledger (even an unreadable one)
        self._unmanaged("sweeps", listing["sweeps"], set())
        specs = {w.sweep for w in self.out.files["sweeps"]}
        self.out.sweeps = ledgered | specs
        for table in sorted(UNMANAGED_TABLES - {"units", "sweeps"}):
            self._unmanaged(table, listing[table], specs)
        with self.store.resolving():  # each partition's directory resolved once, not once per file
            expected = self._expected()
        for table in TABLES:
            if table in UNMANAGED_TABLES:
                continue
            wants = list({w.rel: w for w in reversed(expected[table])}.values())[::-1]  # once each
            named = {w.rel for w in wants}
            for sweep, files in sorted(listing[table].items()):
                if sweep not in ledgered:
                    if files:
                        self._warn(f"table={table}/sweep={sweep}/", f"{len(files)} file(s) of a sweep with no "
                                   f"ledger (table=units/sweep={sweep}/): no ok ledger row names them", "not read")
                    continue
                for rel in files:
                    if rel not in named:
                        self._warn(rel, "not named by any ok ledger row (an orphan)", "not read")
            good = self._members(self._check(wants))
            self.out.files[table] = [w for w, _ in good]
            legacy = [t for _, t in good if t is not None]  # no SHA-256 to identify them: read whole now
            if legacy:
                self.out.memory[table] = _concat(legacy, TABLES[table].append(pa.field("sweep", pa.string())))
        self._keep_bindings()
        if self.cache.forged:
            self.out.warnings.append(
                f"the verified-files cache {self.cache.path}: {self.cache.forged} entr"
                f"{'y does' if self.cache.forged == 1 else 'ies do'} not carry this results tree's signature "
                f"({VerifiedFiles.KEY}): ignored, their files hashed again; the cache is rewritten")
        self.cache.save()
        self.out.native = native_scan(self.store, self.out)
        return self.out


# -- the connection ---------------------------------------------------------------------------------

def _dataset(store: ResultStore, table: str, wants: list[_Want],
             memory: pa.Table | None = None) -> pa.Table | pads.Dataset:
    """What a table's view scans: its verified files (a dataset: scanned natively at query time,
    their statistics trusted because their bytes are the ledger's) plus ``memory`` (rows read at open).
    The pyarrow route only (:func:`native_scan`): ``pyarrow.dataset`` is imported here, not by every command."""
    schema = TABLES[table].append(pa.field("sweep", pa.string()))
    files = [w for w in wants if w.sha256 is not None] if table not in UNMANAGED_TABLES else []
    if not files:  # rows read at open only (every unmanaged table): no import of pyarrow.dataset
        return memory if memory is not None else schema.empty_table()
    import pyarrow.dataset as pads

    # Page CRCs (written by the store) are verified on every read: a file whose bytes changed after
    # it was identified (bit rot under an unchanged identity) fails the query instead of feeding it wrong numbers.
    fmt = pads.ParquetFileFormat(
        default_fragment_scan_options=pads.ParquetFragmentScanOptions(page_checksum_verification=True))
    dataset = pads.FileSystemDataset.from_paths(
        [f"{store.base}/{w.rel}" for w in files], schema=schema, format=fmt,
        filesystem=store.fs, partitions=[pads.field("sweep") == w.sweep for w in files])
    return dataset if memory is None else pads.dataset([dataset, pads.dataset(memory)])


def _bind_units(con: duckdb.DuckDBPyConnection, store: ResultStore, bound: _Bound) -> None:
    """The ``units`` view: the counted ledger rows (read at open), plus ``damaged`` / ``damage`` (why)
    of each unit, plus a ``damaged`` row for each unit whose ledger file is unreadable."""
    full = UNITS.append(pa.field("sweep", pa.string()))
    con.register("_units_tail", bound.ledger if bound.ledger is not None else full.empty_table())
    parts = ["SELECT * FROM _units_tail"]
    cols = ", ".join(_ident(c) for c in UNITS.names)
    for i, (w, superseded) in enumerate(bound.checkpoints):  # scanned at query time, page checksums verified
        if bound.native:
            source = f"read_parquet([{_literal(f'{store.base}/{w.rel}')}], hive_partitioning = false)"
        else:
            import pyarrow.dataset as pads

            fmt = pads.ParquetFileFormat(
                default_fragment_scan_options=pads.ParquetFragmentScanOptions(page_checksum_verification=True))
            source = f"_units_checkpoint_{i}"
            con.register(source, pads.dataset(f"{store.base}/{w.rel}", format=fmt, filesystem=store.fs))
        skip = ""
        if superseded:
            con.register(f"_units_superseded_{i}", pa.table({"unit_id": pa.array(superseded, pa.string())}))
            skip = f" WHERE unit_id NOT IN (SELECT unit_id FROM _units_superseded_{i})"
        parts.append(f"SELECT {cols}, {_literal(w.sweep)} AS sweep FROM {source}{skip}")
    con.execute("CREATE VIEW _units_ledger AS " + "\nUNION ALL BY NAME\n".join(parts))
    con.register("_units_damage", pa.Table.from_pylist(
        [{"sweep": k[0], "unit_id": k[1], "damage": v} for k, v in bound.damaged.items()],
        schema=pa.schema([("sweep", pa.string()), ("unit_id", pa.string()), ("damage", pa.string())])))
    lost = [{**row, "damaged": True, "damage": bound.damaged.get((row["sweep"], row["unit_id"]))} for row in bound.lost]
    con.register("_units_lost", pa.Table.from_pylist(lost, schema=pa.schema([*full, *DAMAGE_COLUMNS])))
    con.execute(
        "CREATE VIEW units AS SELECT l.*, d.unit_id IS NOT NULL AS damaged, d.damage "
        "FROM _units_ledger AS l LEFT JOIN _units_damage AS d ON l.sweep = d.sweep AND l.unit_id = d.unit_id "
        "UNION ALL BY NAME SELECT * FROM _units_lost"
    )


#: The parent of each connection's private spill directory (default: the system's temporary directory).
SPILL_DIR_ENV = "SWAPCHECK_SPILL_DIR"
#: DuckDB's memory limit for a catalog's connection (e.g. ``8GB``); default :func:`default_memory_limit`.
MEMORY_LIMIT_ENV = "SWAPCHECK_DUCKDB_MEMORY"


def default_memory_limit() -> str:
    """Half the machine's physical memory. DuckDB's own default (80%) leaves too little for what it
    does not count: the views scan pyarrow datasets, whose batches live outside DuckDB's buffer
    manager, so ``report all`` over 100M rows at 80% was killed by the kernel's OOM killer (24 GiB
    machine); with half, DuckDB spills (:func:`_spill_dir`) instead."""
    import os

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return ""
    return f"{max(256, total // 2 // 2**20)}MB"


def _spill_dir() -> str:
    """A fresh private (0700) directory for DuckDB to spill to, removed when the process exits
    (and by :meth:`Catalog.close`). Without one, a query larger than memory (the agreement grid at
    100M rows) fails with DuckDB's Out of Memory error instead of spilling."""
    import atexit
    import os
    import shutil
    import tempfile

    parent = os.environ.get(SPILL_DIR_ENV) or None
    if parent is not None and not os.path.isdir(parent):
        why = "does not exist" if not os.path.lexists(parent) else "is not a directory"
        raise StorageError(f"{SPILL_DIR_ENV}={parent}: {why}; set it to an existing directory DuckDB may "
                           "spill to, or unset it (the system's temporary directory)")
    try:
        path = tempfile.mkdtemp(prefix="swapcheck-spill-", dir=parent)
    except OSError as exc:
        where = f"{SPILL_DIR_ENV}={parent}" if parent else f"the temporary directory {tempfile.gettempdir()}"
        raise StorageError(f"{where}: cannot create a spill directory there ({type(exc).__name__}: "
                           f"{exc.strerror or exc}); set {SPILL_DIR_ENV} to a writable directory") from None
    atexit.register(shutil.rmtree, path, True)
    return path


#: Characters DuckDB's file readers take as a glob pattern: a tree whose bound paths hold one is
#: scanned through pyarrow instead (DuckDB would expand the pattern, not read the file named).
_GLOB_CHARS = frozenset("*?[")


def native_scan(store: ResultStore, bound: _Bound) -> bool:
    """Whether the result tables' views scan with DuckDB's own Parquet reader: a local tree whose
    bound paths hold no glob character. An object store is scanned through pyarrow's file systems
    (DuckDB would need its httpfs extension, which a read-only connection may not install)."""
    if not store.local or _GLOB_CHARS & set(store.base):
        return False
    return not any(_GLOB_CHARS & set(w.rel) for t, ws in bound.files.items() if t not in UNMANAGED_TABLES for w in ws)


def _stale_part(path: str, w: _Want, bound: _Bound) -> str:
    """A compacted file some of whose units were superseded since it was written: its rows but theirs."""
    stale = ", ".join(_literal(u) for u in bound.stale[w.rel])
    by_name = "" if bound.exact.get(w.rel, False) else ", union_by_name = true"
    return (f"SELECT *, {_literal(w.sweep)} AS sweep FROM read_parquet([{_literal(path)}], hive_partitioning = false"
            f"{by_name}) WHERE unit_id NOT IN ({stale})")


def _native_files(bound: _Bound) -> list[_Want]:
    """The bound result files a native view reads (each identified by its SHA-256; legacy rows' files
    are read whole at open, held in ``bound.memory``)."""
    return [w for t, ws in bound.files.items() if t not in UNMANAGED_TABLES for w in ws if w.sha256 is not None]


def _native_view(store: ResultStore, table: str, wants: list[_Want], bound: _Bound, memory: str | None) -> str:
    """``CREATE VIEW`` of a result table over exactly ``wants`` with DuckDB's own reader: one
    ``read_parquet`` per sweep over the files whose schema is exactly the declared one (no glob, no
    hive partitioning: ``sweep`` is a constant of its branch), one more with columns matched by
    name over the others (older files), plus ``memory`` (a registered table of rows read at open);
    the declared columns and types, in order, plus ``sweep``."""
    schema = TABLES[table].append(pa.field("sweep", pa.string()))
    parts = [_typed_empty(schema)]
    groups: dict[tuple[str, bool], list[str]] = {}
    for w in wants:
        if w.sha256 is not None and w.rel not in bound.stale:
            groups.setdefault((w.sweep, bound.exact.get(w.rel, False)), []).append(f"{store.base}/{w.rel}")
    for (sweep, exact), files in sorted(groups.items()):
        listed = ", ".join(_literal(f) for f in files)
        by_name = "" if exact else ", union_by_name = true"
        parts.append(f"SELECT *, {_literal(sweep)} AS sweep FROM read_parquet([{listed}], "
                     f"hive_partitioning = false{by_name})")
    parts += [_stale_part(f"{store.base}/{w.rel}", w, bound) for w in wants if w.rel in bound.stale]
    if memory is not None:
        parts.append(f"SELECT * FROM {_ident(memory)}")
    body = "\nUNION ALL BY NAME\n".join(parts)
    if any(not exact for _sweep, exact in groups) or memory is not None:  # types as declared, whatever a file holds
        cols = ", ".join(f"CAST({_ident(c)} AS {t}) AS {_ident(c)}" for c, t in _duck_types(schema))
        body = f"SELECT {cols} FROM (\n{body}\n)"
    return f"CREATE VIEW {_ident(table)} AS {body}"


def _open(store: ResultStore, bound: _Bound, spill: str | None = None,
          tables: Iterable[str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory connection that cannot touch a file outside its private spill directory
    ``spill`` (none: no spilling) and the bound result files, with one view per table over ``bound``
    (``tables``: only those, plus ``units``; :func:`_create_views` adds the others later).

    Natively scanned (:func:`native_scan`): the bound files are the connection's ``allowed_paths``
    (exact files, not directories: a stray file beside them stays unreadable) and the views read them
    with DuckDB's own Parquet reader (footers cached for the connection's life). Otherwise each view
    scans a pyarrow dataset registered with the connection, and DuckDB opens no file at all.
    """
    import os

    native = bound.native
    config: dict[str, str | bool | int | float | list[str]] = {"temp_directory": spill or ""}
    limit = os.environ.get(MEMORY_LIMIT_ENV) or default_memory_limit()
    if limit:
        config["memory_limit"] = limit
    con = duckdb.connect(":memory:", config=config)
    Catalog.connections_opened += 1
    try:
        if not spill:
            con.execute("SET max_temp_directory_size = '0B'")
        if native:
            allowed = [f"{store.base}/{w.rel}" for w in _native_files(bound)]
            allowed += [f"{store.base}/{w.rel}" for w, _ in bound.checkpoints]
            con.execute("SET allowed_paths = $paths", {"paths": allowed})
            con.execute("SET parquet_metadata_cache = true")  # each footer read once per connection
        con.execute("SET enable_external_access = false")  # no file, any path, but the allowed ones
        _bind_units(con, store, bound)
        _create_views(con, store, bound, TABLES if tables is None else tables)
    except BaseException:
        con.close()
        raise
    return con


def _create_views(con: duckdb.DuckDBPyConnection, store: ResultStore, bound: _Bound, tables: Iterable[str]) -> None:
    """The view of each of ``tables`` (but ``units``, made by :func:`_bind_units`) over ``bound``: over
    exactly the verified files, with DuckDB's reader (:func:`_native_view`) or a pyarrow dataset."""
    for table in tables:
        if table == "units":
            continue
        memory = bound.memory.get(table)
        if bound.native and table not in UNMANAGED_TABLES:
            name = None
            if memory is not None:
                name = f"_{table}_read_at_open"
                con.register(name, memory)
            con.execute(_native_view(store, table, bound.files[table], bound, name))
        else:
            wants = bound.files[table]
            stale = [w for w in wants if w.rel in bound.stale]
            if stale:  # a compacted file with superseded units: its other units' rows, read now
                schema = TABLES[table].append(pa.field("sweep", pa.string()))
                parts = [memory] if memory is not None else []
                for w in stale:
                    t = store.read_table(f"{store.base}/{w.rel}")
                    t = t.filter(pc.invert(pc.is_in(t.column("unit_id"), pa.array(bound.stale[w.rel], pa.string()))))
                    parts.append(_conform(t.append_column("sweep", pa.array([w.sweep] * len(t), pa.string())), schema))
                memory = _concat(parts, schema)
                wants = [w for w in wants if w.rel not in bound.stale]
            con.register(table, _dataset(store, table, wants, memory))  # DuckDB opens no file


def connect(results: str | Path, store: ResultStore | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with one view per results table (local path or URI).

    File access is already off; :func:`lock_down` locks the configuration (:class:`Catalog` does
    both, and keeps the warnings this drops).
    """
    store = store if store is not None else open_store(results)
    return _open(store, _Binder(store, str(results)).bind())


def lock_down(con: duckdb.DuckDBPyConnection, results: str | Path | None = None) -> None:
    """Forbid every file system access and any later change of the configuration (``results``: unused)."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


# -- the allow-list -----------------------------------------------------------------------------------

def _kind(st: Any) -> str:
    return str(st.type).rsplit(".", 1)[-1]


def _explained(query: str) -> str:
    """The statement an EXPLAIN explains; QueryError for EXPLAIN ANALYZE (it runs the statement)."""
    starts = [pos for pos, _kind_ in duckdb.tokenize(query)]
    tokens = [(pos, query[pos:end].strip().upper()) for (pos, kind), end in
              zip(duckdb.tokenize(query), [*starts[1:], len(query)], strict=True)
              if kind != duckdb.token_type.comment]
    i, depth = 1, 0  # tokens[0] is EXPLAIN
    while i < len(tokens):
        word = tokens[i][1]
        if word in _ANALYZE:
            raise QueryError("refused EXPLAIN ANALYZE: it runs its statement; `swapcheck query` is read-only "
                             "(use EXPLAIN); nothing was changed")
        if word == "(":
            depth += 1
        elif word == ")":
            depth -= 1
        elif depth == 0:
            return query[tokens[i][0]:]
        i += 1
    return ""


def check_read_only(sql: str) -> list[Any]:
    """The statements of ``sql``; QueryError unless every one of them only reads (DuckDB's own parse)."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse the query: {exc}") from None
    if not statements:
        raise QueryError("the query is empty")
    for st in statements:
        kind = _kind(st)
        if kind == "EXPLAIN":
            inner = check_read_only(_explained(st.query))
            kind = "EXPLAIN " + _kind(inner[0]) if len(inner) != 1 or _kind(inner[0]) != "SELECT" else kind
        if kind not in READ_ONLY_STATEMENTS:
            raise QueryError(
                f"refused a {kind} statement: `swapcheck query` is read-only "
                "(allowed: SELECT, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN of a SELECT); nothing was changed"
            )
    return list(statements)


#: A word of SQL text (what may name a table).
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Catalog:
    """One read-only DuckDB connection over a results tree; the views are created once.

    ``warnings`` lists every file the views do not read (damaged, missing, foreign, orphaned), one
    line each naming the file and ``swapcheck sweep verify``; commands print them before the output.
    """

    #: Incremented for every DuckDB connection opened over a results tree (tests count it).
    connections_opened: ClassVar[int] = 0

    def __init__(self, results: str | Path) -> None:
        self.results = str(results)
        self.store = open_store(results)
        self._con: duckdb.DuckDBPyConnection | None = None
        self._spill: str | None = None
        self._spill = _spill_dir()  # a bad $SWAPCHECK_SPILL_DIR is refused before anything is read
        try:
            bound = _Binder(self.store, self.results).bind()
        except BaseException:
            self.close()
            raise
        self.warnings: list[str] = bound.warnings
        self._sweeps_read = sorted(bound.sweeps)
        self._specs = sorted({w.sweep for w in bound.files['sweeps']})
        self.hashed = bound.hashed
        #: Whether the result views scan with DuckDB's own reader (:func:`native_scan`); then the
        #: (path, identity when verified) of each file they read, checked after every query.
        self.native = bound.native
        self._watched: list[tuple[str, str, list[Any] | None]] = (
            [(w.table, w.rel, bound.identity.get(w.rel)) for w in _native_files(bound)]
            + [("units", w.rel, bound.identity.get(w.rel)) for w, _ in bound.checkpoints] if self.native else [])
        try:  # the views are made when a query first names their table (a report reads a few of 16)
            con = _open(self.store, bound, self._spill, tables=())
        except BaseException:
            self.close()
            raise
        try:
            lock_down(con)
        except BaseException:
            con.close()
            self.close()
            raise
        self._con = con
        self._bound: _Bound | None = bound
        self._viewed: set[str] = {"units"}

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The connection, with every table's view."""
        return self._with_views(TABLES)

    def _with_views(self, tables: Iterable[str]) -> duckdb.DuckDBPyConnection:
        """The connection, once each of ``tables`` has its view (made now if not yet)."""
        if self._con is None:
            raise QueryError(f"the catalog over {self.results} is closed")
        missing = [t for t in tables if t not in self._viewed]
        if missing:
            assert self._bound is not None
            try:
                _create_views(self._con, self.store, self._bound, missing)
            except duckdb.Error as exc:
                raise self._failed("", exc) from None
            self._viewed.update(missing)
            if len(self._viewed) == len(TABLES):
                self._bound = None  # every view made: what they needed is theirs now
        return self._con

    def _views_of(self, sql: str) -> duckdb.DuckDBPyConnection:
        """The connection with the view of every table whose name appears in ``sql`` as a word (a
        name in a comment or a string makes a view too: harmless)."""
        words = set(_WORD.findall(sql))
        return self._with_views(t for t in TABLES if t in words)

    def _failed(self, what: str, exc: duckdb.Error) -> QueryError:
        text = f"{what}{type(exc).__name__}: {exc}"
        if any(w in str(exc).lower() for w in ("arrow", "parquet", "checksum", "ioerror")):
            text += f" (a result file may be damaged: run `swapcheck sweep verify --results {self.results}`)"
        return QueryError(text)

    def named(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """Rows of ``storage/queries/<name>.sql`` with its ``$param`` placeholders bound from ``params``."""
        rows: list[dict[str, Any]] = self.named_arrow(name, **params).to_pylist()
        return rows

    def named_arrow(self, name: str, *, limits: QueryLimits | None = None, **params: Any) -> pa.Table:
        """``named`` as an Arrow table. Binds exactly the placeholders the SQL uses (missing ones as NULL)."""
        sql = named_query(name)
        bound = {p: params.get(p) for p in sql_params(sql)}
        con = self._views_of(sql)
        try:
            return self._unchanged(guarded(con, lambda: _arrow(con.sql(sql, params=bound or None)),
                                           limits or QueryLimits.from_env()))
        except duckdb.Error as exc:
            raise self._failed(f"named query {name!r} failed: ", exc) from None

    def query(self, sql: str, *, limits: QueryLimits | None = None, **params: Any) -> pa.Table:
        """Run user ``sql`` (SELECT / EXPLAIN / DESCRIBE / SHOW / SUMMARIZE only); return an Arrow table.

        Several statements run in order and the last one's result is returned. ``params`` bind the
        ``$name`` placeholders of the last statement (values, never SQL text). ``limits`` (default
        :meth:`QueryLimits.from_env`): the query's wall time and the process's memory (:func:`guarded`),
        and the result's size: a larger result fails naming the limit, before any of it is converted.
        """
        statements = check_read_only(sql)
        con = self.con
        limits = limits or QueryLimits.from_env()

        def work() -> pa.Table:
            for st in statements[:-1]:
                con.execute(st.query).fetchall()
            last = statements[-1].query
            bound = {p: params.get(p) for p in sql_params(last)}
            return _arrow(con.sql(last, params=bound or None), limits.result_mb)

        try:
            return self._unchanged(guarded(con, work, limits))
        except duckdb.Error as exc:
            raise self._failed("", exc) from None

    def _unchanged(self, result: _T) -> _T:
        """``result``, once every file a native view made so far may have read is checked to still be
        the one verified at open (its identity: size, mtime, ctime, inode, device; one ``stat`` each).
        DuckDB opens files by path, so a file replaced or rewritten after the open would otherwise be read
        unverified: then the result is discarded and the query fails, naming the file. (A table without
        a view yet was read by no query.)"""
        import os

        changed = []
        for table, rel, identity in self._watched:
            if table not in self._viewed:
                continue
            try:
                now = local_identity(os.stat(f"{self.store.base}/{rel}"))
            except OSError:
                now = None
            if now != identity:
                changed.append(rel)
        if changed:
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            raise QueryError(f"{changed[0]}{more}: changed after this command verified it (rewritten, replaced or "
                             f"deleted while being read); the result was discarded: run the command again, and "
                             f"`swapcheck sweep verify --results {self.results}`")
        return result

    def sweeps(self) -> list[str]:
        """The sweeps that have a spec record (one the catalog reads)."""
        return list(self._specs)

    def all_sweeps(self) -> list[str]:
        """Every sweep the catalog reads, sorted: those with a spec record and those with a ledger (a
        tree written without spec records). A sweep that only stray partitions name (no ledger, no
        spec record: nothing of it is read, a warning names it) is none of them."""
        return list(self._sweeps_read)

    def close(self) -> None:
        if self._con is not None:
            try:
                self._con.close()
            except duckdb.Error:  # still busy with a query a signal interrupted (guarded): the process exits
                pass
            self._con = None
            self._bound = None
        if self._spill is not None:
            import shutil

            shutil.rmtree(self._spill, ignore_errors=True)
            self._spill = None

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def open_catalog(results: str | Path) -> Catalog:
    """The read-only catalog over ``--results`` (a local directory or a pyarrow filesystem URI)."""
    return Catalog(results)


def read_only_query(results: str | Path, sql: str) -> pa.Table:
    """Run ``sql`` (SELECT / EXPLAIN / DESCRIBE / SHOW only) over the results; return an Arrow table."""
    check_read_only(sql)  # refuse before listing the results tree
    with Catalog(results) as cat:
        return cat.query(sql)


#: ``-- include: <fragment>``: a line of a named query replaced by ``storage/queries/<fragment>.sql``
#: (CTEs that several queries share; a fragment's name starts with ``_`` and it is no query of its own).
_INCLUDE = re.compile(r"^-- include: (_[a-z0-9_]+)$", re.MULTILINE)


def named_query(name: str) -> str:
    """The SQL text of ``storage/queries/<name>.sql``, its ``-- include:`` lines replaced by the fragments."""
    try:
        sql = resources.files("storage.queries").joinpath(f"{name}.sql").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError(f"no named query {name!r}; available: {', '.join(query_names())}") from None
    return _INCLUDE.sub(lambda m: _fragment(m.group(1)).rstrip("\n"), sql)


def _fragment(name: str) -> str:
    """A fragment's text, its own ``-- include:`` lines replaced too (a fragment may build on another)."""
    sql = resources.files("storage.queries").joinpath(f"{name}.sql").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: _fragment(m.group(1)).rstrip("\n"), sql)


def query_names() -> list[str]:
    """The named queries (fragments, ``_*.sql``, are not queries)."""
    return sorted(p.name[:-4] for p in resources.files("storage.queries").iterdir()
                  if p.name.endswith(".sql") and not p.name.startswith("_"))


def run_named(results: str | Path, name: str, **params: Any) -> pa.Table:
    """Run a named query with ``$param`` placeholders bound from ``params`` (one-shot)."""
    with Catalog(results) as cat:
        return cat.named_arrow(name, **params)


def named_queries() -> list[dict[str, Any]]:
    """The named queries a user can run (``swapcheck query --list``): name, the first line of its header
    comment, and its ``$parameters``. Templates with ``{{fragments}}`` (``prediction_*``) are left out:
    they run only as ``reports.predictions`` fills them."""
    out = []
    for name in query_names():
        sql = named_query(name)
        if "{{" in sql:
            continue
        first = next((line.lstrip("- ").strip() for line in sql.splitlines() if line.startswith("--")), "")
        out.append({"name": name, "summary": first, "parameters": sql_params(sql)})
    return out


# -- swapcheck db: the same views for the `duckdb` shell ------------------------------------------------

def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@functools.cache
def _types_connection() -> duckdb.DuckDBPyConnection:
    """One in-memory connection that only converts Arrow schemas (no file, no data), kept for the process:
    opening one per schema cost 0.5-1 s a command."""
    return duckdb.connect(":memory:", config={"enable_external_access": False})


#: The DuckDB type of each Arrow type the declared schemas use (``_duck_type``; tests/test_catalog.py
#: checks every declared column against DuckDB's own reading of the Arrow type).
_DUCK_TYPES = {pa.bool_(): "BOOLEAN", pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER",
               pa.int64(): "BIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR",
               pa.large_string(): "VARCHAR", pa.binary(): "BLOB", pa.timestamp("us", tz="UTC"): "TIMESTAMP WITH TIME ZONE",
               pa.timestamp("us"): "TIMESTAMP"}


def _duck_type(t: pa.DataType) -> str | None:
    """DuckDB's type for the Arrow type ``t`` (lists and structs of the types above), or None."""
    if t in _DUCK_TYPES:
        return _DUCK_TYPES[t]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _duck_type(t.value_type)
        return None if inner is None else f"{inner}[]"
    if pa.types.is_struct(t):
        fields = [(f.name, _duck_type(f.type)) for f in t]
        if any(ft is None for _n, ft in fields):
            return None
        return "STRUCT(" + ", ".join(f"{_ident(n)} {ft}" for n, ft in fields) + ")"
    return None


@functools.lru_cache(maxsize=64)
def _duck_types(schema: pa.Schema) -> tuple[tuple[str, str], ...]:
    """(column, DuckDB type) of each column of ``schema``, in order (as DuckDB reads the Arrow type): from
    :data:`_DUCK_TYPES` where every column's type is there (no connection: about 25 ms of every
    command), else from DuckDB's conversion."""
    known = [(f.name, _duck_type(f.type)) for f in schema]
    if all(t is not None for _n, t in known):
        return tuple((n, t) for n, t in known if t is not None)
    rel = _types_connection().from_arrow(pa.Table.from_pylist([], schema=schema))
    return tuple((str(c), str(t)) for c, t in zip(rel.columns, rel.types, strict=True))


def _typed_empty(schema: pa.Schema) -> str:
    """``SELECT CAST(NULL AS <type>) AS <col>, ... WHERE false``: the declared columns, in order, no rows."""
    cols = [f"CAST(NULL AS {t}) AS {_ident(c)}" for c, t in _duck_types(schema)]
    return f"SELECT {', '.join(cols)} WHERE false"


def _scan(paths: list[str], wants: list[_Want], schema: pa.Schema) -> str:
    """The declared columns plus ``sweep`` over exactly ``wants``: one ``read_parquet`` per sweep, the
    partition directories never parsed (``hive_partitioning = false``: no ``table`` column)."""
    parts = [_typed_empty(schema.append(pa.field("sweep", pa.string())))]
    by_sweep: dict[str, list[str]] = {}
    for path, w in zip(paths, wants, strict=True):
        by_sweep.setdefault(w.sweep, []).append(path)
    for sweep, files in sorted(by_sweep.items()):
        listed = ", ".join(_literal(f) for f in files)
        parts.append(f"SELECT *, {_literal(sweep)} AS sweep FROM read_parquet([{listed}], "
                     "hive_partitioning = false, union_by_name = true)")
    return "\nUNION ALL BY NAME\n".join(parts)


def _rows(columns: list[str], rows: list[tuple[str | None, ...]]) -> str:
    """A literal VALUES table of VARCHAR columns (``WHERE false`` when empty)."""
    if not rows:
        return "SELECT " + ", ".join(f"CAST(NULL AS VARCHAR) AS {_ident(c)}" for c in columns) + " WHERE false"
    values = ", ".join("(" + ", ".join("NULL" if v is None else _literal(v) for v in r) + ")" for r in rows)
    return f"SELECT * FROM (VALUES {values}) AS v({', '.join(_ident(c) for c in columns)})"


def view_definitions(results: str | Path) -> tuple[str, list[str]]:
    """``CREATE VIEW`` statements that open the catalog's tables in any DuckDB (``swapcheck db``), and
    the catalog's warnings.

    Each view reads exactly the files a :class:`Catalog` binds now (same checks, same skips: the
    lists are fixed, so export again after new results), with the declared columns and ``sweep``;
    ``units`` adds ``damaged`` and ``damage`` as the catalog's view does.
    """
    store = open_store(results)
    bound = _Binder(store, str(results)).bind()
    text = str(results)
    prefix = text.split("://", 1)[0] + "://" if "://" in text and not store.local else ""

    def paths(wants: list[_Want]) -> list[str]:
        return [f"{prefix}{store.base}/{w.rel}" for w in wants]

    statements = []
    for table in TABLES:
        wants = [w for w in bound.files[table] if w.rel not in bound.stale]
        body = _scan(paths(wants), wants, TABLES[table])
        for w in bound.files[table]:
            if w.rel in bound.stale:  # a compacted file with superseded units: its other units' rows
                body += "\nUNION ALL BY NAME\n" + _stale_part(paths([w])[0], w, bound)
        if table == "units":
            for w, superseded in bound.checkpoints:  # the checkpoint's rows that no tail file supersedes
                skip = (f" WHERE unit_id NOT IN (SELECT unit_id FROM ({_rows(['unit_id'], [(u,) for u in superseded])}))"
                        if superseded else "")
                body += (f"\nUNION ALL BY NAME\nSELECT * EXCLUDE (replaced_sha256, replaced_writer), {_literal(w.sweep)} "
                         f"AS sweep FROM read_parquet({_literal(paths([w])[0])}, hive_partitioning = false){skip}")
            damage = _rows(["sweep", "unit_id", "damage"], [(k[0], k[1], v) for k, v in bound.damaged.items()])
            lost = _rows(["unit_id", "status", "sweep", "damage"],
                         [(r["unit_id"], "damaged", r["sweep"], bound.damaged.get((r["sweep"], r["unit_id"])))
                          for r in bound.lost])
            body = (f"SELECT l.*, d.unit_id IS NOT NULL AS damaged, d.damage FROM (\n{body}\n) AS l\n"
                    f"LEFT JOIN ({damage}) AS d ON l.sweep = d.sweep AND l.unit_id = d.unit_id\n"
                    f"UNION ALL BY NAME SELECT *, true AS damaged FROM ({lost})")
        statements.append(f"CREATE OR REPLACE VIEW {_ident(table)} AS\n{body};")
    header = (f"-- swapcheck db: one view per table of {text}, over the files the catalog binds now\n"
              "-- (export again after new results). Open with: duckdb -init views.sql, or .read views.sql\n")
    return header + "\n\n".join(statements) + "\n", bound.warnings


def write_views(results: str | Path, out: str | Path) -> tuple[list[str], list[str]]:
    """Write :func:`view_definitions` to ``out``: SQL text for ``*.sql``, else a DuckDB database file
    holding the views (replaced whole). Returns the view names and the catalog's warnings."""
    import os

    sql, warnings = view_definitions(results)
    target = Path(out)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    if target.suffix.lower() == ".sql":
        tmp.write_text(sql, encoding="utf-8")
    else:
        tmp.unlink(missing_ok=True)
        con = duckdb.connect(str(tmp))
        try:
            con.execute(sql)
        finally:
            con.close()
    tmp.replace(target)
    return list(TABLES), warnings
