"""How the costs that grow with a sweep grow: units (plan, skip-check, relaunch) and rows (reads).

Not one of ``make bench``'s stages (``run_all.py`` runs it only when ``--only growth`` names it: it
takes tens of minutes at its default sizes). It prints, and records with ``--json``, the seconds at
each size and the exponent between consecutive sizes, ``log(t2 / t1) / log(n2 / n1)`` (1.0 = linear):
docs/scaling.md's "Measured growth" table comes from it. Exponents are less sensitive to a busy
machine than seconds (a neighbour slows both sizes), but not immune: the load average before and
after each measure is recorded beside it.

**Units** (``--units``, default 1000,10000,100000): a finished sweep of N units of the benchmark kind
``sched_bench`` (benchmarks/bench_scheduling.py: one row each). It is written without Ray, through
the real store API, as a launch would have committed it: per unit its result file
(``ResultStore.write``) and its ``ok`` ledger row (``orchestrator.worker.ledger_row`` with the file's
record, ``ResultStore.record_unit``), with ``os.fsync`` made a no-op while writing and one ``os.sync``
after (the files are the same; only the setup's time differs). The tree is cached under ``--dir``
(default ``growth/`` under the rows cache: ``units-N/``, reused when its marker exists). Measured on it, each the median of ``--repeat``
(default 3; 1 at 100,000 units and more):

* ``plan``: ``orchestrator.plan.make_plan`` of the spec, expanded (``SWAPCHECK_PLAN_CACHE=off``),
  and ``cached plan``: the same from the plan cache (orchestrator.plan_cache);
* ``skip-check``: ``ResultStore.done_units`` (the ledger read);
* ``relaunch``: ``orchestrator.runner.launch`` of the same spec on the finished sweep (plan, skip-check,
  lock, records; nothing pending, so Ray is not started), after a first relaunch in the process
  (reported apart: it pays the runner's imports and fills the machine's read cache, storage.readcache;
  the plan measures before it filled the plan cache), and ``relaunch
  expanding``: the same with the plan cache off, as every relaunch was before it. The case
  "relaunch, 1,000 -> 100,000 units" carries issue #39's goal, at most 5x;
* ``open``: ``storage.catalog.open_catalog`` of the finished sweep and a count of its units and rows,
  after a first open (reported apart: it fills the verified-files cache and the read cache).

The finished sweep is left as a launch leaves it: a ledger checkpoint, its spec record, its result
files compacted (the builder ends with one ``launch``). The bench keeps its plan cache in a fresh
temporary directory unless ``SWAPCHECK_PLAN_CACHE`` is set.

**Rows** (``--rows``, default 1000000,10000000; add 100000000 for 100M, which takes several minutes
per command): the gen_rows tree (benchmarks/gen_rows.py, cached under ``--rows-dir``) read by
``swapcheck report agreement --format json`` and ``swapcheck query`` (bench_reads.py's group-by), each
in a fresh process, the median of ``--repeat`` (1 at 100M), and beside each the hand-written baseline
of bench_reads.py (benchmarks/reads_baseline.py), which computes the same numbers.

    .venv/bin/python benchmarks/bench_growth.py [--units 1000,10000,100000] [--rows 1000000,10000000]
                                                [--quick | --smoke] [--threads N] [--json out.json]

``--quick``: units 1000,10000 and rows 1000000,10000000 (no 100k units). ``--smoke`` (a check of
the harness): units 50,100 and rows 20000,40000, one repetition.

The finished sweeps end as a launch leaves them: their ledger merged into a checkpoint
(storage.records). Two more measures, each its own flag:

* ``--ledger-only 1000,1000000``: the relaunch on a finished sweep's ledger alone (spec record and
  checkpointed ledger written through the store, no result files: a relaunch with nothing to run
  reads none), so a 1M-unit tree takes about an hour to make, not many;
* ``--plan-memory 1000,1000000``: the plan's seconds and the driver's peak memory in a fresh process
  while every unit streams through the scheduler, as a first launch takes them.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import common  # noqa: E402

#: Bump when the cached unit trees change.
VERSION = "3"
SWEEP = "growth"


def exponent(n1: int, t1: float, n2: int, t2: float) -> float:
    return math.log(t2 / t1) / math.log(n2 / n1) if t1 > 0 and t2 > 0 and n2 != n1 else float("nan")


def _median(fn: Callable[[], Any], repeat: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def spec_for(where: Path, n: int) -> Any:
    import bench_scheduling

    from orchestrator.spec import load_spec

    path = where / f"{SWEEP}-{n}.toml"
    path.write_text(bench_scheduling.spec_text(SWEEP, n, 0.0))
    return load_spec(path)


def _cached_root(directory: Path, name: str) -> tuple[Path, Path, bool]:
    """(root, marker, whether the tree under ``directory/name`` is cached at this VERSION); an
    outdated one is removed."""
    directory.mkdir(parents=True, exist_ok=True)
    root, marker = directory / name, directory / f"{name}.json"
    if marker.exists() and root.exists() and json.loads(marker.read_text()).get("version") == VERSION:
        return root, marker, True
    marker.unlink(missing_ok=True)
    if root.exists():
        import shutil

        shutil.rmtree(root)
    return root, marker, False


def finished_sweep(directory: Path, n: int, ledger_only: bool = False) -> tuple[Path, Any]:
    """The results root of a finished ``n``-unit sweep (cached), and its spec: per unit its result
    file (``ResultStore.write``) and its ``ok`` ledger row (``orchestrator.worker.ledger_row`` with the
    file's record, ``ResultStore.record_unit``), the ledger then merged into a checkpoint
    (``SweepRecords.checkpoint``) as a launch's end does.

    ``ledger_only``: the spec record and the ledger alone, no result files (each row records the file
    its unit would have written). What a relaunch with nothing to run reads is all there; what it never
    reads (the result files) is left out, so a 1M-unit tree takes about an hour to make, not many."""
    import bench_scheduling
    import pyarrow as pa

    from orchestrator.plan import make_plan
    from orchestrator.runner import write_sweep_record
    from orchestrator.worker import ledger_row
    from storage.store import FileRecord, ResultStore, utcnow

    bench_scheduling.register()
    root, marker, cached = _cached_root(directory, f"{'ledger-only' if ledger_only else 'units'}-{n}")
    spec = spec_for(directory, n)
    if cached:
        return root, spec
    plan = make_plan(spec)
    store = ResultStore(root)
    if ledger_only:
        write_sweep_record(store, spec, plan)
    real_fsync = os.fsync
    t0 = time.perf_counter()
    os.fsync = lambda fd: None  # setup only: the same files, written faster; one os.sync below
    try:
        for u in plan.iter_units():
            if ledger_only:
                rec = FileRecord(table=bench_scheduling.TABLE, rows=1, bytes=1000, sha256="0" * 64,
                                 path=f"table={bench_scheduling.TABLE}/sweep={plan.sweep}/{u.id}.parquet")
            else:
                rec = store.write(bench_scheduling.TABLE, plan.sweep, u.id, pa.table(
                    {"unit_id": [u.id], "experiment": [u.experiment], "i": [u.params["i"]], "slept_s": [0.0]}))
            payload = {**u.to_payload(), "description": u.describe()}
            store.record_unit(plan.sweep, ledger_row(payload, spec.sha256, status="ok", attempts=1, started=utcnow(),
                                                     duration_s=0.0, error=None, tables=[rec.table], rows=rec.rows,
                                                     ran_here=False, files=[rec]))
        # A launch ends with a ledger checkpoint (storage.records): the finished sweep has one, as a launched one would.
        store.records(plan.sweep).checkpoint()
    finally:
        os.fsync = real_fsync
    os.sync()
    if not ledger_only:
        # As a launch leaves a finished sweep: its spec record written, its result files compacted.
        from orchestrator.runner import launch

        with plan_cache_off():
            assert launch(spec, root).n_skipped == n
    seconds = time.perf_counter() - t0
    marker.write_text(json.dumps({"units": n, "version": VERSION, "seconds": round(seconds, 1), "ledger_only": ledger_only}))
    what = "the ledger of a finished sweep" if ledger_only else "a finished sweep"
    print(f"  wrote {what} of {n:,} units{' (no result files)' if ledger_only else ''} under {root} in {seconds:.1f} s",
          flush=True)
    return root, spec


def measure_relaunch_ledger_only(directory: Path, n: int, repeat: int) -> dict[str, Any]:
    root, spec = finished_sweep(directory, n, ledger_only=True)
    load_before = common.load_average()
    r = relaunches(spec, root, n, repeat)
    print(f"  {n:>9,} units (ledger only): relaunch {r['relaunch_s']:.3f} s (expanding the spec "
          f"{r['relaunch_expanding_s']:.3f} s; the first in this process {r['first_relaunch_s']:.3f} s) (median of "
          f"{repeat}; load {load_before[0]:.1f} -> {common.load_average()[0]:.1f})", flush=True)
    return {"units": n, **r, "load_before": load_before}


@contextmanager
def plan_cache_off() -> Iterator[None]:
    """Expand the spec every time (``SWAPCHECK_PLAN_CACHE=off``), as every relaunch did before the
    plan cache (orchestrator.plan_cache)."""
    before = os.environ.get("SWAPCHECK_PLAN_CACHE")
    os.environ["SWAPCHECK_PLAN_CACHE"] = "off"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SWAPCHECK_PLAN_CACHE", None)
        else:
            os.environ["SWAPCHECK_PLAN_CACHE"] = before


def relaunches(spec: Any, root: Path, n: int, repeat: int) -> dict[str, Any]:
    """The relaunch of a finished sweep three ways: the first in this process (untimed as a measure:
    it pays the runner's imports, and with empty caches expands the spec and reads every record whole),
    then the median of ``repeat`` with the plan cache (what every later relaunch costs) and of
    ``repeat`` with it off (the spec expanded each time)."""
    from orchestrator.runner import launch

    def relaunch() -> None:
        summary = launch(spec, root)
        assert summary.n_skipped == n and summary.n_ok == 0, summary

    t0 = time.perf_counter()
    relaunch()
    first_s = time.perf_counter() - t0
    relaunch_s, relaunch_all = _median(relaunch, repeat)
    with plan_cache_off():
        expanding_s, expanding_all = _median(relaunch, repeat)
    return {"first_relaunch_s": first_s, "relaunch_s": relaunch_s, "relaunch_expanding_s": expanding_s,
            "relaunch_times": relaunch_all, "relaunch_expanding_times": expanding_all}


def catalog_opens(root: Path, n: int, repeat: int) -> tuple[float, float, list[float]]:
    """``open_catalog`` of the finished sweep and a count of its units and result rows (what every
    ``report`` and ``query`` pays first): the first in this process (reported apart: it may fill the
    verified-files and read caches), then the median of ``repeat``."""
    from storage.catalog import open_catalog

    def once() -> None:
        with open_catalog(str(root)) as cat:
            counts = cat.query("SELECT (SELECT count(*) FROM units WHERE status = 'ok' AND NOT damaged) AS units, "
                               "(SELECT count(*) FROM sched_bench) AS rows").to_pylist()[0]
            assert counts == {"units": n, "rows": n} and not cat.warnings, (counts, cat.warnings[:3])

    t0 = time.perf_counter()
    once()
    first = time.perf_counter() - t0
    seconds, times = _median(once, repeat)
    return first, seconds, times


def measure_units(directory: Path, n: int, repeat: int) -> dict[str, Any]:
    from orchestrator.plan import make_plan
    from storage.store import ResultStore

    root, spec = finished_sweep(directory, n)
    load_before = common.load_average()
    with plan_cache_off():
        plan_s, plan_all = _median(lambda: make_plan(spec), repeat)
    sweep = make_plan(spec).sweep
    cached_plan_s, cached_plan_all = _median(lambda: make_plan(spec), repeat)

    def skip() -> None:
        assert len(ResultStore(root).done_units(sweep)) == n

    skip_s, skip_all = _median(skip, repeat)
    r = relaunches(spec, root, n, repeat)
    first_open_s, open_s, open_all = catalog_opens(root, n, repeat)
    out = {"units": n, "plan_s": plan_s, "cached_plan_s": cached_plan_s, "skip_s": skip_s, **r,
           "first_open_s": first_open_s, "open_s": open_s,
           "times": {"plan": plan_all, "cached_plan": cached_plan_all, "skip": skip_all,
                     "relaunch": r["relaunch_times"], "relaunch_expanding": r["relaunch_expanding_times"],
                     "open": open_all},
           "load_before": load_before, "load_after": common.load_average()}
    print(f"  {n:>9,} units: plan {plan_s:.3f} s (from the plan cache {cached_plan_s:.3f} s), skip-check {skip_s:.3f} s, "
          f"relaunch {r['relaunch_s']:.3f} s (expanding the spec {r['relaunch_expanding_s']:.3f} s; the first in this "
          f"process {r['first_relaunch_s']:.3f} s), catalog open {open_s:.3f} s (the first {first_open_s:.3f} s) "
          f"(median of {repeat}; load {load_before[0]:.1f} -> "
          f"{out['load_after'][0]:.1f})", flush=True)
    return out


PLAN_CHILD = """
import resource, sys, time
sys.path[:0] = [{repo!r}, {here!r}]
import bench_growth, bench_scheduling
from pathlib import Path
from orchestrator.plan import make_plan
bench_scheduling.register()
spec = bench_growth.spec_for(Path(sys.argv[1]), int(sys.argv[2]))
from orchestrator.runner import Batches, Pending
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
plan = make_plan(spec)
seconds = time.perf_counter() - t0
pending = Pending(plan, set())  # a first launch: every unit pending
batches = Batches(pending.units(0), 0.0, {{"CPU": 2.0}}, counts=pending.counts(Batches([], 0.0, {{}}).key, 0))
n = 0
while batches:  # the scheduler takes every unit, as a launch's window would
    n += len(batches.take(2000))
assert n == len(plan), (n, len(plan))
print(len(plan), seconds, before * 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def measure_plan_memory(directory: Path, n: int) -> dict[str, Any]:
    """The driver's plan of an ``n``-unit sweep in a fresh process: the seconds of ``make_plan``, and
    peak resident memory before and after a launch's whole walk of it (the plan's ids and profiles,
    every unit pending, streamed through the scheduler's queue as a first launch takes them)."""
    import subprocess

    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-c", PLAN_CHILD.format(repo=str(REPO), here=str(HERE)), str(directory), str(n)],
                          capture_output=True, text=True, cwd=str(REPO))
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    units, seconds, before, after = done.stdout.split()
    out = {"units": int(units), "plan_s": float(seconds), "rss_before_bytes": int(before), "rss_after_bytes": int(after)}
    print(f"  {n:>9,} units planned in {out['plan_s']:.2f} s; driver peak RSS {int(before) / 2**20:.0f} MiB before, "
          f"{int(after) / 2**20:.0f} MiB after (+{(int(after) - int(before)) / 2**20:.0f} MiB)", flush=True)
    return out


def measure_rows(rows_dir: Path, n: int, repeat: int) -> dict[str, Any]:
    from bench_reads import BASELINE, CLI, GROUP_BY
    from gen_rows import ensure_rows

    root = str(ensure_rows(rows_dir, n))
    commands = {
        "report agreement": CLI + ["report", "agreement", "--results", root, "--format", "json"],
        "report agreement, baseline": [*BASELINE, root, "agreement"],
        "query": CLI + ["query", "--results", root, "--format", "csv", GROUP_BY],
        "query, baseline": [*BASELINE, root, "query", GROUP_BY],
    }
    load_before = common.load_average()
    out: dict[str, Any] = {"rows": n, "seconds": {}, "times": {}, "peak_rss_bytes": {}, "load_before": load_before}
    with tempfile.TemporaryDirectory(prefix="swapcheck-growth-") as tmp:
        for name, cmd in commands.items():
            times, rss = [], []
            for _ in range(repeat):
                s, r, done = common.peak_rss_of(cmd, stdout_path=Path(tmp) / "out", cwd=str(REPO))
                if done.returncode != 0:
                    raise RuntimeError(f"{name} failed: {done.stderr[-2000:]}")
                times.append(s)
                rss.append(r)
            out["seconds"][name] = statistics.median(times)
            out["times"][name] = times
            out["peak_rss_bytes"][name] = max(rss)
    out["load_after"] = common.load_average()
    print(f"  {n:>11,} rows: " + ", ".join(f"{k} {v:.2f} s" for k, v in out["seconds"].items())
          + f" (median of {repeat}; load {load_before[0]:.1f} -> {out['load_after'][0]:.1f})", flush=True)
    return out


def main() -> None:
    ap = common.parser(__doc__.splitlines()[0] if __doc__ else "bench_growth")
    ap.add_argument("--units", default=None, help="unit counts (default 1000,10000,100000; --quick 1000,10000; --smoke 50,100)")
    ap.add_argument("--rows", default=None,
                    help="row counts (default 1000000,10000000; --smoke 20000,40000); 100000000 adds 100M")
    ap.add_argument("--repeat", type=int, default=None,
                    help="repetitions per measure, median taken (default 3; 1 at 100k units or 100M rows; --smoke 1)")
    from gen_rows import DEFAULT_DIR

    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR / "growth",
                    help="where the finished sweeps are cached (default: growth/ under the rows cache, "
                         "$SWAPCHECK_BENCH_ROWS_DIR or /tmp/swapcheck-bench-rows)")
    ap.add_argument("--rows-dir", type=Path, default=DEFAULT_DIR, help="where gen_rows trees are cached")
    ap.add_argument("--no-units", action="store_true", help="skip the units measures")
    ap.add_argument("--no-rows", action="store_true", help="skip the rows measures")
    ap.add_argument("--ledger-only", default="",
                    help="unit counts whose relaunch to measure on a finished sweep's ledger alone (no result files), "
                         "e.g. 1000,1000000")
    ap.add_argument("--plan-memory", default="",
                    help="unit counts whose plan's time and driver memory to measure in a fresh process (e.g. 1000000)")
    args = ap.parse_args()
    units = [int(x) for x in (args.units or common.pick(args, "1000,10000,100000", "1000,10000", "50,100")).split(",")]
    rows = [int(x) for x in (args.rows or common.pick(args, "1000000,10000000", "1000000,10000000", "20000,40000")).split(",")]
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a relaunch with work left would start Ray
    # A plan cache of this run's own (orchestrator.plan_cache): the first relaunch of each size fills it.
    os.environ.setdefault("SWAPCHECK_PLAN_CACHE", tempfile.mkdtemp(prefix="swapcheck-bench-plans-"))
    print(f"threads {common.apply_threads(args.threads)}; load average {common.load_average()}", flush=True)

    def reps(big: bool) -> int:
        return args.repeat or (1 if big or common.tier(args) == "smoke" else 3)

    cases: list[common.Case] = []
    results: dict[str, Any] = {"units": [], "rows": []}
    if not args.no_units:
        print("units (a finished sweep: plan, skip-check, relaunch)", flush=True)
        for n in units:
            results["units"].append(measure_units(args.dir, n, reps(n >= 100_000)))
        pairs = list(zip(results["units"], results["units"][1:], strict=False))
        by_n = {r["units"]: r for r in results["units"]}
        if 1000 in by_n and 100_000 in by_n and (1000, 100_000) not in [(a["units"], b["units"]) for a, b in pairs]:
            pairs.append((by_n[1000], by_n[100_000]))
        for a, b in pairs:
            for what in ("plan", "cached_plan", "skip", "relaunch", "relaunch_expanding", "open"):
                e = exponent(a["units"], a[f"{what}_s"], b["units"], b[f"{what}_s"])
                # Issue #39's goal: relaunching a finished 100,000-unit sweep costs at most 5x the 1,000-unit one.
                goal = 5.0 if what == "relaunch" and (a["units"], b["units"]) == (1000, 100_000) else None
                cases.append(common.Case("growth", f"{what.replace('_', ' ')}, {a['units']:,} -> {b['units']:,} units",
                                         f"the same at {a['units']:,} units", [b[f"{what}_s"]], [a[f"{what}_s"]],
                                         goal=goal, quantity="seconds at the larger size / at the smaller",
                                         notes=f"exponent {e:.2f}", extra={"exponent": e, "small": a, "large": b}))
    if args.ledger_only:
        print("relaunch on a finished sweep's ledger alone (spec record, checkpointed ledger, no result files)", flush=True)
        results["ledger_only"] = [measure_relaunch_ledger_only(args.dir, int(n), reps(int(n) >= 100_000))
                                  for n in args.ledger_only.split(",")]
    if args.plan_memory:
        print("plan memory (a fresh process: make_plan, then every unit streamed through the scheduler)", flush=True)
        results["plan_memory"] = [measure_plan_memory(args.dir, int(n)) for n in args.plan_memory.split(",")]
    if not args.no_rows:
        print("rows (report agreement and query, fresh processes; hand-written baselines beside them)", flush=True)
        for n in rows:
            results["rows"].append(measure_rows(args.rows_dir, n, reps(n >= 100_000_000)))
        for a, b in zip(results["rows"], results["rows"][1:], strict=False):
            for what in a["seconds"]:
                e = exponent(a["rows"], a["seconds"][what], b["rows"], b["seconds"][what])
                cases.append(common.Case("growth", f"{what}, {a['rows']:,} -> {b['rows']:,} rows",
                                         f"the same at {a['rows']:,} rows", [b["seconds"][what]], [a["seconds"][what]],
                                         goal=None, quantity="seconds at the larger size / at the smaller",
                                         notes=f"exponent {e:.2f}",
                                         extra={"exponent": e, "peak_rss_bytes": [a["peak_rss_bytes"][what],
                                                                                  b["peak_rss_bytes"][what]]}))
    print("\nexponents, log(t2/t1) / log(n2/n1) (1.0 = linear):")
    for c in cases:
        print(f"  {c.case:48} {c.extra['exponent']:5.2f}  ({c.baseline_seconds[0]:.3f} s -> {c.seconds[0]:.3f} s)")
    common.emit(cases, args.json, title="growth: seconds at the larger size over the smaller (no goals)")


if __name__ == "__main__":
    main()
