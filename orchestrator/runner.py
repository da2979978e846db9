"""The runner: Ray tasks of one unit (or a batch of tiny units), finished units skipped, every outcome
a ledger row.

Units that turn out to take a few milliseconds are packed into tasks of several units that share one
durable commit (:class:`Batches`, ``SWAPCHECK_BATCH_TARGET_S``); long units and cold restarts run one
per task. A unit counts as done only when its task has returned.

Faults and what they cost:

* a task raising -> the worker records a ``failed`` ledger row with the error; the sweep goes on;
* a worker process dying -> Ray re-runs the task (``max_retries``), a batch whole (its units' files
  are named by unit id and replaced: no duplicate rows); after the last retry a batch's units run
  again one per task, and the driver records a ``failed`` row naming the crash for a unit whose own
  task was lost;
* the driver dying -> units already committed stay committed; relaunching the same spec skips them
  and recomputes only units without an ``ok`` ledger row. Result files are named by unit id and
  replaced atomically, so a unit finished twice still has one set of rows;
* SIGINT / SIGTERM, or the results store failing -> the launch stops: it submits nothing more,
  cancels the units in flight (:func:`_stop_in_flight`), waits a bounded time for them to settle and
  then counts the committed units from the ledger, so the count it prints is the count that stays.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cluster import IN_PROCESS
from orchestrator.errors import (
    InfrastructureError,
    Interrupted,
    StorageFailure,
    Terminated,
    UsageError,
)
from orchestrator.plan import (
    CodeChange,
    Plan,
    Profile,
    Unit,
    code_changes,
    kind_code_changes,
    make_plan,
)
from orchestrator.spec import LoadedSpec
from storage.errors import StorageError
from storage.store import ResultStore, open_store, utcnow
from tasks.kinds import kind_ref

if TYPE_CHECKING:
    from storage.verify import Repaired

log = logging.getLogger("swapcheck.runner")

#: Units in flight at once; Ray queues the rest cheaply, this only bounds driver memory.
WINDOW = 2000
#: How long one Ray task of tiny units should take (``SWAPCHECK_BATCH_TARGET_S``; 0: one unit per
#: task, no batching). A Ray task and a durable commit cost about a millisecond each: units much
#: shorter than that are packed into tasks of several units that share one commit (:class:`Batches`).
BATCH_TARGET_S = 0.1
#: Units whose own observed median run time (``duration_s``: the kind's work, not the commit) is at
#: least this long are never batched. The commit is left out on purpose: a slow durable commit (an
#: fsync that takes 30 ms on a busy disk) is exactly the cost batching shares, so it must not make a
#: class of tiny units look long.
SHORT_UNIT_S = 0.02
#: The most units in one task.
MAX_BATCH = 64
#: The most units a launch's scheduler pulls from the plan's stream ahead of the tasks that take them.
QUEUED = 2 * WINDOW
#: How many of a batch class's recent unit durations its batch size is chosen from (their median),
#: and how many it needs before its units are batched.
OBSERVED = 32
OBSERVED_MIN = 3
#: Tasks of one batch class in flight at once, per slot the cluster has for it.
TASKS_PER_SLOT = 4
#: Longest wait on Ray in one call (seconds): how soon the wait loop sees a signal.
POLL_S = 0.25
#: How long a stopping launch waits for the units it cancelled to settle (``SWAPCHECK_STOP_GRACE_S``);
#: a second SIGINT/SIGTERM stops the wait at once. Below Kubernetes' default 30 s grace period.
STOP_GRACE_S = 20.0


class StopSignals:
    """SIGINT and SIGTERM during a launch: a clean stop (a message, no stack dump, exit 130 / 143).

    Outside Ray's calls a signal raises :class:`Terminated` at once, as Ctrl-C raises
    ``KeyboardInterrupt`` (every write is atomic, so stopping anywhere costs no more than a SIGKILL).
    While the runner waits on Ray (:meth:`deferred`) the handler only records the signal: an
    exception raised in a handler that runs inside ``ray.wait`` comes out of Ray's C++ core as a
    ``SystemError`` stack dump. The wait loop wakes every :data:`POLL_S` and stops when it sees one.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self.deferring = False
        self._previous: dict[int, Any] = {}
        #: What a stop says was committed (set once the launch knows its plan and store).
        self.committed: Callable[[], str] = lambda: "nothing was run"
        #: The launch lock once held: an object store's lease can be lost (``lease.lost``), and a
        #: launch that can no longer renew it stops before another launcher could take over.
        self.lease: Any = None

    def lease_lost(self) -> StorageFailure | None:
        """The lease is lost (not renewed for half its life): the stop's cause, else None."""
        from storage.lock import LeaseLost

        if self.lease is None or not self.lease.lost.is_set():
            return None
        try:
            self.lease.check()
        except LeaseLost as exc:
            return StorageFailure(str(exc))
        return None

    @property
    def signum(self) -> int | None:
        """The first signal received, or None."""
        return self.received[0] if self.received else None

    def install(self) -> None:
        """Take SIGINT and SIGTERM (main thread only); again after ``ray.init``, which replaces the
        SIGTERM handler with its own. :meth:`restore` puts back what each replaced last."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(signum)
            if current != self._handle:
                self._previous[signum] = current
                signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if not self.deferring:
            raise Terminated(signum)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals are only recorded inside: the caller looks at :attr:`signum` often."""
        before, self.deferring = self.deferring, True
        try:
            yield
        finally:
            self.deferring = before


def stop_grace_s() -> float:
    """:data:`STOP_GRACE_S`, or ``SWAPCHECK_STOP_GRACE_S`` (0 to 3600 s; read when a launch starts, so
    a bad value is refused before anything is written)."""
    from swapcheck_common.env import seconds_from_env

    return seconds_from_env("SWAPCHECK_STOP_GRACE_S", STOP_GRACE_S, 0.0, 3600.0, UsageError)


def batch_target_s() -> float:
    """:data:`BATCH_TARGET_S`, or ``SWAPCHECK_BATCH_TARGET_S`` (0 to 60 s, 0 = no batching; read when a
    launch starts, so a bad value is refused before anything is written)."""
    from swapcheck_common.env import seconds_from_env

    return seconds_from_env("SWAPCHECK_BATCH_TARGET_S", BATCH_TARGET_S, 0.0, 60.0, UsageError)


class Batches:
    """The pending units of one stage, handed out as Ray tasks of one or more units.

    Units of one *batch class* (the same kind and resources, ``fresh_process`` false) may share a
    task, which runs them one after another and commits them with one durable commit
    (:func:`orchestrator.worker.execute_units`). The size of a class's tasks is chosen from what its
    finished units cost their worker (``cost_s`` of their summaries: run, serialization and a share
    of the commit; ``duration_s`` where a summary has none): one unit per task until
    :data:`OBSERVED_MIN` units of the class have finished; then, while the median of the last
    :data:`OBSERVED` run times (``duration_s``: the unit's own work, without the commit) is below
    :data:`SHORT_UNIT_S`, as many units as cost about ``target_s`` (at most :data:`MAX_BATCH`, and
    no more than spreads the class's remaining units over its slots, so the tail of a stage keeps
    every slot busy). Until it is known to be long, a
    class has at most :data:`TASKS_PER_SLOT` tasks per slot in flight: enough to keep every slot
    busy, few enough that the choice is made again as costs come in (the window is never filled
    with single-unit tasks before anything is known). A class known to be long, cold restarts
    (``fresh_process``) and every unit when ``target_s`` is 0 run one per task with no limit but the
    window, as before batching existed.

    A batch whose worker was lost after Ray's retries is not recorded as lost: its units are handed
    out again one per task (:meth:`retry_alone`), so one unit that kills its worker costs only itself.
    """

    def __init__(self, pending: Iterable[Unit], target_s: float, capacity: dict[str, float],
                 counts: Mapping[Any, int] | None = None) -> None:
        """``pending`` may be a stream (a launch's: :meth:`Pending.units`), then ``counts`` gives each
        batch class's number of units (:meth:`Pending.counts`); at most :data:`QUEUED` units are
        pulled from it ahead of the tasks that take them, so the driver never holds the whole plan."""
        self.target_s = target_s
        self.capacity = capacity
        self.queues: dict[Any, deque[Unit]] = {}
        if counts is None:
            pending = list(pending)
            counts = {}
            for unit in pending:
                counts[self.key(unit)] = counts.get(self.key(unit), 0) + 1
        #: per class: the units not yet taken into a task, queued here or still in the stream
        self.left: dict[Any, int] = dict(counts)
        self._stream: Iterator[Unit] | None = iter(pending)
        self._unpulled = sum(counts.values())
        self.alone: deque[Unit] = deque()
        self.observed: dict[Any, deque[float]] = {}  # what recent units cost (commit share included)
        self.ran: dict[Any, deque[float]] = {}  # their own run times (no commit): long or short
        self.tasks: dict[Any, int] = {}  # tasks in flight per batch class
        self.n_tasks = 0

    def key(self, unit: Unit | Profile) -> Any:
        """The unit's batch class: units of one class may share a task (None: never batched)."""
        if unit.fresh_process or self.target_s <= 0:
            return None
        res = unit.resources
        return (unit.kind, res.num_cpus, res.num_gpus, res.memory_gb)

    def __len__(self) -> int:
        return len(self.alone) + sum(len(q) for q in self.queues.values()) + self._unpulled

    def _fill(self) -> None:
        """Pull units from the stream until :data:`QUEUED` are queued (or it ends)."""
        queued = sum(len(q) for q in self.queues.values())
        while self._stream is not None and queued < QUEUED:
            unit = next(self._stream, None)
            if unit is None:
                self._stream, self._unpulled = None, 0
                break
            self.queues.setdefault(self.key(unit), deque()).append(unit)
            self._unpulled -= 1
            queued += 1

    def slots(self, unit: Unit) -> int:
        """How many units like ``unit`` the cluster runs at once (at least 1)."""
        res = unit.resources
        fits = [self.capacity.get(name, 0.0) / want for name, want in (("CPU", res.num_cpus), ("GPU", res.num_gpus)) if want > 0]
        return max(1, int(min(fits)) if fits else int(self.capacity.get("CPU", 1.0)))

    def median(self, key: Any) -> float | None:
        """The median cost of the class's recent units, None until :data:`OBSERVED_MIN` are known."""
        seen = self.observed.get(key)
        return None if seen is None or len(seen) < OBSERVED_MIN else statistics.median(seen)

    def long(self, key: Any) -> bool | None:
        """Whether the class's recent units ran :data:`SHORT_UNIT_S` or longer (their median run time,
        or their median cost where no run time was reported); None until :data:`OBSERVED_MIN` are known."""
        seen = self.ran.get(key)
        if seen is None or len(seen) < OBSERVED_MIN:
            median = self.median(key)
            return None if median is None else median >= SHORT_UNIT_S
        return statistics.median(seen) >= SHORT_UNIT_S

    def size(self, key: Any, unit: Unit) -> int:
        """How many units of class ``key`` the next task takes."""
        median = self.median(key) if key is not None else None
        if median is None or self.long(key):  # unknown (None only with median None) or long
            return 1
        spread = -(-self.left.get(key, len(self.queues[key])) // self.slots(unit))  # the rest over every slot
        return max(1, min(MAX_BATCH, int(self.target_s / max(median, 1e-4)), spread))

    def capped(self, key: Any, unit: Unit) -> bool:
        """The class has as many tasks in flight as it may now: while it is unknown or batched. A
        class known to be long is not capped (all its units queued, as before batching: an
        autoscaler sees the whole demand)."""
        if key is None or self.long(key):
            return False
        return self.tasks.get(key, 0) >= TASKS_PER_SLOT * self.slots(unit)

    def take(self, room: int) -> list[Unit]:
        """The units of the next task (at most ``room``), or [] when none may be submitted now."""
        if self.alone:
            unit = self.alone.popleft()
            self._started(self.key(unit))
            return [unit]
        self._fill()
        for key, queue in self.queues.items():
            if not queue:
                continue
            if self.capped(key, queue[0]):
                continue  # enough of this class in flight: wait for one to finish
            n = min(self.size(key, queue[0]), room, len(queue))
            self._started(key)
            self.left[key] = self.left.get(key, n) - n
            return [queue.popleft() for _ in range(n)]
        return []

    def _started(self, key: Any) -> None:
        self.n_tasks += 1
        if key is not None:
            self.tasks[key] = self.tasks.get(key, 0) + 1

    def settled(self, units: list[Unit], durations: list[float | None] | None = None,
                runs: list[float | None] | None = None) -> None:
        """A task of ``units`` settled; ``durations`` are what the units cost their worker (commit share
        included) and ``runs`` their own run times (None: it reported none)."""
        key = self.key(units[0])
        if key is None:
            return
        self.tasks[key] = max(0, self.tasks.get(key, 0) - 1)
        for seen, values in ((self.observed, durations), (self.ran, runs)):
            found = [float(d) for d in values or [] if d is not None]
            if found:
                seen.setdefault(key, deque(maxlen=OBSERVED)).extend(found)

    def retry_alone(self, units: list[Unit]) -> None:
        """Hand ``units`` out again, one per task, before anything else."""
        self.alone.extend(units)


class Pending:
    """The units of a plan still to run, one byte each (by index), with their counts per
    :class:`~orchestrator.plan.Profile`: all the launch's checks and its scheduler need to know before
    the units run. :meth:`units` streams the units themselves (a new walk of the plan's expansion), so
    a launch's driver never holds the whole grid."""

    def __init__(self, plan: Plan, done: set[str] | Any) -> None:
        """``done``: the finished units' ids, a set or an Arrow string array (``LedgerRead.done_ids``:
        matched against the plan's ids in Arrow, no Python loop over the units)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        self.plan = plan
        if isinstance(done, set):
            done = pa.array(sorted(done), pa.string())
        if plan.sorted_ids is not None and len(done) == len(plan) and done.equals(plan.sorted_ids):
            # A finished sweep whose checkpoint (sorted by unit id) holds exactly the plan's units, done:
            # one comparison of two sorted arrays instead of a hash of each id.
            pending = np.zeros(len(plan), dtype=bool)
        else:
            pending = np.logical_not(pc.is_in(plan.id_array, value_set=done).to_numpy(zero_copy_only=False))
        self.mask = bytearray(pending.astype(np.uint8).tobytes())
        which = np.frombuffer(plan.which, dtype=np.uint32) if len(plan) else np.zeros(0, np.uint32)
        counts = np.bincount(which[pending], minlength=len(plan.profiles))
        self.by_profile: dict[int, int] = {int(k): int(counts[k]) for k in np.flatnonzero(counts)}
        self.n = int(pending.sum())

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def profiles(self) -> list[tuple[Profile, int]]:
        """Each profile of a pending unit, and how many pending units have it."""
        return [(self.plan.profiles[k], n) for k, n in self.by_profile.items()]

    def count(self, pred: Callable[[Profile], bool]) -> int:
        return sum(n for p, n in self.profiles() if pred(p))

    def stages(self) -> list[int]:
        return sorted({p.stage for p, _n in self.profiles()})

    def counts(self, key: Callable[[Profile], Any], stage: int | None = None) -> dict[Any, int]:
        """``key(profile)`` -> how many pending units (of ``stage``) it covers."""
        out: dict[Any, int] = {}
        for p, n in self.profiles():
            if stage is None or p.stage == stage:
                out[key(p)] = out.get(key(p), 0) + n
        return out

    def units(self, stage: int | None = None, pred: Callable[[Profile], bool] | None = None) -> Iterator[Unit]:
        """The pending units (of ``stage``, whose profile ``pred`` accepts), streamed in plan order."""
        mask, plan = self.mask, self.plan
        if stage is None and pred is None:
            return plan.iter_units(lambda i: bool(mask[i]))
        return plan.iter_units(lambda i: bool(mask[i]) and (stage is None or plan.profile(i).stage == stage)
                               and (pred is None or pred(plan.profile(i))))

    def first(self, pred: Callable[[Profile], bool]) -> Unit | None:
        """The first pending unit whose profile ``pred`` accepts (for a message), or None."""
        if not self.count(pred):
            return None
        return next(self.units(pred=pred), None)


@dataclass
class LaunchSummary:
    sweep: str
    results: str
    n_units: int
    n_skipped: int
    n_ok: int = 0
    n_failed: int = 0
    seconds: float = 0.0
    #: Units cancelled by a stop that had not settled within the grace period (they may still commit).
    n_unsettled: int = 0
    #: Ray tasks submitted (a task runs one unit, or a batch of tiny units: :class:`Batches`).
    n_tasks: int = 0
    #: An in-process launch reached its ``budget_s`` before every unit had run (status ``budget``).
    budget_reached: bool = False
    failures: list[tuple[str, str]] = field(default_factory=list)


def check_sweep_identity(store: ResultStore, plan: Plan, repair: bool = False) -> CodeRerun | None:
    """A sweep partition holds the results of one plan: refuse a different plan under the same name.

    The spec record says which plan. A damaged one stops the launch (exit 2, naming it) unless
    ``repair``: then, as when the record is missing, the ledger's units must all be units of this plan
    (``--repair`` sets the damaged record aside and :func:`write_sweep_record` writes it anew from
    this spec).

    The one difference that is not refused: the same spec whose users' kernels' code changed (issue
    #36, an edited kernel had been served its old results). That returns a :class:`CodeRerun`, and
    :func:`retire_changed_code`, under the launch's lock, sets the old code's units aside so that the
    new code's units run in their place. A retirement cut short (its journal remains) is finished
    under the lock first; until then this check has nothing to say."""
    from storage.errors import DamagedRecord

    if store.size(_retire_journal(plan.sweep)) is not None:
        return CodeRerun([], [], resume=True)
    records = store.records(plan.sweep)
    try:
        claimed = records.claimed_ids()
    except DamagedRecord as exc:
        if not repair:
            raise UsageError(
                f"the spec record of sweep {plan.sweep!r}: {exc}. Run `swapcheck sweep verify --results "
                f"{store.root} --sweep {plan.sweep}`, then relaunch with --repair: it sets the record aside and "
                "writes it anew from this spec when the sweep's ledger holds only units of this spec. "
                "Nothing was written.") from None
        claimed = None
    if claimed is not None and claimed.equals(plan.id_array):
        return None  # the plan the record claims, in the same order: compared in Arrow, no set per unit
    new = set(plan.ids)
    if claimed is None:
        ledger = store.read_ledger(plan.sweep)
        foreign = sorted(set(ledger.rows) - new)
        if foreign:
            raise UsageError(
                f"sweep {plan.sweep!r} in {store.root} has no readable spec record, and its ledger holds "
                f"{len(foreign)} unit(s) this spec does not plan (e.g. {foreign[0]}): it was planned from a "
                "different spec. Give this spec a new `name`, or use another --results directory. Nothing was written.")
        return None
    old = set(claimed.to_pylist())
    if old != new:
        ledger = store.read_ledger(plan.sweep)
        added = new - old
        planned = list(plan.iter_units(lambda i: plan.ids[i] in added))
        recorded = {u: r for u, r in ledger.rows.items() if u in old - new}
        changes = code_changes(planned, recorded, only=True) or kind_code_changes(planned, recorded)
        if changes:
            return CodeRerun(changes, sorted(old - new))
        raise UsageError(
            f"sweep {plan.sweep!r} in {store.root} was planned from a different spec "
            f"({len(new - old)} new and {len(old - new)} missing units; recorded spec sha256 "
            f"{(records.spec_record() or {}).get('spec_sha256', '?')[:12]}). Give the changed spec a new `name`, or use another "
            "--results directory. Nothing was written."
        )
    return None


@dataclass(frozen=True)
class CodeRerun:
    """The same spec, users' kernels' code changed: ``retired`` (the old plan's units that the code
    change replaced) are set aside and their new units run. ``resume``: a retirement cut short."""

    changes: list[CodeChange]
    retired: list[str]
    resume: bool = False


def _retire_journal(sweep: str) -> str:
    return f"_state/code-changed/sweep={sweep}.json"


def retire_changed_code(store: ResultStore, sweep: str, rerun: CodeRerun) -> tuple[str, list[CodeChange], int]:
    """Set aside the old code's units of ``sweep`` and its spec record (call it under the launch's lock).

    A journal (``_state/code-changed/sweep=<s>.json``: where to, which units) is written first, then
    each unit's ledger file and result files move under ``_quarantine/<time>-<id>-code-changed/``
    (:func:`storage.verify.repair`: ledger file first, so a unit is never "ok" with its files gone),
    then the spec record; the journal goes last. A launch killed midway finds the journal and finishes
    the same moves (each is skipped once done), so nothing of the old code stays beside the new code's
    results and nothing is deleted. Returns (the folder, the changes, how many units were set aside);
    :func:`write_sweep_record` then records this plan."""
    from storage import verify

    rel = _retire_journal(sweep)
    if rerun.resume:
        journal = json.loads(store.read_bytes(rel))
        changes = [CodeChange(c["kernel"], tuple(c["before"]), tuple(c["now"]), int(c["units"]))
                   for c in journal["changes"]]
    else:
        changes = rerun.changes
        journal = {"aside": verify.quarantine_folder("code-changed"), "units": rerun.retired,
                   "changes": [{"kernel": c.kernel, "before": list(c.before), "now": list(c.now), "units": c.units}
                               for c in changes]}
        store.write_text(rel, json.dumps(journal, indent=1))
    aside = str(journal["aside"])
    verify.repair(store, sweep, journal["units"], strays=False, aside=aside)
    record = f"table=sweeps/sweep={sweep}/spec.parquet"
    if store.size(record) is not None:
        store.move(record, f"{aside}/{record}")
    store.remove(rel)
    return aside, changes, len(journal["units"])


def check_gpu_resources(pending: Pending, conn: Any, have_gpus: float | None = None) -> None:
    """Units that need a GPU must not wait forever on a cluster that has none: refuse clearly."""
    def wants_gpu(p: Profile) -> bool:
        return p.resources.num_gpus > 0

    n_gpu = pending.count(wants_gpu)
    if not n_gpu:
        return
    if have_gpus is None:
        import ray

        have_gpus = ray.cluster_resources().get("GPU", 0)
    have = have_gpus
    if have > 0:
        return
    if conn.source == IN_PROCESS:
        missing = ["no CUDA device in this process (an in-process launch runs its units here)"]
    else:
        missing = ["no GPU in the Ray cluster" + (" (the embedded local instance on this machine)" if conn.embedded else f" at {conn.address}")]
    import importlib.util

    for package in sorted({n for p, _n in pending.profiles() if wants_gpu(p) for n in p.needs}):
        if importlib.util.find_spec(package) is None:
            missing.append(f"{ {'vllm': 'vLLM'}.get(package, package)} is not installed here (pip install 'swapcheck[{package}]' on the GPU nodes)")
    example = pending.first(wants_gpu)
    raise InfrastructureError(
        f"{n_gpu} unit(s) request a GPU (e.g. {example.describe() if example else '?'}), but: {'; '.join(missing)}. "
        "Run on a GPU cluster with --address, or drop the GPU experiments. Nothing was run.")


def write_sweep_record(store: ResultStore, spec: LoadedSpec, plan: Plan) -> None:
    """The sweep's claim: its spec record, which plan the partition holds (written once)."""
    records = store.records(plan.sweep)
    if records.spec_table() is not None:  # claimed already (and the plan's ids need not become a list)
        return
    records.claim(spec_sha256=spec.sha256, question=spec.sweep.question, spec_path=spec.path,
                  spec_toml=spec.text, unit_ids=list(plan.ids))


def check_placeable(pending: Pending, nodes: list[dict[str, float]], conn: Any) -> None:
    """Refuse units that no node of the cluster can ever hold (they would wait forever)."""
    if not nodes:
        return
    biggest = {key: max(n.get(key, 0.0) for n in nodes) for key in ("CPU", "GPU", "memory")}
    where = "the embedded instance (set --num-cpus)" if conn.embedded else f"the cluster at {conn.address}"
    for profile, _n in pending.profiles():  # in plan order of their first pending unit
        res = profile.resources
        asks = [("num_cpus", res.num_cpus, biggest["CPU"], "CPUs")]
        if res.memory_gb and biggest["memory"] > 0:
            asks.append(("memory_gb", res.memory_gb, biggest["memory"] / 2**30, "GiB of memory"))
        for name, value, most, unit in asks:
            if value > most:
                u = pending.first(profile.__eq__)
                assert u is not None
                raise InfrastructureError(
                    f"unit {u.id} ({u.describe()}) requests {name}={value:g}, but the largest node of {where} "
                    f"has {most:g} {unit}: it could never run. Lower experiments.{u.experiment}.resources.{name}. "
                    "Nothing was run.")


def launch(
    spec: LoadedSpec,
    results: str | Path,
    address: str | None = None,
    num_cpus: int | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    *,
    repair: bool = False,
    connect_timeout_s: float = 30.0,
    in_process: bool = False,
    budget_s: float | None = None,
) -> LaunchSummary:
    """Plan ``spec``, skip finished units, run the rest on Ray, and return what happened.

    ``in_process`` runs the units one after another in this process instead, with no Ray (a machine
    that has none, such as a borrowed GPU: infra/gpu-kit); the same records, ledger and commits as a
    Ray worker's (:func:`orchestrator.worker.execute_units`). Units that need a process of their own
    (cold restarts) are refused there. ``budget_s`` (in-process only) starts no unit after that many
    seconds; the launch then ends with status ``budget`` and a relaunch runs the rest.

    Everything that can refuse (the spec, its predictions, GPUs, units no node can hold, another
    launcher holding the sweep's lock) refuses before the first write. ``repair`` first moves the
    units that ``swapcheck sweep verify`` finds damaged aside, so exactly those are recomputed, and
    rebuilds a damaged or lost ledger file from its unit's result files where they carry its row.
    A damaged ledger file never stops a launch: its unit counts as not done and is recomputed.
    ``on_event(kind, info)`` receives ``cluster`` (``Connection.info()``: which Ray, what it has;
    before anything is submitted), ``message`` (``level`` warning or note, one ``line``: a damaged
    ledger file, rebuilt ledger rows), ``start`` (total, pending, skipped, and ``plan``: "expanded", or
    "cache" when orchestrator.plan_cache reused it), ``unit`` (one finished unit's
    summary) and ``end`` events, for progress display.
    """
    stop = StopSignals()
    stop.install()  # from the start: a signal before Ray is up stops as cleanly as one after
    try:
        return _launch(spec, results, address, num_cpus, on_event, repair, connect_timeout_s, stop,
                       in_process=in_process, budget_s=budget_s)
    except Terminated as term:
        raise _interrupted(term.signum, stop.committed()) from None
    finally:
        stop.restore()


def _launch(spec: LoadedSpec, results: str | Path, address: str | None, num_cpus: int | None,
            on_event: Callable[[str, dict[str, Any]], None] | None, repair: bool, connect_timeout_s: float,
            stop: StopSignals, *, in_process: bool = False, budget_s: float | None = None) -> LaunchSummary:
    from orchestrator import prereg
    from orchestrator.cluster import Connection, connect, in_process_connection, resolve_address
    from storage.lock import LaunchLock
    from storage.store import ensure_cache_key

    emit = on_event or (lambda kind, info: None)
    stop_grace_s()  # a bad SWAPCHECK_STOP_GRACE_S is refused now, not when a stop needs it
    batch_target_s()  # and a bad SWAPCHECK_BATCH_TARGET_S
    checkpoint_from, compact_from, compact_rows = _storage_settings()  # and bad SWAPCHECK_CHECKPOINT_FROM, _COMPACT_*
    plan = make_plan(spec)
    store = open_store(results)
    stop.committed = lambda: committed_line(store, plan)
    rerun = check_sweep_identity(store, plan, repair)
    # Predictions are validated and hashed before anything is written or run.
    prereg_rows = prereg.plan_registration(store, plan.sweep, spec.prereg_paths)
    first_read = store.read_ledger(plan.sweep)
    pending = Pending(plan, first_read.done_ids())
    if in_process:
        if address is not None:
            raise UsageError("an in-process launch runs no Ray: it takes no --address")
        n_fresh = pending.count(lambda p: p.fresh_process)
        if n_fresh:
            fresh = pending.first(lambda p: p.fresh_process)
            raise UsageError(f"{n_fresh} unit(s) need a process of their own (cold restarts, e.g. {fresh.describe() if fresh else '?'}): "
                             "an in-process launch cannot give them one; launch this spec on Ray. Nothing was run.")
        if budget_s is not None and budget_s <= 0:
            raise UsageError(f"budget_s must be positive, got {budget_s}")

        def connect(address: str | None = None, num_cpus: int | None = None, timeout_s: float = 0.0) -> Connection:
            return in_process_connection()
    elif budget_s is not None:
        raise UsageError("budget_s applies to in-process launches only")
    if (in_process or resolve_address(address)[0] is None) and pending.count(lambda p: p.resources.num_gpus > 0):
        import torch

        if not torch.cuda.is_available():
            # The embedded instance (or this process) has this machine's GPUs only: refuse before writing anything.
            here = in_process_connection() if in_process else Connection(True, "embedded", 0)
            check_gpu_resources(pending, here, have_gpus=0)
    conn = None
    try:
        if pending or repair or rerun is not None:
            conn = _connect(connect, address, num_cpus, connect_timeout_s, stop)
            emit("cluster", conn.info())
            if not in_process:
                check_gpu_resources(pending, conn)
                check_placeable(pending, _node_resources(), conn)

        t0 = time.perf_counter()
        lock = LaunchLock(store.fs, store.base, plan.sweep, local=store.local, where=str(results))
        lock.acquire()
        stop.lease = lock
        try:
            # Under the lock: nobody else can change the partition between these checks and the run.
            rerun = check_sweep_identity(store, plan, repair)
            fixed = None
            try:
                while rerun is not None:  # a retirement cut short first, then (if any) this one
                    aside, changes, n = retire_changed_code(store, plan.sweep, rerun)
                    for change in changes:
                        emit("message", {"level": "warning", "line": f"{change.line()}: rerun"})
                    emit("message", {"level": "note", "line": (
                        f"the old code's {n} unit(s) and the old spec record are set aside under {aside} "
                        "(nothing deleted); the units the code change did not touch are kept")})
                    rerun = check_sweep_identity(store, plan, repair)
                store.records(plan.sweep).mark_lost_launches(
                    lambda line: emit("message", {"level": "warning", "line": line}))
                if pending or repair:  # a relaunch with nothing to run need not walk the whole tree
                    store.remove_stale_temporaries()
                if repair:
                    from storage import verify

                    problems = verify.verify(store, plan.sweep)
                    fixed = verify.repair(store, plan.sweep, verify.damaged_units(store, plan.sweep, problems),
                                          problems=problems)
                    if fixed.compare:
                        emit("message", {"level": "note", "line": (
                            f"{len(fixed.compare)} unit(s) had result files but no intact ledger entry (e.g. "
                            f"{fixed.compare[0]}): nothing vouches for those files, so they are set aside under "
                            f"{fixed.quarantine}, the units recomputed and compared with them")})
                write_sweep_record(store, spec, plan)
                ensure_cache_key(store)  # the secret that signs readers' verified-files caches
                prereg.write_registrations(store, plan.sweep, prereg_rows)
                ledger = store.read_ledger(plan.sweep)  # damaged entries: not done, recomputed, named
                for line in ledger.warnings(str(results)):
                    emit("message", {"level": "warning", "line": line})
                state = ledger.state()
                done = None if state is not None and state == first_read.state() else ledger.done_ids()  # the same files as before the lock: the same units done
            except OSError as exc:
                raise StorageFailure(f"cannot write under {store.root}: {exc}. Nothing was run.") from None
            if done is not None:
                pending = Pending(plan, done)
            summary = LaunchSummary(plan.sweep, str(results), len(plan), len(plan) - len(pending))
            emit("start", {"total": len(plan), "pending": len(pending), "skipped": summary.n_skipped,
                           "plan": plan.source})
            if pending:
                if conn is None:
                    conn = _connect(connect, address, num_cpus, connect_timeout_s, stop)
                    emit("cluster", conn.info())
                deadline = None if budget_s is None else time.monotonic() + budget_s
                _run_launch(spec, plan, store, pending, str(results), summary, emit, conn, stop, deadline)
            if fixed is not None and fixed.compare:
                _compare_recomputed(store, plan.sweep, fixed, emit)
            if stop.signum is None:
                _checkpoint(store, plan.sweep, checkpoint_from, emit)
                if summary.n_skipped + summary.n_ok == summary.n_units and not summary.budget_reached:
                    _compact(store, plan.sweep, compact_from, compact_rows, emit)  # the sweep is finished
            summary.seconds = time.perf_counter() - t0
        finally:
            lock.release()
    except Terminated as term:  # before any unit was submitted (or after the last one settled)
        raise _interrupted(term.signum, committed_line(store, plan)) from None
    if stop.signum is not None:  # a signal after the last unit settled: still an interrupted launch
        raise _interrupted(stop.signum, committed_line(store, plan))
    emit("end", {"summary": summary})
    return summary


def _storage_settings() -> tuple[int, int, int]:
    """``SWAPCHECK_CHECKPOINT_FROM``, ``SWAPCHECK_COMPACT_FROM`` and ``SWAPCHECK_COMPACT_ROWS``; a bad
    value is refused (exit 2) before anything is written."""
    from storage.records import checkpoint_from, compact_settings

    try:
        return (checkpoint_from(), *compact_settings())
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _compact(store: ResultStore, sweep: str, min_files: int, target_rows: int,
             emit: Callable[[str, dict[str, Any]], None]) -> None:
    """When a launch leaves its sweep finished (every unit ok), under its lock: merge each result
    partition of at least ``min_files`` unit files into files of ``target_rows`` rows (storage.records,
    ``SweepRecords.compact``). The results are committed already: a compaction that cannot be written
    is a warning, and what it left is finished by the next launch."""
    if min_files <= 0:
        return
    from storage.schemas import UNMANAGED_TABLES

    tables = [t for t in store.table_partitions() if t not in UNMANAGED_TABLES]
    try:
        written = store.records(sweep).compact(tables, min_files, target_rows)
    except (OSError, StorageError) as exc:
        emit("message", {"level": "warning", "line": (
            f"the result files of sweep {sweep} could not be compacted ({exc}); they stay as they are and the next "
            "launch of the finished sweep tries again")})
        return
    if written:
        log.info("compacted sweep %s into %d file(s)", sweep, len(written))


def _checkpoint(store: ResultStore, sweep: str, min_tail: int, emit: Callable[[str, dict[str, Any]], None]) -> None:
    """At the end of a launch, under its lock: merge the ledger's tail into a checkpoint when it holds
    at least ``min_tail`` files (storage.records). The units are committed already: a checkpoint that
    cannot be written is a warning, and the tail stays as it is (nothing is removed before the
    checkpoint is durable)."""
    if min_tail <= 0:
        return
    try:
        cp = store.records(sweep).checkpoint(min_tail)
    except (OSError, StorageError) as exc:
        emit("message", {"level": "warning", "line": (
            f"the ledger checkpoint of sweep {sweep} could not be written ({exc}); the ledger files stay as they "
            "are and the next launch tries again")})
        return
    if cp is not None:
        log.info("ledger checkpoint %s written", cp.rel)


def _compare_recomputed(store: ResultStore, sweep: str, fixed: Repaired, emit: Callable[[str, dict[str, Any]], None]) -> None:
    """After ``--repair`` recomputed units whose result files had lost their ledger entry: whether those
    files held what the units compute (storage.verify.compare_with_aside), one line each way."""
    from storage import verify

    done = store.done_units(sweep)
    same: list[str] = []
    differ: list[tuple[str, str]] = []
    missing: list[str] = []
    for unit in fixed.compare:
        if unit not in done:
            missing.append(unit)
            continue
        why = verify.compare_with_aside(store, sweep, unit, fixed.quarantine)
        if why is None:
            same.append(unit)
        else:
            differ.append((unit, why))
    if same:
        emit("message", {"level": "note", "line": (
            f"{len(same)} recomputed unit(s) equal the result files set aside (every column but "
            f"{', '.join(sorted(verify.RUN_VARYING))}): those files were as committed")})
    for unit, why in differ:
        emit("message", {"level": "warning", "line": (
            f"unit {unit}: the result files that had lost their ledger entry DIFFER from its recomputation "
            f"({why}): they were damaged or forged; the recomputed rows stand, the old files are kept under "
            f"{fixed.quarantine}")})
    if missing:
        emit("message", {"level": "warning", "line": (
            f"{len(missing)} unit(s) set aside for comparison did not finish (e.g. {missing[0]}): not compared; "
            f"their old files are under {fixed.quarantine}")})


def _connect(connect: Callable[..., Any], address: str | None, num_cpus: int | None, timeout_s: float,
             stop: StopSignals) -> Any:
    """``cluster.connect``, then this launch's handlers again (``ray.init`` replaced the SIGTERM one)."""
    try:
        conn = connect(address, num_cpus, timeout_s=timeout_s)
    except SystemExit as exc:
        if exc.code == signal.SIGTERM:  # Ray's own handler, while ray.init ran: sys.exit(SIGTERM)
            raise Terminated(signal.SIGTERM) from None
        raise
    stop.install()
    return conn


def _interrupted(signum: int, committed: str) -> Interrupted:
    return Interrupted(f"{signal.Signals(signum).name}: stopped; {committed}. Relaunch the same spec to resume.",
                       128 + int(signum))


def committed_line(store: ResultStore, plan: Plan, counted: int | None = None) -> str:
    """``N of M units are committed`` (``, F of them failed``), counted from the ledger itself.

    Called once the units in flight have settled, so the count is the one a relaunch will find.
    When the ledger cannot be read, ``counted`` (this launch's own count) is given and says so.
    """
    import pyarrow as pa

    ids = set(plan.ids)
    try:
        committed, failed = store.records(plan.sweep).committed(ids)
    except (OSError, StorageError, pa.ArrowException) as exc:
        if counted is None:
            return f"the committed units could not be counted (the ledger cannot be read: {type(exc).__name__})"
        return (f"{counted} of {len(ids)} units are committed (this launch's count: the ledger cannot be read: "
                f"{type(exc).__name__})")
    return f"{committed} of {len(ids)} units are committed" + (f", {failed} of them failed" if failed else "")


def _node_resources() -> list[dict[str, float]]:
    import ray

    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def _run_launch(spec: LoadedSpec, plan: Plan, store: ResultStore, pending: Pending, results: str,
                summary: LaunchSummary, emit: Callable[[str, dict[str, Any]], None], conn: Any,
                stop: StopSignals, deadline: float | None = None) -> None:
    """Run the pending units with a ``launches`` row that says how the launch ended."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator import provenance

    # What needs torch in the driver (CUDA, the GPUs: 1-3 s of import on a CPU-only driver) is collected
    # while the units run: the "running" row has the rest, the final row all of it.
    facts = ThreadPoolExecutor(1, thread_name_prefix="swapcheck-provenance")
    full = facts.submit(provenance.collect)
    facts.shutdown(wait=False)
    launch_id = f"{utcnow().strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    launch_row: dict[str, Any] = {
        "launch_id": launch_id,
        "spec_sha256": spec.sha256,
        "started_at": utcnow(),
        "finished_at": None,
        "address": conn.address,
        "embedded": conn.embedded,
        "n_units": len(plan),
        "n_skipped": summary.n_skipped,
        "n_ok": 0,
        "n_failed": 0,
        "status": "running",
        "provenance_json": json.dumps(provenance.collect(torch_facts=False), sort_keys=True),
    }
    if os.environ.get("SWAPCHECK_VERBOSITY") != "verbose":
        # Every unit's outcome is fetched (stopping included), so Ray's "Unhandled error" dumps could
        # only repeat, with a worker's whole traceback each, what the one error line says; -v keeps them.
        os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    status = "interrupted"
    with stop.deferred():
        store.records(plan.sweep).record_launch(launch_row)
        try:
            # Stage by stage: teacher-forced units read the sequences that generate units wrote.
            for stage in pending.stages():
                if stop.signum is not None:
                    break
                if conn.source == IN_PROCESS:
                    _run_units_here(spec, plan, pending, stage, results, summary, emit, stop, deadline)
                else:
                    _run_units(spec, plan, pending, stage, results, summary, emit, stop)
                if summary.budget_reached:
                    break
            if summary.budget_reached and stop.signum is None:
                status = "budget"
            elif stop.signum is None:
                status = "finished"
        except StorageFailure as exc:
            status = "storage-failure"
            counted = summary.n_skipped + summary.n_ok + summary.n_failed
            raise StorageFailure(f"{exc}; {committed_line(store, plan, counted)}{_unsettled(summary)}: fix the "
                                 "storage, then relaunch the same spec to resume") from None
        finally:
            launch_row.update(finished_at=utcnow(), n_ok=summary.n_ok, n_failed=summary.n_failed, status=status)
            try:
                launch_row["provenance_json"] = json.dumps(full.result(timeout=60), sort_keys=True)
            except Exception:  # noqa: BLE001 - the facts without torch's stay (collect never raises itself)
                pass
            try:
                store.records(plan.sweep).record_launch(launch_row)
            except OSError:
                pass
    if stop.signum is not None:
        counted = summary.n_skipped + summary.n_ok + summary.n_failed
        raise _interrupted(stop.signum, committed_line(store, plan, counted) + _unsettled(summary))


def _unsettled(summary: LaunchSummary) -> str:
    if not summary.n_unsettled:
        return ""
    return (f" ({summary.n_unsettled} more had not stopped after {stop_grace_s():g} s and may still commit: "
            "a relaunch skips what did)")


def _run_units(spec: LoadedSpec, plan: Plan, pending: Pending, stage: int, results: str, summary: LaunchSummary,
               emit: Callable[[str, dict[str, Any]], None], stop: StopSignals) -> None:
    import ray

    from orchestrator.worker import run_units_task

    remote = ray.remote(run_units_task)
    # A cold restart: the worker process exits after this one task, so no engine, cache or kernel
    # choice survives into the next unit (``max_calls`` is fixed per remote function).
    remote_fresh = ray.remote(max_calls=1)(run_units_task)
    in_flight: dict[Any, list[Unit]] = {}
    refs = {p.kind: kind_ref(p.kind) for p, _n in pending.profiles() if p.stage == stage}
    target = batch_target_s()
    classes = Batches([], target, {})  # the batch class of a profile, as of a unit
    batches = Batches(pending.units(stage), target, dict(ray.cluster_resources()),
                      counts=pending.counts(classes.key, stage))

    def submit(units: list[Unit]) -> None:
        unit = units[0]
        res = unit.resources
        opts: dict[str, Any] = {
            "num_cpus": res.num_cpus,
            "num_gpus": res.num_gpus,
            "max_retries": spec.sweep.max_retries,
            "retry_exceptions": False,
            "name": f"{unit.kind}:{unit.id}" + (f"+{len(units) - 1}" if len(units) > 1 else ""),
        }
        if res.memory_gb:
            opts["memory"] = int(res.memory_gb * 2**30)
        payloads = [{**u.to_payload(), "description": u.describe(), "kind_ref": refs[u.kind]} for u in units]
        fn = remote_fresh if unit.fresh_process else remote
        ref = fn.options(**opts).remote(payloads, results, plan.sweep, spec.sha256)
        in_flight[ref] = units

    try:
        _drain(batches, in_flight, submit, spec, plan, results, summary, emit, stop)
    finally:
        summary.n_tasks += batches.n_tasks


def _run_units_here(spec: LoadedSpec, plan: Plan, pending: Pending, stage: int, results: str, summary: LaunchSummary,
                    emit: Callable[[str, dict[str, Any]], None], stop: StopSignals, deadline: float | None) -> None:
    """The units one after another in this process (``launch(in_process=True)``): each committed as a
    Ray worker commits it (:func:`orchestrator.worker.execute_units`), counted when its commit returns.

    A signal is recorded while a unit runs (the launch is inside :meth:`StopSignals.deferred`): that
    unit finishes and commits, and no other starts. Past ``deadline`` no unit starts either."""
    from orchestrator.worker import execute_units

    refs = {p.kind: kind_ref(p.kind) for p, _n in pending.profiles() if p.stage == stage}
    for unit in pending.units(stage):
        fault = stop.lease_lost()
        if fault is not None:
            raise fault
        if stop.signum is not None:
            return
        if deadline is not None and time.monotonic() >= deadline:
            summary.budget_reached = True
            return
        payload = {**unit.to_payload(), "description": unit.describe(), "kind_ref": refs[unit.kind]}
        try:
            outcome = execute_units([payload], results, plan.sweep, spec.sha256)[0]
        except (OSError, StorageError) as exc:
            cause = getattr(exc, "cause", None) or exc
            first = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
            raise StorageFailure(f"unit {unit.id} could not commit its results: {first}") from None
        if outcome["status"] == "ok":
            summary.n_ok += 1
        else:
            summary.n_failed += 1
            summary.failures.append((unit.id, (outcome.get("error") or "").splitlines()[0]))
        emit("unit", {"unit": unit, "result": outcome, "batch": 1})


def _outcomes(refs: list[Any]) -> list[tuple[Any, Any, BaseException | None]]:
    """``(ref, value, error)`` of finished refs: one ``ray.get`` for all, one by one if any failed."""
    import ray

    try:
        return [(ref, value, None) for ref, value in zip(refs, ray.get(refs), strict=True)]
    except ray.exceptions.RayError:
        pass
    out: list[tuple[Any, Any, BaseException | None]] = []
    for ref in refs:
        try:
            out.append((ref, ray.get(ref), None))
        except ray.exceptions.RayError as exc:
            out.append((ref, None, exc))
    return out


def _ready(in_flight: Mapping[Any, object], stop: StopSignals, timeout: float = POLL_S) -> list[Any]:
    """The refs in flight that have finished, waiting at most ``timeout`` for the first."""
    import ray

    try:
        ready, rest = ray.wait(list(in_flight), num_returns=1, timeout=timeout)
        # Then every other finished one with it: each wait looks at every ref in flight, so one
        # wait per finished unit would cost O(window) per unit.
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
    except (SystemError, Terminated, KeyboardInterrupt):
        # A handler that raised inside Ray's wait (only a foreign one can: ours records while the
        # runner waits) surfaces as SystemError from Ray's core, or as itself from Ray's Python;
        # while stopping it is the stop, not a fault.
        if stop.signum is None:
            raise
        return []
    return ready


def _which(units: list[Unit]) -> str:
    """``unit <id>``, and for a batch how many it was one of (messages)."""
    return f"unit {units[0].id}" + (f" (one of a batch of {len(units)})" if len(units) > 1 else "")


def _drain(batches: Batches, in_flight: dict[Any, list[Unit]], submit: Callable[[list[Unit]], None],
           spec: LoadedSpec, plan: Plan, results: str, summary: LaunchSummary,
           emit: Callable[[str, dict[str, Any]], None], stop: StopSignals) -> None:
    """Submit and collect tasks until every unit is done, a signal arrives or the store fails.

    A unit counts (``summary``, its ``unit`` event) only when its task has returned: for a batch,
    once the batch's one durable commit is done. Stopping (a signal, a storage failure) submits
    nothing more and cancels what is in flight (:func:`_stop_in_flight`): the count printed
    afterwards is then the count that stays.
    """
    import ray

    from orchestrator.worker import record_lost_unit

    fault: StorageFailure | None = None
    n_in_flight = 0  # units

    def settle(ref: Any, value: Any, exc: BaseException | None, stopping: bool) -> None:
        nonlocal fault, n_in_flight
        units = in_flight.pop(ref)
        n_in_flight -= len(units)
        if exc is not None:
            batches.settled(units)
            cause = getattr(exc, "cause", None)
            if isinstance(cause, OSError | StorageError) or isinstance(exc, OSError):
                log.info("%s could not commit its results:\n%s", _which(units), exc)  # -v: the whole traceback
                if fault is None:
                    first = str(cause or exc).splitlines()[0] if str(cause or exc) else type(exc).__name__
                    fault = StorageFailure(f"{_which(units)} could not commit its results: {first}")
                return
            if stopping or isinstance(exc, ray.exceptions.TaskCancelledError):
                return  # cancelled, or lost while stopping: no ledger row, a relaunch recomputes it
            if len(units) > 1:
                # Not the batch's fault as a whole: each unit runs again alone, and only a unit whose
                # own task is lost gets a failed row.
                log.info("a batch of %d units lost its worker after %d retries; each runs again alone: %s",
                         len(units), spec.sweep.max_retries, str(exc)[:2000])
                batches.retry_alone(units)
                return
            error = f"{type(exc).__name__}: worker lost after {spec.sweep.max_retries} retries: {str(exc)[:2000]}"
            try:
                record_lost_unit(units[0].to_payload(), results, plan.sweep, spec.sha256, error)
            except (OSError, StorageError) as os_exc:
                if fault is None:
                    fault = StorageFailure(f"cannot record unit {units[0].id}: {os_exc}")
                return
            value = [{"unit_id": units[0].id, "status": "failed", "error": error, "rows": 0}]
        else:
            batches.settled(units, [v.get("cost_s", v.get("duration_s")) for v in value],
                            [v.get("duration_s") for v in value])
        for unit, outcome in zip(units, value, strict=True):
            if outcome["status"] == "ok":
                summary.n_ok += 1
            else:
                summary.n_failed += 1
                summary.failures.append((unit.id, (outcome.get("error") or "").splitlines()[0]))
            emit("unit", {"unit": unit, "result": outcome, "batch": len(units)})

    while (batches or in_flight) and fault is None and stop.signum is None:
        fault = stop.lease_lost()  # a lease that cannot be renewed: stop before it can lapse
        if fault is not None:
            break
        while batches and n_in_flight < WINDOW and stop.signum is None:
            units = batches.take(WINDOW - n_in_flight)
            if not units:
                break  # a batch class waits for its first finished unit
            submit(units)
            n_in_flight += len(units)
        for ref, value, exc in _outcomes(_ready(in_flight, stop)):
            settle(ref, value, exc, stopping=False)
    if in_flight:
        why = signal.Signals(stop.signum).name if stop.signum is not None else "the results store failed"
        grace = stop_grace_s()
        if stop.lease is not None and stop.lease.lost.is_set():
            # Between a lost lease (ttl/2 without renewal) and the backstop that exits at 7/8 of its
            # life there are 3/8 ttl: settling must leave time to count and record the stop.
            why, grace = "the launch lease could not be renewed", min(grace, stop.lease.ttl_s / 8)
        summary.n_unsettled = _stop_in_flight(in_flight, lambda ref, value, exc: settle(ref, value, exc, stopping=True),
                                              stop, emit, why, grace)
    if fault is not None:
        raise fault


def _stop_in_flight(in_flight: dict[Any, list[Unit]], settle: Callable[[Any, Any, BaseException | None], None],
                    stop: StopSignals, emit: Callable[[str, dict[str, Any]], None], why: str,
                    grace: float | None = None) -> int:
    """Cancel the units in flight and wait (at most :func:`stop_grace_s`) until each has settled.

    ``ray.cancel(force=False)``: a queued unit never starts; a running one gets ``KeyboardInterrupt``
    and commits nothing (its ledger row would be written last, and a kind's ``KeyboardInterrupt`` is
    never recorded as a failure); a unit already committing may still finish, and is then counted.
    ``force=True`` is not used: killing a worker whose reply is on its way trips a check inside Ray.
    A batch is cancelled as one task: the interrupt ends its process (``ends_process_on_cancel``)
    before its group commit, or inside it, where the units whose ledger files were already renamed
    stay committed and the rest are not. A unit that has not settled in time (a kind stuck in native
    code) is left to Ray: the driver's exit ends its job, and the ledger says whether it committed.
    Returns how many units had not settled.
    """
    import ray

    grace = stop_grace_s() if grace is None else grace
    emit("stopping", {"why": why, "in_flight": sum(len(units) for units in in_flight.values()), "grace_s": grace})
    for ref in list(in_flight):
        try:
            ray.cancel(ref, force=False)
        except ray.exceptions.RayError as cancel_error:  # finished meanwhile, or its owner is gone: waited for below
            log.info("cancelling %s: %s", _which(in_flight[ref]), cancel_error)
    signals = len(stop.received)
    deadline = time.monotonic() + grace
    while in_flight and time.monotonic() < deadline and len(stop.received) <= signals:  # another signal: stop now
        for ref, value, exc in _outcomes(_ready(in_flight, stop)):
            settle(ref, value, exc)
    return sum(len(units) for units in in_flight.values())
