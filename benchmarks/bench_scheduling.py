"""Stage 4 of issue #14: what a sweep costs beyond its units' own work (issue #25: Ray start counted).

On the embedded Ray instance (loopback, token auth, ``--num-cpus`` slots, default 2), with a
benchmark-only kind (``sched_bench``: each unit sleeps ``seconds`` and writes one row; registered
through ``tasks.kinds.register_kind`` by reference, found by Ray workers as ``bench_scheduling:KIND``). Every goal
is judged on the median of the pairs; only ``orchestrator.runner.launch`` and the CLI are used, no
runner internals.

(a) ``slow units``: ``--slow`` units (default 40) of ``--seconds`` (default 1.0).
    * ``sweep wall, Ray start included`` (goal <= 1.15x): ``swapcheck sweep launch`` in a fresh
      process (its imports, the embedded Ray's start, planning, the units, Ray's stop: what a user
      waits for) against a fresh process that starts Ray with the same settings (``address="local"``,
      the same ``num_cpus``, no dashboard, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, ``RAY_AUTH_MODE=token``,
      a fresh 0700 temp dir), runs the same number of tasks that each sleep ``seconds`` (the same
      ``ray.remote`` options, the same in-flight window, ``BARE_WINDOW``), and stops Ray. Timed
      alternately, ``--cli-pairs`` pairs (default 3; --quick and --smoke 1), before the driver starts
      a Ray of its own (nothing else of this script runs meanwhile). The units' durable commits
      (a few ms each) are swapcheck's cost, not the baseline's.
    * ``sweep wall, Ray running`` (informative): the same units through ``launch`` in this process
      with Ray already started, against the ideal parallel time, the sum of the ledger's per-unit
      ``duration_s`` divided by the number of slots (``lpt`` in the notes: the greedy longest-first
      makespan of the same durations).
(b) ``tiny units``: 1,000 and 10,000 units that do nothing (``--quick``: 200 and 1,000) through
    ``launch`` (Ray running) against a bare Ray task loop with the same settings: the same
    ``ray.remote`` options (num_cpus, num_gpus, max_retries, retry_exceptions, a name per task), the
    same payloads, the same number of CPUs and an in-flight window of ``BARE_WINDOW`` tasks, a task
    that returns at once. Ratio of wall times (= of per-unit costs); goal <= 2x with the results on
    disk (``--dir``, default under /tmp) and <= 1.5x with the results on tmpfs (``/dev/shm``, where an
    fsync costs nothing; skipped with a note where /dev/shm does not exist). Informative, with the
    exponent of the cost from the smaller to the larger size (1.0 = linear): planning
    (``make_plan``), the skip-check (``ResultStore.done_units``) and a whole relaunch of the finished
    sweep; ``benchmarks/bench_growth.py`` measures those up to 100,000 units.

Threads: ``--threads`` (default 1) in the driver (``common.apply_threads``) and in the environment the
Ray workers and the fresh processes inherit (also as ``SWAPCHECK_THREADS_PER_UNIT``), for the launch
path and the bare loops alike. ``--smoke`` (a check of the harness): 2 slow units of 0.05 s, one CLI
pair, 5 and 10 tiny units on disk and on tmpfs, one repetition. Ray's starts are most of its time.

    .venv/bin/python benchmarks/bench_scheduling.py [--quick | --smoke] [--threads N] [--json out.json] [--dir /tmp/...]
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import pyarrow as pa  # noqa: E402
from pydantic import Field  # noqa: E402

from storage.schemas import register_table  # noqa: E402
from tasks.kinds import Kind, KindError, get_kind, register_kind  # noqa: E402
from tasks.kinds.base import Unit, UnitContext  # noqa: E402
from tasks.kinds.fields import Strict  # noqa: E402

TABLE = "sched_bench"
register_table(TABLE, pa.schema([("unit_id", pa.string()), ("experiment", pa.string()), ("i", pa.int64()),
                                 ("slept_s", pa.float64())]))


class SchedExperiment(Strict):
    """Units that sleep ``seconds`` each (0: do nothing) and write one row."""

    kind: Literal["sched_bench"]
    units: int = Field(ge=1)
    seconds: float = Field(default=0.0, ge=0)


def _expand(experiment: str, exp: SchedExperiment) -> Iterator[Unit]:
    return (KIND.unit(experiment, {"i": i, "seconds": exp.seconds}) for i in range(exp.units))


def _run(params: dict[str, Any], ctx: UnitContext | None = None) -> dict[str, list[dict[str, Any]]]:
    if params["seconds"]:
        time.sleep(params["seconds"])
    return {TABLE: [{"i": params["i"], "slept_s": params["seconds"]}]}


KIND = Kind(name="sched_bench", version="1", spec=SchedExperiment, tables=(TABLE,), describe=lambda p: f"sched unit {p['i']}",
            run=_run, expand=_expand)


def register() -> None:
    """Register the kind in this (driver) process by reference (``bench_scheduling:KIND``, as a
    plugin's entry is: its code is fingerprinted, so the process stays hermetic and a relaunch may
    reuse its plan, orchestrator.plan_cache); workers import it by the same reference."""
    try:
        get_kind("sched_bench")
    except KindError:
        register_kind("bench_scheduling:KIND", name="sched_bench")


def _noop(payload: dict[str, Any], results: str, sweep: str, spec_sha256: str) -> dict[str, Any]:
    """The bare loop's task: the same arguments as ``execute_unit``, returns at once."""
    return {"unit_id": payload["id"], "status": "ok", "error": None, "rows": 0, "attempts": 1}


def spec_text(name: str, units: int, seconds: float) -> str:
    return textwrap.dedent(f"""
        question = "What does scheduling cost beyond the units' own work?"
        name = "{name}"

        [experiments.b]
        kind = "sched_bench"
        units = {units}
        seconds = {seconds}
        """)


def _spec(where: Path, name: str, units: int, seconds: float) -> Any:
    from orchestrator.spec import load_spec

    path = where / f"{name}.toml"
    path.write_text(spec_text(name, units, seconds))
    return load_spec(path)


def _ideal(results: Path, sweep: str, slots: int) -> tuple[float, float]:
    """(sum of the ledger's durations / slots, greedy longest-first makespan) of a finished sweep."""
    from storage.store import ResultStore

    durations = sorted((float(r["duration_s"]) for r in ResultStore(results).ledger_records(sweep).values()), reverse=True)
    loads = [0.0] * slots
    for d in durations:
        loads[loads.index(min(loads))] += d
    return sum(durations) / slots, max(loads)


#: The bare loops' in-flight window (tasks submitted and not yet returned): the runner's window when
#: this benchmark was written (its internals are not read here: it may batch or window otherwise).
BARE_WINDOW = 2000

#: The baseline of the slow-units wall: a fresh process starts Ray as the embedded instance is started
#: (orchestrator.cluster.connect), runs N tasks that sleep, stops Ray. argv: units, seconds, num_cpus,
#: max_retries.
BARE_SLOW = r"""
import logging, os, shutil, sys, tempfile, time
from collections import deque
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "token")
n, seconds, cpus, retries = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
window = int(sys.argv[5])
session = tempfile.mkdtemp(prefix="sc-bench-ray-", dir="/tmp")
import ray
ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
         configure_logging=True, _temp_dir=os.path.join(session, "ray"))
def unit(i, seconds):
    time.sleep(seconds)
    return {"i": i, "slept_s": seconds}
remote = ray.remote(unit)
queue, in_flight, done = deque(range(n)), {}, 0
while queue or in_flight:
    while queue and len(in_flight) < window:
        i = queue.popleft()
        ref = remote.options(num_cpus=1, num_gpus=0, max_retries=retries, retry_exceptions=False,
                             name=f"sched_bench:{i}").remote(i, seconds)
        in_flight[ref] = i
    ready, rest = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
    if ready and rest:
        ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
    for ref, value in zip(ready, ray.get(ready), strict=True):
        in_flight.pop(ref)
        done += 1
ray.shutdown()
shutil.rmtree(session, ignore_errors=True)
assert done == n, (done, n)
"""


def bare_loop(payloads: list[dict[str, Any]], results: str, sweep: str, sha: str, max_retries: int) -> None:
    """A bare Ray task loop with the runner's settings: the same options and payloads, ``BARE_WINDOW``."""
    import ray

    remote = ray.remote(_noop)
    queue = deque(payloads)
    in_flight: dict[Any, dict[str, Any]] = {}
    while queue or in_flight:
        while queue and len(in_flight) < BARE_WINDOW:
            p = queue.popleft()
            ref = remote.options(num_cpus=1, num_gpus=0, max_retries=max_retries, retry_exceptions=False,
                                 name=f"{p['kind']}:{p['id']}").remote(p, results, sweep, sha)
            in_flight[ref] = p
        ready, rest = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        for ref, _value in zip(ready, ray.get(ready), strict=True):
            in_flight.pop(ref)


def _exponent(small: float, large: float, n_small: int, n_large: int) -> float:
    return math.log(large / small) / math.log(n_large / n_small) if small > 0 and large > 0 else float("nan")


def tmpfs_root() -> Path | None:
    """Where results on tmpfs go (``/dev/shm``), or None where it does not exist or is not writable."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


def main() -> None:
    from common import Case, apply_threads, emit, machine, parser, pick, tier

    ap = parser(__doc__ or "")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a fresh /tmp/sched_bench-*)")
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--slow", type=int, default=None, help="slow units (default 40; --quick 8; --smoke 2)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per slow unit (default 1; --smoke 0.05)")
    ap.add_argument("--cli-pairs", type=int, default=None,
                    help="pairs of fresh processes for the wall with Ray start (default 3; --quick, --smoke 1)")
    ap.add_argument("--sizes", type=str, default=None,
                    help="tiny-unit counts, comma separated (default 1000,10000; --quick 200,1000; --smoke 5,10)")
    ap.add_argument("--no-tmpfs", action="store_true", help="skip the tiny units on tmpfs")
    args = ap.parse_args()
    quick = tier(args) != "default"
    n_slow = args.slow or pick(args, 40, 8, 2)
    args.seconds = args.seconds if args.seconds is not None else pick(args, 1.0, 1.0, 0.05)
    cli_pairs = args.cli_pairs or pick(args, 3, 1, 1)
    sizes = [int(x) for x in (args.sizes or pick(args, "1000,10000", "200,1000", "5,10")).split(",")]
    reps_tiny = {n: (1 if quick or n >= 10_000 else 2) for n in sizes}

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only
    # Before Ray starts, so that its workers inherit the thread count (execute_unit applies this one).
    os.environ["SWAPCHECK_THREADS_PER_UNIT"] = str(args.threads)
    # Ray workers import the kind by reference (bench_scheduling:KIND) and find it on this path.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    register()
    where = args.dir or Path(tempfile.mkdtemp(prefix="sched_bench-", dir="/tmp"))
    where.mkdir(parents=True, exist_ok=True)
    shm = None if args.no_tmpfs else tmpfs_root()
    shm_where = Path(tempfile.mkdtemp(prefix="sched_bench-tmpfs-", dir=shm)) if shm else None

    from orchestrator.cluster import connect, disconnect
    from orchestrator.plan import make_plan
    from orchestrator.runner import launch
    from storage.store import ResultStore
    from tasks.kinds import kind_ref

    print(f"threads {apply_threads(args.threads)}", flush=True)
    cases: list[Case] = []
    counter = [0]

    def fresh(tag: str, root: Path = where) -> Path:
        counter[0] += 1
        return root / f"{tag}-{counter[0]}"

    slow_spec = _spec(where, "slow", n_slow, args.seconds)
    try:
        # (a) the wall a user waits for, Ray start included: fresh processes, before this process starts Ray.
        code = (f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(REPO)!r}]; import bench_scheduling as b; "
                "b.register(); from orchestrator.cli.main import app; app()")
        env = {**os.environ, "RAY_ADDRESS": ""}
        cli_walls: list[float] = []
        bare_walls: list[float] = []
        ideal_cli: list[float] = []
        for _ in range(cli_pairs):
            results = fresh("cli")
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", code, "sweep", "launch", str(where / "slow.toml"), "--results",
                                   str(results), "--no-progress", "--num-cpus", str(args.num_cpus)],
                                  cwd=REPO, env=env, capture_output=True, text=True)
            cli_walls.append(time.perf_counter() - t0)
            if done.returncode != 0:
                raise RuntimeError(done.stdout[-2000:] + done.stderr[-3000:])
            ideal_cli.append(_ideal(results, "slow", args.num_cpus)[0])
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", BARE_SLOW, str(n_slow), str(args.seconds), str(args.num_cpus),
                                   str(slow_spec.sweep.max_retries), str(BARE_WINDOW)],
                                  cwd=REPO, env=env, capture_output=True, text=True)
            bare_walls.append(time.perf_counter() - t0)
            if done.returncode != 0:
                raise RuntimeError(done.stdout[-2000:] + done.stderr[-3000:])
            print(f"  slow, Ray start included: swapcheck sweep launch {cli_walls[-1]:.2f} s, bare Ray process "
                  f"{bare_walls[-1]:.2f} s (ideal {ideal_cli[-1]:.2f} s)", flush=True)
        cases.append(Case("scheduling", f"{n_slow} units of {args.seconds:g} s, sweep wall, Ray start included",
                          "fresh process: Ray started alike, bare task loop of the same sleeps, Ray stopped",
                          cli_walls, bare_walls, goal=1.15,
                          notes="swapcheck sweep launch in a fresh process (imports, Ray start and stop, planning, "
                                "commits)",
                          extra={"ideal_seconds": ideal_cli, "vs_ideal": [w / i for w, i in zip(cli_walls, ideal_cli, strict=True)]}))

        t0 = time.perf_counter()
        conn = connect(num_cpus=args.num_cpus)
        ray_start = time.perf_counter() - t0
        slots = int(conn.num_cpus)
        print(f"Ray started in {ray_start:.1f} s: {conn.describe()}", flush=True)

        # Warm the workers (imports, torch) so the first measured launch does not pay for them.
        warm = _spec(where, "warm", 2 * slots, 0.0)
        launch(warm, fresh("warm"))

        # (a) slow units through launch(), Ray running: informative.
        walls, ideals, lpts = [], [], []
        for _ in range(1 if quick else 2):
            results = fresh("slow")
            t0 = time.perf_counter()
            summary = launch(slow_spec, results)
            walls.append(time.perf_counter() - t0)
            assert summary.n_ok == n_slow, summary
            ideal, lpt = _ideal(results, "slow", slots)
            ideals.append(ideal)
            lpts.append(lpt)
            print(f"  slow, Ray running: wall {walls[-1]:.2f} s, ideal {ideal:.2f} s, lpt {lpt:.2f} s", flush=True)
        cases.append(Case("scheduling", f"{n_slow} units of {args.seconds:g} s, sweep wall, Ray running",
                          "ideal: sum(ledger duration_s) / slots", walls, ideals, goal=None,
                          notes=f"informative; {slots} slots; vs LPT makespan "
                                f"{min(w / m for w, m in zip(walls, lpts, strict=True)):.3f}x; embedded Ray start "
                                f"{ray_start:.1f} s",
                          extra={"lpt_seconds": lpts, "ray_start_s": ray_start}))

        # (b) tiny units: launch() against a bare Ray loop, on disk and on tmpfs; planning, skip-check, relaunch.
        places = [("disk", where, 2.0)] + ([("tmpfs", shm_where, 1.5)] if shm_where is not None else [])
        if shm_where is None:
            print("  tiny units on tmpfs: skipped (" + ("--no-tmpfs" if args.no_tmpfs else "no writable /dev/shm") + ")")
        scale: dict[int, dict[str, float]] = {}
        for place, root, goal in places:
            for n in sizes:
                spec = _spec(where, f"tiny{n}", n, 0.0)
                plan_times = []
                for _ in range(3):  # the median of three
                    t0 = time.perf_counter()
                    plan = make_plan(spec)
                    plan_times.append(time.perf_counter() - t0)
                plan_s = sorted(plan_times)[1]
                payloads = [{**u.to_payload(), "description": u.describe(), "kind_ref": kind_ref(u.kind)} for u in plan.units]
                ours, bare = [], []
                results = root / "none"
                for _ in range(reps_tiny[n]):
                    results = fresh(f"tiny{n}", root)
                    t0 = time.perf_counter()
                    summary = launch(spec, results)
                    ours.append(time.perf_counter() - t0)
                    assert summary.n_ok == n, summary
                    t0 = time.perf_counter()
                    bare_loop(payloads, str(fresh("bare", root)), plan.sweep, spec.sha256, spec.sweep.max_retries)
                    bare.append(time.perf_counter() - t0)
                    print(f"  tiny {n} ({place}): launch {ours[-1] / n * 1e3:.2f} ms/unit, bare loop "
                          f"{bare[-1] / n * 1e3:.2f} ms/unit", flush=True)
                extra: dict[str, Any] = {"units": n, "results_on": place, "results_root": str(root), "plan_s": plan_s}
                if place == "disk":
                    skip_times = []
                    for _ in range(3):
                        t0 = time.perf_counter()
                        done_n = len(ResultStore(results).done_units(plan.sweep))
                        skip_times.append(time.perf_counter() - t0)
                        assert done_n == n
                    skip_s = sorted(skip_times)[1]
                    t0 = time.perf_counter()
                    again = launch(spec, results)
                    relaunch_s = time.perf_counter() - t0
                    assert again.n_skipped == n
                    scale[n] = {"plan": plan_s, "skip": skip_s, "relaunch": relaunch_s}
                    extra.update(done_units_s=skip_s, relaunch_s=relaunch_s)
                    print(f"  tiny {n}: plan {plan_s:.3f} s, done_units {skip_s:.3f} s, relaunch {relaunch_s:.3f} s",
                          flush=True)
                cases.append(Case("scheduling", f"{n:,} tiny units, per unit" + (", results on tmpfs" if place == "tmpfs" else ""),
                                  "bare Ray task loop, same settings", ours, bare, goal=goal,
                                  notes=f"median {statistics.median(ours) / n * 1e3:.2f} vs "
                                        f"{statistics.median(bare) / n * 1e3:.2f} ms/unit; results on {place}",
                                  extra=extra))
        if len(sizes) >= 2:
            a, b = sizes[0], sizes[-1]
            exps = {k: _exponent(scale[a][k], scale[b][k], a, b) for k in ("plan", "skip", "relaunch")}
            print(f"scaling {a:,} -> {b:,} units (exponent, 1.0 = linear): "
                  + ", ".join(f"{k} {v:.2f} ({scale[a][k]:.3f} s -> {scale[b][k]:.3f} s)" for k, v in exps.items()))
            for c in cases:
                c.extra["exponents"] = exps
        for c in cases:
            c.extra["pair_ratios"] = c.pair_ratios()
        m = machine()
        print(f"machine: {m['cpu']}, {m['cores']} cores, Ray {m['versions'].get('ray')}")
        emit(cases, args.json, title="scheduling overhead (candidate / baseline)")
    finally:
        disconnect()
        if args.dir is None:
            shutil.rmtree(where, ignore_errors=True)
        if shm_where is not None:
            shutil.rmtree(shm_where, ignore_errors=True)


if __name__ == "__main__":
    # Run as the module ``bench_scheduling`` (not ``__main__``), so Ray workers can import the kind.
    import bench_scheduling

    bench_scheduling.main()
