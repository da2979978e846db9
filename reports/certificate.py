"""The swap certificate: one verdict per kernel pair of a sweep, with its evidence as numbers.

One certificate per (sweep, kernel A, kernel B), for every pair of the kernels a sweep ran (the N x N
matrix, kernels of one input format), with one section per scale mode. Each section holds:

* ``kdepth`` (``kdepth_summary``): outputs, differing, ppm with an exact (Clopper-Pearson) interval,
  ``max_spacing_significant`` (the normal-range max spacing: THE max spacing of the answer, the evidence
  and every other report), the near-zero outputs beyond it (``near_zero_*``), ``max_spacing`` (raw,
  near-zero outputs included; reports/spacing.py), ``max_spacing_beyond_reference_error`` (see
  :func:`kdepth_section`), one row per K, and the K-trend (:func:`k_trend`);
* ``replay`` (``replay_by_type`` summed by ``reports.replay.pair_totals``): layers identical n/N, the
  same spacing fields;
* ``end_to_end`` (``cross_arm``, ``self_reproducibility``, ``teacher_forced_pairs``): per arm pair whose
  arms ran the two kernels under this scale mode, sequences identical n/N, each arm's
  self-reproducibility, and the flips of each teacher-forced (ref_arm, arm) pair read alone
  (``reports.fliprisk.load``) with an exact interval: never pooled across pairs.

Beside them: each kernel's check verdicts (``check_verdicts``) and the provenance (``certificate_provenance``,
``certificate_kernel_versions``, ``certificate_arms``). A sweep is always a key: without a sweep every
sweep gets its own certificates, nothing is pooled across sweeps. Intervals come from scipy
(``binomtest(...).proportion_ci(method="exact")``); the K-trend is a quasi-likelihood profile interval
over (K, seed) cells, its dispersion estimated (:func:`k_trend`). The
rules and the JSON keys are documented in docs/certificate.md and docs/schema.md.
"""

from __future__ import annotations

import json
from itertools import combinations
from typing import TYPE_CHECKING, Any

from reports import arbiter as arbiter_mod
from reports import attention as attention_swap
from reports import divergence, kdepth, noise_floor, quantizer_swap, replay, spacing
from reports.agreement import self_cell
from swapcheck_common import verdicts as _vocabulary

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["NOT_RUN", "RARE_FRACTION", "VERDICT_ORDER", "certificates", "check_verdicts", "detail_lines",
           "evidence_rows", "exact_ci", "identity_line", "not_exact_lines", "k_trend", "matrix_rows", "section_verdict", "select_pair", "summary_rows",
           "worst_verdict"]

#: The verdict vocabulary (swapcheck_common.verdicts, shared with tasks.verdicts): the order from most to
#: least benign (several trials end in the worst one), what passes, the check verdicts that fail a kernel
#: (they decide a certificate alone), and "rare".
VERDICT_ORDER = list(_vocabulary.VERDICT_ORDER)
FAILING = _vocabulary.FAILING
PASSING = _vocabulary.PASSING
RARE_FRACTION = _vocabulary.RARE_FRACTION
#: The verdict and status of an experiment (or a whole section) that did not run for a pair.
NOT_RUN = "not run"
#: Confidence level of every interval.
LEVEL = 0.95
#: A K-trend bound beyond this slope counts as unbounded (K^10 is no physical trend).
SLOPE_LIMIT = 10.0
#: The check cells of each GEMM kernel (check_verdicts' tables): the worst verdict of each, "not run" when absent.
CHECKS = ("exact_match", "bounds", "fuzz", "precision")
#: The arbiter of a quantizer pair: a quantizer declares no error bound to judge it against.
QUANTIZER_ARBITER: dict[str, Any] = {"status": NOT_RUN, "verdict": None,
                                     "reason": "a quantizer declares no error bound: nothing to judge each side against"}
#: How the answer names a scale mode.
SCALE_NAMES = {"pow2": "power-of-two scales", "real": "real scales"}


def worst_verdict(verdicts: list[str]) -> str:
    return _vocabulary.worst_name(verdicts)


def check_verdicts(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """Worst check verdict per (sweep, check, kernel, output dtype), exact_match before bounds.

    Over every sweep of the results (``Catalog.sweeps``) when ``sweep`` is None.
    """
    rows = cat.named("check_verdicts", sweep=sweep)
    order = [sweep] if sweep else cat.sweeps()
    by_sweep: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_sweep.setdefault(r["sweep"], []).append({"sweep": r["sweep"], "check": r["check"], "kernel": r["kernel"],
                                                    "dtype": r["dtype"], "verdict": worst_verdict(r["verdicts"])})
    return [r for sw in order for r in by_sweep.get(sw, [])]


# -- statistics -----------------------------------------------------------------------------------

def exact_ci(k: int, n: int, level: float = LEVEL) -> tuple[float, float] | None:
    """Clopper-Pearson interval of k/n from scipy (None when n is 0)."""
    if n <= 0:
        return None
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


#: The K-trend's method, named beside every interval.
TREND_METHOD = ("quasi-likelihood profile interval of the log-log slope (multinomial over (K, seed) cells, "
                "Pearson dispersion over the cells, F(1, cells - 2) cut; scipy)")
TREND_METHOD_NO_DISPERSION = ("likelihood-ratio profile interval of the log-log slope (multinomial over "
                              "(K, seed) cells, chi2(1) cut; dispersion not estimable: 2 cells; scipy)")
TREND_METHOD_ONE_END = ("likelihood-ratio bound of the log-log slope (every differing output at one end of K: "
                        "no finite maximum, no dispersion estimate; chi2(1) cut; scipy)")
#: The unit of the slope.
TREND_UNIT = "d log(differing rate) / d log(K)"


def k_trend(per_k: list[tuple[int, int, int]], level: float = LEVEL) -> dict[str, Any]:
    """The trend of the differing rate in K: ``rate ~ K^slope``, with a dispersion-aware interval.

    ``per_k`` is ``(k, differing, elements)`` per cell: one per (K, seed) where the seeds are known
    (several cells may share a K), else one per K. Model: differing ~ Poisson(elements * c * K^s) per
    cell; conditioning on the total removes ``c``: the counts are multinomial with probabilities
    proportional to ``elements * K^s``, a one-parameter likelihood that handles zero counts. The slope
    is its maximum (scipy). Seeds vary more than a binomial count allows (the audit of issue #26 found
    a chi-square interval [0.022, 0.225] that became [-0.003, 0.251] once dispersion was estimated), so
    the interval is quasi-likelihood: ``dispersion`` is the Pearson chi-square over the cells divided
    by ``cells - 2`` (at least 1), and the interval is every s whose likelihood-ratio statistic divided
    by the dispersion is within ``F(1, cells - 2).ppf(level)`` (with 2 cells: chi2(1), dispersion 1).
    ``kind``: ``identical`` (no differing output at any K: slope None), ``single_k``, ``no_trend`` (the
    interval holds 0: "no clear trend"), ``grows`` / ``shrinks``. A bound farther than ``SLOPE_LIMIT``
    is None (unbounded); so is the slope when every differing output lies at the smallest or the
    largest K (the maximum is at infinity). ``method``, ``unit``, ``cells``, ``ks``, ``differing`` and
    ``elements`` say what the interval rests on.
    """
    import numpy as np
    from scipy.optimize import brentq, minimize_scalar
    from scipy.special import logsumexp
    from scipy.stats import chi2, f

    pts = sorted((k, d, n) for k, d, n in per_k if n and n > 0)
    x = np.log(np.array([p[0] for p in pts], dtype=np.float64))
    d = np.array([p[1] for p in pts], dtype=np.float64)
    lw = np.log(np.array([p[2] for p in pts], dtype=np.float64))
    total = float(d.sum())
    out: dict[str, Any] = {"kind": "identical", "slope": None, "slope_ci_low": None, "slope_ci_high": None,
                           "dispersion": None, "ks": len(set(x.tolist())), "cells": len(pts), "level": level,
                           "differing": int(total), "elements": int(sum(p[2] for p in pts)),
                           "method": None, "unit": TREND_UNIT}
    if total == 0:
        return out
    if len(set(x.tolist())) < 2:
        return {**out, "kind": "single_k"}

    def nll(s: float) -> float:
        return -float(np.sum(d * (lw + s * x)) - total * logsumexp(lw + s * x))

    at_max = bool(d[x < x.max()].sum() == 0)
    at_min = bool(d[x > x.min()].sum() == 0)
    df = len(pts) - 2
    if at_max or at_min:
        s_hat, best = (SLOPE_LIMIT, nll(SLOPE_LIMIT)) if at_max else (-SLOPE_LIMIT, nll(-SLOPE_LIMIT))
        slope = None
        phi, cut, method = 1.0, float(chi2.ppf(level, 1)), TREND_METHOD_ONE_END
    else:
        res = minimize_scalar(nll, bounds=(-SLOPE_LIMIT, SLOPE_LIMIT), method="bounded",
                              options={"xatol": 1e-10})
        s_hat, best = float(res.x), float(res.fun)
        slope = s_hat
        if df > 0:
            mu = total * np.exp(lw + s_hat * x - logsumexp(lw + s_hat * x))
            phi = max(1.0, float(np.sum((d - mu) ** 2 / mu)) / df)
            cut, method = phi * float(f.ppf(level, 1, df)), TREND_METHOD
        else:
            phi, cut, method = 1.0, float(chi2.ppf(level, 1)), TREND_METHOD_NO_DISPERSION

    def excess(s: float) -> float:
        return 2.0 * (nll(s) - best) - cut

    lo = None if excess(-SLOPE_LIMIT) <= 0 or s_hat <= -SLOPE_LIMIT else float(brentq(excess, -SLOPE_LIMIT, s_hat))
    hi = None if excess(SLOPE_LIMIT) <= 0 or s_hat >= SLOPE_LIMIT else float(brentq(excess, s_hat, SLOPE_LIMIT))
    kind = "grows" if lo is not None and lo > 0 else "shrinks" if hi is not None and hi < 0 else "no_trend"
    return {**out, "kind": kind, "slope": slope, "slope_ci_low": lo, "slope_ci_high": hi, "dispersion": phi,
            "method": method}


def trend_phrase(t: dict[str, Any]) -> str:
    """The K-trend in words, for the answer: a growth is only named when its interval excludes 0."""
    if t["kind"] == "identical":
        return "bit-identical at every K"
    if t["kind"] == "single_k":
        return "one K only"
    if t["kind"] == "no_trend":
        return "no clear trend in K"
    word = "grows" if t["kind"] == "grows" else "shrinks"
    if t["slope"] is None:
        return f"{word} with K (differences only at the {'largest' if word == 'grows' else 'smallest'} K)"
    return f"{word} like K^{t['slope']:.2g}"


def trend_counts(t: dict[str, Any]) -> str:
    """What a K-trend interval rests on: method, unit and counts (for the evidence table)."""
    if t.get("method") is None:
        return ""
    disp = "" if t.get("dispersion") is None else f", dispersion {t['dispersion']:.3g}"
    return (f"{t['method']}; unit {t['unit']}; {t['differing']} differing of {t['elements']} outputs in "
            f"{t['cells']} cells over {t['ks']} K{disp}")


# -- sections -------------------------------------------------------------------------------------

def _ppm(d: int, n: int) -> float | None:
    return 1e6 * d / n if n else None


#: The near-zero fields (reports/spacing.py) a section carries beside its spacing maxima.
NEAR_ZERO_KEYS = ("near_zero_beyond", "near_zero_beyond_exact", "near_zero_max_spacing", "near_zero_worst_abs_error",
                  "max_abs_error")


def _ref(refs: dict[tuple[str, int], tuple[int | None, int | None]], a: str, b: str, k: int, i: int) -> int | None:
    """The larger of kernel a's and b's own distance from exact at K (raw: i = 0; normal range: 1)."""
    ra, rb = refs.get((a, k)), refs.get((b, k))
    va, vb = (None if r is None else r[i] for r in (ra, rb))
    return None if va is None or vb is None else max(va, vb)


def _beyond(pair: int | None, ref: int | None) -> int | None:
    return None if pair is None or ref is None else max(0, pair - ref)


def kdepth_section(rows: list[dict[str, Any]], refs: dict[tuple[str, int], tuple[int | None, int | None]],
                   a: str, b: str, cells: list[tuple[int, int, int]] | None = None) -> dict[str, Any]:
    """K-depth evidence of one pair and scale mode from its ``kdepth_summary`` rows; ``cells`` are its
    ``(k, differing, elements)`` per (K, seed) from ``kdepth_by_seed`` for the K-trend (per K without).

    ``max_spacing_beyond_reference_error``: over K, the largest ``pair max_spacing at K - max(max_spacing
    of a vs exact at K, of b vs exact at K)``, floored at 0: how many spacings the pair's largest
    difference exceeds the larger of the two kernels' own largest errors against the exact result at
    the same K. None when a K lacks either reference row. ``max_spacing_significant_beyond_reference_error``:
    the same over the normal-range maxima (``max_spacing_significant``).
    """
    if not rows:
        return {"status": NOT_RUN}
    per_k: dict[int, dict[str, Any]] = {}
    for t in kdepth.pair_totals(rows, keys=("k",)):
        ref, ref_sig = (_ref(refs, a, b, t["k"], i) for i in (0, 1))
        per_k[t["k"]] = {"k": t["k"], "elements": t["elements"], "differing": t["differing"],
                         "ppm": _ppm(t["differing"], t["elements"]), "max_spacing": t["max_spacing"],
                         "reference_max_spacing": ref,
                         "beyond_reference_error": _beyond(t["max_spacing"], ref),
                         "max_spacing_significant": t["max_spacing_significant"],
                         "reference_max_spacing_significant": ref_sig,
                         "beyond_reference_error_significant": _beyond(t["max_spacing_significant"], ref_sig)}
    (tot,) = kdepth.pair_totals(rows, keys=())
    ci = exact_ci(tot["differing"], tot["elements"])
    beyond = [r["beyond_reference_error"] for r in per_k.values()]
    beyond_sig = [r["beyond_reference_error_significant"] for r in per_k.values()]
    return {"status": "run", "out_dtype": rows[0]["out_dtype"], "seeds": max(r["seeds"] for r in rows),
            "elements": tot["elements"], "differing": tot["differing"],
            "ppm": _ppm(tot["differing"], tot["elements"]),
            "ppm_ci_low": None if ci is None else 1e6 * ci[0], "ppm_ci_high": None if ci is None else 1e6 * ci[1],
            "max_spacing": tot["max_spacing"], "max_spacing_significant": tot["max_spacing_significant"],
            **{k: tot[k] for k in NEAR_ZERO_KEYS},
            "max_spacing_beyond_reference_error": None if None in beyond else max(beyond),
            "max_spacing_significant_beyond_reference_error": None if None in beyond_sig else max(beyond_sig),
            "per_k": [per_k[k] for k in sorted(per_k)],
            "trend": k_trend(cells if cells else [(r["k"], r["differing"], r["elements"]) for r in per_k.values()])}


def replay_section(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if not rows:
        return {"status": NOT_RUN}
    (t,) = replay.pair_totals(rows, keys=())
    return {"status": "run", "layers": t["layers"], "identical_layers": t["identical_layers"],
            "elements": t["elements"], "differing": t["differing"], "ppm": _ppm(t["differing"], t["elements"]),
            "max_spacing": t["max_spacing"], "max_spacing_significant": t["max_spacing_significant"],
            **{k: t[k] for k in NEAR_ZERO_KEYS}, "accumulators_equal": t["accumulators_equal"]}


def flip_figures(counts: dict[str, Any]) -> dict[str, Any]:
    """The flips of ONE teacher-forced (ref_arm, arm) pair alone, with an exact interval: ``counts`` is
    its row of ``teacher_forced_pairs`` (the positions ``reports.fliprisk.load`` keeps, the flips among
    them, the rows it drops), counted by DuckDB without reading the positions out."""
    n, k = int(counts["kept"]), int(counts["flips"])
    ci = exact_ci(k, n)
    return {"ref_arm": counts["ref_arm"], "arm": counts["arm"], "positions": n, "flips": k,
            "flip_rate": k / n if n else None, "flip_rate_ci_low": None if ci is None else ci[0],
            "flip_rate_ci_high": None if ci is None else ci[1], "dropped": int(counts["dropped"])}


def _self(r: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if r is None else {"identical": r["identical"], "total": r["total"], "restarts": r["restarts"]}


def end_to_end_section(cat: Catalog, sweep: str, cross: list[dict[str, Any]], self_rows: dict[str, dict[str, Any]],
                       tf_pairs: dict[tuple[str, str], dict[str, Any]], arms: dict[str, dict[str, Any]],
                       div: dict[str, Any] | None = None) -> dict[str, Any]:
    if not cross:
        return {"status": NOT_RUN}
    pairs = []
    for c in cross:
        flips = [flip_figures(tf_pairs[(ra, a)]) for ra, a in ((c["arm_a"], c["arm_b"]), (c["arm_b"], c["arm_a"]))
                 if (ra, a) in tf_pairs]
        ci = exact_ci(c["identical"], c["total"])
        pairs.append({"arm_a": c["arm_a"], "arm_b": c["arm_b"], "kernel_a": c["kernel_a"], "kernel_b": c["kernel_b"],
                      "model": (arms.get(c["arm_a"]) or {}).get("model"),
                      "identical": c["identical"], "total": c["total"],
                      "identical_ci_low": None if ci is None else ci[0], "identical_ci_high": None if ci is None else ci[1],
                      "self_reproducibility_a": _self(self_rows.get(c["arm_a"])),
                      "self_reproducibility_b": _self(self_rows.get(c["arm_b"])),
                      "flips": flips})
        if div is not None:  # where the arms part, probs_diff / KL (reports/divergence.py)
            pairs[-1]["divergence"] = divergence.pair_figures(div, c["arm_a"], c["arm_b"])
    return {"status": "run", "arm_pairs": pairs}


# -- verdicts -------------------------------------------------------------------------------------

def section_verdict(sec: dict[str, Any], checks: dict[str, dict[str, str]]) -> str:
    """The verdict of one (pair, scale mode) section (rules: docs/certificate.md)."""
    kd, rp, e2e = sec["kdepth"], sec["replay"], sec["end_to_end"]
    if all(x["status"] == NOT_RUN for x in (kd, rp, e2e)):
        return NOT_RUN
    kernel_checks = [v for c in checks.values() for v in c.values() if v != NOT_RUN]
    if any(v in FAILING for v in kernel_checks):
        return worst_verdict([v for v in kernel_checks if v in FAILING])
    identical = ((kd["status"] == NOT_RUN or kd["differing"] == 0)
                 and (rp["status"] == NOT_RUN or (rp["identical_layers"] == rp["layers"] and rp["differing"] == 0))
                 and (e2e["status"] == NOT_RUN or all(p["identical"] == p["total"] for p in e2e["arm_pairs"])))
    if identical:
        return "IDENTICAL"
    kernel_identical = ((kd["status"] == NOT_RUN or kd["differing"] == 0)
                        and (rp["status"] == NOT_RUN or (rp["identical_layers"] == rp["layers"] and rp["differing"] == 0)))
    if kernel_identical:
        return "INCONCLUSIVE"   # sequences differ, but no kernel-level experiment ran or saw a difference
    ran = [x for x in (kd, rp) if x["status"] == "run"]
    max_sp = max((x["max_spacing"] or 0) for x in ran)
    rate = ran[0]["differing"] / ran[0]["elements"] if ran[0]["elements"] else 0.0
    grows = kd["status"] == "run" and kd["trend"]["kind"] == "grows"
    if max_sp <= 1 and rate <= RARE_FRACTION and not grows:
        return "EPILOGUE_ROUNDING"
    if all(c.get("bounds") in PASSING for c in checks.values()):
        return "WITHIN_ALGORITHM_BOUND"
    return "DIFFERENT"


def _overall(sections: list[dict[str, Any]]) -> str:
    run = [s["verdict"] for s in sections if s["verdict"] != NOT_RUN]
    return worst_verdict(run) if run else NOT_RUN


LEADS = {"IDENTICAL": "interchangeable: bit-identical",
         "EPILOGUE_ROUNDING": "interchangeable within 1 {out} spacing",
         "WITHIN_ALGORITHM_BOUND": "interchangeable within the accumulation algorithm's error bound",
         "DIFFERENT": "not interchangeable bit for bit",
         "INCORRECT": "not interchangeable: a kernel fails its correctness check",
         "PRECISION_DOWNGRADE": "not interchangeable: a kernel computes in a narrower format than it claims",
         "ERROR": "not interchangeable: a kernel raised in its check",
         "INCONCLUSIVE": "inconclusive: sequences differ end to end, no kernel-level experiment shows why",
         NOT_RUN: "not run: no experiment compared these two kernels"}


def answer(cert: dict[str, Any]) -> str:
    """The one-line answer that leads a certificate."""
    outs = {s["kdepth"]["out_dtype"] for s in cert["scale_modes"] if s["kdepth"]["status"] == "run"}
    lead = str(LEADS.get(cert["verdict"], cert["verdict"])).format(out="/".join(sorted(outs)) or "output")
    if cert["verdict"] == "IDENTICAL":
        names = [SCALE_NAMES.get(s["scale_mode"], f"{s['scale_mode']} scales") for s in cert["scale_modes"]
                 if s["verdict"] != NOT_RUN]
        return f"{lead} under {' and '.join(names)}"
    clauses = []
    for s in cert["scale_modes"]:
        if s["verdict"] == NOT_RUN:
            continue
        name = SCALE_NAMES.get(s["scale_mode"], f"{s['scale_mode']} scales")
        kd, e2e = s["kdepth"], s["end_to_end"]
        if s["verdict"] == "IDENTICAL":
            text = f"bit-identical under {name}"
        elif kd["status"] == "run":
            text = (f"{kd['ppm']:.3g} ppm differ under {name} "
                    f"({spacing.phrase(kd, kd.get('max_spacing_significant_beyond_reference_error'))}), "
                    f"{trend_phrase(kd['trend'])}")
        elif s["replay"]["status"] == "run":
            rp = s["replay"]
            text = f"{rp['identical_layers']}/{rp['layers']} replayed layers identical under {name} ({spacing.phrase(rp)})"
        else:
            text = f"under {name}"
        if e2e["status"] == "run" and s["verdict"] != "IDENTICAL":
            text += "; " + ", ".join(f"{p['identical']}/{p['total']} sequences identical" for p in e2e["arm_pairs"])
        clauses.append(text)
    return str(lead + (": " + "; ".join(clauses) if clauses else "") + arbiter_clause(cert))


def arbiter_clause(cert: dict[str, Any]) -> str:
    """The arbiter joins the answer where it names a side outside its declared bound (per scale mode);
    ``both_inside`` and undecided arbiters are in the evidence only."""
    said = []
    for s in cert["scale_modes"]:
        arb = s.get("arbiter") or {}
        if arb.get("verdict") in ("a_outside_bound", "b_outside_bound", "both_outside"):
            name = SCALE_NAMES.get(s["scale_mode"], f"{s['scale_mode']} scales")
            out = [arbiter_mod.side_phrase(arb[k]) for k in ("a", "b") if arb[k]["status"] == "outside"]
            said.append(f"arbiter under {name}: {arb['verdict']} ({'; '.join(out)})")
    return "; " + "; ".join(said) if said else ""


# -- the certificates -----------------------------------------------------------------------------

def _unordered(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def _spacing_facts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The certificate's normal-range max spacing and near-zero fields over ``rows`` (the pair's
    ``kdepth_summary`` rows, or its one replay section): reports/spacing.py. Near-zero fields are None
    where the rows do not measure them (a quantizer pair's downstream GEMM)."""
    if not rows:
        return {"max_spacing_significant": None, **{k: None for k in NEAR_ZERO_KEYS}}
    if any("hist_1" not in r for r in rows):  # replay sections (one per certificate: real scales)
        one = rows[0] if len(rows) == 1 else {}
        return {"max_spacing_significant": max((r["max_spacing_significant"] for r in rows
                                                 if r.get("max_spacing_significant") is not None), default=None),
                **{k: one.get(k) for k in NEAR_ZERO_KEYS}}
    (t,) = kdepth.pair_totals(rows, keys=())
    return {"max_spacing_significant": t["max_spacing_significant"], **{k: t[k] for k in NEAR_ZERO_KEYS}}


def _provenance(cat: Catalog, sweep: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    launches = []
    for r in cat.named("certificate_provenance", sweep=sweep):
        p = json.loads(r["provenance_json"] or "{}")
        launches.append({"launch_id": r["launch_id"], "spec_sha256": r["spec_sha256"], "status": r["status"],
                         "started_at": None if r["started_at"] is None else r["started_at"].isoformat(),
                         "host": p.get("host"), "cpu": p.get("cpu"), "platform": p.get("platform"),
                         "python": p.get("python"), "cuda_available": p.get("cuda_available"),
                         "torch_cuda": p.get("torch_cuda"), "versions": p.get("versions", {}),
                         # The kernel's full identity (orchestrator/provenance.py); None in older rows.
                         "identity_sha256": p.get("identity_sha256"), "identity": p.get("identity")})
    versions: dict[str, list[str]] = {}
    for r in cat.named("certificate_kernel_versions", sweep=sweep):
        versions.setdefault(r["kernel"], []).append(r["version"])
    prov = {"spec_sha256": sorted({x["spec_sha256"] for x in launches if x["spec_sha256"]}), "launches": launches,
            "identity_sha256": sorted({x["identity_sha256"] for x in launches if x["identity_sha256"]})}
    return prov, versions


def _sweep_certificates(cat: Catalog, sweep: str) -> list[dict[str, Any]]:
    kd_rows = kdepth.summary(cat, sweep)
    refs = {(t["impl_a"], t["scale_mode"], t["k"]): (t["max_spacing"], t["max_spacing_significant"])
            for t in kdepth.pair_totals([r for r in kd_rows if r["comparison"] == "reference"],
                                        keys=("impl_a", "scale_mode", "k"))}
    rp_rows = [r for r in replay.by_type(cat, sweep) if r["comparison"] == "pair"]
    arms = {r["arm"]: r for r in cat.named("certificate_arms", sweep=sweep)}
    qarms = quantizer_swap.arm_quantizers(cat, sweep)
    cross = [c for c in cat.named("cross_arm", sweep=sweep) if c["same_scales"] and c["kernel_a"] and c["kernel_b"]
             and c["kernel_a"] != c["kernel_b"] and c.get("attention_a") == c.get("attention_b")
             and quantizer_swap.same_quantizer(c, qarms)]
    self_rows = {r["arm"]: r for r in cat.named("self_reproducibility", sweep=sweep)}
    tf_pairs = {(r["ref_arm"], r["arm"]): r for r in cat.named("teacher_forced_pairs", sweep=sweep)}
    div = divergence.for_certificate(cat, sweep) if cross else None
    checks_rows = check_verdicts(cat, sweep)
    floor = noise_floor.noise_floor(cat, sweep)
    prov, versions = _provenance(cat, sweep)
    # The K-trend's cells: per (unordered pair, scale mode), differing and elements per (K, seed).
    seed_cells: dict[tuple[tuple[str, str], str], dict[tuple[int, int], list[int]]] = {}
    for r in cat.named("kdepth_by_seed", sweep=sweep):
        if r["comparison"] == "pair":
            by_cell = seed_cells.setdefault((_unordered(r["impl_a"], r["impl_b"]), r["scale_mode"]), {})
            cell = by_cell.setdefault((int(r["k"]), int(r["seed"])), [0, 0])
            cell[0] += int(r["differing"])
            cell[1] += int(r["elements"])

    dtype: dict[str, str] = {}
    order: dict[tuple[str, str], tuple[str, str]] = {}
    for r in kd_rows:
        dtype.setdefault(r["impl_a"], r["dtype"])
        if r["comparison"] == "pair":
            dtype.setdefault(r["impl_b"], r["dtype"])
            order.setdefault(_unordered(r["impl_a"], r["impl_b"]), (r["impl_a"], r["impl_b"]))
    for r in rp_rows:
        order.setdefault(_unordered(r["impl_a"], r["impl_b"]), (r["impl_a"], r["impl_b"]))
    for c in cross:
        order.setdefault(_unordered(c["kernel_a"], c["kernel_b"]), (c["kernel_a"], c["kernel_b"]))
    kernels = set(dtype) | {k for p in order for k in p} | {a["kernel"] for a in arms.values() if a["kernel"]} \
        | {r["kernel"] for r in checks_rows}
    pairs = [p for p in combinations(sorted(kernels), 2)
             if p[0] not in dtype or p[1] not in dtype or dtype[p[0]] == dtype[p[1]]]

    bounds = arbiter_mod.by_pair(cat, sweep)
    certs = []
    for key in pairs:
        a, b = order.get(key, key)
        kd = [r for r in kd_rows if r["comparison"] == "pair" and _unordered(r["impl_a"], r["impl_b"]) == key]
        rp = [r for r in rp_rows if _unordered(r["impl_a"], r["impl_b"]) == key]
        xs = [c for c in cross if _unordered(c["kernel_a"], c["kernel_b"]) == key]
        modes = sorted({r["scale_mode"] for r in kd} | {r["scale_mode"] for r in rp} | {c["scales_a"] or "" for c in xs})
        checks = {k: {c: worst_verdict([r["verdict"] for r in checks_rows if r["kernel"] == k and r["check"] == c])
                      if any(r["kernel"] == k and r["check"] == c for r in checks_rows) else NOT_RUN
                      for c in CHECKS} for k in (a, b)}
        sections: list[dict[str, Any]] = []
        for m in modes:
            sec: dict[str, Any] = {"scale_mode": m,
                   "kdepth": kdepth_section([r for r in kd if r["scale_mode"] == m],
                                            {(i, k): v for (i, sm, k), v in refs.items() if sm == m}, a, b,
                                            [(k, dn[0], dn[1]) for (k, _), dn in sorted(seed_cells.get((key, m), {}).items())]),
                   "replay": replay_section([r for r in rp if r["scale_mode"] == m]),
                   "end_to_end": end_to_end_section(cat, sweep, [c for c in xs if (c["scales_a"] or "") == m],
                                                    self_rows, tf_pairs, arms, div)}
            arb_rows = bounds.get((*key, m))
            sections.append({**sec, "verdict": section_verdict(sec, checks),
                             "arbiter": arbiter_mod.for_pair(arb_rows, a, b)})
        kd_run = [s["kdepth"] for s in sections if s["kdepth"]["status"] == "run"]
        beyond = [x["max_spacing_beyond_reference_error"] for x in kd_run]
        beyond_sig = [x["max_spacing_significant_beyond_reference_error"] for x in kd_run]
        cert: dict[str, Any] = {
            "sweep": sweep, "kernel_a": a, "kernel_b": b, "dtype": dtype.get(a) or dtype.get(b),
            "verdict": _overall(sections), "answer": "",
            "max_spacing": max((x["max_spacing"] for x in kd_run), default=None),
            "max_spacing_beyond_reference_error": None if not beyond or None in beyond else max(beyond),
            **_spacing_facts(kd),
            "max_spacing_significant_beyond_reference_error": None if not beyond_sig or None in beyond_sig
            else max(beyond_sig),
            "scale_modes": sections,
            # The three-way arbiter per scale mode (reports/arbiter.py): the sections' own, keyed by mode.
            "arbiter": {s["scale_mode"]: s["arbiter"] for s in sections},
            "checks_a": checks[a], "checks_b": checks[b],
            "noise_floor": noise_floor.certificate_section(floor, sweep, (a, b)),
            "provenance": {**prov, "kernel_versions_a": versions.get(a, []), "kernel_versions_b": versions.get(b, []),
                           "weights_sha256": sorted({w for c in xs for arm in (c["arm_a"], c["arm_b"])
                                                     for w in (arms.get(arm) or {}).get("weights_sha256") or []})},
        }
        cert["answer"] = answer(cert)
        certs.append(cert)
    certs.extend(_attention_certificates(cat, sweep, qarms, self_rows, tf_pairs, arms, prov, versions, floor))
    certs.extend(_quantizer_certificates(cat, sweep, qarms, checks_rows, self_rows, tf_pairs, arms, prov, versions, floor))
    return certs


def _attention_certificates(cat: Catalog, sweep: str, qarms: dict[str, str | None], self_rows: dict[str, dict[str, Any]],
                            tf_pairs: dict[tuple[str, str], dict[str, Any]], arms: dict[str, dict[str, Any]],
                            prov: dict[str, Any], versions: dict[str, list[str]], floor: Any) -> list[dict[str, Any]]:
    """One certificate per attention pair (reports/attention.py): the sections of a GEMM pair's, the
    kernel names the attention registry's; kdepth is not run, replay is the per-layer q/k/v replay."""
    rp = attention_swap.replay_rows(cat, sweep)
    cross = attention_swap.arm_pairs(cat.named("cross_arm", sweep=sweep), qarms)
    certs = []
    for key, (a, b) in sorted(attention_swap.pair_order(rp, cross).items()):
        xs = [c for c in cross if _unordered(c["kernel_a"], c["kernel_b"]) == key]
        checks, algorithms = attention_swap.bound_checks(rp, (a, b))
        sections: list[dict[str, Any]] = []
        # The replay captured the model under real scales; end-to-end pairs bring their arms' scales.
        for m in sorted({c["scales_a"] or "" for c in xs} or {"real"}):
            sec: dict[str, Any] = {"scale_mode": m, "kdepth": {"status": NOT_RUN},
                                   "replay": attention_swap.replay_section(rp, key) if m == "real" else {"status": NOT_RUN},
                                   "end_to_end": end_to_end_section(cat, sweep, [c for c in xs if (c["scales_a"] or "") == m],
                                                                    self_rows, tf_pairs, arms)}
            arb = arbiter_mod.for_pair(arbiter_mod.attention_rows(rp, key) if m == "real" else None, a, b)
            sections.append({**sec, "verdict": section_verdict(sec, checks), "arbiter": arb})
        replayed = [s["replay"] for s in sections if s["replay"]["status"] == "run"]
        gemm = sorted({c["gemm_kernel"] for c in xs})
        cert: dict[str, Any] = {
            "sweep": sweep, "swap": "attention", "kernel_a": a, "kernel_b": b,
            "dtype": "/".join(replayed[0]["dtypes"]) if replayed else None,
            "verdict": _overall(sections), "answer": "",
            "max_spacing": max((x["max_spacing"] for x in replayed), default=None),
            "max_spacing_beyond_reference_error": attention_swap.beyond_reference(rp, key),
            **_spacing_facts(replayed),
            "max_spacing_significant_beyond_reference_error": attention_swap.beyond_reference(
                rp, key, "max_spacing_significant"),
            "scale_modes": sections, "arbiter": {s["scale_mode"]: s["arbiter"] for s in sections},
            "checks_a": checks[a], "checks_b": checks[b], "algorithms": algorithms,
            "attention_replay": attention_swap.per_dtype(rp, key),
            # The floor beside an attention swap: the model's with either attention kernel (and the arms' GEMM kernel).
            "noise_floor": noise_floor.certificate_section(floor, sweep, (a, b), swap="attention", gemm=gemm),
            "provenance": {**prov, "kernel_versions_a": versions.get(a, []), "kernel_versions_b": versions.get(b, []),
                           "gemm_kernels": gemm,
                           "weights_sha256": sorted({w for c in xs for arm in (c["arm_a"], c["arm_b"])
                                                     for w in (arms.get(arm) or {}).get("weights_sha256") or []})},
        }
        cert["answer"] = answer(cert) + attention_swap.answer_detail(
            replayed[0] if replayed else None, cert["attention_replay"],
            algorithms if cert["verdict"] == "WITHIN_ALGORITHM_BOUND" else None)
        certs.append(cert)
    return certs


def _quantizer_certificates(cat: Catalog, sweep: str, qarms: dict[str, str | None], checks_rows: list[dict[str, Any]],
                            self_rows: dict[str, dict[str, Any]], tf_pairs: dict[tuple[str, str], dict[str, Any]],
                            arms: dict[str, dict[str, Any]], prov: dict[str, Any], versions: dict[str, list[str]],
                            floor: Any) -> list[dict[str, Any]]:
    """One certificate per quantizer pair and fixed GEMM kernel (reports/quantizer_swap.py): the sections
    of a GEMM pair's, the names the quantizers'; kdepth is not run, replay is the ``quantize`` kind's
    downstream comparison through the fixed GEMM kernel. Only the GEMM kernel's failed checks
    (INCORRECT, PRECISION_DOWNGRADE, ERROR) enter the verdict: a passed bounds check says nothing about a quantizer."""
    qrows = quantizer_swap.quantize_rows(cat, sweep)
    cross = quantizer_swap.arm_pairs(cat.named("cross_arm", sweep=sweep), qarms)
    qversions: dict[str, list[str]] = {}
    for r in cat.named("quantizer_arms", sweep=sweep):
        if r["quantizer"] and r["quantizer_version"]:
            qversions.setdefault(quantizer_swap.identity(r["quantizer"], r["quantizer_params"]), []).append(r["quantizer_version"])
    certs = []
    for (key, gemm), (a, b) in sorted(quantizer_swap.pair_keys(qrows, cross).items()):
        xs = [c for c in cross if _unordered(c["kernel_a"], c["kernel_b"]) == key and c["gemm_kernel"] == gemm]
        gemm_checks = {c: worst_verdict([r["verdict"] for r in checks_rows if r["kernel"] == gemm and r["check"] == c])
                       if any(r["kernel"] == gemm and r["check"] == c for r in checks_rows) else NOT_RUN
                       for c in CHECKS}
        failed = {gemm: {c: v for c, v in gemm_checks.items() if v in FAILING}}
        replay_sec = quantizer_swap.replay_section(qrows, key, gemm)
        sections: list[dict[str, Any]] = []
        # The quantize kind runs the engine under real scales; end-to-end pairs bring their arms' scales.
        for m in sorted({c["scales_a"] or "" for c in xs} or {"real"}):
            sec: dict[str, Any] = {"scale_mode": m, "kdepth": {"status": NOT_RUN},
                                   "replay": replay_sec if m == "real" else {"status": NOT_RUN},
                                   "end_to_end": end_to_end_section(cat, sweep, [c for c in xs if (c["scales_a"] or "") == m],
                                                                    self_rows, tf_pairs, arms)}
            sections.append({**sec, "verdict": section_verdict(sec, failed), "arbiter": dict(QUANTIZER_ARBITER)})
        replayed = [s["replay"] for s in sections if s["replay"]["status"] == "run"]
        summary = quantizer_swap.quantize_summary(qrows, key, gemm)
        not_run = {c: NOT_RUN for c in CHECKS}
        cert: dict[str, Any] = {
            "sweep": sweep, "swap": "quantizer", "kernel_a": a, "kernel_b": b, "gemm_kernel": gemm,
            "fixed": quantizer_swap.fixed_phrase(gemm, summary),
            "dtype": "/".join(sorted({x["q_dtype"] for x in summary})) or "int8",
            "verdict": _overall(sections), "answer": "",
            "max_spacing": max((x["max_spacing"] for x in replayed), default=None),
            "max_spacing_beyond_reference_error": None,
            **_spacing_facts(replayed),
            "max_spacing_significant_beyond_reference_error": None,
            "scale_modes": sections, "arbiter": {s["scale_mode"]: s["arbiter"] for s in sections},
            "checks_a": not_run, "checks_b": not_run, "gemm_checks": gemm_checks,
            "quantize": summary,
            # A quantizer has no floor of its own: the floor of the fixed GEMM kernel, named as such.
            "noise_floor": noise_floor.certificate_section(floor, sweep, (a, b), swap="quantizer", gemm=[gemm]),
            "provenance": {**prov, "kernel_versions_a": qversions.get(a, []), "kernel_versions_b": qversions.get(b, []),
                           "gemm_kernels": [gemm], "gemm_kernel_versions": versions.get(gemm, []),
                           "weights_sha256": sorted({w for c in xs for arm in (c["arm_a"], c["arm_b"])
                                                     for w in (arms.get(arm) or {}).get("weights_sha256") or []})},
        }
        cert["answer"] = quantizer_swap.answer(cert)
        certs.append(cert)
    return certs


def certificates(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """Every certificate of a sweep (of each sweep, separately, when ``sweep`` is None): JSON-able."""
    sweeps = [sweep] if sweep else sorted(set(cat.sweeps()) | {r["sweep"] for r in cat.named("certificate_sweeps", sweep=None)})
    certs = [c for sw in sweeps for c in _sweep_certificates(cat, sw)]
    for c in certs:  # the identities it holds for: one hash per distinct identity of its sweep's launches
        c["identity_sha256"] = c["provenance"]["identity_sha256"]
    return certs


def identity_line(prov: dict[str, Any], kernels: tuple[str, ...] = ()) -> str:
    """The identity a certificate holds for, in words: its hash, the parts that decide it (the layout
    path of each of ``kernels``), or why none."""
    hashes = prov.get("identity_sha256") or []
    known = [la for la in prov["launches"] if la.get("identity_sha256")]
    if not hashes:
        return ("kernel identity: not recorded (launches before identity provenance, or torch facts "
                "missing): the certificate holds for the kernel names and versions only")
    ident = known[-1].get("identity") or {}
    cpu, lib, mm = ident.get("cpu") or {}, ident.get("libraries") or {}, ident.get("matmul") or {}
    thr = ident.get("threads") or {}
    level = f"ISA level {cpu['isa_level']}, torch " if cpu.get("isa_level") else "ISA "
    parts = [f"CPU {cpu.get('model')}", f"torch {lib.get('torch')}", f"oneDNN {lib.get('onednn')}", f"MKL {lib.get('mkl')}",
             f"BLAS {lib.get('blas')}", f"{level}{cpu.get('torch_capability')} ({' '.join(cpu.get('isa_flags') or []) or 'no flags'})",
             f"{thr.get('intra_op')} threads", f"fp32 matmul precision {mm.get('float32_matmul_precision')}",
             f"allow_tf32 {mm.get('allow_tf32')}"]
    gpu = ident.get("gpu")
    if isinstance(gpu, dict):
        runtime = f" (cuBLASLt runtime {lib['cublaslt_runtime']})" if lib.get("cublaslt_runtime") else ""
        parts.append(f"GPU {', '.join(gpu.get('devices') or [])} (capability {'.'.join(map(str, gpu.get('capability') or []))}), "
                     f"driver {lib.get('driver')}, cuda {lib.get('cuda')} cuBLAS {lib.get('cublas')}{runtime} cuDNN {lib.get('cudnn')} "
                     f"triton {lib.get('triton')} autotune cache {gpu.get('autotune_cache_sha256')}")
    exposed = ident.get("layout_path") or {}
    parts.append("layout path " + (", ".join(f"{k} {exposed.get(k, 'not exposed')}" for k in kernels)
                                   if kernels else ", ".join(f"{k} {v}" for k, v in sorted(exposed.items()))
                                   or "not exposed"))
    many = f" ({len(hashes)} identities across {len(known)} launches: the evidence pools them)" if len(hashes) > 1 else ""
    unknown = len(prov["launches"]) - len(known)
    return (f"kernel identity {', '.join(hashes)}{many}: " + "; ".join(parts)
            + (f"; {unknown} launch(es) without a recorded identity" if unknown else ""))


def not_exact_lines(prov: dict[str, Any], kernels: tuple[str, ...]) -> list[str]:
    """One line per kernel of ``kernels`` whose recorded code path says it was not exact on the CPU a
    launch ran on (issue #35: int8-onednn without VNNI): the evidence for it measures that CPU's kernel."""
    out = []
    for la in prov["launches"]:
        exposed = (la.get("identity") or {}).get("layout_path") or {}
        cpu = ((la.get("identity") or {}).get("cpu") or {}).get("model") or la.get("cpu")
        for k in kernels:
            path = str(exposed.get(k) or "")
            if "NOT EXACT" in path:
                line = f"WARNING: {k} was not exact on the CPU of launch {la['launch_id']} ({cpu}): {path}"
                if line not in out:
                    out.append(line)
    return out


def summary_rows(certs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per certificate: pair, scales, verdict (overall and per scale mode), answer, max spacings."""
    return [{"sweep": c["sweep"], "pair": f"{c['kernel_a']} vs {c['kernel_b']}", "kernel_a": c["kernel_a"],
             "kernel_b": c["kernel_b"], "scales": ", ".join(s["scale_mode"] for s in c["scale_modes"]),
             "verdict": c["verdict"],
             "verdicts_by_scale": "; ".join(f"{s['scale_mode']}: {s['verdict']}" for s in c["scale_modes"]),
             "answer": c["answer"],
             "arbiter": "; ".join(f"{s['scale_mode']}: {s['arbiter'].get('verdict') or s['arbiter']['status']}"
                                  for s in c["scale_modes"] if "arbiter" in s) or NOT_RUN,
             "max_spacing_significant": c.get("max_spacing_significant"),
             "near_zero_beyond": c.get("near_zero_beyond"), "max_spacing": c["max_spacing"],
             "max_spacing_significant_beyond_reference_error": c.get("max_spacing_significant_beyond_reference_error"),
             "max_spacing_beyond_reference_error": c["max_spacing_beyond_reference_error"]} for c in certs]


def arbiter_columns(arb: dict[str, Any]) -> dict[str, Any]:
    """The arbiter's cells of a matrix row: verdict (or status), each side's outputs outside its bound and
    its worst element in units of its bound (None where unknown or not run)."""
    sides = {k: arb.get(k) or {} for k in ("a", "b")}
    return {"arbiter": arb.get("verdict") or arb["status"], "arbiter_reason": arb.get("reason"),
            **{f"arbiter_{k}_outside_bound": s.get("outside_bound") if s.get("status") in ("inside", "outside") else None
               for k, s in sides.items()},
            **{f"arbiter_{k}_max_bound_ratio": s.get("max_bound_ratio") if s.get("status") in ("inside", "outside")
               else None for k, s in sides.items()}}


def matrix_rows(certs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (certificate, scale mode): numbers beside the verdict and the certificate's answer (``report conformance``)."""
    out = []
    for c in certs:
        for s in c["scale_modes"] or [{"scale_mode": None, "verdict": NOT_RUN, "kdepth": {"status": NOT_RUN},
                                       "replay": {"status": NOT_RUN}, "end_to_end": {"status": NOT_RUN}}]:
            kd, rp, e2e = s["kdepth"], s["replay"], s["end_to_end"]
            t = kd.get("trend") or {}
            pairs = e2e.get("arm_pairs", [])
            out.append({"sweep": c["sweep"], "kernel_a": c["kernel_a"], "kernel_b": c["kernel_b"],
                        "scale_mode": s["scale_mode"], "verdict": s["verdict"], "answer": c["answer"],
                        "kdepth_elements": kd.get("elements"), "kdepth_differing": kd.get("differing"),
                        "kdepth_ppm": kd.get("ppm"), "kdepth_ppm_ci_low": kd.get("ppm_ci_low"),
                        "kdepth_ppm_ci_high": kd.get("ppm_ci_high"), "kdepth_max_spacing": kd.get("max_spacing"),
                        "kdepth_max_spacing_beyond_reference_error": kd.get("max_spacing_beyond_reference_error"),
                        "kdepth_max_spacing_significant": kd.get("max_spacing_significant"),
                        "kdepth_max_spacing_significant_beyond_reference_error":
                            kd.get("max_spacing_significant_beyond_reference_error"),
                        **{f"kdepth_{k}": kd.get(k) for k in NEAR_ZERO_KEYS},
                        "k_trend_slope": t.get("slope"), "k_trend_slope_ci_low": t.get("slope_ci_low"),
                        "k_trend_slope_ci_high": t.get("slope_ci_high"),
                        # what the interval rests on (k_trend): dispersion, (K, seed) cells, method
                        "k_trend_dispersion": t.get("dispersion"), "k_trend_cells": t.get("cells"),
                        "k_trend_method": t.get("method"),
                        "replay_identical_layers": rp.get("identical_layers"), "replay_layers": rp.get("layers"),
                        "replay_max_spacing": rp.get("max_spacing"),
                        "replay_max_spacing_significant": rp.get("max_spacing_significant"),
                        **{f"replay_{k}": rp.get(k) for k in NEAR_ZERO_KEYS},
                        **arbiter_columns(s.get("arbiter") or {"status": NOT_RUN}),
                        "e2e_arm_pairs": len(pairs),
                        "e2e_identical": sum(p["identical"] for p in pairs) if pairs else None,
                        "e2e_total": sum(p["total"] for p in pairs) if pairs else None})
    return out


# -- the views people read ------------------------------------------------------------------------

def _num(v: float | None, spec: str = ".3g") -> str:
    return NOT_RUN if v is None else format(v, spec)


def _interval(lo: float | None, hi: float | None, spec: str = ".3g") -> str:
    return "" if lo is None and hi is None else f"[{'-inf' if lo is None else format(lo, spec)}, " \
        f"{'inf' if hi is None else format(hi, spec)}]"


def evidence_rows(cert: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per scale mode of a certificate, every cell a number with its name ("not run" where it did not)."""
    rows = []
    for s in cert["scale_modes"]:
        kd, rp, e2e = s["kdepth"], s["replay"], s["end_to_end"]
        row = {"scales": s["scale_mode"], "verdict": s["verdict"]}
        if kd["status"] == "run":
            t = kd["trend"]
            row.update({
                "K-depth ppm [95% exact]": f"{kd['ppm']:.3g} {_interval(kd['ppm_ci_low'], kd['ppm_ci_high'])}",
                "ppm per K": " ".join(f"{r['k']}:{r['ppm']:.3g}" for r in kd["per_k"]),
                "K-trend slope [95%]": trend_phrase(t) if t["kind"] in ("identical", "single_k") else
                f"{_num(t['slope'], '.2f')} {_interval(t['slope_ci_low'], t['slope_ci_high'], '.2f')} ({trend_phrase(t)}; "
                f"{trend_counts(t)})",
                spacing.NORMAL: kd["max_spacing_significant"],
                f"{spacing.NORMAL} beyond reference error": _num(kd.get("max_spacing_significant_beyond_reference_error"), "d"),
                spacing.NEAR_ZERO: spacing.near_zero_cell(kd),
                spacing.RAW: kd["max_spacing"],
                f"{spacing.RAW} beyond reference error": _num(kd["max_spacing_beyond_reference_error"], "d"),
            })
        else:
            row.update({"K-depth ppm [95% exact]": NOT_RUN, "ppm per K": NOT_RUN, "K-trend slope [95%]": NOT_RUN,
                        spacing.NORMAL: NOT_RUN, f"{spacing.NORMAL} beyond reference error": NOT_RUN,
                        spacing.NEAR_ZERO: NOT_RUN, spacing.RAW: NOT_RUN,
                        f"{spacing.RAW} beyond reference error": NOT_RUN})
        row["replay layers identical"] = (f"{rp['identical_layers']}/{rp['layers']} ({spacing.phrase(rp)})"
                                          if rp["status"] == "run" else NOT_RUN)
        pairs = e2e.get("arm_pairs", [])
        row["sequences identical"] = "; ".join(
            f"{p['arm_a']}~{p['arm_b']} {p['identical']}/{p['total']}" for p in pairs) or NOT_RUN
        row["self-reproducible"] = "; ".join(
            f"{arm} {self_cell(sr['identical'], sr['total'], sr['restarts'])}" for p in pairs
            for arm, sr in ((p["arm_a"], p["self_reproducibility_a"]), (p["arm_b"], p["self_reproducibility_b"]))
            if sr is not None) or NOT_RUN
        row["flips [95% exact]"] = "; ".join(
            f"{f['ref_arm']}->{f['arm']} {f['flips']}/{f['positions']} = {_num(f['flip_rate'])} "
            f"{_interval(f['flip_rate_ci_low'], f['flip_rate_ci_high'])}" for p in pairs for f in p["flips"]) or NOT_RUN
        arb = s.get("arbiter") or {"status": NOT_RUN}
        row["arbiter (each side vs its declared bound)"] = arbiter_mod.phrase(arb)
        row["error budget"] = arbiter_mod.error_budget_cell(arb)
        row.update(divergence_cells(pairs))
        row.update(noise_floor.evidence_cells(cert.get("noise_floor"), s["scale_mode"], pairs))
        rows.append(row)
    return rows


#: The KL cell of a pair whose mismatch KL is not recorded (vLLM arms; reports/divergence.py says why).
KL_CELL_NOT_MEASURED = "KL not measured (vLLM: the two full distributions are never in one process; report divergence)"


def divergence_cells(pairs: list[dict[str, Any]]) -> dict[str, str]:
    """The evidence cells of reports/divergence.py: first divergence, TARr@2N, probs_diff / k3 / KL and the gate."""
    divs = [(p, p["divergence"]) for p in pairs if p.get("divergence")]
    if not divs:
        return {}
    first = "; ".join(f"{p['arm_a']}~{p['arm_b']} {d['first_divergence']['diverged']}/{d['first_divergence']['sequences']}"
                      f" diverge, KM median {d['first_divergence']['km_median'] if d['first_divergence']['km_median'] is not None else 'not reached'}"
                      for p, d in divs if d["first_divergence"]) or NOT_RUN
    tarr = "; ".join(f"{p['arm_a']}+{p['arm_b']} {d['tarr_2n']['k']}/{d['tarr_2n']['n']} "
                     f"{_interval(*(d['tarr_2n']['interval'] or (None, None)))}" for p, d in divs if d["tarr_2n"]) or NOT_RUN
    tf = [t for _p, d in divs for t in d["teacher_forced"]]
    dist = "; ".join(f"{t['ref_arm']}->{t['arm']} probs_diff {_num(t['probs_diff_mean'])} (max {_num(t['probs_diff_max'])}), "
                     f"k3 {_num(t['k3_mean'])}, " + (f"KL {_num(t['kl_mean'])} {_interval(*(t['kl_ci'] or (None, None)))}"
                                                  + (f" (bootstrap over {t['kl_sequences']} sequences, "
                                                     f"{t['kl_positions']} positions)" if t.get("kl_sequences") else "")
                                                  if t["kl_mean"] is not None else KL_CELL_NOT_MEASURED)
                     for t in tf) or NOT_RUN
    gate = "; ".join(f"{t['ref_arm']}->{t['arm']} " + (
        f"{'PASS' if t['gate']['passed'] else 'FAIL'} ({t['gate']['metric']} {_num(abs(t['gate']['mean']))} + 2 x "
        f"{_num(t['gate']['se'], '.2g')} vs {t['gate']['threshold']:g})" if t["gate"]["passed"] is not None
        else f"not evaluated ({t['gate']['metric']} {'not measured' if t['kl_mean'] is None else 'without an interval'})")
        for t in tf) or NOT_RUN
    cells = {"first divergence": first, "TARr@2N [95% exact]": tarr, "probs_diff / k3 / KL per position [95%]": dist,
             "KL gate (|mean| + 2 SE)": gate}
    answers = [(p, d["answers"]) for p, d in divs if d.get("answers")]
    if answers:
        cells["accuracy; TARa@N [95% exact]"] = "; ".join(
            f"{arm} {a['accuracy']['k']}/{a['accuracy']['n']} {_interval(*(a['accuracy']['interval'] or (None, None)))}; "
            f"TARa {a['tara']['k']}/{a['tara']['n']} {_interval(*(a['tara']['interval'] or (None, None)))}"
            for _p, d in answers for arm, a in d["arms"].items())
        changes = [(p, c) for p, d in answers if (c := d.get("accuracy_change"))]
        if changes:
            cells["accuracy change per swap (paired, restart 0)"] = "; ".join(
                f"{c['arm_a']}->{c['arm_b']} {c['b_only'] - c['a_only']:+d}/{c['n']} "
                f"({c['a_only']} right only under {c['arm_a']}, {c['b_only']} only under {c['arm_b']}); "
                + (f"exact McNemar p {_num(c['mcnemar_p'], '.3g')}" if c["mcnemar_p"] is not None
                   else f"95% upper confidence bound on |change| {_num(c['abs_change_bound'], '.3g')} "
                        f"(Clopper-Pearson, {c['a_only'] + c['b_only']} of {c['n']} prompts discordant)")
                for _p, c in changes)
    return cells


def detail_lines(cert: dict[str, Any]) -> list[str]:
    """The checks and provenance of a certificate, one line each."""
    prov = cert["provenance"]
    fixed = [cert["fixed"] if quantizer_swap.no_downstream(cert.get("quantize", [])) else  # no GEMM: its checks say nothing
             f"{cert['fixed']}; checks of {cert['gemm_kernel']}: "
             + ", ".join(f"{c} {v}" for c, v in cert["gemm_checks"].items())] if cert.get("swap") == "quantizer" else []
    lines = fixed + [f"checks of {k}: " + ", ".join(f"{c} {v}" for c, v in cert[key].items())
             for k, key in ((cert["kernel_a"], "checks_a"), (cert["kernel_b"], "checks_b"))]
    lines.append(f"kernel versions: {cert['kernel_a']} {', '.join(prov['kernel_versions_a']) or '?'}; "
                 f"{cert['kernel_b']} {', '.join(prov['kernel_versions_b']) or '?'}")
    lines.append(f"spec sha256: {', '.join(prov['spec_sha256']) or '?'}")
    lines.append(identity_line(prov, (cert["kernel_a"], cert["kernel_b"])))
    lines.extend(not_exact_lines(prov, (cert["kernel_a"], cert["kernel_b"])))
    for la in prov["launches"]:
        versions = ", ".join(f"{k} {v}" for k, v in la["versions"].items() if v)
        lines.append(f"launch {la['launch_id']} ({la['status']}): {la['host']}, {la['cpu']}, {la['platform']}, "
                     f"cuda {la['torch_cuda'] or 'none'}; {versions}; identity {la.get('identity_sha256') or 'not recorded'}")
    if prov["weights_sha256"]:
        lines.append(f"weights sha256: {', '.join(prov['weights_sha256'])}")
    return lines


def select_pair(certs: list[dict[str, Any]], a: str, b: str) -> list[dict[str, Any]]:
    """The certificates of the pair {a, b} (either order)."""
    return [c for c in certs if {c["kernel_a"], c["kernel_b"]} == {a, b}]
