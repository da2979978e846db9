"""Speed of each matmul algorithm's exact emulation relative to torch.matmul, measured in the same run.

Baseline: ``torch.matmul`` of fp32 ``[M, K] @ [K, N]`` on the same shape (default M = N = 256,
K = 4096), timed before and after the algorithms (the faster of the two is used: on a shared machine
the slower one measures the neighbours).  A ratio of 20.0 means twenty times the baseline's time.  Rows: the accumulation format
(fp32), the inputs' dtype (fp32 randn, or bf16 randn whose products are exact in fp32) and fma.

    python benchmarks/numerics_speed.py [--m 256] [--k 4096] [--repeat 3] [--threads 0]

Which path each row takes (tasks/numerics/orders.py): fp32 inputs with ``fma=False`` multiply and add
in native fp32 (both IEEE, one rounding each); bf16 inputs have products exact in fp32, so fma is
irrelevant and each step is one native add; fp32 inputs with ``fma=True`` add the exact float64
product, cast once to fp32, and test each sum for an fp32 midpoint (the rare flagged ones are
recomputed with TwoSum).
"""

from __future__ import annotations

import argparse
import os
import time


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    import torch

    from tasks.numerics import products as P

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--quick", action="store_true", help="skip exact accumulation and slots16")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    m = n = args.m
    k = args.k
    g = torch.Generator().manual_seed(0)
    a32 = torch.randn(m, k, generator=g)
    b32 = torch.randn(k, n, generator=g)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    def baseline() -> float:
        return best_of(lambda: torch.matmul(a32, b32), max(3 * args.repeat, 10))

    base = baseline()
    base_name = "torch.matmul fp32"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"M = N = {m}, K = {k}, torch threads = {torch.get_num_threads()}, load average {load}")
    print(f"{'algorithm':40} {'inputs':7} {'fma':5} {'seconds':>9} {'ratio':>7}  baseline")
    rows = []
    for fma in (False, True):
        rows += [
            (P.matmul_sequential("float32", fma=fma), "fp32", fma),
            (P.matmul_pairwise("float32", fma=fma), "fp32", fma),
            (P.matmul_blocked("float32", 128, fma=fma), "fp32", fma),
        ]
    rows += [
        (P.matmul_sequential("float32"), "bf16", True),
        (P.matmul_pairwise("float32"), "bf16", True),
        (P.matmul_blocked("float32", 128), "bf16", True),
    ]
    if not args.quick:
        rows += [
            (P.matmul_exact_accumulation("float32"), "fp32", True),
            (P.matmul_slots16("float32"), "fp32", False),
        ]
    times = []
    for alg, inputs, _ in rows:
        a, b = (a32, b32) if inputs == "fp32" else (a16, b16)
        times.append(best_of(lambda alg=alg, a=a, b=b: alg.run(a, b), args.repeat))
    base = min(base, baseline())  # measured before and after: the faster is the less disturbed
    print(f"{base_name:40} {'fp32':7} {'-':5} {base:9.4f} {1.0:7.2f}  (baseline)")
    for (alg, inputs, fma), t in zip(rows, times, strict=True):
        name = alg.name + (f"({alg.block_size})" if hasattr(alg, "block_size") else "")
        print(f"{name:40} {inputs:7} {str(fma):5} {t:9.4f} {t / base:7.2f}  {base_name}")


if __name__ == "__main__":
    main()
