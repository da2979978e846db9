"""Summary metrics of a sweep: the numbers a nightly run compares with its baseline.

Each metric has a name (a path such as ``kdepth/int8/int8-cutlass-order~int8-triton-order/real/differing_rate``),
a value and a rule:

* ``exact`` — bitwise facts (bit-identical or not, ``k/N`` identical layers or sequences, a
  prediction's status, a check's verdict): any change is a regression;
* ``rate`` — fractions of differing outputs or flips: a regression when today's value exceeds the
  baseline by more than ``max(abs_tol, rel_tol * baseline)``; a larger drop is reported as a change;
* ``max`` — worst-case distances in spacings: a regression when today's value is larger;
* ``auc`` — the flip-risk ROC-AUC: a change larger than ``abs_tol`` either way is reported, a drop
  larger than it is a regression.

Every metric is computed with DuckDB from the documented tables, so each can be re-derived by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

RATE_ABS_TOL = 2e-5
RATE_REL_TOL = 0.5
AUC_ABS_TOL = 0.05


def _metric(value: Any, rule: str, **extra: Any) -> dict[str, Any]:
    return {"value": value, "rule": rule, **extra}


def _q(results: str | Path, sql: str, sweep: str) -> list[dict[str, Any]]:
    from storage.catalog import read_only_query

    return read_only_query(results, sql.replace("$sweep", "'" + sweep.replace("'", "") + "'")).to_pylist()


def kdepth_metrics(results: str | Path, sweep: str) -> dict[str, dict[str, Any]]:
    rows = _q(results, """
        SELECT dtype, impl_a, impl_b, scale_mode, sum(elements)::BIGINT AS e, sum(differing)::BIGINT AS d,
               max(max_spacing_significant) AS ms
        FROM kdepth WHERE sweep = $sweep GROUP BY ALL ORDER BY ALL""", sweep)
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = f"kdepth/{r['dtype']}/{r['impl_a']}~{r['impl_b']}/{r['scale_mode']}"
        out[f"{key}/bit_identical"] = _metric(r["d"] == 0, "exact")
        out[f"{key}/differing_rate"] = _metric(r["d"] / r["e"] if r["e"] else 0.0, "rate",
                                               abs_tol=RATE_ABS_TOL, rel_tol=RATE_REL_TOL)
        out[f"{key}/max_spacing_significant"] = _metric(int(r["ms"]), "max")
    return out


def replay_metrics(results: str | Path, sweep: str) -> dict[str, dict[str, Any]]:
    rows = _q(results, """
        SELECT comparison, impl_a, impl_b, scale_mode, count(DISTINCT layer) AS n,
               count(DISTINCT layer) FILTER (WHERE bitwise_equal) AS k, sum(elements)::BIGINT AS e, sum(differing)::BIGINT AS d,
               max(max_spacing) AS ms, bool_and(coalesce(accumulators_equal, true)) AS acc
        FROM replay WHERE sweep = $sweep GROUP BY ALL ORDER BY ALL""", sweep)
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = f"replay/{r['impl_a']}~{r['impl_b']}/{r['scale_mode']}"
        out[f"{key}/identical_layers"] = _metric(f"{r['k']}/{r['n']}", "exact")
        out[f"{key}/differing_rate"] = _metric(r["d"] / r["e"] if r["e"] else 0.0, "rate",
                                               abs_tol=RATE_ABS_TOL, rel_tol=RATE_REL_TOL)
        out[f"{key}/max_spacing"] = _metric(int(r["ms"]), "max")
        if r["comparison"] == "pair":
            out[f"{key}/accumulators_equal"] = _metric(bool(r["acc"]), "exact")
    return out


def generation_metrics(results: str | Path, sweep: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in _q(results, """
        SELECT arm, count(*) AS n, count(*) FILTER (WHERE h = 1) AS k FROM (
            SELECT arm, prompt_index, count(DISTINCT sequence_hash) AS h FROM sequences WHERE sweep = $sweep GROUP BY ALL)
        GROUP BY arm ORDER BY arm""", sweep):
        out[f"generate/{r['arm']}/self_reproducibility"] = _metric(f"{r['k']}/{r['n']}", "exact")
    for r in _q(results, """
        SELECT a.arm AS arm_a, b.arm AS arm_b, count(*) AS n,
               count(*) FILTER (WHERE a.sequence_hash = b.sequence_hash) AS k
        FROM sequences a JOIN sequences b ON a.sweep = b.sweep AND a.prompt_index = b.prompt_index
             AND a.restart = 0 AND b.restart = 0 AND a.arm < b.arm
        WHERE a.sweep = $sweep GROUP BY ALL ORDER BY ALL""", sweep):
        out[f"generate/{r['arm_a']}~{r['arm_b']}/cross_arm_identical"] = _metric(f"{r['k']}/{r['n']}", "exact")
    for r in _q(results, """
        SELECT ref_arm, arm, count(*) AS n, count(*) FILTER (WHERE flip) AS flips
        FROM teacher_forced WHERE sweep = $sweep GROUP BY ALL ORDER BY ALL""", sweep):
        key = f"teacher_forced/{r['ref_arm']}~{r['arm']}"
        out[f"{key}/flip_rate"] = _metric(r["flips"] / r["n"] if r["n"] else 0.0, "rate",
                                          abs_tol=RATE_ABS_TOL, rel_tol=RATE_REL_TOL)
        from storage import fliprisk

        data = fliprisk.load(results, sweep=sweep, ref_arm=r["ref_arm"], arm=r["arm"])
        auc = fliprisk.auc(data.margin, data.flip) if r["flips"] else None
        out[f"{key}/flip_auc"] = _metric(None if auc is None else round(float(auc), 4), "auc", abs_tol=AUC_ABS_TOL)
    return out


#: Verdicts from most to least benign (tasks/verdicts.py): several trials end in the worst one.
VERDICT_ORDER = ["IDENTICAL", "EPILOGUE_ROUNDING", "WITHIN_ALGORITHM_BOUND", "DIFFERENT", "INCORRECT",
                 "INCONCLUSIVE", "ERROR"]


def check_metrics(results: str | Path, sweep: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for table in ("exact_match", "bounds"):
        rows = _q(results, f"SELECT kernel, dtype, list(DISTINCT verdict) AS verdicts FROM {table} WHERE sweep = $sweep GROUP BY ALL ORDER BY ALL", sweep)
        for r in rows:
            worst = max(r["verdicts"], key=lambda v: VERDICT_ORDER.index(v) if v in VERDICT_ORDER else len(VERDICT_ORDER))
            out[f"check/{table}/{r['kernel']}/{r['dtype']}/verdict"] = _metric(worst, "exact")
    return out


def unit_metrics(results: str | Path, sweep: str) -> dict[str, dict[str, Any]]:
    rows = _q(results, "SELECT status, count(*) AS n FROM units WHERE sweep = $sweep GROUP BY ALL", sweep)
    counts = {r["status"]: r["n"] for r in rows}
    return {"units/failed": _metric(counts.get("failed", 0), "exact"), "units/ok": _metric(counts.get("ok", 0), "exact")}


def sweep_metrics(results: str | Path, sweep: str) -> dict[str, dict[str, Any]]:
    """Every summary metric of one sweep."""
    metrics: dict[str, dict[str, Any]] = {}
    for part in (kdepth_metrics, replay_metrics, generation_metrics, check_metrics, unit_metrics):
        metrics.update(part(results, sweep))
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
