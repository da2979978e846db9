"""The ``exact_match`` kind: one kernel, one shape, ``trials`` binary draws (tasks.checks).

``run(params, context) -> {"exact_match": rows}``, one row per trial with the columns of
:data:`tasks.checks.result.ROW_COLUMNS` plus ``kernel``, ``kind`` ("matmul" or "scaled"),
``operands`` and ``dtype``.  Unit parameters:

* ``kernel`` (registry name or ``module:attr``), ``params`` (dict, default {});
* ``dtype`` ("bf16", "fp16" or "fp32": the output format), ``m``, ``k``, ``n``;
* ``trials`` (default 20), ``seed`` (default 0), ``scales`` ("pow2" or "unit"),
  ``operands`` (scaled kernels: "int8" / "fp8_e4m3", default the kernel's), ``p`` (default
  derived), ``overflow`` (default 0.01).

A kernel that raises gives a row with verdict ERROR (not a failed unit); bad parameters raise.
"""

from __future__ import annotations

from typing import Any, Literal

from tasks.kinds._checks import (
    DEFAULT_TRIALS,
    CheckFields,
    check_problems,
    describe_check,
    expand_checks,
)
from tasks.kinds.base import Kind, Rows, Unit, UnitContext

__all__ = ["KIND", "VERSION", "ExactMatchExperiment", "run"]

VERSION = "1"


class ExactMatchExperiment(CheckFields):
    """Exact match on binary inputs (docs/checks.md): one unit per kernel and shape."""

    kind: Literal["exact_match"]


def expand(experiment: str, exp: ExactMatchExperiment) -> list[Unit]:
    return expand_checks(KIND, experiment, exp, {})


def describe(p: dict[str, Any]) -> str:
    return describe_check("exact_match", p)


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    """Run the check for one unit and return its rows."""
    from tasks.checks import load_subject, run_exact_match
    from tasks.numerics import get_format

    subject = load_subject(params["kernel"], params.get("params") or {}, operands=params.get("operands"))
    result = run_exact_match(
        subject, [(int(params["m"]), int(params["k"]), int(params["n"]))], get_format(params["dtype"]).torch_dtype,
        int(params.get("trials", DEFAULT_TRIALS)), int(params.get("seed", 0)), params.get("scales", "pow2"),
        params.get("p"), float(params.get("overflow", 0.01)),
    )  # fmt: skip
    base = {"kernel": params.get("label") or params["kernel"], "kind": subject.kind, "operands": result.settings["operands"],
            "dtype": params["dtype"]}  # fmt: skip
    return {"exact_match": [{**base, **r.to_row()} for r in result.results]}


KIND = Kind(name="exact_match", version=VERSION, spec=ExactMatchExperiment, tables=("exact_match",),
            describe=describe, run=run, expand=expand, problems=check_problems, doc=__doc__ or "")
