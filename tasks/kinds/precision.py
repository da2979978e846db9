"""The ``precision`` kind: one kernel, one shape, the precision-downgrade probe (tasks.checks.precision).

``run(params, context) -> {"precision": rows}``, one row per (family, draw) with the columns of
:data:`tasks.checks.result.ROW_COLUMNS` (``inputs`` is the family: input-bits, sum-bits, absorb)
plus ``kernel``, ``kind`` ("matmul" or "scaled"), ``operands`` and ``dtype``.  Unit parameters:

* ``kernel`` (registry name or ``module:attr``), ``params`` (dict, default {});
* ``dtype`` ("bf16", "fp16" or "fp32": the claimed output format, default fp32), ``m``, ``k``
  (>= 5), ``n``;
* ``trials`` (draws per family, default 2), ``seed`` (default 0), ``families`` (default every
  family that applies), ``operands`` (scaled kernels).  Scaled kernels get unit scales: the
  ``scales`` field of the spec is accepted for symmetry with the other checks and not used.

A kernel that raises gives a row with verdict ERROR (not a failed unit); bad parameters raise.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tasks.kinds._checks import CheckFields, check_problems, describe_check, expand_checks
from tasks.kinds.base import Kind, Rows, Unit, UnitContext

__all__ = ["KIND", "VERSION", "PrecisionExperiment", "run"]

VERSION = "1"
FAMILIES = ("input-bits", "sum-bits", "absorb")  # tasks.checks.precision.FAMILIES (no torch import here)


class PrecisionExperiment(CheckFields):
    """Silent precision downgrades on exact-integer operands (docs/checks.md): one unit per kernel and shape."""

    kind: Literal["precision"]
    dtype: Literal["bf16", "fp16", "fp32"] = "fp32"
    trials: int = Field(default=2, ge=1, le=10000)
    families: list[Literal["input-bits", "sum-bits", "absorb"]] | None = None


def problems(base: str, exp: PrecisionExperiment) -> list[str]:
    out = check_problems(base, exp)
    for i, (m, k, n) in enumerate(exp.shapes):
        if k < 5:
            out.append(f"{base}.shapes[{i}]: the precision check needs K >= 5, got [{m}, {k}, {n}]")
    if exp.families and exp.dtype != "fp32" and set(exp.families) - {"absorb"}:
        out.append(f"{base}.families: at dtype {exp.dtype} only absorb applies (input-bits and sum-bits need fp32)")
    return out


def expand(experiment: str, exp: PrecisionExperiment) -> list[Unit]:
    extra: dict[str, Any] = {"families": list(exp.families)} if exp.families else {}
    return expand_checks(KIND, experiment, exp, extra)


def describe(p: dict[str, Any]) -> str:
    return describe_check("precision", p)


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    """Run the probe for one unit and return its rows."""
    from tasks.checks import load_subject, run_precision
    from tasks.numerics import get_format

    subject = load_subject(params["kernel"], params.get("params") or {}, operands=params.get("operands"))
    fams = params.get("families")
    result = run_precision(
        subject, [(int(params["m"]), int(params["k"]), int(params["n"]))], get_format(params["dtype"]).torch_dtype,
        int(params.get("trials", 2)), int(params.get("seed", 0)), tuple(fams) if fams else None,
    )  # fmt: skip
    base = {"kernel": params.get("label") or params["kernel"], "kind": subject.kind, "operands": result.settings["operands"],
            "dtype": params["dtype"]}  # fmt: skip
    return {"precision": [{**base, **r.to_row()} for r in result.results]}


#: A spec's experiment of this kind (the kind contract's example; docs/checks.md).
EXAMPLE: dict[str, Any] = {"kind": "precision", "kernels": ["int8-onednn", "fp8-blocked"], "dtype": "fp32",
                           "shapes": [[64, 1000, 48], [1, 4096, 33]], "trials": 2}

KIND = Kind(name="precision", version=VERSION, spec=PrecisionExperiment, tables=("precision",),
            describe=describe, run=run, expand=expand, problems=problems, doc=__doc__ or "", example=EXAMPLE)
