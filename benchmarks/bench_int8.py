"""The INT8 K-depth unit on the CPU it runs on, against one float64 GEMM of its shape (issue #35).

Every INT8 kernel starts from the exact int32 accumulator; ``torch._int_mm`` computes it fast only where
oneDNN has AVX512-VNNI or AMX (elsewhere PyTorch runs a reference loop, 40-90x slower), so
``tasks/kernels/accumulator.py`` takes the fastest exact path of this CPU and a unit shares it between
its kernels and the exact reference. This stage prints the CPU, its ISA level, the path chosen and
oneDNN's implementation, then times, interleaved with the baseline:

* ``int8 kdepth unit`` (goal <= 15x): ``tasks.kinds.kdepth.run`` of one unit at M = N = 256,
  K = 16384 (int8-cutlass-order, int8-triton-order, int8-torch-channelwise and the exact reference,
  real scales, bf16 output: the demo's largest unit), operands drawn included;
* ``accumulator <path>`` (informative): each exact path's ``a @ b`` of the unit's operands, and
  ``torch._int_mm`` itself where it is exact (its reference loop on a CPU without VNNI).

Baseline of each: one float64 GEMM ``[256, 16384] @ [16384, 256]`` (randn) in the same process.

    python benchmarks/bench_int8.py [--repeat 5] [--quick | --smoke] [--threads N] [--json PATH]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import Case, apply_threads, cpu_paths, emit, interleaved, parser, pick  # noqa: E402

STAGE = "int8"
#: One INT8 unit within this many float64 GEMMs of its shape on every CPU (issue #35).
GOAL = 15.0


def main() -> None:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=None, help="timed pairs per case (default 5, quick 3, smoke 1)")
    args = ap.parse_args()
    threads = apply_threads(args.threads)
    import torch

    from tasks.devices import cpu_model
    from tasks.kernels.accumulator import PATHS, accumulator_path, check_path, compute_exact
    from tasks.kinds import kdepth
    from tasks.models.operands import draw_operands

    repeat = args.repeat or pick(args, 5, 3, 1)
    m = n = 256
    k = pick(args, 16384, 16384, 1024)
    cpu = cpu_paths()  # what the figures depend on, as every results record names it
    print(f"CPU {cpu_model()}: ISA level {cpu['isa_level']} (torch {cpu['torch_capability']}; flags "
          f"{' '.join(cpu['isa_flags'])})\n{cpu['int8_accumulator']}\n{cpu['onednn_int8']}"
          + (f"\nnote: {cpu['int_mm_note']}" if cpu["int_mm_note"] else ""), flush=True)
    impls = [{"name": i, "kernel": i, "params": {}}
             for i in ("int8-cutlass-order", "int8-triton-order", "int8-torch-channelwise")]
    params = {"dtype": "int8", "m": m, "n": n, "k": k, "seed": 0, "scale_mode": "real", "out_dtype": "bf16",
              "bias": False, "implementations": impls, "reference": {"name": "exact", "kernel": "exact", "params": {}}}
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, dtype=torch.float64, generator=gen)
    y = torch.randn(k, n, dtype=torch.float64, generator=gen)
    ops = draw_operands("int8", m, n, k, 0, "real")
    a, b = ops["a"], ops["b"]

    cases: list[Case] = []
    extra = {**cpu, "threads": threads, "shape": [m, k, n]}
    t = interleaved({"unit": lambda: kdepth.run(params), "gemm": lambda: x @ y}, repeat)
    cases.append(Case(STAGE, f"int8 kdepth unit {m}x{k}x{n}", f"float64 GEMM {m}x{k}x{n}", t["unit"], t["gemm"],
                      GOAL, notes=f"accumulator {accumulator_path().name}", extra=extra))
    for path in PATHS:
        why = check_path(path)
        if why is not None:
            print(f"accumulator {path}: not exact here ({why}); not timed")
            continue
        t = interleaved({"path": lambda path=path: compute_exact(path, a, b), "gemm": lambda: x @ y}, repeat)
        cases.append(Case(STAGE, f"accumulator {path}", f"float64 GEMM {m}x{k}x{n}", t["path"], t["gemm"], None,
                          notes="informative", extra={"path": path}))
    emit(cases, args.json, title=f"INT8 kdepth unit and accumulator paths vs a float64 GEMM ({cpu['isa_level']})")


if __name__ == "__main__":
    main()
