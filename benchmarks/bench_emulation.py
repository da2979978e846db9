"""Speed of the exact emulations of the matmul algorithms (``tasks.numerics.products``) relative to
``torch.matmul`` in fp32 on the same shape, timed interleaved in the same run (issue #14).

Each row is one algorithm x accumulation format x input dtype x fma.  The candidate is ``alg.run(A, B)``;
the baseline is ``torch.matmul`` of the same ``A [M, K]`` and ``B [K, N]`` in fp32 (randn data), each
round timing ``--calls`` matmuls and keeping the fastest, so one matmul's time is not one scheduler
tick.  The ratio is candidate time over baseline time, judged on the least disturbed round (the
minimum).  Goals: 10x for fp32 accumulators, 30x for 16-bit (bf16, fp16) accumulators.

    python benchmarks/bench_emulation.py [--m 256] [--k 4096] [--repeat 3] [--quick | --smoke] [--threads N]
                                         [--json PATH]

The ``path`` column says which exact method each row takes (docs/numerics.md, "Speed"): the rows call
the public ``alg.run``, which dispatches to a compiled numba kernel (tasks/numerics/compiled.py)
where one covers the configuration.  The first call of a row (the warm-up, not timed in the ratio)
loads the kernel from numba's cache or compiles it; its time is printed and recorded as
``first_call_s``.  Torch (the baseline) and numba (the candidate) run with the same explicit thread
count, ``--threads`` (default 1; ``common.apply_threads``), recorded per row as ``threads`` and
``numba_threads``.  ``--smoke`` runs four rows at M = N = 16, K = 128: a check of the harness.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402


def _path(alg: Any, a: Any, b: Any) -> str:
    """In words, the exact method ``alg.run(a, b)`` takes (kept in step with tasks/numerics/products.py
    and compiled.py): the public entry point dispatches to a compiled kernel where one covers it."""
    from tasks.numerics import compiled

    acc = alg.format.name
    name = alg.name
    if name == "matmul_exact_accumulation":
        if compiled.available():
            return ("numba: fp64 BLAS over 16 K-blocks + certified bound per output; undecided outputs "
                    "re-summed by compiled TwoSum, then in digits")
        return "torch: one fp64 BLAS matmul + certified bound; undecided outputs re-summed, then in digits"
    if name == "matmul_slots16":
        return "torch: per-output int32 sort, runs interleaved with +0 padding, numpy row-by-row fp32 adds"
    x, y = compiled.operands32(a), compiled.operands32(b)
    assert x is not None and y is not None
    which = compiled.path(alg.format, alg.rounding, x[1], y[1], x[0], y[0])
    tree = name == "matmul_pairwise"
    if which == "f32" and acc == "fp32":
        if alg.fma:
            how = "fp32 llvm.fma per step" + ("; leaf pairs: fp64 sum rounded to odd" if tree else "")
        else:
            how = "fp32 multiply, fp32 tree" if tree else "fp32 multiply + fp32 add per step"
        return f"numba f32 kernel: {how}"
    if which == "f32":
        how = "fp32 TwoSum rounded to odd" if alg.fma else f"products and fp32 sums rounded to {acc}"
        return f"numba f32 kernel: {how}, rounded to {acc} (fp16: hardware conversion where the CPU has one)"
    if which == "gen":
        return "numba fp64 kernel: TwoSum + bit rounding to the format per addition"
    return "torch engines (numba not available)"


#: The rows a --smoke run keeps (one per kind of path: fp32 kernel, exact, 16-bit accumulator).
SMOKE_ROWS = ("sequential acc=fp32 in=fp32 fma=False", "sequential acc=fp32 in=bf16 fma=True",
              "exact_accumulation acc=fp32 in=fp32 fma=True", "sequential acc=bf16 in=bf16 fma=False")


def _rows(quick: bool) -> list[tuple[Any, str, bool, float]]:
    """(algorithm, inputs dtype, fma, goal)."""
    from tasks.numerics import products as P

    rows: list[tuple[Any, str, bool, float]] = []
    for fma in (False, True):
        for alg in (P.matmul_sequential("float32", fma=fma), P.matmul_pairwise("float32", fma=fma),
                    P.matmul_blocked("float32", 128, fma=fma)):  # fmt: skip
            rows.append((alg, "fp32", fma, 10.0))
    for fma in (False, True):
        for alg in (P.matmul_sequential("float32", fma=fma), P.matmul_pairwise("float32", fma=fma),
                    P.matmul_blocked("float32", 128, fma=fma)):  # fmt: skip
            rows.append((alg, "bf16", fma, 10.0))
    rows.append((P.matmul_exact_accumulation("float32"), "fp32", True, 10.0))
    rows.append((P.matmul_exact_accumulation("float32"), "bf16", True, 10.0))
    rows.append((P.matmul_slots16("float32"), "fp32", False, 10.0))
    for fmt, inputs in (("bfloat16", "bf16"), ("float16", "fp16")):
        for fma in (False, True):
            algs = [P.matmul_sequential(fmt, fma=fma), P.matmul_pairwise(fmt, fma=fma),
                    P.matmul_blocked(fmt, 128, fma=fma)]  # fmt: skip
            if quick:
                algs = algs[:1]
            for alg in algs:
                rows.append((alg, inputs, fma, 30.0))
    return rows


def _label(alg: Any, inputs: str, fma: bool) -> str:
    name = alg.name.removeprefix("matmul_")
    if hasattr(alg, "block_size"):
        name += f"({alg.block_size})"
    return f"{name} acc={alg.format.name} in={inputs} fma={fma}"


def main(argv: list[str] | None = None) -> None:
    import torch

    ap = common.parser(__doc__.splitlines()[0] if __doc__ else "bench_emulation")
    ap.add_argument("--m", type=int, default=None, help="M = N (default 256; --quick: 64; --smoke: 16)")
    ap.add_argument("--k", type=int, default=None, help="K (default 4096; --quick: 1024; --smoke: 128)")
    ap.add_argument(
        "--repeat", type=int, default=None, help="timed rounds per row (default 3; --quick: 2; --smoke: 1)"
    )
    ap.add_argument(
        "--calls", type=int, default=10, help="matmuls per baseline round (the fastest counts)"
    )
    ap.add_argument("--only", default="", help="run only rows whose label contains this text")
    args = ap.parse_args(argv)
    smoke = common.tier(args) == "smoke"
    m = args.m or common.pick(args, 256, 64, 16)
    k = args.k or common.pick(args, 4096, 1024, 128)
    repeat = args.repeat or common.pick(args, 3, 2, 1)
    calls = args.calls if not smoke else min(args.calls, 2)
    # numba (the compiled paths) is imported here, after the environment has the thread count
    threads = common.apply_threads(args.threads, numba=True)
    g = torch.Generator().manual_seed(0)
    a32 = torch.randn(m, k, generator=g)
    b32 = torch.randn(k, m, generator=g)
    inputs = {"fp32": (a32, b32), "bf16": (a32.bfloat16(), b32.bfloat16()),
              "fp16": (a32.half(), b32.half())}  # fmt: skip

    def baseline() -> float:
        best = float("inf")
        for _ in range(calls):
            t0 = time.perf_counter()
            torch.matmul(a32, b32)
            best = min(best, time.perf_counter() - t0)
        return best

    cases: list[common.Case] = []
    print(f"M = N = {m}, K = {k}, threads {threads}, rounds = {repeat}")
    for alg, kind, fma, goal in _rows(args.quick or smoke):
        label = _label(alg, kind, fma)
        if args.only and args.only not in label:
            continue
        if smoke and label not in SMOKE_ROWS:
            continue
        a, b = inputs[kind]
        base_times: list[float] = []
        fns: dict[str, Callable[[], Any]] = {
            "candidate": lambda alg=alg, a=a, b=b: alg.run(a, b),
            "baseline": lambda base_times=base_times: base_times.append(baseline()),
        }
        t0 = time.perf_counter()
        alg.run(a, b)  # first call: kernel load or JIT compile, reported, not in the ratio
        first = time.perf_counter() - t0
        times = common.interleaved(fns, repeat=repeat, warmup=1)
        path = _path(alg, a, b)
        case = common.Case(stage="emulation", case=label, baseline=f"torch.matmul fp32 ({m}x{k}x{m})",
                           seconds=times["candidate"], baseline_seconds=base_times[-repeat:], goal=goal,
                           notes=f"{path}; first call {first:.2f} s (not in the ratio)",
                           extra={"m": m, "n": m, "k": k, "threads": torch.get_num_threads(),
                                  "numba_threads": threads.get("numba"), "path": path,
                                  "first_call_s": first, "load_average": common.load_average()})  # fmt: skip
        cases.append(case)
        print(f"  {label:48} {case.ratio_min:9.2f}x (median {case.ratio_median:.2f}x, "
              f"{min(case.seconds) * 1e3:.1f} ms; first call {first:.2f} s; row took "
              f"{time.perf_counter() - t0:.1f} s)  [{path}]",
              flush=True)  # fmt: skip
    common.emit(cases, args.json, title=f"bench_emulation: exact emulation vs torch.matmul fp32, "
                                        f"M = N = {m}, K = {k}")  # fmt: skip


if __name__ == "__main__":
    main()
