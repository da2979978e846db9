"""The ``kdepth`` kind: one GEMM shape and seed, every implementation and the exact reference.

Operands are drawn the way a real W8A8 layer produces them (:func:`tasks.models.operands.draw_operands`,
docs/reference/vllm-kernels.md §2.6); under scale mode ``pow2`` all epilogue orders must agree bit for bit.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field, field_validator

from tasks.comparison import compare
from tasks.devices import on_device
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
    gemm_unit_memory_bytes,
    impl_payload,
    kernel_problem,
    memory_problem,
    needs_gpu,
    seed_values,
)
from tasks.numerics.formats import INT8_MAX_K

VERSION = "1"



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
    estimate = gemm_unit_memory_bytes(max(ms), max(ns), max(ks), len(exp.implementations) + 1)
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


def expand(experiment: str, exp: KdepthExperiment) -> Iterator[Unit]:
    """The grid's units, one at a time (a launch streams them: orchestrator.plan.Plan)."""
    impls = [impl_payload(i) for i in exp.impls()]
    ref = impl_payload(exp.ref())
    resources = exp.resources.with_gpu(needs_gpu([*exp.impls(), exp.ref()]))
    for m, n, k, seed, mode in itertools.product(
        axis_values(exp.m), axis_values(exp.n), axis_values(exp.k), exp.seed_values(), exp.scale_modes
    ):
        params = {
            "dtype": exp.dtype, "m": m, "n": n, "k": k, "seed": seed, "scale_mode": mode,
            "out_dtype": exp.out_dtype, "bias": exp.bias, "implementations": impls, "reference": ref,
        }
        yield KIND.unit(experiment, params, resources)


def describe(p: dict[str, Any]) -> str:
    return f"{p['dtype']} M={p['m']} N={p['n']} K={p['k']} seed={p['seed']} scales={p['scale_mode']}"


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    """Compute one unit's rows: every pair of implementations, and each against the reference."""
    import torch

    from tasks.kernels import get_kernel
    from tasks.kernels.accumulator import shared_accumulators
    from tasks.models.operands import draw_operands
    from tasks.numerics import get_format

    ops = draw_operands(
        params["dtype"], params["m"], params["n"], params["k"], params["seed"],
        params["scale_mode"], params["out_dtype"], params["bias"],
    )
    fmt = get_format(params["out_dtype"])
    out_dtype = fmt.torch_dtype
    outputs: dict[str, tuple[torch.Tensor, float, str]] = {}
    declared: dict[str, tuple[str, str] | None] = {}
    # The built-in INT8 kernels and the exact reference share one exact accumulator per unit (the
    # first of them to run computes it); a user's kernel runs its own code (tasks/kernels/accumulator.py).
    with shared_accumulators():
        for impl in [*params["implementations"], params["reference"]]:
            kernel = get_kernel(impl["kernel"], **impl["params"])
            out, seconds = on_device(kernel.device, kernel, ops["a"], ops["b"], ops["scale_a"], ops["scale_b"],
                                     out_dtype, ops["bias"])
            outputs[impl["name"]] = (out, seconds, impl["kernel"])
            declared[impl["name"]] = kernel.bounds_algorithm(params["dtype"], params["m"], params["n"])

    base = {
        "dtype": params["dtype"], "out_dtype": params["out_dtype"], "m": params["m"], "n": params["n"],
        "k": params["k"], "seed": params["seed"], "scale_mode": params["scale_mode"], "bias": params["bias"],
    }
    names = [i["name"] for i in params["implementations"]]
    ref = params["reference"]["name"]
    pairs = [("pair", a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    pairs += [("reference", a, ref) for a in names]
    bounds: dict[tuple[str, str], Any] = {}
    rows = []
    for comparison, a, b in pairs:
        (oa, ta, ka), (ob, tb, kb) = outputs[a], outputs[b]
        judged = (_judged(declared[a], oa, ops, fmt, params["bias"], bounds) if comparison == "reference"
                  else NOT_JUDGED)
        rows.append({
            **base, "comparison": comparison, "impl_a": a, "impl_b": b, "kernel_a": ka, "kernel_b": kb,
            **compare(oa, ob, fmt), "seconds_a": ta, "seconds_b": tb, **judged,
        })
    return {"kdepth": rows}


#: The bound columns of a pair row (and of an implementation the bound does not judge, with a status).
NOT_JUDGED: dict[str, Any] = {"bound_status": None, "bound_algorithm": None, "bound_accumulate": None,
                              "outside_bound": None, "max_bound_ratio": None, "bound_worst_row": None,
                              "bound_worst_col": None}


def _judged(declaration: tuple[str, str] | None, out: Any, ops: dict[str, Any], fmt: Any, bias: bool,
            cache: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """The bound columns of one implementation's reference row: its output against the bound of the
    algorithm its kernel declares (``Kernel.bounds_algorithm``) around the exact result, for the
    three-way arbiter (tasks/checks/scaled_bound.py; docs/certificate.md)."""
    from tasks.checks.scaled_bound import judge, scaled_output_bound

    if declaration is None:
        return {**NOT_JUDGED, "bound_status": "no bound declared"}
    name, accumulate = declaration
    if bias:
        return {**NOT_JUDGED, "bound_status": "bias not modelled", "bound_algorithm": name,
                "bound_accumulate": accumulate}
    if declaration not in cache:
        cache[declaration] = scaled_output_bound(name, accumulate, ops["a"], ops["b"], ops["scale_a"],
                                                 ops["scale_b"], fmt)
    bound = cache[declaration]
    j = judge(bound, out)
    return {"bound_status": "judged", "bound_algorithm": name, "bound_accumulate": bound.accumulate,
            "outside_bound": j["outside_bound"], "max_bound_ratio": j["max_bound_ratio"],
            "bound_worst_row": j["worst_row"], "bound_worst_col": j["worst_col"]}


KIND = Kind(name="kdepth", version=VERSION, spec=KdepthExperiment, tables=("kdepth",), describe=describe,
            run=run, expand=expand, problems=problems, doc=__doc__ or "")
