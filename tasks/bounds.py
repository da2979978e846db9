"""The ``bounds`` task kind: one kernel, one shape, ``trials`` general draws against an algorithm.

``run(params, context) -> {"bounds": rows}``, one row per trial with the columns of
:data:`tasks.checks.result.ROW_COLUMNS` plus ``kernel``, ``kind``, ``operands``, ``dtype`` and
``accumulate``.  Unit parameters:

* ``kernel``, ``params``, ``dtype``, ``m``, ``k``, ``n``, ``trials``, ``seed``, ``scales``,
  ``operands`` as for ``exact_match`` (:mod:`tasks.exact_match`);
* ``algorithm`` (default "any"; :data:`tasks.checks.ALGORITHMS`), ``accumulate`` (default "fp32"),
  ``fma`` (default True), ``inputs`` (list, default all of :data:`tasks.checks.INPUT_KINDS`, in turn
  per trial).
"""

from __future__ import annotations

from typing import Any

__all__ = ["run", "VERSION"]

VERSION = "1"


def run(params: dict[str, Any], context: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Run the check for one unit and return its rows."""
    from tasks.checks import INPUT_KINDS, load_subject, run_bounds
    from tasks.checks.subject import FLOAT_DTYPES

    subject = load_subject(params["kernel"], params.get("params") or {}, operands=params.get("operands"))
    result = run_bounds(
        subject, [(int(params["m"]), int(params["k"]), int(params["n"]))],
        params.get("algorithm", "any"), FLOAT_DTYPES[params["dtype"]], int(params.get("trials", 20)),
        int(params.get("seed", 0)), tuple(params.get("inputs") or INPUT_KINDS),
        params.get("accumulate", "fp32"), bool(params.get("fma", True)), params.get("scales", "pow2"),
    )  # fmt: skip
    base = {"kernel": params.get("label") or params["kernel"], "kind": subject.kind, "operands": result.settings["operands"],
            "dtype": params["dtype"], "accumulate": result.settings["accumulate"]}  # fmt: skip
    return {"bounds": [{**base, **r.to_row()} for r in result.results]}
