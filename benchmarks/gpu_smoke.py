"""GPU smoke test: the GPU kernels against their CPU emulations, the correctness checks, and K-depth.

Run on a machine with one NVIDIA GPU, no network needed, in well under 8 minutes::

    python benchmarks/gpu_smoke.py                    # or: infra/gpu-smoke.sh
    python benchmarks/gpu_smoke.py --out my.txt --budget-s 300

Sections (each prints what it did, or why it was skipped):

1. environment: versions (torch, CUDA, driver, vLLM), the GPU, each GPU kernel's availability;
2. emulation: each GPU kernel against the CPU kernel that emulates its epilogue bit for bit
   (``vllm-cutlass`` vs ``int8-cutlass-order``, ``vllm-triton`` vs ``int8-triton-order`` with the
   installed vLLM's bias mode; reference/vllm-kernels.md §2.1, §2.2), aligned and unaligned shapes
   (the unaligned one shows ``vllm-cutlass`` falling back to Triton, §1.2 Pitfall 1);
3. checks: ``tasks.checks`` exact-match and bounds on each available GPU kernel (skipped with a
   note when the checks package is absent);
4. K-depth: ``tasks.models.operands.draw_operands`` operands moved to the GPU; ``vllm-cutlass`` vs
   ``vllm-triton`` (INT8) and ``torch-scaled-mm-cuda`` fast vs precise accumulation (FP8), each
   also against the exact reference, under real and power-of-two scales; the table is printed last.

Without CUDA it prints ``skipped: <why>`` and exits 0.  Without vLLM the vLLM kernels are skipped
and the torch FP8 kernels still run.  The output is written to ``--out`` (default
``benchmarks/results/gpu-smoke-<date>-<gpu>.txt``; nothing is written by default when skipped).
Exit code 1 when a section crashed or power-of-two INT8 scales did not give bit-identical outputs
(every epilogue order must agree there); otherwise 0 -- differences elsewhere are findings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import platform
import re
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # runs from a checkout without installing

GPU_KERNELS = ("vllm-cutlass", "vllm-cutlass-raw", "vllm-triton", "torch-scaled-mm-cuda")


class Report:
    """Prints every line and keeps it for the output file."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(self.lines) + "\n")


class Budget:
    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.seconds = seconds

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except Exception:
        return "unknown (nvidia-smi not runnable)"


def _kernel(name: str, **params: Any) -> Any:
    from tasks.kernels import get_kernel

    return get_kernel(name, **params)


def _run(kernel: Any, ops: dict[str, Any], out_dtype: Any, device: str) -> Any:
    """The kernel's output on the CPU, operands moved to ``device``; waits for the GPU."""
    moved = {k: (v.to(device) if v is not None else None) for k, v in ops.items()}
    out = kernel(moved["a"], moved["b"], moved["scale_a"], moved["scale_b"], out_dtype, moved["bias"])
    return out.to("cpu")


def section_environment(rep: Report) -> dict[str, Any]:
    import torch

    from tasks.kernels import list_kernels
    from tasks.kernels.cuda import cuda_reason, vllm_reason, vllm_version

    rep("== environment")
    rep(f"date        {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}")
    rep(f"host        {socket.gethostname()} ({platform.machine()}, python {platform.python_version()})")
    rep(f"torch       {torch.__version__} (CUDA build {torch.version.cuda})")
    rep(f"vllm        {vllm_version() or 'not installed'}" + (f" -- {vllm_reason()}" if vllm_reason() else ""))
    info: dict[str, Any] = {"cuda": cuda_reason(), "vllm": vllm_reason()}
    if info["cuda"] is None:
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = torch.cuda.get_device_name(0)
        rep(f"gpu         {info['gpu']} (capability {props.major}.{props.minor}, "
            f"{props.total_memory / 2**30:.0f} GiB), driver {_driver()}")
    rows = {r["name"]: r for r in list_kernels()}
    for name in GPU_KERNELS:
        r = rows.get(name)
        state = "available" if r and r["available"] else f"unavailable: {r['reason'] if r else 'not registered'}"
        rep(f"kernel      {name:22s} {state}")
    info["available"] = {n: bool(rows.get(n, {}).get("available")) for n in GPU_KERNELS}
    return info


def section_emulation(rep: Report, avail: dict[str, bool]) -> bool:
    """GPU kernels vs the CPU emulations of their epilogues; returns False if a section crashed."""
    import torch

    from tasks.comparison import compare
    from tasks.models.operands import draw_operands
    from tasks.numerics import get_format

    rep()
    rep("== emulation: GPU kernel vs the CPU kernel that emulates its epilogue (differing / elements)")
    if not any(avail[n] for n in ("vllm-cutlass", "vllm-cutlass-raw", "vllm-triton")):
        rep("skipped: no vLLM kernel available (see environment)")
        return True
    fmt = get_format(torch.bfloat16)
    shapes = [(64, 4096, 1024), (200, 1000, 520)]  # the second: K and N not multiples of 16
    for m, k, n in shapes:
        for bias in (False, True):
            ops = draw_operands("int8", m, n, k, 0, "real", "bf16", bias)
            for name in ("vllm-cutlass", "vllm-cutlass-raw", "vllm-triton"):
                if not avail[name]:
                    continue
                kern = _kernel(name)
                ok, why = kern.supports(m, n, k, m, n, bias)
                label = f"{name:17s} M={m:<4d} K={k:<5d} N={n:<5d} bias={str(bias):5s}"
                if not ok:
                    rep(f"{label} refused: {why}")
                    continue
                counterpart: dict[str, Any] = (
                    kern.cpu_counterpart(k, n) if hasattr(kern, "cpu_counterpart")
                    else {"kernel": "int8-cutlass-order", "params": {}}
                )
                emu = _kernel(counterpart["kernel"], **counterpart["params"])
                got = _run(kern, ops, torch.bfloat16, "cuda")
                want = _run(emu, ops, torch.bfloat16, "cpu")
                c = compare(got, want, fmt)
                note = " (fell back to Triton, §1.2 Pitfall 1)" if getattr(kern, "last_fallback", False) else ""
                rep(f"{label} vs {counterpart['kernel']}{counterpart['params'] or ''}: "
                    f"{c['differing']}/{c['elements']}, max {c['max_spacing']} spacing(s){note}")
    return True


def section_checks(rep: Report, avail: dict[str, bool], trials: int, budget: Budget) -> bool:
    import torch

    rep()
    rep("== checks: tasks.checks exact-match and bounds (algorithm 'any') on each GPU kernel")
    if importlib.util.find_spec("tasks.checks") is None:
        rep("skipped: the checks package (tasks.checks) is not in this checkout")
        return True
    try:
        checks = importlib.import_module("tasks.checks")
    except Exception as exc:
        rep(f"skipped: tasks.checks does not import: {type(exc).__name__}: {exc}")
        return True
    subjects: list[tuple[str, str, dict[str, Any], str]] = [
        ("vllm-cutlass", "vllm-cutlass", {}, "int8"),
        ("vllm-cutlass-raw", "vllm-cutlass-raw", {}, "int8"),
        ("vllm-triton", "vllm-triton", {}, "int8"),
        ("torch-scaled-mm-cuda(precise)", "torch-scaled-mm-cuda", {"use_fast_accum": False}, "fp8_e4m3"),
        ("torch-scaled-mm-cuda(fast)", "torch-scaled-mm-cuda", {"use_fast_accum": True}, "fp8_e4m3"),
    ]
    aligned = [(64, 1024, 256), (48, 4096, 128)]
    unaligned = [(33, 1000, 72)]
    ok = True
    for label, name, params, operands in subjects:
        if not avail[name]:
            rep(f"{label:30s} skipped (unavailable)")
            continue
        if budget.left() < 60:
            rep(f"{label:30s} skipped (time budget)")
            continue
        shapes = aligned + (unaligned if name in ("vllm-cutlass", "vllm-triton") else [])
        try:
            subject = checks.load_subject(name, params, operands=operands)
            for check, fn in (("exact-match", checks.run_exact_match), ("bounds", checks.run_bounds)):
                t0 = time.monotonic()
                res = fn(subject, shapes, dtype=torch.bfloat16, trials=trials)
                verdict = getattr(res.verdict, "name", str(res.verdict))
                rep(f"{label:30s} {check:12s} {verdict:22s} checked {res.checked}, mismatches "
                    f"{res.mismatches} ({time.monotonic() - t0:.1f} s)")
        except Exception as exc:
            ok = False
            rep(f"{label:30s} ERROR {type(exc).__name__}: {exc}")
    return ok


def section_kdepth(rep: Report, avail: dict[str, bool], ks: list[int], m: int, n: int, seeds: int,
                   budget: Budget) -> tuple[list[dict[str, Any]], bool]:
    import torch

    from tasks.comparison import compare
    from tasks.models.operands import draw_operands
    from tasks.numerics import get_format

    rep()
    rep(f"== K-depth: M={m}, N={n}, K in {ks}, {seeds} seed(s), scales real and pow2, bf16 output")
    fmt = get_format(torch.bfloat16)
    plans: list[tuple[str, list[tuple[str, Any, str]], list[tuple[str, str]]]] = []
    if avail["vllm-cutlass"] and avail["vllm-triton"]:
        plans.append(("int8", [("cutlass", _kernel("vllm-cutlass"), "cuda"), ("triton", _kernel("vllm-triton"), "cuda"),
                               ("exact", _kernel("exact"), "cpu")],
                      [("cutlass", "triton"), ("cutlass", "exact"), ("triton", "exact")]))
    else:
        rep("int8: skipped (vllm-cutlass and vllm-triton need CUDA and vLLM 0.29-0.32; see environment)")
    if avail["torch-scaled-mm-cuda"]:
        plans.append(("fp8_e4m3", [("fast", _kernel("torch-scaled-mm-cuda", use_fast_accum=True), "cuda"),
                                   ("precise", _kernel("torch-scaled-mm-cuda", use_fast_accum=False), "cuda"),
                                   ("exact", _kernel("exact"), "cpu")],
                      [("fast", "precise"), ("fast", "exact"), ("precise", "exact")]))
    else:
        rep("fp8: skipped (torch-scaled-mm-cuda unavailable; see environment)")
    agg: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    ok = True
    for dtype, impls, pairs in plans:
        for k in ks:
            for scale in ("real", "pow2"):
                for seed in range(seeds):
                    if budget.left() < 20:
                        rep(f"{dtype} K={k} {scale} seed {seed}: skipped (time budget)")
                        continue
                    try:
                        ops = draw_operands(dtype, m, n, k, seed, scale, "bf16", False)
                        outs = {nm: _run(kern, ops, torch.bfloat16, dev) for nm, kern, dev in impls}
                    except Exception as exc:
                        ok = False
                        rep(f"{dtype} K={k} {scale} seed {seed}: ERROR {type(exc).__name__}: {exc}")
                        continue
                    for a, b in pairs:
                        c = compare(outs[a], outs[b], fmt)
                        key = (dtype, f"{a}~{b}", scale, k)
                        row = agg.setdefault(key, {"differing": 0, "elements": 0, "max_spacing": 0})
                        row["differing"] += c["differing"]
                        row["elements"] += c["elements"]
                        row["max_spacing"] = max(row["max_spacing"], c["max_spacing"])
    rows = [{"dtype": d, "pair": p, "scale": s, "k": k, **v} for (d, p, s, k), v in agg.items()]
    return rows, ok


def table(rep: Report, rows: list[dict[str, Any]]) -> bool:
    """The K-depth table (printed last); False if a pow2 INT8 pair was not bit-identical."""
    rep()
    rep("== K-depth table (bf16 outputs; differing elements / elements, max distance in spacings)")
    if not rows:
        rep("(no K-depth rows: see above)")
        return True
    rep(f"{'dtype':8s} {'pair':16s} {'scale':5s} {'K':>6s} {'differing':>18s} {'frac':>10s} {'max':>4s}")
    ok = True
    for r in sorted(rows, key=lambda r: (r["dtype"], r["pair"], r["scale"], r["k"])):
        frac = r["differing"] / r["elements"] if r["elements"] else 0.0
        flag = ""
        if r["dtype"] == "int8" and r["scale"] == "pow2" and r["differing"]:
            ok = False
            flag = "  UNEXPECTED: pow2 scales must agree bit for bit"
        rep(f"{r['dtype']:8s} {r['pair']:16s} {r['scale']:5s} {r['k']:>6d} "
            f"{str(r['differing']) + '/' + str(r['elements']):>18s} {frac:>10.2e} {r['max_spacing']:>4d}{flag}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help="output file (default benchmarks/results/gpu-smoke-<date>-<gpu>.txt)")
    p.add_argument("--budget-s", type=float, default=420.0, help="time budget in seconds (default 420)")
    p.add_argument("--trials", type=int, default=3, help="trials per shape for the checks (default 3)")
    p.add_argument("--k", default="256,1024,4096,16384,32768", help="K values of the K-depth sweep")
    p.add_argument("--m", type=int, default=128)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--seeds", type=int, default=2)
    args = p.parse_args(argv)
    budget = Budget(args.budget_s)
    rep = Report()
    rep("swapcheck GPU smoke (benchmarks/gpu_smoke.py)")
    rep()
    info = section_environment(rep)
    if info["cuda"] is not None:
        rep()
        rep(f"skipped: {info['cuda']}")
        if args.out is not None:
            rep.write(args.out)
        return 0
    out = args.out or (REPO / "benchmarks" / "results"
                       / f"gpu-smoke-{dt.date.today().isoformat()}-{_slug(info['gpu'])}.txt")
    ok = True
    rows: list[dict[str, Any]] = []
    try:
        ok &= section_emulation(rep, info["available"])
        ok &= section_checks(rep, info["available"], args.trials, budget)
        rows, kd_ok = section_kdepth(rep, info["available"], [int(x) for x in args.k.split(",")],
                                     args.m, args.n, args.seeds, budget)
        ok &= kd_ok
    except Exception:
        ok = False
        rep("ERROR:")
        for line in traceback.format_exc().splitlines():
            rep("  " + line)
    ok &= table(rep, rows)
    rep()
    rep(f"done in {budget.elapsed:.0f} s: {'ok' if ok else 'FAILED (see ERROR / UNEXPECTED above)'}")
    rep.write(out)
    print(f"written to {out}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
