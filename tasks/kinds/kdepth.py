"""The ``kdepth`` kind: one GEMM shape and seed, every implementation and the exact reference.

Operands are drawn the way a real W8A8 layer produces them (reference/vllm-kernels.md §2.6):

* int8 activations: per-token scale ``sa = absmax(row) / 127`` (fp32) and
  ``q = round_half_even(x * (127 / absmax))`` saturated to [-128, 127], as ``scaled_int8_quant``;
  int8 weights: per-channel ``sb = absmax(column) / 127`` and ``round(w / sb)`` in [-127, 127] —
  both are the model's own quantizer (:mod:`tasks.models.quantization`);
* fp8 e4m3: the analogue with 448, ``x / s`` cast to e4m3 (round to nearest even), clamped to ±448.

Scale mode ``pow2`` rounds every scale UP to a power of two before quantizing (so nothing saturates);
multiplying by a power of two is exact, so under ``pow2`` all epilogue orders must agree bit for bit.
The same seed draws the same real-valued ``x`` and ``w`` in both scale modes, so the modes are paired.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Literal

from pydantic import Field, field_validator

from tasks.comparison import compare
from tasks.kinds.base import Kind, Rows, Unit, UnitContext
from tasks.kinds.fields import (
    MAX_DIM,
    MAX_UNITS,
    Implementation,
    IntAxis,
    Resources,
    ScaleMode,
    Strict,
    as_impl,
    axis_values,
    check_axis,
    check_distinct,
    check_seed_axis,
    impl_payload,
    kernel_problem,
    memory_problem,
    needs_gpu,
    seed_values,
)

VERSION = "1"
QMAX = {"int8": 127.0, "fp8_e4m3": 448.0}

#: K above which an int32 accumulator of int8 products can overflow: weights in [-127, 127] and
#: activations in [-128, 127] give |product| <= 16256, and floor((2**31 - 1) / 16256) = 132104
#: (reference/numerics.md §3).
INT8_MAX_K = 132104


def unit_memory_bytes(m: int, n: int, k: int, implementations: int) -> int:
    """An upper estimate of one unit's memory, from what :func:`run` allocates.

    Per operand element (``m*k + k*n``) 32 bytes: the fp32 draws, the quantizer's fp32 temporaries,
    the int8/e4m3 operands and the exact reference's float64 (or int64 chunk) copies.  Per output
    element (``m*n``) 128 bytes for the reference (its int64/float64 accumulator and the float64
    temporaries of its correctly rounded epilogue) and 16 per implementation (an int32/fp32
    accumulator, the output, the comparison's copies).
    """
    return 32 * (m * k + k * n) + m * n * (128 + 16 * implementations)


class KdepthExperiment(Strict):
    """K on an axis: every implementation and the exact reference on identical operands."""

    kind: Literal["kdepth"]
    dtype: Literal["int8", "fp8_e4m3"]
    implementations: list[str | Implementation] = Field(min_length=1)
    reference: str | Implementation = "exact"
    scale_modes: list[ScaleMode] = Field(default_factory=lambda: list[ScaleMode](["real"]), min_length=1)
    m: IntAxis = 256
    n: IntAxis = 256
    k: IntAxis
    seeds: IntAxis = 4
    out_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    bias: bool = False
    resources: Resources = Field(default_factory=Resources)

    @field_validator("m", "n", "k")
    @classmethod
    def _positive_axis(cls, v: Any) -> Any:
        return check_axis(v, 1, MAX_DIM)

    @field_validator("seeds")
    @classmethod
    def _seed_axis(cls, v: Any) -> Any:
        return check_seed_axis(v)

    @field_validator("scale_modes")
    @classmethod
    def _distinct_modes(cls, v: list[str]) -> list[str]:
        return check_distinct(v, "scale modes")

    def seed_values(self) -> list[int]:
        return seed_values(self.seeds)

    def impls(self) -> list[Implementation]:
        return [as_impl(i) for i in self.implementations]

    def ref(self) -> Implementation:
        return as_impl(self.reference)


def problems(base: str, exp: KdepthExperiment) -> list[str]:
    from tasks.kernels import get_kernel

    out: list[str] = []
    ks = axis_values(exp.k)
    ms, ns = axis_values(exp.m), axis_values(exp.n)
    n_units = len(ms) * len(ns) * len(ks) * len(exp.seed_values()) * len(exp.scale_modes)
    if n_units > MAX_UNITS:
        out.append(f"{base}: m x n x k x seeds x scale_modes is {n_units} units; at most {MAX_UNITS} per experiment")
    estimate = unit_memory_bytes(max(ms), max(ns), max(ks), len(exp.implementations) + 1)
    p = memory_problem(f"{base}.m/n/k", f"M={max(ms)} N={max(ns)} K={max(ks)}", estimate,
                       exp.resources)
    if p:
        out.append(p)
    if exp.dtype == "int8" and max(ks) > INT8_MAX_K:
        out.append(
            f"{base}.k: K={max(ks)} exceeds the int32 no-overflow bound for int8 products "
            f"(K <= {INT8_MAX_K} with weights in [-127, 127]); an int32 accumulator could wrap"
        )
    labels: list[str] = []
    entries = [(f"{base}.implementations[{i}]", impl) for i, impl in enumerate(exp.impls())]
    entries.append((f"{base}.reference", exp.ref()))
    for field, impl in entries:
        labels.append(impl.name)
        problem = kernel_problem(field, impl, exp.dtype)
        if problem:
            out.append(problem)
            continue
        kernel = get_kernel(impl.kernel, **impl.params)
        unsupported = [(m, n, why) for m in ms for n in ns
                       for ok, why in [kernel.supports(m, n, max(ks), m, n, exp.bias)] if not ok]
        if unsupported:
            m, n, why = unsupported[0]
            out.append(f"{field}: kernel {impl.kernel!r} cannot run M={m} N={n} with per-token/per-channel scales: {why}")
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        out.append(f"{base}.implementations: duplicate implementation names {dupes}; give each a distinct `label`")
    return out


def expand(experiment: str, exp: KdepthExperiment) -> list[Unit]:
    impls = [impl_payload(i) for i in exp.impls()]
    ref = impl_payload(exp.ref())
    resources = exp.resources.with_gpu(needs_gpu([*exp.impls(), exp.ref()]))
    units = []
    for m, n, k, seed, mode in itertools.product(
        axis_values(exp.m), axis_values(exp.n), axis_values(exp.k), exp.seed_values(), exp.scale_modes
    ):
        params = {
            "dtype": exp.dtype, "m": m, "n": n, "k": k, "seed": seed, "scale_mode": mode,
            "out_dtype": exp.out_dtype, "bias": exp.bias, "implementations": impls, "reference": ref,
        }
        units.append(KIND.unit(experiment, params, resources))
    return units


def describe(p: dict[str, Any]) -> str:
    return f"{p['dtype']} M={p['m']} N={p['n']} K={p['k']} seed={p['seed']} scales={p['scale_mode']}"


def draw_operands(
    dtype: str, m: int, n: int, k: int, seed: int, scale_mode: str, out_dtype: str = "bf16", bias: bool = False
) -> dict[str, Any]:
    """Quantized operands, scales and bias of one unit (deterministic in the parameters)."""
    import torch

    from tasks.models.quantization import pow2_up, quantize_activations, quantize_weight
    from tasks.numerics import get_format
    from tasks.seeds import stable_seed

    g = torch.Generator().manual_seed(stable_seed("kdepth", dtype, m, n, k, seed))
    x = torch.randn(m, k, generator=g, dtype=torch.float32)
    w = torch.randn(k, n, generator=g, dtype=torch.float32)
    bias_t = torch.randn(n, generator=g, dtype=torch.float32).to(get_format(out_dtype).torch_dtype) if bias else None
    if dtype == "int8":
        a, sa = quantize_activations(x, scale_mode)  # [M, K], [M, 1]
        bq, sb = quantize_weight(w.t(), scale_mode)  # [N, K], [N]
        b = bq.t().contiguous()
    elif dtype == "fp8_e4m3":
        qmax = QMAX[dtype]
        tiny = torch.finfo(torch.float32).tiny
        sa = x.abs().amax(dim=1, keepdim=True).clamp_min(tiny) / qmax
        sb = w.abs().amax(dim=0).clamp_min(tiny) / qmax
        if scale_mode == "pow2":
            sa, sb = pow2_up(sa), pow2_up(sb)
        a = (x / sa).clamp(-qmax, qmax).to(torch.float8_e4m3fn)
        b = (w / sb[None, :]).clamp(-qmax, qmax).to(torch.float8_e4m3fn)
    else:
        raise ValueError(f"unknown operand dtype {dtype!r}; allowed: int8, fp8_e4m3")
    return {"a": a, "b": b, "scale_a": sa.contiguous(), "scale_b": sb.reshape(n).contiguous(), "bias": bias_t}


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    """Compute one unit's rows: every pair of implementations, and each against the reference."""
    import torch

    from tasks.kernels import get_kernel
    from tasks.numerics import get_format

    ops = draw_operands(
        params["dtype"], params["m"], params["n"], params["k"], params["seed"],
        params["scale_mode"], params["out_dtype"], params["bias"],
    )
    fmt = get_format(params["out_dtype"])
    out_dtype = fmt.torch_dtype
    outputs: dict[str, tuple[torch.Tensor, float, str]] = {}
    for impl in [*params["implementations"], params["reference"]]:
        kernel = get_kernel(impl["kernel"], **impl["params"])
        args = [ops["a"], ops["b"], ops["scale_a"], ops["scale_b"], out_dtype, ops["bias"]]
        if kernel.device == "cuda":  # GPU kernels take their operands on the device
            args = [x.cuda() if isinstance(x, torch.Tensor) else x for x in args]
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = kernel(*args)
        if kernel.device == "cuda":
            torch.cuda.synchronize()
        outputs[impl["name"]] = (out.cpu(), time.perf_counter() - t0, impl["kernel"])

    base = {
        "dtype": params["dtype"], "out_dtype": params["out_dtype"], "m": params["m"], "n": params["n"],
        "k": params["k"], "seed": params["seed"], "scale_mode": params["scale_mode"], "bias": params["bias"],
    }
    names = [i["name"] for i in params["implementations"]]
    ref = params["reference"]["name"]
    pairs = [("pair", a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    pairs += [("reference", a, ref) for a in names]
    rows = []
    for comparison, a, b in pairs:
        (oa, ta, ka), (ob, tb, kb) = outputs[a], outputs[b]
        rows.append({
            **base, "comparison": comparison, "impl_a": a, "impl_b": b, "kernel_a": ka, "kernel_b": kb,
            **compare(oa, ob, fmt), "seconds_a": ta, "seconds_b": tb,
        })
    return {"kdepth": rows}


KIND = Kind(name="kdepth", version=VERSION, spec=KdepthExperiment, tables=("kdepth",), describe=describe,
            run=run, expand=expand, problems=problems, doc=__doc__ or "")
