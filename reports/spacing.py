"""Spacing distances, each with its yardstick: one fact under one name in every report.

A distance in output spacings (ordered bit patterns, tasks/numerics) is only comparable across
outputs of similar magnitude: near zero a spacing is tiny, so two outputs a rounding apart in
absolute terms can be dozens of spacings apart. Every report therefore shows:

* ``max_spacing_significant`` -- **the normal-range max spacing**: the largest distance over outputs
  with ``|reference| >= 5%`` of the largest ``|reference|`` of their unit (``tasks/comparison.py``,
  ``SIGNIFICANT``). This is THE max spacing of the certificate's answer, its evidence rows, ``report
  kdepth``, ``report conformance``, the documents and the nightly metrics;
* beside it, the near-zero outputs farther apart than that (all near zero, since no normal-range
  output is): ``near_zero_beyond`` (a count from the spacing histogram; exact unless
  ``near_zero_beyond_exact`` is false -- a normal-range max above 2 -- then a lower bound),
  ``near_zero_max_spacing`` (their largest distance) and ``near_zero_worst_abs_error`` (``|a - b|`` at
  the farthest of them), with ``max_abs_error`` (over all outputs) as the yardstick of that error;
* ``max_spacing``, the raw maximum over all outputs, labelled **raw** wherever it is shown.

Every column comes from the named queries (the fragment ``storage/queries/_near_zero_totals.sql``,
included by ``kdepth_summary``, ``replay_by_type``, ``replay_by_layer`` and ``attention_replay_pairs``);
this module sums query rows by the same rule (:func:`add`) and words them. docs/schema.md, "Spacing
distances", states the rule.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NEAR_ZERO", "NORMAL", "RAW", "RULE", "add", "empty", "near_zero_cell", "near_zero_count", "normal_cell",
           "phrase", "public"]

#: The names people read (table columns, evidence rows), the same in every report.
NORMAL = "max sp (normal range)"
NEAR_ZERO = "near-zero outputs beyond it"
RAW = "max sp (raw, incl. near zero)"
#: The rule in words, for notes and captions.
RULE = "normal range: outputs with |reference| >= 5% of the largest |reference| of their unit"

_MAX = ("max_spacing", "max_spacing_significant", "max_abs_error")
_SUM = ("hist_1", "hist_2", "hist_gt2")


def empty() -> dict[str, Any]:
    """The spacing fields of a total before any row is added."""
    return {"max_spacing": None, "max_spacing_significant": None, "hist_1": 0, "hist_2": 0, "hist_gt2": 0,
            "max_abs_error": None, "near_zero_beyond": 0, "near_zero_beyond_exact": True,
            "near_zero_max_spacing": None, "near_zero_worst_abs_error": None}


def add(total: dict[str, Any], row: dict[str, Any]) -> None:
    """Add one query row to ``total`` and recompute the near-zero fields of the sum by the rule of
    ``_near_zero_totals.sql`` (tests/test_spacing_facts.py checks the two agree): maxima of the
    spacings, sums of the histogram, and the farthest near-zero output's ``|a - b|`` carried from
    the row it lies in."""
    for m in _MAX:
        v = row.get(m)
        if v is not None and (total.get(m) is None or v > total[m]):
            total[m] = v
    for m in _SUM:
        total[m] = (total.get(m) or 0) + (row.get(m) or 0)
    far, err = row.get("near_zero_max_spacing"), row.get("near_zero_worst_abs_error")
    mark = None if far is None else (far, -1.0 if err is None else err)
    if mark is not None and (total.get("_far") is None or mark > total["_far"]):
        total["_far"] = mark
    _finish(total)


def _finish(t: dict[str, Any]) -> None:
    raw, s = t.get("max_spacing"), t.get("max_spacing_significant")
    if raw is None or s is None or raw <= s:
        t.update(near_zero_beyond=0, near_zero_beyond_exact=True, near_zero_max_spacing=None,
                 near_zero_worst_abs_error=None)
        return
    hist = {0: t["hist_1"] + t["hist_2"] + t["hist_gt2"], 1: t["hist_2"] + t["hist_gt2"], 2: t["hist_gt2"]}
    t["near_zero_beyond"] = hist.get(s, 1)
    t["near_zero_beyond_exact"] = s <= 2
    t["near_zero_max_spacing"] = raw
    far = t.get("_far")
    t["near_zero_worst_abs_error"] = far[1] if far is not None and far[0] == raw and far[1] >= 0 else None


def public(total: dict[str, Any]) -> dict[str, Any]:
    """``total`` without its bookkeeping (``_far``)."""
    return {k: v for k, v in total.items() if not k.startswith("_")}


def _g(v: float) -> str:
    return format(v, ".2g")


def near_zero_count(r: dict[str, Any]) -> str:
    n = r.get("near_zero_beyond")
    if n is None:
        return "not measured"
    return f"{'' if r.get('near_zero_beyond_exact', True) else '>= '}{n:,}"


def _detail(r: dict[str, Any]) -> str:
    """``"up to 27 sp, |a-b| 6.1e-05 (largest |a-b| over all outputs: 2)"``."""
    parts = [] if r.get("near_zero_max_spacing") is None else [f"up to {r['near_zero_max_spacing']:,} sp"]
    if r.get("near_zero_worst_abs_error") is not None:
        parts.append(f"|a-b| {_g(r['near_zero_worst_abs_error'])}"
                     + ("" if r.get("max_abs_error") is None
                        else f" (largest |a-b| over all outputs: {_g(r['max_abs_error'])})"))
    return ", ".join(parts)


def near_zero_cell(r: dict[str, Any]) -> str:
    """A table cell: ``"10: up to 27 sp, |a-b| 6.1e-05 (largest |a-b| over all outputs: 2)"``, ``"0"``,
    ``">= 1: ..."`` (a lower bound), ``"not measured"`` where the query has no such column."""
    n = r.get("near_zero_beyond")
    if n is None:
        return "not measured"
    if not n:
        return "0"
    detail = _detail(r)
    return near_zero_count(r) + (f": {detail}" if detail else "")


def normal_cell(r: dict[str, Any]) -> str:
    """The normal-range max with the near-zero outputs beside it, for one table cell."""
    v = r.get("max_spacing_significant")
    if v is None:
        return "not measured"
    if not r.get("near_zero_beyond"):
        return f"{v:,}"
    detail = _detail(r)
    return f"{v:,} (+{near_zero_count(r)} near-zero outputs beyond it" + (f": {detail})" if detail else ")")


def phrase(r: dict[str, Any], beyond: int | None = None) -> str:
    """The spacing clause of an answer: ``"max 1 sp in the normal range, 0 beyond the reference's own
    error; 10 near-zero outputs farther apart: up to 27 sp, |a-b| 6.1e-05 (largest |a-b| over all
    outputs: 2)"`` (``beyond``: the normal-range excess over the reference's own error, when known)."""
    v = r.get("max_spacing_significant")
    if v is None:
        return f"max {r.get('max_spacing')} sp (raw, near-zero outputs included)"
    head = f"max {v:,} sp in the normal range" + ("" if beyond is None else f", {beyond} beyond the reference's own error")
    n = r.get("near_zero_beyond")
    if not n:
        return head
    many = "output" if n == 1 and r.get("near_zero_beyond_exact", True) else "outputs"
    detail = _detail(r)
    return f"{head}; {near_zero_count(r)} near-zero {many} farther apart" + (f": {detail}" if detail else "")
