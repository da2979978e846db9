"""The runner: one Ray task per unit, finished units skipped, every outcome a ledger row.

Faults and what they cost:

* a task raising -> the worker records a ``failed`` ledger row with the error; the sweep goes on;
* a worker process dying -> Ray re-runs the task (``max_retries``); after the last retry the driver
  records a ``failed`` row naming the crash;
* the driver dying -> units already committed stay committed; relaunching the same spec skips them
  and recomputes only units without an ``ok`` ledger row. Result files are named by unit id and
  replaced atomically, so a unit finished twice still has one set of rows.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import InfrastructureError, Interrupted, StorageFailure, UsageError
from orchestrator.plan import Plan, Unit, make_plan
from orchestrator.spec import LoadedSpec
from storage.errors import StorageError
from storage.store import ResultStore, open_store, utcnow
from tasks.kinds import kind_ref

#: Units in flight at once; Ray queues the rest cheaply, this only bounds driver memory.
WINDOW = 2000


class Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler of :func:`stop_on_sigterm`."""


def stop_on_sigterm() -> None:
    """Make SIGTERM stop a launch the way Ctrl-C does (a message, no stack dump, exit 143).

    Called after Ray has started (``ray.init`` installs handlers of its own); main thread only.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


@dataclass
class LaunchSummary:
    sweep: str
    results: str
    n_units: int
    n_skipped: int
    n_ok: int = 0
    n_failed: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)


def check_sweep_identity(store: ResultStore, plan: Plan) -> None:
    """A sweep partition holds the results of one plan: refuse a different plan under the same name."""
    record = store.sweep_record(plan.sweep)
    if record is None:
        return
    old, new = set(record["unit_ids"] or []), {u.id for u in plan.units}
    if old != new:
        raise UsageError(
            f"sweep {plan.sweep!r} in {store.root} was planned from a different spec "
            f"({len(new - old)} new and {len(old - new)} missing units; recorded spec sha256 "
            f"{record['spec_sha256'][:12]}). Give the changed spec a new `name`, or use another "
            "--results directory. Nothing was written."
        )


def check_gpu_resources(pending: list[Unit], conn: Any, have_gpus: float | None = None) -> None:
    """Units that need a GPU must not wait forever on a cluster that has none: refuse clearly."""
    gpu_units = [u for u in pending if u.resources.num_gpus > 0]
    if not gpu_units:
        return
    if have_gpus is None:
        import ray

        have_gpus = ray.cluster_resources().get("GPU", 0)
    have = have_gpus
    if have > 0:
        return
    missing = ["no GPU in the Ray cluster" + (" (the embedded local instance on this machine)" if conn.embedded else f" at {conn.address}")]
    import importlib.util

    for package in sorted({p for u in gpu_units for p in u.needs}):
        if importlib.util.find_spec(package) is None:
            missing.append(f"{ {'vllm': 'vLLM'}.get(package, package)} is not installed here (pip install 'swapcheck[{package}]' on the GPU nodes)")
    raise InfrastructureError(
        f"{len(gpu_units)} unit(s) request a GPU (e.g. {gpu_units[0].describe()}), but: {'; '.join(missing)}. "
        "Run on a GPU cluster with --address, or drop the GPU experiments. Nothing was run.")


def write_sweep_record(store: ResultStore, spec: LoadedSpec, plan: Plan) -> None:
    if store.sweep_record(plan.sweep) is not None:
        return
    store.write(
        "sweeps",
        plan.sweep,
        "spec",
        [
            {
                "spec_sha256": spec.sha256,
                "question": spec.sweep.question,
                "spec_path": spec.path,
                "spec_toml": spec.text,
                "n_units": len(plan.units),
                "unit_ids": [u.id for u in plan.units],
                "created_at": utcnow(),
            }
        ],
    )


def check_placeable(pending: list[Unit], nodes: list[dict[str, float]], conn: Any) -> None:
    """Refuse units that no node of the cluster can ever hold (they would wait forever)."""
    if not nodes:
        return
    biggest = {key: max(n.get(key, 0.0) for n in nodes) for key in ("CPU", "GPU", "memory")}
    where = "the embedded instance (set --num-cpus)" if conn.embedded else f"the cluster at {conn.address}"
    for u in pending:
        res = u.resources
        asks = [("num_cpus", res.num_cpus, biggest["CPU"], "CPUs")]
        if res.memory_gb and biggest["memory"] > 0:
            asks.append(("memory_gb", res.memory_gb, biggest["memory"] / 2**30, "GiB of memory"))
        for name, value, most, unit in asks:
            if value > most:
                raise InfrastructureError(
                    f"unit {u.id} ({u.describe()}) requests {name}={value:g}, but the largest node of {where} "
                    f"has {most:g} {unit}: it could never run. Lower experiments.{u.experiment}.resources.{name}. "
                    "Nothing was run.")


def _mark_lost_launches(store: ResultStore, sweep: str) -> list[str]:
    """Launches recorded as running whose launcher is gone (we hold the lock now): mark them lost."""
    lost = []
    for path in store.parquet_files("launches", sweep):
        for row in store.read_table(path).to_pylist():
            if row.get("status") == "running":
                row.update(status="lost")
                store.write("launches", sweep, str(row["launch_id"]), [row])
                lost.append(str(row["launch_id"]))
    return lost


def launch(
    spec: LoadedSpec,
    results: str | Path,
    address: str | None = None,
    num_cpus: int | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    *,
    repair: bool = False,
    connect_timeout_s: float = 30.0,
) -> LaunchSummary:
    """Plan ``spec``, skip finished units, run the rest on Ray, and return what happened.

    Everything that can refuse (the spec, its predictions, GPUs, units no node can hold, another
    launcher holding the sweep's lock) refuses before the first write. ``repair`` first moves the
    units that ``swapcheck sweep verify`` finds damaged aside, so exactly those are recomputed.
    ``on_event(kind, info)`` receives ``cluster`` (``Connection.info()``: which Ray, what it has;
    before anything is submitted), ``start`` (total, pending), ``unit`` (one finished unit's
    summary) and ``end`` events, for progress display.
    """
    from orchestrator import prereg
    from orchestrator.cluster import Connection, connect, resolve_address
    from storage.lock import LaunchLock

    emit = on_event or (lambda kind, info: None)
    plan = make_plan(spec)
    store = open_store(results)
    check_sweep_identity(store, plan)
    # Predictions are validated and hashed before anything is written or run.
    prereg_rows = prereg.plan_registration(store, plan.sweep, spec.prereg_paths)
    done = store.done_units(plan.sweep)
    pending = [u for u in plan.units if u.id not in done]
    if resolve_address(address)[0] is None and any(u.resources.num_gpus > 0 for u in pending):
        import torch

        if not torch.cuda.is_available():
            # The embedded instance has this machine's GPUs only: refuse before writing anything.
            check_gpu_resources(pending, Connection(True, "embedded", 0), have_gpus=0)
    conn = None
    if pending or repair:
        conn = connect(address, num_cpus, timeout_s=connect_timeout_s)
        emit("cluster", conn.info())
        stop_on_sigterm()
        check_gpu_resources(pending, conn)
        check_placeable(pending, _node_resources(), conn)

    t0 = time.perf_counter()
    lock = LaunchLock(store.fs, store.base, plan.sweep, local=store.local, where=str(results))
    lock.acquire()
    try:
        # Under the lock: nobody else can change the partition between these checks and the run.
        check_sweep_identity(store, plan)
        try:
            _mark_lost_launches(store, plan.sweep)
            store.remove_stale_temporaries()
            if repair:
                from storage import verify

                verify.repair(store, plan.sweep, verify.damaged_units(store, plan.sweep))
            write_sweep_record(store, spec, plan)
            prereg.write_registrations(store, plan.sweep, prereg_rows)
            done = store.done_units(plan.sweep)
        except OSError as exc:
            raise StorageFailure(f"cannot write under {store.root}: {exc}. Nothing was run.") from None
        pending = [u for u in plan.units if u.id not in done]
        summary = LaunchSummary(plan.sweep, str(results), len(plan.units), len(plan.units) - len(pending))
        emit("start", {"total": len(plan.units), "pending": len(pending), "skipped": summary.n_skipped})
        if pending:
            if conn is None:
                conn = connect(address, num_cpus, timeout_s=connect_timeout_s)
                emit("cluster", conn.info())
                stop_on_sigterm()
            _run_launch(spec, plan, store, pending, str(results), summary, emit, conn)
        summary.seconds = time.perf_counter() - t0
    finally:
        lock.release()
    emit("end", {"summary": summary})
    return summary


def _node_resources() -> list[dict[str, float]]:
    import ray

    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def _run_launch(spec: LoadedSpec, plan: Plan, store: ResultStore, pending: list[Unit], results: str,
                summary: LaunchSummary, emit: Callable[[str, dict[str, Any]], None], conn: Any) -> None:
    """Run the pending units with a ``launches`` row that says how the launch ended."""
    from orchestrator import provenance

    launch_id = f"{utcnow().strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    launch_row: dict[str, Any] = {
        "launch_id": launch_id,
        "spec_sha256": spec.sha256,
        "started_at": utcnow(),
        "finished_at": None,
        "address": conn.address,
        "embedded": conn.embedded,
        "n_units": len(plan.units),
        "n_skipped": summary.n_skipped,
        "n_ok": 0,
        "n_failed": 0,
        "status": "running",
        "provenance_json": json.dumps(provenance.collect(), sort_keys=True),
    }
    store.write("launches", plan.sweep, launch_id, [launch_row])
    status = "interrupted"

    def committed() -> int:
        return summary.n_skipped + summary.n_ok + summary.n_failed

    try:
        # Stage by stage: teacher-forced units read the sequences that generate units wrote.
        for stage in sorted({u.stage for u in pending}):
            _run_units(spec, plan, [u for u in pending if u.stage == stage], results, summary, emit)
        status = "finished"
    except StorageFailure as exc:
        status = "storage-failure"
        raise StorageFailure(f"{exc}; {committed()} of {summary.n_units} units are committed: fix the "
                             "storage, then relaunch the same spec to resume") from None
    except (KeyboardInterrupt, Terminated) as exc:
        signum = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
        raise Interrupted(f"{signal.Signals(signum).name}: stopped; {committed()} of {summary.n_units} units are "
                          "committed. Relaunch the same spec to resume.", 128 + int(signum)) from None
    finally:
        launch_row.update(finished_at=utcnow(), n_ok=summary.n_ok, n_failed=summary.n_failed, status=status)
        try:
            store.write("launches", plan.sweep, launch_id, [launch_row])
        except OSError:
            pass


def _run_units(spec: LoadedSpec, plan: Plan, pending: list[Unit], results: str, summary: LaunchSummary,
               emit: Callable[[str, dict[str, Any]], None]) -> None:
    import ray

    from orchestrator.worker import execute_unit

    remote = ray.remote(execute_unit)
    # A cold restart: the worker process exits after this one task, so no engine, cache or kernel
    # choice survives into the next unit (``max_calls`` is fixed per remote function).
    remote_fresh = ray.remote(max_calls=1)(execute_unit)
    queue = deque(pending)
    in_flight: dict[Any, Unit] = {}
    refs = {kind: kind_ref(kind) for kind in {u.kind for u in pending}}

    def submit(unit: Unit) -> None:
        res = unit.resources
        opts: dict[str, Any] = {
            "num_cpus": res.num_cpus,
            "num_gpus": res.num_gpus,
            "max_retries": spec.sweep.max_retries,
            "retry_exceptions": False,
            "name": f"{unit.kind}:{unit.id}",
        }
        if res.memory_gb:
            opts["memory"] = int(res.memory_gb * 2**30)
        payload = {**unit.to_payload(), "description": unit.describe(), "kind_ref": refs[unit.kind]}
        fn = remote_fresh if unit.fresh_process else remote
        ref = fn.options(**opts).remote(payload, results, plan.sweep, spec.sha256)
        in_flight[ref] = unit

    # Stopping (a signal, a storage failure) starts nothing more. Units in flight are not cancelled
    # (force-cancelling a task whose reply is on its way trips a check inside Ray): each finishes and
    # commits atomically, or dies with the driver's Ray session, and a relaunch skips what committed.
    _drain(queue, in_flight, submit, spec, plan, results, summary, emit)


def _drain(queue: deque[Unit], in_flight: dict[Any, Unit], submit: Callable[[Unit], None], spec: LoadedSpec,
           plan: Plan, results: str, summary: LaunchSummary, emit: Callable[[str, dict[str, Any]], None]) -> None:
    import ray

    from orchestrator.worker import record_lost_unit

    while queue or in_flight:
        while queue and len(in_flight) < WINDOW:
            submit(queue.popleft())
        # Wait for one unit, then take every other finished one with it: each wait looks at every
        # ref in flight, so one wait per finished unit would cost O(window) per unit.
        ready, rest = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        try:
            values: list[Any] = ray.get(ready)
        except (ray.exceptions.RayTaskError, ray.exceptions.RayError):
            values = [None] * len(ready)  # one of them failed: get them one by one below
        for ref, value in zip(ready, values, strict=True):
            unit = in_flight.pop(ref)
            try:
                result = value if value is not None else ray.get(ref)
            except (ray.exceptions.RayTaskError, ray.exceptions.RayError) as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, OSError | StorageError) or isinstance(exc, OSError):
                    raise StorageFailure(f"unit {unit.id} could not commit its results: {cause or exc}") from None
                error = f"{type(exc).__name__}: worker lost after {spec.sweep.max_retries} retries: {str(exc)[:2000]}"
                try:
                    record_lost_unit(unit.to_payload(), results, plan.sweep, spec.sha256, error)
                except (OSError, StorageError) as os_exc:
                    raise StorageFailure(f"cannot record unit {unit.id}: {os_exc}") from None
                result = {"unit_id": unit.id, "status": "failed", "error": error, "rows": 0}
            if result["status"] == "ok":
                summary.n_ok += 1
            else:
                summary.n_failed += 1
                summary.failures.append((unit.id, (result.get("error") or "").splitlines()[0]))
            emit("unit", {"unit": unit, "result": result})
