"""The ``bounds`` kind: one kernel, one shape, ``trials`` general draws against an algorithm.

``run(params, context) -> {"bounds": rows}``, one row per trial with the columns of
:data:`tasks.checks.result.ROW_COLUMNS` plus ``kernel``, ``kind``, ``operands``, ``dtype`` and
``accumulate``.  Unit parameters:

* ``kernel``, ``params``, ``dtype``, ``m``, ``k``, ``n``, ``trials``, ``seed``, ``scales``,
  ``operands`` as for ``exact_match`` (:mod:`tasks.kinds.exact_match`);
* ``algorithm`` (default "any"; :data:`tasks.checks.ALGORITHMS`), ``accumulate`` (default "fp32"),
  ``fma`` (default True), ``inputs`` (list, default all of :data:`tasks.checks.INPUT_KINDS`, in turn
  per trial).
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

__all__ = ["KIND", "VERSION", "BoundsExperiment", "run"]

VERSION = "1"


class BoundsExperiment(CheckFields):
    """Error bounds on general inputs against a named accumulation algorithm (docs/checks.md)."""

    kind: Literal["bounds"]
    algorithm: str = "any"
    accumulate: str = "fp32"


def problems(base: str, exp: BoundsExperiment) -> list[str]:
    from tasks.checks import ALGORITHMS

    out = check_problems(base, exp)
    if exp.algorithm not in ALGORITHMS:
        out.append(f"{base}.algorithm: unknown algorithm {exp.algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
    return out


def expand(experiment: str, exp: BoundsExperiment) -> list[Unit]:
    return expand_checks(KIND, experiment, exp, {"algorithm": exp.algorithm, "accumulate": exp.accumulate})


def describe(p: dict[str, Any]) -> str:
    return describe_check("bounds", p)


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    """Run the check for one unit and return its rows."""
    from tasks.checks import INPUT_KINDS, load_subject, run_bounds
    from tasks.numerics import get_format

    subject = load_subject(params["kernel"], params.get("params") or {}, operands=params.get("operands"))
    result = run_bounds(
        subject, [(int(params["m"]), int(params["k"]), int(params["n"]))],
        params.get("algorithm", "any"), get_format(params["dtype"]).torch_dtype, int(params.get("trials", DEFAULT_TRIALS)),
        int(params.get("seed", 0)), tuple(params.get("inputs") or INPUT_KINDS),
        params.get("accumulate", "fp32"), bool(params.get("fma", True)), params.get("scales", "pow2"),
    )  # fmt: skip
    base = {"kernel": params.get("label") or params["kernel"], "kind": subject.kind, "operands": result.settings["operands"],
            "dtype": params["dtype"], "accumulate": result.settings["accumulate"]}  # fmt: skip
    return {"bounds": [{**base, **r.to_row()} for r in result.results]}


KIND = Kind(name="bounds", version=VERSION, spec=BoundsExperiment, tables=("bounds",), describe=describe,
            run=run, expand=expand, problems=problems, doc=__doc__ or "")
