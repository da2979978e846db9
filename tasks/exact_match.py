"""The ``exact_match`` task kind: one kernel, one shape, ``trials`` binary draws (tasks.checks).

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

from typing import Any

__all__ = ["run", "VERSION"]

VERSION = "1"


def run(params: dict[str, Any], context: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Run the check for one unit and return its rows."""
    from tasks.checks import load_subject, run_exact_match
    from tasks.checks.subject import FLOAT_DTYPES

    subject = load_subject(params["kernel"], params.get("params") or {}, operands=params.get("operands"))
    result = run_exact_match(
        subject, [(int(params["m"]), int(params["k"]), int(params["n"]))], FLOAT_DTYPES[params["dtype"]],
        int(params.get("trials", 20)), int(params.get("seed", 0)), params.get("scales", "pow2"),
        params.get("p"), float(params.get("overflow", 0.01)),
    )  # fmt: skip
    base = {"kernel": params.get("label") or params["kernel"], "kind": subject.kind, "operands": result.settings["operands"],
            "dtype": params["dtype"]}  # fmt: skip
    return {"exact_match": [{**base, **r.to_row()} for r in result.results]}
