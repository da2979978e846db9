"""What the two check kinds (``exact_match``, ``bounds``) share: spec fields and the unit grid.

One unit per kernel and shape; the trials of a unit run in the one trial harness of
:mod:`tasks.checks`. The defaults (trials, shapes) are the harness's own.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from tasks.checks.defaults import DEFAULT_SHAPES, DEFAULT_TRIALS
from tasks.kinds.base import Kind, Unit
from tasks.kinds.fields import (
    MAX_DIM,
    MAX_SEED,
    Implementation,
    Resources,
    Strict,
    as_impl,
    impl_payload,
    kernel_problem,
    memory_problem,
)

__all__ = ["DEFAULT_SHAPES", "DEFAULT_TRIALS", "CheckFields", "check_problems", "describe_check", "expand_checks",
           "kernel_problems", "unit_memory_bytes"]


def unit_memory_bytes(m: int, k: int, n: int) -> int:
    """An upper estimate of one check unit's memory (trials run one after another).

    Per operand element (``m*k + k*n``) 64 bytes: the operands in the check's dtype and their
    float64 copies (exact products, bounds).  Per output element (``m*n``) 512 bytes: the float64
    exact result, bounds and sums of magnitudes, and one chunk of float64 products per output row
    block.  Plus 256 MiB for the fixed-size chunks of products.
    """
    return 64 * (m * k + k * n) + 512 * m * n + 256 * 2**20


class CheckFields(Strict):
    """Kernel correctness checks (docs/checks.md): one unit per kernel and shape."""

    kernels: list[str | Implementation] = Field(min_length=1)
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    shapes: list[list[int]] = Field(default_factory=lambda: [list(s) for s in DEFAULT_SHAPES], min_length=1)
    trials: int = Field(default=DEFAULT_TRIALS, ge=1, le=10000)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    scales: Literal["pow2", "unit"] = "pow2"
    resources: Resources = Field(default_factory=Resources)

    @field_validator("shapes")
    @classmethod
    def _shapes(cls, v: list[list[int]]) -> list[list[int]]:
        for i, s in enumerate(v):
            if len(s) != 3 or any(x < 1 for x in s):
                raise ValueError(f"shape {i} must be [m, k, n] with positive sizes, got {s}")
            if any(x > MAX_DIM for x in s):
                raise ValueError(f"shape {i}: m, k and n must be <= {MAX_DIM}, got {s}")
        return v

    def impls(self) -> list[Implementation]:
        return [as_impl(i) for i in self.kernels]


def kernel_problems(base: str, exp: CheckFields) -> list[str]:
    out = []
    for i, impl in enumerate(exp.impls()):
        p = kernel_problem(f"{base}.kernels[{i}]", impl)
        if p:
            out.append(p.replace(f"{base}.kernels[{i}].params:", f"{base}.kernels[{i}]:"))
    return out


def check_problems(base: str, exp: CheckFields) -> list[str]:
    """The kernels' problems, and shapes whose estimated memory does not fit a unit."""
    out = kernel_problems(base, exp)
    for i, (m, k, n) in enumerate(exp.shapes):
        p = memory_problem(f"{base}.shapes[{i}]", f"shape [m, k, n] = [{m}, {k}, {n}]",
                           unit_memory_bytes(m, k, n), exp.resources)
        if p:
            out.append(p)
    return out


def expand_checks(kind: Kind, experiment: str, exp: CheckFields, extra: dict[str, Any]) -> list[Unit]:
    units = []
    for impl in exp.impls():
        payload = impl_payload(impl)
        code = {"code": payload["code"]} if "code" in payload else {}  # a user's kernel: its code's fingerprint
        for m, k, n in exp.shapes:
            params: dict[str, Any] = {"kernel": impl.kernel, "params": dict(sorted(impl.params.items())), "label": impl.name,
                                      "version": payload["version"], **code, "dtype": exp.dtype, "m": m, "k": k, "n": n,
                                      "trials": exp.trials, "seed": exp.seed, "scales": exp.scales, **extra}
            units.append(kind.unit(experiment, params, exp.resources))
    return units


def describe_check(kind: str, p: dict[str, Any]) -> str:
    alg = f" vs {p['algorithm']}" if kind == "bounds" else ""
    return f"{kind} {p['label']}{alg} {p['dtype']} M={p['m']} K={p['k']} N={p['n']} x{p['trials']}"
