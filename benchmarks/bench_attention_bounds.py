"""Tightness of the attention bounds: per kernel and the algorithm that describes it, the ratio of the
bound to the largest error observed over N random cases (issue #17).

Each case draws q [1, 2, L, E], k and v [1, 2, S, E] (randn, fp32, E = 16) with a random logit size
(q and k times 0.5, 1 or 3) and one of: no mask, causal, an ALiBi float mask (slope 2^(-8/12)).  For every kernel
of ``tasks.numerics.attention_emulate.KERNELS`` it computes the kernel's exact emulation, forward
(out, logsumexp) and fused backward (dq, dk, dv, given that forward's out and logsumexp), and the
bounds of ``AttentionAlgorithm(**DESCRIBED_BY[kernel])``, all measured from the exact result (the
bounds' centre, checked against the 60-digit reference by the tests).  Per kernel and output:

* ``bound/err max``: the largest bound over all elements of all cases, over the largest error
  observed (the issue's figure: how far the worst case of the bound is from the worst error seen);
* ``closest``: the smallest ratio bound / |error| of any single element (>= 1 means every element
  was inside; how close any element came to the edge);
* ``outside``: elements outside the bound (must be 0).

As a harness case (``common.Case``, one per kernel and output, collected by ``run_all.py``): there is
no baseline time and no goal. ``seconds`` holds each random case's largest bound and
``baseline_seconds`` its largest error (``quantity`` says so), so the ratios are per-case tightness
figures: ``best`` is the tightest case, ``median`` the middle one; ``extra`` holds the figures above
(``bound_over_err_max``, ``closest``, ``outside``, ``max_err``, ``max_bound``). A case where any element
falls outside its bound is reported in the notes (``OUTSIDE``); the script then exits 1 (a bound that
does not hold is an error, not a finding).

Sizes: 60 random cases per kernel (``--quick`` 12; ``--smoke`` 1, a check of the harness), every
kernel. Threads: ``--threads`` (default 1) for torch (``common.apply_threads``).

    python benchmarks/bench_attention_bounds.py [--cases 60] [--seed 0] [--length 32] [--kernel NAME]
                                                [--quick | --smoke] [--threads N] [--json PATH]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402

QUANTITY = "largest absolute error bound (seconds) / largest absolute error (baseline_seconds), per random case"


def _case(rng: np.random.Generator, length: int) -> tuple[Any, ...]:
    import torch

    lq, e = 8, 16
    s = float(rng.choice([0.5, 1.0, 3.0]))
    q = torch.from_numpy(rng.standard_normal((1, 2, lq, e)) * s).float()
    k = torch.from_numpy(rng.standard_normal((1, 2, length, e)) * s).float()
    v = torch.from_numpy(rng.standard_normal((1, 2, length, e))).float()
    g = torch.from_numpy(rng.standard_normal((1, 2, lq, e))).float()
    kw: dict[str, Any] = {}
    kind = rng.integers(3)
    if kind == 1:
        kw["is_causal"] = True
    elif kind == 2:
        i, j = np.arange(lq)[:, None] + (length - lq), np.arange(length)[None, :]
        # an ALiBi slope of a 12-head model, 2^(-8/12): its fp32 biases are not bf16 values
        kw["attn_mask"] = torch.from_numpy(-(2.0 ** (-8 / 12)) * np.abs(i - j)).float()
    return q, k, v, g, kw


def main() -> int:
    ap = common.parser(__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=None, help="random cases per kernel (default 60; --quick 12; --smoke 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--length", type=int, default=32, help="keys per row (S)")
    ap.add_argument("--kernel", action="append", help="only these kernels (repeatable; default all)")
    args = ap.parse_args()
    args.cases = args.cases or common.pick(args, 60, 12, 1)

    import torch  # noqa: F401  (imported before apply_threads, which sets an imported torch's count)

    from tasks.numerics import AttentionAlgorithm
    from tasks.numerics.attention import (
        _prepare,  # the default options: fp32 compute, any order, no flushing
    )
    from tasks.numerics.attention_bounds import _problem
    from tasks.numerics.attention_emulate import DESCRIBED_BY, KERNELS

    print(f"threads {common.apply_threads(args.threads)}", flush=True)
    rng = np.random.default_rng(args.seed)
    cases = [_case(rng, args.length) for _ in range(args.cases)]
    parts = ("out", "logsumexp", "dq", "dk", "dv")
    print(f"{args.cases} cases, q [1, 2, 8, 16], k and v [1, 2, {args.length}, 16], fp32; "
          "bound/err max = largest bound / largest error; closest = min over elements of bound / |error|")  # fmt: skip
    print(f"{'kernel':<24} {'output':<10} {'bound/err max':>14} {'closest':>9} {'outside':>8} "
          f"{'max err':>10} {'max bound':>10}")  # fmt: skip
    t0 = time.perf_counter()
    out: list[common.Case] = []
    for name, ker in KERNELS.items():
        if args.kernel and name not in args.kernel:
            continue
        alg = AttentionAlgorithm(**DESCRIBED_BY[name])
        stats = {p: {"err": 0.0, "tol": 0.0, "closest": np.inf, "outside": 0} for p in parts}
        per_case: dict[str, tuple[list[float], list[float]]] = {p: ([], []) for p in parts}
        for q, k, v, g, kw in cases:
            fwd = ker.forward(q, k, v, **kw)
            bwd = ker.backward(q, k, v, g, fwd.out, fwd.logsumexp, **kw)
            tol = alg.tolerance(q, k, v, **kw)
            btol = alg.backward_tolerance(q, k, v, g, fwd.out, fwd.logsumexp, **kw)
            # the exact centres the bounds are measured from
            p = _problem(q, k, v, kw.get("attn_mask"), kw.get("is_causal", False), None, False)
            cen = alg._backward(p, g, fwd.out, fwd.logsumexp, 0, _prepare(p, "fp32", "any-order", False))[0]
            got = {"out": (fwd.out, p.o, tol.out), "logsumexp": (fwd.logsumexp, p.lse, tol.logsumexp),
                   "dq": (bwd.dq, cen.dq, btol.dq), "dk": (bwd.dk, cen.dk, btol.dk),
                   "dv": (bwd.dv, cen.dv, btol.dv)}  # fmt: skip
            for part, (val, centre, t) in got.items():
                err = np.abs(val - centre)
                st = stats[part]
                st["err"] = max(st["err"], float(err.max()))
                st["tol"] = max(st["tol"], float(t.max()))
                per_case[part][0].append(float(t.max()))
                per_case[part][1].append(float(err.max()))
                with np.errstate(divide="ignore"):
                    st["closest"] = min(st["closest"], float(np.min(np.where(err > 0, t / err, np.inf))))
                st["outside"] += int(np.count_nonzero(err > t))
        for part in parts:
            st = stats[part]
            ratio = st["tol"] / st["err"] if st["err"] else float("inf")
            print(f"{name:<24} {part:<10} {ratio:>14.3g} {st['closest']:>9.3g} {st['outside']:>8d} "
                  f"{st['err']:>10.3g} {st['tol']:>10.3g}")  # fmt: skip
            bounds, errs = per_case[part]
            out.append(common.Case(
                "attention_bounds", f"{name} {part}", "largest error observed (exact emulation vs exact centre)",
                bounds, errs, goal=None, quantity=QUANTITY,
                notes=f"bound/err max {ratio:.3g}, closest {st['closest']:.3g}, "
                      + (f"OUTSIDE {st['outside']}" if st["outside"] else "outside 0"),
                extra={"kernel": name, "output": part, "cases": args.cases, "length": args.length,
                       "seed": args.seed, "bound_over_err_max": ratio, "closest": st["closest"],
                       "outside": st["outside"], "max_err": st["err"], "max_bound": st["tol"]}))
    print(f"elapsed {time.perf_counter() - t0:.1f} s")
    common.emit(out, args.json, title=f"attention bounds: per-case largest bound / largest error, {args.cases} "
                                      f"cases per kernel (no goal: tightness figures)")
    outside = [c.case for c in out if c.extra["outside"]]
    if outside:
        print(f"elements outside their bound: {', '.join(outside)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
