"""``batch_invariance`` at the kernel level, GEMM kernels (table ``batch_invariance``): one probe row
alone and at each position of batches of M rows (the package docstring, "Kernel level"), each
computation judged against the declared algorithm's bound (:mod:`.bound`), at each torch thread count.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from tasks.comparison import compare
from tasks.devices import on_device
from tasks.kinds.base import Rows
from tasks.kinds.batch_invariance.spec import BatchInvarianceExperiment, probe_row
from tasks.kinds.fields import (
    Resources,
    axis_values,
    gemm_unit_memory_bytes,
    impl_payload,
    kernel_problem,
    memory_problem,
)


def kernel_dtype(kernel: Any, dtype: str) -> str:
    """The operand dtype a kernel runs on here: its own, or the spec's for a kernel taking either."""
    return str(kernel.operand_dtype) if kernel.operand_dtype != "any" else dtype


def problems(base: str, exp: BatchInvarianceExperiment, ms: list[int]) -> list[str]:
    """The GEMM kernels of a kernel-level experiment: each must run every M of the axis here, within
    the int32 no-overflow bound for int8, and the largest batch's operands must fit."""
    from tasks.checks.bounds import algorithm
    from tasks.checks.subject import CheckInputError
    from tasks.kernels import get_kernel
    from tasks.numerics import INT8_MAX_K

    out: list[str] = []
    if exp.kernels:
        try:
            algorithm(exp.algorithm, exp.accumulate)
        except CheckInputError as exc:
            out.append(f"{base}.algorithm: {exc}")
        p = memory_problem(f"{base}.m/n/k", f"M={max(ms)} N={exp.n} K={exp.k}",
                           gemm_unit_memory_bytes(max(ms), exp.n, exp.k, 2), exp.resources)
        out += [p] if p else []
    names: list[str] = []
    for i, impl in enumerate(exp.impls()):
        field = f"{base}.kernels[{i}]"
        names.append(impl.name)
        p = kernel_problem(field, impl)
        if p:
            out.append(p)
            continue
        kernel = get_kernel(impl.kernel, **impl.params)
        dtype = kernel_dtype(kernel, exp.dtype)
        if dtype == "int8" and exp.k > INT8_MAX_K:
            out.append(f"{field}: K={exp.k} exceeds the int32 no-overflow bound for int8 products (K <= {INT8_MAX_K})")
        bad = [m for m in ms for ok, _ in [kernel.supports(m, exp.n, exp.k, m, exp.n, False)] if not ok]
        if bad:
            why = kernel.supports(bad[0], exp.n, exp.k, bad[0], exp.n, False)[1]
            out.append(f"{field}: kernel {impl.kernel!r} cannot run M={bad[0]} N={exp.n} K={exp.k}: {why}")
    dupes = sorted({x for x in names if names.count(x) > 1})
    if dupes:
        out.append(f"{base}.kernels: duplicate kernel names {dupes}; give each a distinct `label`")
    return out


def expand(exp: BatchInvarianceExperiment) -> list[tuple[dict[str, Any], Resources]]:
    """One unit per GEMM kernel, seed and output dtype: its parameters and resources."""
    from tasks.kernels import get_kernel

    units: list[tuple[dict[str, Any], Resources]] = []
    threads = exp.thread_counts()
    for impl, seed, out_dtype in itertools.product(exp.impls(), exp.seed_values(), exp.out_dtypes()):
        kernel = get_kernel(impl.kernel, **impl.params)
        params = {"level": "kernel", "kernel": impl_payload(impl), "dtype": kernel_dtype(kernel, exp.dtype),
                  "m": axis_values(exp.m), "positions": exp.gemm_positions(), "k": exp.k, "n": exp.n, "seed": seed,
                  "scale_mode": exp.scale_mode, "out_dtype": out_dtype,
                  "tolerance_spacings": exp.tolerance_spacings, "algorithm": exp.algorithm,
                  "accumulate": exp.accumulate}
        if threads is not None:  # only when set: unset, the worker's own thread count (recorded per row)
            params["threads"] = threads
        units.append((params, exp.resources.with_gpu(kernel.device == "cuda")))
    return units


def describe(p: dict[str, Any]) -> str:
    ms = p["m"]
    alg = f", {p['algorithm']} ({p['accumulate']}) bound" if "algorithm" in p else ""
    threads = f", threads {'/'.join(map(str, p['threads']))}" if p.get("threads") else ""
    return (f"batch invariance of {p['kernel']['name']} ({p['dtype']} -> {p['out_dtype']}, K={p['k']} N={p['n']}, "
            f"seed {p['seed']}{alg}{threads}): probe at {'/'.join(p['positions'])} of M={ms[0]}..{ms[-1]} "
            f"({len(ms)} sizes)")


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[int]:
    """Run the block at ``count`` torch threads (None: as it is); yields the count in effect, and
    restores the previous one afterwards."""
    import torch

    before = torch.get_num_threads()
    if count is not None and count != before:
        torch.set_num_threads(count)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def run_kernel(params: dict[str, Any]) -> dict[str, Rows]:
    """One kernel, seed and output dtype: at each thread count, the probe alone, then at each position
    of each batch size; each computation judged against the declared algorithm's bound (units
    planned before the bound was added carry no ``algorithm``: their bound columns stay NULL)."""
    import torch

    from tasks.kernels import get_kernel
    from tasks.kinds.batch_invariance.bound import cell_stats, row_bound
    from tasks.models.operands import draw_operands
    from tasks.numerics import get_format

    impl = params["kernel"]
    kernel = get_kernel(impl["kernel"], **impl["params"])
    fmt = get_format(params["out_dtype"])
    ms = list(params["m"])
    seed = params["seed"]
    # Row 0 is the probe, rows 1.. its neighbours (per-token scales: each row quantized alone).
    ops = draw_operands(params["dtype"], max(ms), params["n"], params["k"], seed, params["scale_mode"])
    a, sa, b, sb = ops["a"], ops["scale_a"], ops["b"], ops["scale_b"]
    name = params.get("algorithm")
    bound = None if name is None else row_bound(name, params["accumulate"], a[:1], b, sa[:1], sb, fmt)
    base = {"kernel": impl["name"], "kernel_name": impl["kernel"], "kernel_version": impl["version"],
            "device": kernel.device, "dtype": params["dtype"], "out_dtype": params["out_dtype"],
            "scale_mode": params["scale_mode"], "k": params["k"], "n": params["n"], "seed": seed,
            "tolerance_spacings": params["tolerance_spacings"], "algorithm": name,
            "accumulate": None if bound is None else bound.accumulate}
    first: dict[tuple[int, str], torch.Tensor] = {}  # each cell's output row at the first thread count
    rows = []
    for t_index, count in enumerate(params.get("threads") or [None]):
        with torch_threads(count) as threads:
            ref, ref_seconds = on_device(kernel.device, kernel, a[:1], b, sa[:1], sb, fmt.torch_dtype)
            for m in ms:
                for position in params["positions"]:
                    r = probe_row(m, position, seed)
                    order = torch.cat([torch.arange(1, r + 1), torch.zeros(1, dtype=torch.long),
                                       torch.arange(r + 1, m)])
                    out, seconds = on_device(kernel.device, kernel, a[order].contiguous(), b,
                                             sa[order].contiguous(), sb, fmt.torch_dtype)
                    row = out[r: r + 1].cpu()
                    stats = compare(row, ref.cpu(), fmt)
                    judged: dict[str, Any] = ({"outside_bound": None, "reference_outside_bound": None,
                                               "max_bound_ratio": None} if bound is None
                                              else cell_stats(bound, row, ref.cpu()))
                    if t_index == 0:
                        first[(m, position)] = row
                        across: dict[str, Any] = {"thread_differing": None, "thread_max_spacing": None}
                    else:
                        t = compare(row, first[(m, position)], fmt)
                        across = {"thread_differing": t["differing"], "thread_max_spacing": t["max_spacing"]}
                    rows.append({**base, "m": m, "position": position, "row_index": r, **stats,
                                 "bitwise_equal": stats["differing"] == 0, "seconds": seconds,
                                 "seconds_reference": ref_seconds, "threads": threads, **judged, **across})
    return {"batch_invariance": rows}
