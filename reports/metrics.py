"""Summary metrics of a sweep: the numbers a nightly run compares with its baseline.

Each metric has a name (a path such as ``kdepth/int8/int8-cutlass-order~int8-triton-order/real/differing_rate``),
a value and a rule:

* ``exact`` — bitwise facts (bit-identical or not, ``k/N`` identical layers or sequences, a
  prediction's status, a check's verdict): any change is a regression;
* ``rate`` — fractions of differing outputs or flips: a regression when today's value exceeds the
  baseline by more than ``max(abs_tol, rel_tol * baseline)``; a larger drop is reported as a change;
* ``max`` — worst-case distances in spacings (``max_spacing_significant``: the normal-range max, the
  max spacing every report shows; ``max_spacing``: the raw max, near-zero outputs included) and the
  count of near-zero outputs beyond the normal-range max (``near_zero_beyond``, reports/spacing.py):
  a regression when today's value is larger;
* ``auc`` — the flip-risk ROC-AUC: a change larger than ``abs_tol`` either way is reported, a drop
  larger than it is a regression.

Every metric is computed with DuckDB from the documented tables, so each can be re-derived by hand:
each comes from the same named query (storage/queries/*.sql) as the report that shows it —
``kdepth_summary``, ``replay_by_type``, ``self_reproducibility``, ``cross_arm``, ``flip_positions``
(through ``reports.fliprisk``), ``check_verdicts``, ``kdepth_bounds`` (the arbiter's verdict per pair and
scale mode, rule ``exact``) and ``unit_status``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reports import fliprisk, kdepth, replay
from reports.conformance import VERDICT_ORDER, check_verdicts

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["VERDICT_ORDER", "check_metrics", "compare", "conformance_metrics", "generation_metrics", "kdepth_metrics",
           "replay_metrics", "sweep_metrics", "unit_metrics"]

RATE_ABS_TOL = 2e-5
RATE_REL_TOL = 0.5
AUC_ABS_TOL = 0.05


def _metric(value: Any, rule: str, **extra: Any) -> dict[str, Any]:
    return {"value": value, "rule": rule, **extra}


def kdepth_metrics(cat: Catalog, sweep: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in kdepth.pair_totals(kdepth.summary(cat, sweep)):
        key = f"kdepth/{r['dtype']}/{r['impl_a']}~{r['impl_b']}/{r['scale_mode']}"
        d, e = r["differing"], r["elements"]
        out[f"{key}/bit_identical"] = _metric(d == 0, "exact")
        out[f"{key}/differing_rate"] = _metric(d / e if e else 0.0, "rate",
                                               abs_tol=RATE_ABS_TOL, rel_tol=RATE_REL_TOL)
        out[f"{key}/max_spacing_significant"] = _metric(int(r["max_spacing_significant"]), "max")
        out[f"{key}/near_zero_beyond"] = _metric(int(r["near_zero_beyond"]), "max")
    return out


def replay_metrics(cat: Catalog, sweep: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in replay.pair_totals(replay.by_type(cat, sweep)):
        key = f"replay/{r['impl_a']}~{r['impl_b']}/{r['scale_mode']}"
        d, e = r["differing"], r["elements"]
        out[f"{key}/identical_layers"] = _metric(f"{r['identical_layers']}/{r['layers']}", "exact")
        out[f"{key}/differing_rate"] = _metric(d / e if e else 0.0, "rate",
                                               abs_tol=RATE_ABS_TOL, rel_tol=RATE_REL_TOL)
        out[f"{key}/max_spacing"] = _metric(int(r["max_spacing"]), "max")  # raw (kept: baselines name it)
        if r.get("max_spacing_significant") is not None:
            out[f"{key}/max_spacing_significant"] = _metric(int(r["max_spacing_significant"]), "max")
            out[f"{key}/near_zero_beyond"] = _metric(int(r["near_zero_beyond"]), "max")
        if r["comparison"] == "pair":
            out[f"{key}/accumulators_equal"] = _metric(bool(r["accumulators_equal"]), "exact")
    return out


def generation_metrics(cat: Catalog, sweep: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in cat.named("self_reproducibility", sweep=sweep):
        # identical is NULL (no value) for an arm with a single restart: nothing to compare.
        value = None if r["identical"] is None else f"{r['identical']}/{r['total']}"
        out[f"generate/{r['arm']}/self_reproducibility"] = _metric(value, "exact")
    for r in cat.named("cross_arm", sweep=sweep):
        out[f"generate/{r['arm_a']}~{r['arm_b']}/cross_arm_identical"] = _metric(f"{r['identical']}/{r['total']}", "exact")
    data = fliprisk.load(cat, sweep=sweep)
    for pid, pair in enumerate(data.pairs):
        sub = data.subset(data.pair == pid)
        n, flips = len(sub), int(sub.flip.sum())
        key = f"teacher_forced/{pair['ref_arm']}~{pair['arm']}"
        out[f"{key}/flip_rate"] = _metric(flips / n if n else 0.0, "rate", abs_tol=RATE_ABS_TOL, rel_tol=RATE_REL_TOL)
        auc = fliprisk.auc(sub.margin, sub.flip) if flips else None
        out[f"{key}/flip_auc"] = _metric(None if auc is None else round(float(auc), 4), "auc", abs_tol=AUC_ABS_TOL)
    return out


def check_metrics(cat: Catalog, sweep: str) -> dict[str, dict[str, Any]]:
    return {f"check/{r['check']}/{r['kernel']}/{r['dtype']}/verdict": _metric(r["verdict"], "exact")
            for r in check_verdicts(cat, sweep)}


def conformance_metrics(cat: Catalog, sweep: str) -> dict[str, dict[str, Any]]:
    """``report conformance``'s metrics: each kernel's check verdicts and each K-depth pair's arbiter
    verdict per scale mode (reports/arbiter.py)."""
    from reports.arbiter import metrics as arbiter_metrics

    return {**check_metrics(cat, sweep), **arbiter_metrics(cat, sweep)}


def unit_metrics(cat: Catalog, sweep: str) -> dict[str, dict[str, Any]]:
    counts: dict[str, int] = {}
    for r in cat.named("unit_status", sweep=sweep):
        counts[r["status"]] = counts.get(r["status"], 0) + int(r["units"])
    return {"units/failed": _metric(counts.get("failed", 0), "exact"), "units/ok": _metric(counts.get("ok", 0), "exact")}


def sweep_metrics(cat: Catalog, sweep: str) -> dict[str, dict[str, Any]]:
    """Every summary metric of one sweep: those each registered report declares (``Report.metrics``)."""
    if not hasattr(cat, "named"):
        raise TypeError(f"sweep_metrics takes a Catalog (storage.catalog.open_catalog(results)), not {cat!r}")
    from reports.registry import reports

    metrics: dict[str, dict[str, Any]] = {}
    for report in reports():  # each report declares the metrics of what it shows (a plugin's too)
        if report.metrics is not None:
            metrics.update(report.metrics(cat, sweep))
    return dict(sorted(metrics.items()))


def compare(baseline: dict[str, dict[str, Any]], today: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every metric that changed, appeared or disappeared, each marked ``regression`` or not."""
    changes = []
    for name in sorted(set(baseline) | set(today)):
        b, t = baseline.get(name), today.get(name)
        if b is None:
            assert t is not None  # the name came from one of the two
            changes.append({"metric": name, "baseline": None, "today": t["value"], "rule": t["rule"],
                            "kind": "new", "regression": False})
            continue
        if t is None:
            changes.append({"metric": name, "baseline": b["value"], "today": None, "rule": b["rule"],
                            "kind": "missing", "regression": True})
            continue
        bv, tv, rule = b["value"], t["value"], b["rule"]
        kind, regression = None, False
        if rule == "exact":
            if bv != tv:
                kind, regression = "changed", True
        elif rule == "rate":
            allowed = max(b.get("abs_tol", RATE_ABS_TOL), b.get("rel_tol", RATE_REL_TOL) * bv)
            if tv > bv + allowed:
                kind, regression = "worse", True
            elif tv < bv - allowed:
                kind = "better"
        elif rule == "max":
            if tv > bv:
                kind, regression = "worse", True
            elif tv < bv:
                kind = "better"
        elif rule == "auc":
            if (bv is None) != (tv is None):
                kind = "changed"
            elif bv is not None and abs(tv - bv) > b.get("abs_tol", AUC_ABS_TOL):
                kind, regression = ("worse", True) if tv < bv else ("better", False)
        if kind:
            changes.append({"metric": name, "baseline": bv, "today": tv, "rule": rule, "kind": kind,
                            "regression": regression})
    return changes
