"""The three-way arbiter: which side of a kernel pair left its declared bound (issue #41).

A pair verdict such as DIFFERENT says two kernels disagree; it cannot say which one is wrong. The
``kdepth`` kind runs both kernels and the exact reference on identical operands and judges each
kernel's outputs against the bound of the accumulation algorithm the kernel declares
(``Kernel.bounds_algorithm``), around the exact result (tasks/checks/scaled_bound.py: the algorithm's
error model, the epilogue's fp32 roundings, one rounding to the output format). The named query
``kdepth_bounds`` sums those judgements per side over the units where the pair was compared; here each
pair and scale mode gets one verdict of ``swapcheck_common.verdicts.ARBITER_ORDER``:

* ``both_inside``: both sides inside their bounds -- what differs is order, not a defect;
* ``a_outside_bound`` / ``b_outside_bound``: one side has outputs outside its bound, the other none;
* ``both_outside``: both sides have outputs outside their bounds.

A side's bound may be unknown: its kernel declares no algorithm ("no bound declared for K"), the
units had a bias (the bound models none), or the rows were written before kdepth judged bounds. Then
the arbiter does not guess: it is ``undecided`` with the reason, even when the other side is outside
(that side's facts are still shown: one side outside says nothing about the unknown one).

Each side carries its worst element in units of its bound (``max_bound_ratio``: 0 where the output is
what rounding the exact result once can give, at most 1 inside) and where it is. The **error budget**
splits a side's distance from the exact result into what the project measures: the reference's own
error (the quantization of the operands: not measured by kdepth, whose exact reference is the product
of the already quantized operands; the reference's rounding to the output: correctly rounded, at most
half a spacing, when the reference is ``exact``), accumulation order and epilogue (the side's distance
from the reference when every output is inside its bound) and a defect (the outputs outside it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swapcheck_common.verdicts import ARBITER_UNDECIDED, arbiter_verdict

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["COLUMN", "NOT_RUN", "attention_rows", "by_pair", "cell", "error_budget_cell", "for_pair", "matrix_cell",
           "metrics", "phrase", "side_phrase"]

NOT_RUN = "not run"
#: The arbiter's column in the tables people read (``report conformance``, the documents' evidence).
COLUMN = "arbiter (worst, in units of each side's bound)"
#: What a side's status is when its rows predate the bound columns (kdepth before issue #41).
NOT_RECORDED = ("not recorded (K-depth rows written before kdepth judged each kernel against its declared bound: "
                "rerun the sweep's kdepth units)")
#: The quantization component of the reference's own error: no kdepth number measures it.
QUANTIZATION_NOT_MEASURED = ("not measured: kdepth's exact reference is the product of the already quantized "
                             "operands, so its distance from the unquantized product is not recorded")


def by_pair(cat: Catalog, sweep: str) -> dict[tuple[str, str, str], dict[str, dict[str, Any]]]:
    """``kdepth_bounds`` rows keyed ``(pair_a, pair_b, scale_mode) -> {side: row}``."""
    out: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for r in cat.named("kdepth_bounds", sweep=sweep):
        out.setdefault((r["pair_a"], r["pair_b"], r["scale_mode"]), {})[r["side"]] = r
    return out


def attention_rows(replay: list[dict[str, Any]], key: tuple[str, str]) -> dict[str, dict[str, Any]]:
    """An attention pair's sides in ``kdepth_bounds``' shape, from its ``attention_replay_pairs`` reference
    rows (each kernel against the float64 attention, judged against its attention algorithm's bounds,
    output and logsumexp elements; one row per dtype). No ratio is recorded there: ``max_bound_ratio``
    is None. Empty when the replay did not compare both kernels with the reference."""
    out: dict[str, dict[str, Any]] = {}
    for kernel in key:
        rows = [r for r in replay if r["comparison"] == "reference" and r["impl_a"] == kernel]
        if not rows:
            continue
        judged = [r for r in rows if r["algorithm"]]
        out[kernel] = {
            "kernel": kernel, "reference": rows[0]["impl_b"], "reference_kernel": rows[0]["impl_b"],
            "out_dtype": "/".join(sorted({r["dtype"] for r in rows})), "units": len(rows), "units_judged": len(judged),
            "units_unrecorded": 0, "statuses": ["judged"] * bool(judged) + ["no bound declared"] * (len(judged) < len(rows)),
            "algorithms": ",".join(sorted({r["algorithm"] for r in judged})) or None,
            "elements_judged": sum(r["elements"] or 0 for r in judged),
            "outside_bound": sum((r["outside_bound"] or 0) + (r["lse_outside_bound"] or 0) for r in judged),
            "max_bound_ratio": None, "worst": None, "differing": sum(r["differing"] or 0 for r in rows),
            "elements": sum(r["elements"] or 0 for r in rows), "max_spacing": max(r["max_spacing"] or 0 for r in rows),
            "max_spacing_significant": max(r["max_spacing_significant"] or 0 for r in rows)}
    return out if len(out) == 2 else {}


def _side(name: str, r: dict[str, Any] | None) -> dict[str, Any]:
    """One side's judgement: ``outside`` True / False / None (unknown) with the reason, and its figures."""
    if r is None:
        return {"kernel": name, "status": NOT_RUN, "outside": None,
                "reason": f"{name}: no K-depth comparison with the reference"}
    statuses = [s for s in (r["statuses"] or []) if s is not None]
    kernel = r["kernel"] or name
    side: dict[str, Any] = {
        "kernel": name, "kernel_name": kernel, "algorithm": r["algorithms"], "units": r["units"],
        "units_judged": r["units_judged"], "elements": r["elements_judged"], "outside_bound": r["outside_bound"],
        "max_bound_ratio": r["max_bound_ratio"], "worst": r["worst"] if r["max_bound_ratio"] is not None else None,
        "reference": r["reference"], "max_spacing_from_reference": r["max_spacing"],
        "max_spacing_significant_from_reference": r["max_spacing_significant"],
        "differing_from_reference": r["differing"], "elements_compared": r["elements"]}
    if r["outside_bound"]:  # proven outside, whatever the other units say
        return {**side, "status": "outside", "outside": True, "reason": None}
    if r["units_judged"] and r["units_judged"] == r["units"]:
        return {**side, "status": "inside", "outside": False, "reason": None}
    if "no bound declared" in statuses:
        why = f"no bound declared for {kernel}"
    elif "bias not modelled" in statuses:
        why = f"{name}: not judged (K-depth with bias: the bound models no bias)"
    elif r["units_unrecorded"]:
        why = f"{name}: {NOT_RECORDED}"
    else:
        why = f"{name}: {r['units_judged']} of {r['units']} units judged"
    if r["units_judged"]:
        why += f" ({r['units_judged']} of {r['units']} units judged, none outside)"
    return {**side, "status": "unknown", "outside": None, "reason": why}


def _budget(side: dict[str, Any], out_dtype: str | None, reference_kernel: str | None) -> dict[str, Any]:
    """A side's error budget in output spacings: the reference's own error, order, defect (module docstring)."""
    unit = f"{out_dtype or 'output'} spacings"
    rounding = ("at most 1/2 spacing: the exact result rounded once, correctly" if reference_kernel == "exact"
                else f"not measured: the reference is {reference_kernel}, not the exact result")
    if side["outside"] is None:
        order = defect = f"not measured: {side['reason']}"
    elif side["outside"]:
        order = ("not separated: outputs outside the bound; the side's largest distance from the reference, "
                 f"{side['max_spacing_from_reference']} sp, includes the defect")
        defect = (f"{side['outside_bound']} of {side['elements']} outputs outside the {side['algorithm']} bound, "
                  f"worst {_ratio(side['max_bound_ratio'])} the bound")
    else:
        order = (f"up to {side['max_spacing_from_reference']} sp from the reference (normal range "
                 f"{side['max_spacing_significant_from_reference']} sp), every output inside the {side['algorithm']} "
                 f"bound (worst {_ratio(side['max_bound_ratio'])} the bound)")
        defect = f"none: 0 of {side['elements']} outputs outside the bound"
    return {"unit": unit, "quantization": QUANTIZATION_NOT_MEASURED, "reference_rounding": rounding,
            "accumulation_order": order, "defect": defect}


def for_pair(rows: dict[str, dict[str, Any]] | None, a: str, b: str) -> dict[str, Any]:
    """The arbiter of one pair and scale mode from its ``kdepth_bounds`` rows (``{side: row}``; None or
    empty: K-depth did not compare the pair). JSON-able: ``status`` (``run``, ``undecided``, ``not run``),
    ``verdict`` (one of ARBITER_ORDER, None unless run), ``reason``, ``a``/``b`` and ``error_budget``."""
    if not rows:
        return {"status": NOT_RUN, "verdict": None}
    sa, sb = _side(a, rows.get(a)), _side(b, rows.get(b))
    verdict = arbiter_verdict(sa["outside"], sb["outside"])
    any_row = next(iter(rows.values()))
    budget = {"a": _budget(sa, any_row["out_dtype"], any_row["reference_kernel"]),
              "b": _budget(sb, any_row["out_dtype"], any_row["reference_kernel"])}
    reasons = [s["reason"] for s in (sa, sb) if s["reason"]]
    return {"status": "run" if verdict else ARBITER_UNDECIDED, "verdict": verdict,
            "reason": "; ".join(reasons) or None, "yardstick": "each side against the bound of the accumulation "
            "algorithm its kernel declares, around the exact result (tasks/checks/scaled_bound.py)",
            "a": {k: v for k, v in sa.items() if k != "outside"}, "b": {k: v for k, v in sb.items() if k != "outside"},
            "error_budget": budget}


def _ratio(x: float | None) -> str:
    return "ratio not recorded" if x is None else f"{x:.3g}x"


def side_phrase(s: dict[str, Any]) -> str:
    """One side in words: its kernel, algorithm and judgement, with its worst element."""
    if s["status"] in ("inside", "outside"):
        w = s.get("worst") or {}
        where = (f" at K={w['k']} seed {w['seed']} [{w['row']}, {w['col']}]"
                 if w.get("k") is not None and w.get("row") is not None else "")
        if s["status"] == "outside":
            return (f"{s['kernel']} outside its {s['algorithm']} bound: {s['outside_bound']} of {s['elements']} "
                    f"outputs, worst {_ratio(s['max_bound_ratio'])} the bound{where}")
        return f"{s['kernel']} inside its {s['algorithm']} bound (worst {_ratio(s['max_bound_ratio'])}{where})"
    return str(s.get("reason") or s["status"])


def phrase(arb: dict[str, Any]) -> str:
    """The arbiter in words: its verdict (or why none) and both sides."""
    if arb["status"] == NOT_RUN:
        return NOT_RUN
    head = arb["verdict"] or f"{ARBITER_UNDECIDED} ({arb['reason']})"
    return f"{head}: {side_phrase(arb['a'])}; {side_phrase(arb['b'])}"


def cell(arb: dict[str, Any]) -> str:
    """The short cell of a table: the verdict with each side's worst element in units of its bound."""
    if arb["status"] == NOT_RUN:
        return NOT_RUN
    parts = []
    for s in (arb["a"], arb["b"]):
        if s["status"] in ("inside", "outside"):
            parts.append(f"{s['kernel']} {_ratio(s['max_bound_ratio'])}"
                         + (f", {s['outside_bound']} out" if s["status"] == "outside" else ""))
        else:
            parts.append(f"{s['kernel']} unknown")
    return f"{arb['verdict'] or ARBITER_UNDECIDED} ({'; '.join(parts)})"


def error_budget_cell(arb: dict[str, Any]) -> str:
    """The error budget in one cell: each side's order and defect components, the quantization once."""
    if arb["status"] == NOT_RUN:
        return NOT_RUN
    eb = arb["error_budget"]
    return (f"in {eb['a']['unit']}: quantization {eb['a']['quantization'].split(':')[0]}; reference rounding "
            f"{eb['a']['reference_rounding'].split(':')[0]}; "
            + "; ".join(f"{arb[k]['kernel']}: order {eb[k]['accumulation_order']}, defect {eb[k]['defect']}"
                        for k in ("a", "b")))


def matrix_cell(r: dict[str, Any]) -> str:
    """The arbiter's cell of a matrix row (``reports.certificate.matrix_rows``): its verdict (or status)
    with each side's worst element in units of its bound."""
    if r.get("arbiter") in (None, NOT_RUN):
        return NOT_RUN
    ratios = [f"{side} {r[f'arbiter_{side}_max_bound_ratio']:.3g}x" if r.get(f"arbiter_{side}_max_bound_ratio") is not None
              else f"{side} {r[f'arbiter_{side}_outside_bound']} out" if r.get(f"arbiter_{side}_outside_bound") is not None
              else f"{side} unknown" for side in ("a", "b")]
    return f"{r['arbiter']} ({', '.join(ratios)})"


def metrics(cat: Catalog, sweep: str) -> dict[str, dict[str, Any]]:
    """The nightly's arbiter metrics: per K-depth pair and scale mode, the verdict (or ``undecided``),
    rule ``exact`` (any change is a regression), from the same named query as the certificate's."""
    out: dict[str, dict[str, Any]] = {}
    for (a, b, mode), rows in by_pair(cat, sweep).items():
        arb = for_pair(rows, a, b)
        out[f"arbiter/{a}~{b}/{mode}/verdict"] = {"value": arb["verdict"] or arb["status"], "rule": "exact"}
    return out
