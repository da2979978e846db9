"""Does ``check fuzz`` reach the shape-dependent defects within its budget? (issue 26)

Not one of ``make bench``'s stages: it fuzzes each kernel once per seed, one run at a time, in this
process (the same :func:`tasks.checks.fuzz.fuzz` that ``swapcheck check fuzz --kernel K --budget B
--seed S`` runs), and prints one line per (kernel, seed):

* ``found``: whether a failing trial was found within the budget (for a correct kernel: a false alarm);
* ``trials``: trials run up to and including the first failing one (all trials run, if none failed);
* ``trial seconds``: the seconds those trials took (both checks; the shrinking after a find excluded);
* ``total seconds``: the whole run, shrinking included;
* ``shape``: the failing trial's drawn shape, the failing check's inputs (the bounds recipe, or exact
  match's input kind: binary / cancelling-runs) and layout, and what it shrank to.

Then, per kernel, found-within-budget as a count of seeds and a Clopper-Pearson 95% interval on the
probability (scipy.stats.binomtest), and the median trials and seconds to find.

    .venv/bin/python benchmarks/fuzz_reach.py [--kernels a,b] [--seeds 1-10] [--budget 60] [--json out.json]

Default kernels: the planted boundary defects of tests/_fuzz_planted.py (``PLANTED`` and
``PLANTED_FAR``). ``--correct`` instead fuzzes every registered correct CPU kernel (``swapcheck
kernels list``: those available here) and ``_planted_kernels:correct`` (a plain matmul).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

CORRECT_CPU = ("exact", "fp8-blocked", "fp8-pairwise", "fp8-sequential", "fp8-torch-scaled-mm",
               "int8-cutlass-order", "int8-onednn", "int8-torch-channelwise", "int8-triton-order",
               "_planted_kernels:correct")  # fmt: skip


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def measure(kernel: str, seed: int, budget: float) -> dict[str, Any]:
    from tasks.checks import load_subject
    from tasks.checks.fuzz import fuzz

    subject = load_subject(kernel)
    t0 = time.monotonic()
    r = fuzz(subject, budget, seed)
    total = time.monotonic() - t0
    row: dict[str, Any] = {"kernel": kernel, "seed": seed, "budget_s": budget, "found": bool(r.failures),
                           "trials": len(r.trials), "trial_seconds": round(sum(t.seconds for t in r.trials), 2),
                           "total_seconds": round(total, 2), "shape": None}  # fmt: skip
    if r.failures:
        f = r.failures[0]
        o = f.original.plan
        inputs = o.recipe if f.check == "bounds" else o.exact_inputs  # what the failing check drew
        row["shape"] = f"{o.shape} {inputs} {o.layout} ({f.check}) -> {f.shrunk.plan.shape}"
    return row


def main() -> None:
    from _fuzz_planted import PLANTED, PLANTED_FAR
    from scipy.stats import binomtest

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", default=None, help="comma-separated kernel references")
    ap.add_argument("--correct", action="store_true", help="fuzz the correct CPU kernels (false alarms)")
    ap.add_argument("--seeds", default="1-10")
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.kernels:
        kernels = args.kernels.split(",")
    elif args.correct:
        kernels = list(CORRECT_CPU)
    else:
        kernels = [f"_fuzz_planted:{k}" for k in (*PLANTED_FAR, *PLANTED)]
    rows = []
    print(f"{'kernel':<45} {'seed':>4} {'found':>5} {'trials':>6} {'trial s':>8} {'total s':>8}  shape")
    for kernel in kernels:
        for seed in _seeds(args.seeds):
            row = measure(kernel, seed, args.budget)
            rows.append(row)
            print(f"{kernel:<45} {seed:>4} {'yes' if row['found'] else 'no':>5} {row['trials']:>6} "
                  f"{row['trial_seconds']:>8.1f} {row['total_seconds']:>8.1f}  {row['shape'] or '-'}", flush=True)
    print()
    for kernel in kernels:
        group = [r for r in rows if r["kernel"] == kernel]
        found = [r for r in group if r["found"]]
        ci = binomtest(len(found), len(group)).proportion_ci(0.95, method="exact")
        med = (f"median trials to find {statistics.median(r['trials'] for r in found):g}, median trial seconds "
               f"to find {statistics.median(r['trial_seconds'] for r in found):.1f}") if found else "none found"
        print(f"{kernel}: found within {args.budget:g} s for {len(found)}/{len(group)} seeds "
              f"(Clopper-Pearson 95% interval on the probability [{ci.low:.2f}, {ci.high:.2f}]); {med}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
