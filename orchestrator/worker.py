"""What runs inside a Ray worker for one unit: run the task, write its files, commit the ledger.

A task raising is the task's failure: it becomes a ledger row with status ``failed`` and the error,
and the sweep goes on. A worker process dying (OOM kill, segfault, node loss) is an infrastructure
fault that Ray retries; each execution attempt leaves a marker, so the ledger counts attempts.
"""

from __future__ import annotations

import importlib
import os
import socket
import time
import traceback
from typing import Any

from orchestrator.plan import canonical_json
from storage.store import open_store, utcnow

#: Task kind -> "module:function" computing a unit's rows: fn(params, context) -> {table: rows}, where
#: context names the results root, sweep and unit id (for units that also write artifacts).
TASK_FUNCTIONS = {
    "kdepth": "tasks.kdepth:run",
    "replay": "tasks.replay:run",
    "generate": "tasks.generate:run",
    "teacher_forced": "tasks.teacher_forced:run",
    "exact_match": "tasks.exact_match:run",
    "bounds": "tasks.bounds:run",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("swapcheck")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - provenance only
        return None


def _task_function(kind: str) -> Any:
    module, attr = TASK_FUNCTIONS[kind].split(":")
    return getattr(importlib.import_module(module), attr)


def execute_unit(payload: dict[str, Any], results: str, sweep: str, spec_sha256: str) -> dict[str, Any]:
    """Run one unit and commit its results; returns a small summary for the driver."""
    import torch

    # One thread per unit keeps runs deterministic and lets Ray pack units onto cores.
    torch.set_num_threads(max(1, int(os.environ.get("SWAPCHECK_THREADS_PER_UNIT", "1"))))
    store = open_store(results)
    unit_id = payload["id"]
    attempt = store.mark_attempt(sweep, unit_id, _node_id())
    started = utcnow()
    t0 = time.perf_counter()
    tables: list[str] = []
    rows = 0
    error = None
    try:
        context = {"results": results, "sweep": sweep, "unit_id": unit_id}
        produced = _task_function(payload["kind"])(payload["params"], context)
        for table, table_rows in produced.items():
            rows += store.write(table, sweep, unit_id, [{"unit_id": unit_id, "experiment": payload["experiment"], **r} for r in table_rows])
            tables.append(table)
        status = "ok"
    except Exception as exc:  # noqa: BLE001 - any task failure is recorded, never lost
        status = "failed"
        error = f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exc(limit=8))
    record = {
        "unit_id": unit_id,
        "kind": payload["kind"],
        "experiment": payload["experiment"],
        "description": payload.get("description", ""),
        "params_json": canonical_json(payload["params"]),
        "status": status,
        "attempts": attempt,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "node_id": _node_id(),
        "started_at": started,
        "finished_at": utcnow(),
        "duration_s": time.perf_counter() - t0,
        "error": error,
        "tables": tables,
        "rows": rows,
        "spec_sha256": spec_sha256,
        "swapcheck_version": _version(),
        "torch_version": torch.__version__,
    }
    store.record_unit(sweep, record)
    return {"unit_id": unit_id, "status": status, "error": error, "rows": rows, "attempts": attempt}


def record_lost_unit(payload: dict[str, Any], results: str, sweep: str, spec_sha256: str, error: str) -> None:
    """Driver side: a unit whose every attempt died (worker crash) still gets a failed ledger row."""
    store = open_store(results)
    now = utcnow()
    store.record_unit(
        sweep,
        {
            "unit_id": payload["id"],
            "kind": payload["kind"],
            "experiment": payload["experiment"],
            "description": payload.get("description", ""),
            "params_json": canonical_json(payload["params"]),
            "status": "failed",
            "attempts": store.attempts(sweep, payload["id"]),
            "host": None,
            "pid": None,
            "node_id": None,
            "started_at": now,
            "finished_at": now,
            "duration_s": 0.0,
            "error": error,
            "tables": [],
            "rows": 0,
            "spec_sha256": spec_sha256,
            "swapcheck_version": _version(),
            "torch_version": None,
        },
    )
