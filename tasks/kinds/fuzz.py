"""The ``fuzz`` kind: a seeded hunt for one kernel's failures, for a fixed time budget.

``run(params, context) -> {"fuzz": rows}``, one row per trial (:mod:`tasks.checks.fuzz`): its
shape, value recipe, scale kind, operand layout, exact match's input kind (``exact_inputs``:
binary or cancelling-runs) and boundary classes (the coverage table of ``report fuzz``), both checks' verdicts, and for a failing trial the shrunk
shape, the first failing element and the artifact (written through ``context.put_artifact``)
that ``swapcheck check replay`` reproduces byte for byte.  Unit parameters:

* ``kernel`` (registry name or ``module:attr``), ``params`` (dict), ``version`` (the kernel's, so
  a new kernel version is new work), ``label``;
* ``budget_s`` (seconds), ``max_trials`` (None: until the budget is spent), ``max_failures``,
  ``seed``, ``dtype`` ("bf16", "fp16", "fp32"), ``algorithm`` and ``accumulate`` (the bounds check).

A time budget decides how many trials run, not what they are: trial ``i`` is the same draw on
every machine.  Give ``max_trials`` (with a budget that comfortably covers it) when the rows must
be the same on every run, as the nightly spec does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tasks.kinds.base import Kind, Rows, Unit, UnitContext
from tasks.kinds.fields import (
    MAX_SEED,
    Implementation,
    Resources,
    Strict,
    as_impl,
    impl_payload,
    kernel_problem,
)

__all__ = ["KIND", "VERSION", "FuzzExperiment", "run"]

# 2: boundary-weighted shapes up to K = 32,769, operand layouts, coverage classes;
# 3: exact match draws cancelling-runs operands in half the trials (fp32 accumulation claimed), so
#    the same (seed, trial) judges other operands: new work, and the rows' exact_inputs column
VERSION = "3"


class FuzzExperiment(Strict):
    """A seeded fuzzing hunt per kernel, judged by exact match and bounds (docs/checks.md)."""

    kind: Literal["fuzz"]
    kernels: list[str | Implementation] = Field(min_length=1)
    budget_s: float = Field(default=60.0, gt=0, le=86400)
    max_trials: int | None = Field(default=None, ge=1, le=10**7)
    max_failures: int = Field(default=1, ge=1, le=1000)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    algorithm: str = "any"
    accumulate: Literal["fp32", "bf16", "fp16"] = "fp32"
    resources: Resources = Field(default_factory=Resources)


def problems(base: str, exp: FuzzExperiment) -> list[str]:
    from tasks.checks import ALGORITHMS
    from tasks.checks.bounds import algorithm
    from tasks.checks.subject import CheckInputError

    out = []
    for i, k in enumerate(exp.kernels):
        p = kernel_problem(f"{base}.kernels[{i}]", as_impl(k))
        if p:
            out.append(p)
    try:
        algorithm(exp.algorithm, exp.accumulate)
    except CheckInputError:
        out.append(f"{base}.algorithm: unknown algorithm {exp.algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
    return out


def expand(experiment: str, exp: FuzzExperiment) -> list[Unit]:
    units = []
    for impl in (as_impl(k) for k in exp.kernels):
        payload = impl_payload(impl)
        params: dict[str, Any] = {
            "kernel": impl.kernel, "params": payload["params"], "label": impl.name, "version": payload["version"],
            "budget_s": exp.budget_s, "max_trials": exp.max_trials, "max_failures": exp.max_failures,
            "seed": exp.seed, "dtype": exp.dtype, "algorithm": exp.algorithm, "accumulate": exp.accumulate,
        }  # fmt: skip
        if "code" in payload:  # a user's kernel: its code's fingerprint (an edit reruns the hunt)
            params["code"] = payload["code"]
        units.append(KIND.unit(experiment, params, exp.resources))
    return units


def describe(p: dict[str, Any]) -> str:
    cap = f", at most {p['max_trials']} trials" if p.get("max_trials") else ""
    return f"fuzz {p['label']} {p['dtype']} for {p['budget_s']:g} s{cap}, seed {p['seed']}"


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    """Fuzz one kernel for the unit's budget; one row per trial."""
    from tasks.checks import load_subject
    from tasks.checks.artifact import artifact_bytes, artifact_name
    from tasks.checks.fuzz import Failure, FuzzSettings, boundary_classes, fuzz
    from tasks.numerics import get_format

    kparams = params.get("params") or {}
    subject = load_subject(params["kernel"], kparams)
    settings = FuzzSettings(get_format(params["dtype"]).torch_dtype, params.get("algorithm", "any"),
                            params.get("accumulate", "fp32"))  # fmt: skip
    seed = int(params.get("seed", 0))

    def save(fail: Failure) -> str | None:
        if context is None:
            return None
        data, _ = artifact_bytes(fail, subject, kparams, seed, settings)
        return context.put_artifact(artifact_name(fail), data)

    result = fuzz(subject, float(params["budget_s"]), seed, settings, max_trials=params.get("max_trials"),
                  max_failures=int(params.get("max_failures", 1)), save=save)  # fmt: skip
    base = {"kernel": params.get("label") or params["kernel"], "kernel_version": subject.kernel.version,
            "kind": subject.kind, "operands": subject.operands or params["dtype"], "dtype": params["dtype"],
            "algorithm": settings.algorithm, "seed": seed, "budget_s": float(params["budget_s"])}  # fmt: skip
    rows = []
    for t in result.trials:
        row: dict[str, Any] = {**base, "trial": t.plan.index, "m": t.plan.m, "k": t.plan.k, "n": t.plan.n,
                               "recipe": t.plan.recipe, "scales": t.plan.scales, "layout": t.plan.layout,
                               "exact_inputs": t.plan.exact_inputs, "classes": boundary_classes(t.plan),
                               "exact_match_verdict": t.exact_match.value, "bounds_verdict": t.bounds.value,
                               "verdict": t.verdict.value, "seconds": t.seconds}  # fmt: skip
        f = t.failure
        r = f.shrunk.judged.result if f else None
        row.update({
            "failed_check": f.check if f else None, "shrunk_m": r.m if r else None, "shrunk_k": r.k if r else None,
            "shrunk_n": r.n if r else None, "shrink_runs": f.shrink_runs if f else None,
            "first_row": r.first.row if r and r.first else None, "first_col": r.first.col if r and r.first else None,
            "first_expected": r.first.expected if r and r.first else None,
            "first_observed": r.first.observed if r and r.first else None,
            "error": (r.error or r.info.get("problem")) if r else None, "artifact": f.artifact if f else None,
        })  # fmt: skip
        rows.append(row)
    return {"fuzz": rows}


KIND = Kind(name="fuzz", version=VERSION, spec=FuzzExperiment, tables=("fuzz",), describe=describe, run=run,
            expand=expand, problems=problems, doc=__doc__ or "")
