"""What runs inside a Ray worker for one unit or a batch of tiny units: run each, write its files,
commit the ledger.

A Ray task runs one unit (:func:`execute_unit`) or, for units the driver found tiny, a batch of
several (:func:`execute_units`): run one after another, each with its own attempt marker, failure
handling and ledger row, then committed together with one durability barrier (a group commit,
:meth:`storage.store.ResultStore.commit_units`). The driver counts a unit done only when its task
has returned, that is once its batch is durable.

A task raising is the task's failure: it becomes a ledger row with status ``failed`` and the error,
and the sweep goes on. A worker process dying (OOM kill, segfault, node loss) is an infrastructure
fault that Ray retries; each execution attempt leaves a marker, so the ledger counts attempts.

The results tree failing (permission, disk full, object store unreachable) while the worker writes
the attempt marker, a result file, an artifact or the ledger row is neither: it raises
:class:`storage.errors.StorageFault` (naming the path) out of :func:`execute_unit`, writes no
ledger row, and the driver stops the sweep. Result files written before the fault have no ledger
row naming them, so the unit stays pending and a relaunch recomputes it.

A kind returns each table as an Arrow table (columns: the fast path for per-position rows) or as a
list of dicts; the worker adds the constant columns (``unit_id``, ``experiment``) as Arrow columns,
never by copying rows. What does not change from unit to unit in a worker process (the package
version, the Ray node, the results store) is looked up once per process.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import pyarrow as pa

from storage.errors import StorageFault
from storage.store import (
    FileRecord,
    ResultStore,
    StagedUnit,
    hostname,
    open_store,
    to_table,
    utcnow,
)
from tasks.kinds import canonical_json, get_kind

T = TypeVar("T")


@contextmanager
def _storage(path: str) -> Iterator[None]:
    """An error of the file system or object store under ``path`` becomes a :class:`StorageFault`."""
    try:
        yield
    except StorageFault:
        raise
    except OSError as exc:  # PermissionError, ENOSPC, pyarrow's ArrowIOError (an OSError), ...
        raise StorageFault(path, f"{type(exc).__name__}: {exc}") from exc


def _store_call(path: str, fn: Callable[[], T]) -> T:
    with _storage(path):
        return fn()


@dataclass(frozen=True)
class UnitFiles:
    """The :class:`tasks.kinds.UnitContext` a kind gets: its artifacts and earlier stages' rows."""

    store: ResultStore
    sweep: str
    unit_id: str

    def put_artifact(self, name: str, data: bytes) -> str:
        rel = f"_artifacts/sweep={self.sweep}/{self.unit_id}/{name}"
        _store_call(str(self.store.root / rel), lambda: self.store.put_bytes(rel, data))
        return rel

    def read_unit(self, table: str, unit_id: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
        where = str(self.store.partition(table, self.sweep) / f"{unit_id}.parquet")
        return _store_call(where, lambda: self.store.read_unit(table, self.sweep, unit_id, columns))


@functools.cache
def _version() -> str:
    """The installed swapcheck version (looked up once per process: the lookup parses metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("swapcheck")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"


def _node_id() -> str | None:
    try:
        import ray

        if not ray.is_initialized():
            return None
        return _ray_node_id()
    except Exception:  # noqa: BLE001 - provenance only
        return None


@functools.cache
def _ray_node_id() -> str | None:
    """The Ray node this process runs on (a worker process never moves: looked up once)."""
    import ray

    node: str | None = ray.get_runtime_context().get_node_id()
    return node


@functools.cache
def _store(results: str) -> ResultStore:
    """The results store, opened once per worker process (it holds no state but the file system)."""
    return open_store(results)


def unit_table(table: str, rows: pa.Table | list[dict[str, Any]], unit_id: str, experiment: str) -> pa.Table:
    """A kind's rows for ``table`` (without ``unit_id``/``experiment``) as its declared schema, the
    constant columns added as Arrow columns (:func:`storage.store.to_table`)."""
    return to_table(table, rows, {"unit_id": unit_id, "experiment": experiment})


def _torch_version() -> str | None:
    """The version of the torch this worker runs: the imported module's, else the installed
    distribution's (the same string; a unit that never needed torch does not import it for this)."""
    torch = sys.modules.get("torch")
    return str(torch.__version__) if torch is not None else _installed_torch()


@functools.cache
def _installed_torch() -> str | None:
    """The installed torch distribution's version, looked up once per process (a lookup scans the
    installed distributions: about a millisecond, once per unit before this cache)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def _set_threads() -> None:
    """One thread per unit (``SWAPCHECK_THREADS_PER_UNIT``, default 1) keeps runs deterministic and
    lets Ray pack units onto cores. torch is not imported for it (1-3 s in a fresh worker, paid by
    every worker of a kind that never needs it): an imported torch is set now, and the OpenMP and
    MKL variables make a torch that a kind imports later start with that many threads."""
    threads = max(1, int(os.environ.get("SWAPCHECK_THREADS_PER_UNIT", "1")))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def ledger_row(payload: dict[str, Any], spec_sha256: str, *, status: str, attempts: int, started: datetime,
               duration_s: float, error: str | None, tables: list[str], rows: int, ran_here: bool,
               files: list[FileRecord] | None = None) -> dict[str, Any]:
    """The one place a ledger row (table ``units``) is built, for a unit run here or lost on a worker.

    ``files`` are the records :meth:`ResultStore.write` returned for the unit's result files (none
    for a failed unit); ``swapcheck sweep verify`` checks the tree against them.
    """
    torch_version = _torch_version() if ran_here else None
    return {
        "unit_id": payload["id"],
        "kind": payload["kind"],
        "experiment": payload["experiment"],
        "description": payload.get("description", ""),
        "params_json": canonical_json(payload["params"]),
        "status": status,
        "attempts": attempts,
        "host": hostname() if ran_here else None,
        "pid": os.getpid() if ran_here else None,
        "node_id": _node_id() if ran_here else None,
        "started_at": started,
        "finished_at": utcnow(),
        "duration_s": duration_s,
        "error": error,
        "tables": tables,
        "rows": rows,
        "spec_sha256": spec_sha256,
        "swapcheck_version": _version(),
        "torch_version": torch_version,
        "files": [f.as_dict() for f in files or []],
    }


@dataclass
class _Ran:
    """One unit run in this worker, not yet committed: its tables, how its ledger row is built, and
    its summary for the driver (``rows`` and ``duration_s`` set when the row is built)."""

    unit_id: str
    arrow: dict[str, pa.Table]
    row: Callable[[list[FileRecord]], dict[str, Any]]
    summary: dict[str, Any]


def _interrupted(exc: BaseException) -> bool:
    """``exc`` is a cancel (``KeyboardInterrupt``, as ``ray.cancel`` delivers it) that a library
    turned into an exception of its own: raised from it, or naming it (pydantic builds a model's
    validators when a kind's module is imported, and reports an interrupt landing there as a
    ``SchemaError`` whose text ends in ``KeyboardInterrupt:``). Recorded as the unit's failure it
    would blame the unit for the stop."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    # pydantic-core's SchemaError carries no cause, only the interrupt's name at the end of its text.
    return type(exc).__name__ == "SchemaError" and str(exc).rstrip().endswith("KeyboardInterrupt:")


def _run_unit(store: ResultStore, payload: dict[str, Any], sweep: str, spec_sha256: str) -> _Ran:
    """Mark the attempt, run the kind, check its tables: everything of a unit but the commit.

    Raises :class:`StorageFault` when the results tree fails (the attempt marker, an artifact, an
    earlier stage's rows); an exception inside the kind's ``run()`` or rows that do not fit a table's
    schema are the unit's failure (status ``failed``, no tables).
    """
    unit_id = payload["id"]
    attempt = _store_call(str(store.root / "_state" / "attempts" / f"sweep={sweep}" / unit_id),
                          lambda: store.mark_attempt(sweep, unit_id, _node_id()))
    started = utcnow()
    t0 = time.perf_counter()
    arrow: dict[str, pa.Table] = {}
    error = None
    try:
        kind = get_kind(payload["kind"], payload.get("kind_ref"))
        produced: Mapping[str, Any] = kind.run(payload["params"], UnitFiles(store, sweep, unit_id))
        undeclared = sorted(set(produced) - set(kind.tables))
        if undeclared:
            raise RuntimeError(f"kind {kind.name!r} produced tables {undeclared} it does not declare {list(kind.tables)}")
        # Rows that do not fit their schema are the unit's failure: check every table before writing any.
        arrow = {table: unit_table(table, table_rows, unit_id, payload["experiment"])
                 for table, table_rows in produced.items()}
        status = "ok"
    except StorageFault:
        raise
    except Exception as exc:  # noqa: BLE001 - any task failure is recorded, never lost
        if _interrupted(exc):
            raise KeyboardInterrupt from exc  # a cancel, not the unit's failure: no ledger row
        status, arrow = "failed", {}
        error = f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exc(limit=8))
    summary: dict[str, Any] = {"unit_id": unit_id, "status": status, "error": error, "rows": 0, "attempts": attempt,
                               "duration_s": 0.0}

    def row(files: list[FileRecord]) -> dict[str, Any]:
        summary["duration_s"] = duration = time.perf_counter() - t0
        summary["rows"] = sum(f.rows for f in files)
        return ledger_row(payload, spec_sha256, status=status, attempts=attempt, started=started,
                          duration_s=duration, error=error, tables=[f.table for f in files],
                          rows=summary["rows"], ran_here=True, files=files)

    return _Ran(unit_id, arrow, row, summary)


#: A batch commits the units it has staged once they hold this many bytes, and stages the rest for its
#: next commit: a worker never holds more than about this much of a batch's files in memory.
COMMIT_BYTES = 64 * 2**20


def execute_units(payloads: list[dict[str, Any]], results: str, sweep: str, spec_sha256: str) -> list[dict[str, Any]]:
    """Run a batch of units one after another and commit them together; one summary per unit.

    Each unit is run as :func:`execute_unit` runs it (its own attempt marker, its own failure
    handling: a kind that raises is that unit's ``failed`` row, the others are unaffected; its own
    ledger row) and serialized in memory (:meth:`ResultStore.stage_unit`) when it finishes, so its
    ``duration_s`` is its own. Then ONE group commit (:meth:`ResultStore.commit_units`) writes every
    file of the batch, makes them durable with one barrier, renames the result files into place and
    then the ledger files (a batch holding :data:`COMMIT_BYTES` commits early and goes on). A batch
    of one unit commits as :func:`execute_unit` always has (:meth:`ResultStore.commit_unit`). Each
    summary's ``cost_s`` is the task's time over its units: what the driver sizes batches by.

    The driver counts the units done when this returns. Killed before that (SIGKILL, OOM, node
    loss), the batch has published no ledger file, or, dying inside the commit's renames, the ledger
    files of some units, each complete; Ray re-runs the whole batch and the files of a unit, named by
    its id, are replaced, so no row is ever duplicated. Raises :class:`StorageFault` (and publishes
    no ledger file after the fault) when the results tree fails.
    """
    _set_threads()
    store = _store_call(results, lambda: _store(results))
    _import_kinds(payloads)
    _set_threads()  # a kind module that imports torch at import time
    t0 = time.perf_counter()
    if len(payloads) == 1:
        ran = _run_unit(store, payloads[0], sweep, spec_sha256)
        # Result files and then the ledger row (renamed last); a storage fault names its file.
        store.commit_unit(sweep, ran.unit_id, ran.arrow, ran.row)
        summaries = [ran.summary]
    else:
        summaries = _run_batch(store, payloads, sweep, spec_sha256)
    # What each unit cost this worker, its share of the commit included: the driver sizes batches by it.
    cost = (time.perf_counter() - t0) / len(payloads)
    for summary in summaries:
        summary["cost_s"] = cost
    return summaries


def _import_kinds(payloads: list[dict[str, Any]]) -> None:
    """Import the kinds of ``payloads`` before the units are timed: the first unit in a worker
    process would otherwise report a kind module's import as its own cost (and look long to the
    driver). A kind that cannot be loaded is left for its units to fail on (:func:`_run_unit`)."""
    for name, ref in {(p["kind"], p.get("kind_ref")) for p in payloads}:
        try:
            get_kind(name, ref)
        except Exception as exc:  # noqa: BLE001 - the unit records it
            if _interrupted(exc):
                raise KeyboardInterrupt from exc


def _run_batch(store: ResultStore, payloads: list[dict[str, Any]], sweep: str, spec_sha256: str) -> list[dict[str, Any]]:
    """:func:`execute_units` of more than one unit: each staged when it finishes, then group commits."""
    summaries: list[dict[str, Any]] = []
    staged: list[StagedUnit] = []
    held = 0  # bytes staged
    for payload in payloads:
        ran = _run_unit(store, payload, sweep, spec_sha256)
        staged.append(store.stage_unit(sweep, ran.unit_id, ran.arrow, ran.row))
        summaries.append(ran.summary)
        held += staged[-1].nbytes
        if held >= COMMIT_BYTES:
            store.commit_units(staged)
            staged, held = [], 0
    store.commit_units(staged)
    return summaries


def execute_unit(payload: dict[str, Any], results: str, sweep: str, spec_sha256: str) -> dict[str, Any]:
    """Run one unit and commit its results; returns a small summary for the driver.

    Raises :class:`StorageFault` (and writes no ledger row) when the results tree fails; an
    exception inside the kind's ``run()`` or rows that do not fit a table's schema are the unit's
    failure, committed as a ``failed`` ledger row.
    """
    return execute_units([payload], results, sweep, spec_sha256)[0]


def ends_process_on_cancel(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` as a Ray task body whose process ends when the task is cancelled.

    A launch that stops cancels its units in flight (``ray.cancel``: ``KeyboardInterrupt`` in the
    task). That may land anywhere, inside an import included — torch then stays half-initialised in
    this worker, and every later unit the process runs fails with "partially initialized module
    'torch'". So a cancelled task ends its process (the unit committed nothing: its ledger row is
    written last) and Ray starts a clean worker for whatever runs next in this job.
    """
    @functools.wraps(fn)
    def task(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            import sys

            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
    return task


def run_unit_task(payload: dict[str, Any], results: str, sweep: str, spec_sha256: str) -> dict[str, Any]:
    """:func:`execute_unit` as a Ray task (:func:`ends_process_on_cancel`)."""
    return ends_process_on_cancel(execute_unit)(payload, results, sweep, spec_sha256)


def run_units_task(payloads: list[dict[str, Any]], results: str, sweep: str, spec_sha256: str) -> list[dict[str, Any]]:
    """:func:`execute_units` as the runner's Ray task (:func:`ends_process_on_cancel`): a cancel
    that lands mid-batch ends the process before the batch commits anything more."""
    return ends_process_on_cancel(execute_units)(payloads, results, sweep, spec_sha256)


def record_lost_unit(payload: dict[str, Any], results: str, sweep: str, spec_sha256: str, error: str) -> None:
    """Driver side: a unit whose every attempt died (worker crash) still gets a failed ledger row.

    Raises :class:`StorageFault` when the ledger row cannot be written.
    """
    store = _store_call(results, lambda: open_store(results))
    where = str(store.partition("units", sweep) / f"{payload['id']}.parquet")
    with _storage(where):
        store.record_unit(sweep, ledger_row(payload, spec_sha256, status="failed", attempts=store.attempts(sweep, payload["id"]),
                                            started=utcnow(), duration_s=0.0, error=error, tables=[], rows=0,
                                            ran_here=False))
