"""Speed of each CPU kernel relative to a named baseline, measured in the same run.

Baselines: for INT8, the bare exact accumulation on this CPU's path (``tasks.kernels.accumulator``:
``torch._int_mm`` where oneDNN has VNNI or AMX, a float GEMM of the integers elsewhere; what every
INT8 kernel starts with);
for FP8, ``torch._scaled_mm`` on the CPU. A ratio of 3.0 means three times the baseline's time.
The K-depth demo's budget depends on these: the exact emulations must stay within a small factor of
the baseline at M = N = 256 up to K = 16384.

    python benchmarks/kernel_speed.py [--k 1024,4096,16384] [--repeat 3]
"""

from __future__ import annotations

import argparse
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

    from tasks.kernels import get_kernel
    from tasks.kernels.accumulator import accumulator_path, compute_exact
    from tasks.models.operands import draw_operands

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default="1024,4096,16384")
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    int8 = ["int8-cutlass-order", "int8-triton-order", "int8-torch-channelwise", "exact"]
    fp8 = ["fp8-sequential", "fp8-pairwise", "fp8-blocked-128", "exact"]
    print(f"{'dtype':8} {'K':>6} {'kernel':24} {'seconds':>9} {'ratio':>7}  baseline")
    for k in (int(x) for x in args.k.split(",")):
        for dtype, names in (("int8", int8), ("fp8_e4m3", fp8)):
            ops = draw_operands(dtype, args.m, args.m, k, 0, "real")
            call = (ops["a"], ops["b"], ops["scale_a"], ops["scale_b"], torch.bfloat16)
            if dtype == "int8":
                path = accumulator_path().name
                base_name = f"accumulator {path}"
                base = best_of(lambda ops=ops, path=path: compute_exact(path, ops["a"], ops["b"]), args.repeat)
            else:
                base_name = "fp8-torch-scaled-mm"
                kern = get_kernel(base_name)
                base = best_of(lambda kern=kern, call=call: kern(*call), args.repeat)
            print(f"{dtype:8} {k:>6} {base_name:24} {base:9.4f} {1.0:7.2f}  (baseline)")
            for name in names:
                kern = get_kernel(name)
                t = best_of(lambda kern=kern, call=call: kern(*call), args.repeat)
                print(f"{dtype:8} {k:>6} {name:24} {t:9.4f} {t / base:7.2f}  {base_name}")


if __name__ == "__main__":
    main()
