"""Run every stage benchmark and collect the cases into ``benchmarks/results.json`` (``make bench``).

Each ``benchmarks/bench_<stage>.py`` runs in a subprocess of its own (its memory and threads are its
own, a crash in one does not stop the others) with ``--json``; this script records the machine, the
package versions, the load average before and after each script and its wall time, then prints one
summary table: every case with its ratio, its goal and whether the goal is met.

    python benchmarks/run_all.py                 # every stage, default sizes (under 15 minutes on 2 cores)
    python benchmarks/run_all.py --quick         # smaller sizes: a smoke run of the harness
    python benchmarks/run_all.py --only reads    # stages whose name contains "reads"

Exit status: 0 when every script ran (goals met or not: a missed goal is a finding, printed as NO and
recorded with ``met: false``), 1 when a script failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402

HERE = Path(__file__).parent
#: The order in which the stages run: the short ones first, so a smoke run shows the harness works.
ORDER = ["emulation", "writer", "cold_restart", "scheduling", "reads"]


def scripts() -> list[Path]:
    found = {p.stem.removeprefix("bench_"): p for p in HERE.glob("bench_*.py")}
    return [found[s] for s in ORDER if s in found] + [p for s, p in sorted(found.items()) if s not in ORDER]


def main() -> int:
    ap = common.parser(__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="run only stages whose name contains this")
    ap.add_argument("--out", type=Path, default=HERE / "results.json", help="where the collected results go")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one script may take")
    ap.add_argument("--show", type=Path, default=None, metavar="RESULTS_JSON",
                    help="run nothing: print the summary of an earlier run's results file")
    ap.add_argument("--markdown", action="store_true", help="with --show: the summary as a Markdown table")
    args = ap.parse_args()
    if args.show is not None:
        shown = json.loads(args.show.read_text())
        (_markdown if args.markdown else _summary)(shown)
        return 0
    run: dict[str, object] = {"started_at": datetime.now(UTC).isoformat(timespec="seconds"), "quick": args.quick,
                              "machine": common.machine(), "stages": []}
    failed = []
    t_all = time.perf_counter()
    for script in scripts():
        stage = script.stem.removeprefix("bench_")
        if args.only and not any(o in stage for o in args.only):
            continue
        with tempfile.TemporaryDirectory(prefix="swapcheck-bench-") as tmp:
            out = Path(tmp) / "cases.json"
            cmd = [sys.executable, str(script), "--json", str(out)] + (["--quick"] if args.quick else [])
            print(f"\n=== {stage}: {' '.join(cmd[1:])}", flush=True)
            load_before = common.load_average()
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, cwd=common.REPO, timeout=args.timeout)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = -1
            seconds = time.perf_counter() - t0
            cases = json.loads(out.read_text()) if out.exists() else []
        entry = {"stage": stage, "script": str(script.relative_to(common.REPO)), "returncode": rc,
                 "seconds": round(seconds, 1), "load_before": load_before, "load_after": common.load_average(),
                 "cases": cases}
        run["stages"].append(entry)  # type: ignore[attr-defined]
        if rc != 0:
            failed.append(stage)
    run["seconds"] = round(time.perf_counter() - t_all, 1)
    args.out.write_text(json.dumps(run, indent=1, default=str) + "\n")
    _summary(run)
    print(f"\nwritten: {args.out}  ({run['seconds']} s in all)")
    if failed:
        print(f"FAILED scripts: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _summary(run: dict[str, object]) -> None:
    rows = [(s["stage"], c) for s in run["stages"] for c in s["cases"]]  # type: ignore[attr-defined]
    if not rows:
        return
    width = max(len(f"{st}: {c['case']}") for st, c in rows)
    print(f"\n{'stage: case':{width}}  {'best':>8} {'median':>8}  {'goal':>10}  met  baseline")
    for stage, c in rows:
        goal = "-" if c["goal"] is None else f"{c['direction']} {c['goal']:g}{c['unit']}"
        met = {True: "yes", False: "NO", None: "-"}[c["met"]]
        print(f"{stage + ': ' + c['case']:{width}}  {c['ratio_best']:7.2f}{c['unit']} {c['ratio_median']:7.2f}{c['unit']}"
              f"  {goal:>10}  {met:3}  {c['baseline']}")
    judged = [c for _, c in rows if c["met"] is not None]
    print(f"\n{sum(1 for c in judged if c['met'])} of {len(judged)} goals met")


def _markdown(run: dict[str, object]) -> None:
    """The summary as the Markdown table of docs/performance.md, with the machine and its load."""
    m = run["machine"]  # type: ignore[index]
    print(f"Run of {run['started_at']} ({'--quick' if run['quick'] else 'default sizes'}, {run['seconds']} s): "  # type: ignore[index]
          f"{m['cpu']}, {m['cores']} cores, load average before {', '.join(map(str, m['load_average']))}.\n")
    print("| stage | case | best | median | goal | met | baseline (same run) | load before |")
    print("|---|---|---|---|---|---|---|---|")
    for s in run["stages"]:  # type: ignore[attr-defined]
        load = ", ".join(f"{x:.1f}" for x in s["load_before"])
        for c in s["cases"]:
            goal = "-" if c["goal"] is None else f"{c['direction']} {c['goal']:g}{c['unit']}"
            met = {True: "yes", False: "**no**", None: "-"}[c["met"]]
            print(f"| {s['stage']} | {c['case']} | {c['ratio_best']:.2f}{c['unit']} | {c['ratio_median']:.2f}{c['unit']} "
                  f"| {goal} | {met} | {c['baseline']} | {load} |")
    judged = [c for s in run["stages"] for c in s["cases"] if c["met"] is not None]  # type: ignore[attr-defined]
    print(f"\n{sum(1 for c in judged if c['met'])} of {len(judged)} goals met.")


if __name__ == "__main__":
    sys.exit(main())
