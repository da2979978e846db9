"""Run every stage benchmark and collect the cases into ``benchmarks/results.json`` (``make bench``).

Each ``benchmarks/bench_<stage>.py`` runs in a subprocess of its own (its memory and threads are its
own, a crash in one does not stop the others) with the harness's common options (``--json``,
``--threads``, ``--quick``/``--smoke``); this script records the machine, the package versions, the
thread count, the load average before and after each script, the script's own CPU time and its wall
time, then prints one summary table: every case with its ratio, its goal and whether the goal is met.

Every goal is judged on the median of the case's paired ratios (``common.JUDGED_ON``; ``best``, the
least disturbed pair, is printed beside it as information); the summary, ``--show`` and ``--markdown``
say so, and say "judged on the best pair" for a results file written under the earlier rule (its
cases carry ``judge: "min"``).

Every script runs with the same explicit thread count (``--threads``, default 1), for candidate and
baseline alike: ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and
``NUMBA_NUM_THREADS`` in its environment, and ``common.apply_threads`` in the script itself.

A stage is *not comparable* when the load of the machine's other processes exceeds ``--max-load``
(default 0.75 per core) before it, after it or at any sample during it: its cases are recorded with
``met: null``, ``comparable: false`` and the reason (``why``), and the summary prints "not comparable"
instead of yes/NO. The others' load is computed as the kernel computes the 1-minute load average --
every 5 s the runnable and uninterruptible threads are counted and damped with a 60 s time constant --
counting every thread but this run's and its descendants' (``common.OthersLoad``; this script is the
subreaper of what its stages leave behind, so Ray's raylet, GCS and workers are its descendants). Each
stage records ``others_load_before`` / ``_after`` / ``_peak``, our share (``own_load_before`` /
``_after``: the load average less the others'), and the older CPU-time estimate of our share
(``own_load_cpu_estimate``, ``common.own_load``), which missed processes reaped after the stage.

    python benchmarks/run_all.py                 # every stage, default sizes (under 15 minutes on 2 cores)
    python benchmarks/run_all.py --quick         # smaller sizes (make bench-quick)
    python benchmarks/run_all.py --smoke         # the smallest sizes: the harness end to end in about a minute
    python benchmarks/run_all.py --only reads    # the stage "reads" (a name that is no stage: those containing it)
    python benchmarks/run_all.py --threads 2     # another thread count (the same for every script)
    python benchmarks/run_all.py --only growth   # bench_growth.py (not a stage of a plain run: OPTIONAL)

Exit status: 0 when every script ran (goals met or not, comparable or not: a missed goal is a finding,
printed as NO and recorded with ``met: false``), 1 when a script failed.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402

HERE = Path(__file__).parent
#: The order in which the stages run: the short ones first, so a smoke run shows the harness works.
ORDER = ["int8", "emulation", "writer", "cold_restart", "scheduling", "reads"]


#: Scripts that are not stages of a plain run: run only when ``--only`` names them exactly (growth
#: measures units and rows at several sizes: tens of minutes; docs/scaling.md).
OPTIONAL = ("growth",)


def scripts(optional: bool = False) -> list[Path]:
    """The stage scripts in their order; ``optional``: also the ``OPTIONAL`` ones, last."""
    found = {p.stem.removeprefix("bench_"): p for p in HERE.glob("bench_*.py")}
    stages = [found[s] for s in ORDER if s in found] + [p for s, p in sorted(found.items())
                                                         if s not in ORDER and s not in OPTIONAL]
    return stages + ([found[s] for s in OPTIONAL if s in found] if optional else [])


def selected(stage: str, only: list[str], stages: list[str]) -> bool:
    """Does ``--only`` pick ``stage``? A value that is a stage's name picks that stage alone; any other
    value picks every stage whose name contains it. No values: every stage."""
    return not only or any(o == stage or (o not in stages and o in stage) for o in only)


def _adopt_orphans() -> bool:
    """Become the subreaper of our descendants (Linux ``PR_SET_CHILD_SUBREAPER``): processes a stage
    leaves behind when their parent exits first (Ray's workers when the raylet stops) are then reaped
    here, so their CPU time counts in ``RUSAGE_CHILDREN`` (the stage's own load) instead of vanishing."""
    try:
        import ctypes

        return int(ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _reap() -> None:
    """Wait for every adopted descendant that has exited (their CPU time joins RUSAGE_CHILDREN)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def mark(entry: dict[str, Any], max_load: float) -> None:
    """Judge a stage's comparability from its loads and mark its cases: a case of a stage that is not
    comparable keeps its measured verdict as ``met_as_measured`` and gets ``met: None``."""
    ok, why = common.comparability(entry["load_before"], entry["load_after"], max_load,
                                   entry.get("own_load_before", 0.0), entry.get("own_load_after", 0.0),
                                   entry.get("others_load_peak"))
    entry["comparable"], entry["why"] = ok, why
    for c in entry["cases"]:
        c["comparable"], c["why"] = ok, why
        if not ok:
            c["met_as_measured"] = c.get("met")
            c["met"] = None


def main() -> int:
    ap = common.parser(__doc__.splitlines()[0])
    ap.add_argument("--max-load", type=float, default=None, metavar="LOAD",
                    help="the load threshold: a stage whose 1-minute load average, less this run's own share, "
                         f"exceeds it before or after is not comparable (default {common.MAX_LOAD_PER_CORE:g} "
                         f"per core: {common.default_max_load()} here)")
    ap.add_argument("--only", action="append", default=[], help="run only this stage, or (a name that is no stage's) the stages whose name contains this")
    ap.add_argument("--out", type=Path, default=HERE / "results.json", help="where the collected results go")
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="seconds one script may take (default 1800: the reads stage runs 27 pairs at 10M rows)")
    ap.add_argument("--show", type=Path, default=None, metavar="RESULTS_JSON",
                    help="run nothing: print the summary of an earlier run's results file")
    ap.add_argument("--markdown", action="store_true", help="with --show: the summary as a Markdown table")
    args = ap.parse_args()
    if args.show is not None:
        shown = json.loads(args.show.read_text())
        (_markdown if args.markdown else _summary)(shown)
        return 0
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    machine = common.machine()
    max_load = args.max_load if args.max_load is not None else common.default_max_load(machine["cores"])
    tier = common.tier(args)
    machine["threads"] = args.threads
    run: dict[str, Any] = {"started_at": datetime.now(UTC).isoformat(timespec="seconds"), "tier": tier,
                           "quick": tier != "default", "threads": args.threads, "max_load": max_load,
                           "max_load_rule": "1-minute load average less this run's own share, before or after "
                                            "a stage, above max_load: not comparable",
                           "machine": machine, "stages": []}
    stated = "--max-load" if args.max_load is not None else f"{common.MAX_LOAD_PER_CORE:g} x {machine['cores']} cores"
    print(f"CPU {machine['cpu']}: ISA level {machine.get('isa_level')} (torch {machine.get('torch_capability')}); "
          f"{machine.get('int8_accumulator')}; {machine.get('onednn_int8')}"
          + (f"; note: {machine['int_mm_note']}" if machine.get("int_mm_note") else ""), flush=True)
    print(f"threads {args.threads} (candidate and baseline alike); load threshold {max_load:g} ({stated}, "
          "1-minute load average less this run's own share); sizes: " + tier, flush=True)
    env = {**os.environ, **{var: str(args.threads) for var in common.THREAD_ENV}}
    opts = ["--threads", str(args.threads)] + {"smoke": ["--smoke"], "quick": ["--quick"], "default": []}[tier]
    adopted = _adopt_orphans()
    own, own_at = 0.0, time.perf_counter()  # the CPU-time estimate of our share of the load, and when
    others = common.OthersLoad().start()  # the load of every process but ours, sampled as the kernel does
    failed = []
    t_all = time.perf_counter()
    stages = [s.stem.removeprefix("bench_") for s in scripts(optional=True)]
    for script in scripts(optional=True):
        stage = script.stem.removeprefix("bench_")
        if not selected(stage, args.only, stages) or (stage in OPTIONAL and stage not in args.only):
            continue
        with tempfile.TemporaryDirectory(prefix="swapcheck-bench-") as tmp:
            out = Path(tmp) / "cases.json"
            cmd = [sys.executable, str(script), "--json", str(out), *opts]
            print(f"\n=== {stage}: {' '.join(cmd[1:])}", flush=True)
            _reap()
            cpu0 = _children_cpu()
            t0 = time.perf_counter()
            own_cpu_before = common.own_load(own, 0.0, t0 - own_at)
            load_before = common.load_average()
            others_before = others.sample()
            others.reset_peak()
            try:
                proc = subprocess.run(cmd, cwd=common.REPO, timeout=args.timeout, env=env)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = -1
            seconds = time.perf_counter() - t0
            load_after = common.load_average()
            others_after = others.sample()
            others_peak = others.peak
            _reap()
            cpu = _children_cpu() - cpu0
            own = common.own_load(own_cpu_before, cpu / seconds if seconds > 0 else 0.0, seconds)
            own_at = time.perf_counter()
            # our share of each load average: what the sampler does not count as others'
            own_before = max(load_before[0] - others_before, 0.0)
            own_after = max(load_after[0] - others_after, 0.0)
            cases = json.loads(out.read_text()) if out.exists() else []
        entry: dict[str, Any] = {
            "stage": stage, "script": str(script.relative_to(common.REPO)), "returncode": rc,
            "seconds": round(seconds, 1), "threads": args.threads, "load_before": load_before,
            "load_after": load_after, "cpu_seconds": round(cpu, 1),
            "cores_busy": round(cpu / seconds, 2) if seconds > 0 else None,
            "own_load_before": round(own_before, 2), "own_load_after": round(own_after, 2),
            "others_load_before": round(others_before, 2), "others_load_after": round(others_after, 2),
            "others_load_peak": round(others_peak, 2), "own_load_cpu_estimate": round(own, 2), "max_load": max_load,
            "cases": cases}
        mark(entry, max_load)
        print(f"=== {stage}: exit {rc}, {seconds:.1f} s, {cpu:.1f} CPU s; load {load_before[0]:.2f} -> "
              f"{load_after[0]:.2f} (others' {others_before:.2f} -> {others_after:.2f}, peak {others_peak:.2f}); "
              + ("comparable" if entry["comparable"] else f"NOT COMPARABLE: {entry['why']}"), flush=True)
        run["stages"].append(entry)
        if rc != 0:
            failed.append(stage)
    others.stop()
    run["orphans_adopted"] = adopted
    run["seconds"] = round(time.perf_counter() - t_all, 1)
    args.out.write_text(json.dumps(run, indent=1, default=str) + "\n")
    _summary(run)
    print(f"\nwritten: {args.out}  ({run['seconds']} s in all)")
    if failed:
        print(f"FAILED scripts: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _verdict(c: dict[str, Any], markdown: bool = False) -> str:
    if c.get("comparable", True) is False:
        return "not comparable"
    return {True: "yes", False: "**no**" if markdown else "NO", None: "-"}[c["met"]]


def _judged_on(cases: list[dict[str, Any]]) -> str:
    """What the goals of these cases were judged on, in words (a results file records each case's
    ``judge``; files from before the median rule were judged on the best pair)."""
    rules = {c.get("judge", "min") for c in cases if c.get("goal") is not None}
    if rules <= {"median"}:
        return common.JUDGED_ON
    if rules == {"min"}:
        return "judged on the best pair (the rule before the median; this file predates it)"
    return "judged on the median, some cases on the best pair (each case's judge says which)"


def _tally(cases: list[dict[str, Any]]) -> str:
    judged = [c for c in cases if c["met"] is not None]
    text = f"{sum(1 for c in judged if c['met'])} of {len(judged)} goals met"
    off = [c for c in cases if c.get("comparable", True) is False and c.get("goal") is not None]
    return text + (f"; {len(off)} not comparable (load)" if off else "") + f"; {_judged_on(cases)}"


def _summary(run: dict[str, Any]) -> None:
    rows = [(s["stage"], c) for s in run["stages"] for c in s["cases"]]
    if not rows:
        return
    width = max(len(f"{st}: {c['case']}") for st, c in rows)
    print(f"\ngoals {_judged_on([c for _, c in rows])}")
    print(f"{'stage: case':{width}}  {'best':>8} {'median':>8}  {'goal':>10}  {'met':14}  baseline")
    for stage, c in rows:
        goal = "-" if c["goal"] is None else f"{c['direction']} {c['goal']:g}{c['unit']}"
        print(f"{stage + ': ' + c['case']:{width}}  {c['ratio_best']:7.2f}{c['unit']} {c['ratio_median']:7.2f}{c['unit']}"
              f"  {goal:>10}  {_verdict(c):14}  {c['baseline']}")
    for s in run["stages"]:
        if s.get("comparable", True) is False:
            print(f"not comparable: {s['stage']}: {s['why']}")
    threads = run.get("threads")
    print(f"\n{_tally([c for _, c in rows])}"
          + (f" (threads {threads}, load threshold {run.get('max_load')})" if threads is not None else ""))


def _markdown(run: dict[str, Any]) -> None:
    """The summary as the Markdown table of docs/performance.md, with the machine and its load."""
    m = run["machine"]
    sizes = {"smoke": "--smoke", "quick": "--quick"}.get(run.get("tier", ""), "--quick" if run["quick"] else "default sizes")
    threads = f", {run['threads']} thread{'s' if run['threads'] != 1 else ''}, load threshold {run['max_load']:g}" \
        if run.get("threads") is not None else ""
    print(f"Run of {run['started_at']} ({sizes}, {run['seconds']} s{threads}): "
          f"{m['cpu']} (ISA level {m.get('isa_level')}, torch {m.get('torch_capability')}; {m.get('int8_accumulator')}; "
          f"{m.get('onednn_int8')}), {m['cores']} cores, load average before {', '.join(map(str, m['load_average']))}. "
          f"Goals {_judged_on([c for s in run['stages'] for c in s['cases']])}.\n")
    print("| stage | case | best | median | goal | met | baseline (same run) | load before |")
    print("|---|---|---|---|---|---|---|---|")
    for s in run["stages"]:
        load = ", ".join(f"{x:.1f}" for x in s["load_before"])
        for c in s["cases"]:
            goal = "-" if c["goal"] is None else f"{c['direction']} {c['goal']:g}{c['unit']}"
            print(f"| {s['stage']} | {c['case']} | {c['ratio_best']:.2f}{c['unit']} | {c['ratio_median']:.2f}{c['unit']} "
                  f"| {goal} | {_verdict(c, markdown=True)} | {c['baseline']} | {load} |")
    print(f"\n{_tally([c for s in run['stages'] for c in s['cases']])}.")
    for s in run["stages"]:
        if s.get("comparable", True) is False:
            print(f"\nNot comparable: {s['stage']} ({s['why']}).")


if __name__ == "__main__":
    sys.exit(main())
