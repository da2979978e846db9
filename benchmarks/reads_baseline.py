"""The hand-written baselines of ``bench_reads.py``: plain DuckDB and Python over the same Parquet files,
computing the same numbers as the report each is paired with, and printing them (as JSON).

    python benchmarks/reads_baseline.py RESULTS_ROOT WHAT[,WHAT...] [SQL]

``WHAT``: ``agreement``, ``flips``, ``kdepth``, ``units``, ``noise-floor``, ``certificate`` (also the
baseline of ``report conformance``: the same numbers, another layout), ``all`` (everything ``report
all`` computes, each fact once) or ``query`` (the SQL of the last argument, printed as CSV).

No swapcheck module is imported: the views are ``read_parquet`` over the files found by a glob
(``table=<t>/sweep=<s>/*.parquet``; no ledger, no catalog, no page checksums, no footer checks), the
SQL is written here, and the statistics are the library calls the reports make (scipy's
``binomtest(...).proportion_ci`` exact and Wilson intervals, or statsmodels' ``proportion_confint``
for Wilson where installed; scikit-learn's ``roc_auc_score`` and ``LogisticRegression``; scipy's
``minimize_scalar``/``brentq``/``chi2`` for the K-trend; numpy's ``quantile``). What each computes:

* ``agreement``: per arm, self-reproducibility across restarts (with the processes of ``arm_runs``)
  and distinct completions; per arm pair, cross-arm identity over the full grid of prompts (a prompt
  one arm lacks counts as not identical), the first divergence per prompt and the agreement per
  generated position over the full grid of positions either arm generated (a position one arm did not
  generate differs), and per pair the min/median/max of the first divergences.
* ``flips``: per teacher-forced (ref_arm, arm) pair: rows without a usable margin or flag dropped and
  counted, reference mismatches, the flip rate with its exact interval (one-sided bound at 0 flips),
  the power rows, the ROC-AUC, its percentile-bootstrap interval over whole reference sequences (1,000
  resamples, seed 0, drawn as the report draws them; the AUC of each resample from per-sequence counts
  between consecutive flip margins), the logistic fit, the calibration per margin decade with Wilson
  intervals and the model's mean prediction, and the 50/90/99% concentration margins.
* ``kdepth``: the K-depth table summed over seeds with the near-zero totals.
* ``units``: the ledger per sweep, kind and status, and the units whose recorded files are missing
  or have another size (``damaged``).
* ``noise-floor``: distinct completions per arm (the batch-invariance tables the gen_rows tree lacks
  are found absent and give empty lists, as in the report).
* ``certificate``: per kernel pair and scale mode the K-depth totals with an exact ppm interval, per K
  with the kernels' own distance from the reference, the K-trend (Poisson profile likelihood); per arm
  pair identity with an exact interval, each arm's self-reproducibility, the flips of each
  teacher-forced pair with an exact interval; per arm pair the divergence figures (first divergence
  from the token lists with its Kaplan-Meier median, TARr over all 2N runs; per teacher-forced pair
  probs_diff, k3, KL with its bootstrap interval and gate, flips at p_ref in [0.1, 0.9)); the arms' kernels, models and weights; the launches.
  The verdict rules (a few comparisons per section over these aggregates) are not re-implemented.
* ``all``: agreement, flips (as ``report all`` runs them: 500 resamples), the K-depth table and its
  per-seed series, the certificate figures, distinct completions and the launches, each once.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import statistics
import sys
from typing import Any

import duckdb
import numpy as np

TABLES = ("generations", "sequences", "arm_runs", "teacher_forced", "kdepth", "units", "launches",
          "batch_invariance", "batch_invariance_model", "batch_invariance_attention")
EPS = 1e-7
DECADES = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, math.inf)
LEVEL = 0.95
SLOPE_LIMIT = 10.0


def connect(root: str) -> tuple[duckdb.DuckDBPyConnection, set[str]]:
    con = duckdb.connect()
    present = set()
    for t in TABLES:
        files = sorted(glob.glob(f"{root}/table={t}/sweep=*/*.parquet"))
        if files:
            con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet({files!r}, hive_partitioning = true, "
                        "union_by_name = true)")
            present.add(t)
    return con, present


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


# -- agreement ----------------------------------------------------------------------------------------

SELF = """
WITH per_prompt AS (
    SELECT sweep, arm, prompt_index, count(DISTINCT sequence_hash) AS hashes, count(sequence_hash) AS hashed,
           count(*) AS n, count(DISTINCT restart) AS restarts_here
    FROM sequences GROUP BY ALL),
r AS (SELECT sweep, arm, count(DISTINCT restart) AS restarts FROM sequences GROUP BY ALL),
runs AS (
    SELECT sweep, arm, string_agg(DISTINCT scales, ',' ORDER BY scales) AS scales,
           string_agg(DISTINCT configured_kernel, ',' ORDER BY configured_kernel) AS configured_kernel,
           count(*) AS runs, count(DISTINCT pid) AS distinct_pids, count(DISTINCT (host, pid)) AS distinct_processes,
           bool_and(evidence_ok) AS evidence_ok
    FROM arm_runs GROUP BY ALL)
SELECT p.sweep, p.arm, any_value(runs.scales) AS scales, any_value(runs.configured_kernel) AS configured_kernel,
       any_value(r.restarts) AS restarts,
       CASE WHEN any_value(r.restarts) >= 2 THEN count(*) FILTER (WHERE p.hashes = 1 AND p.hashed = p.n
            AND p.restarts_here = r.restarts) END AS identical,
       count(*) AS total,
       coalesce(list(p.prompt_index ORDER BY p.prompt_index) FILTER (WHERE NOT (p.hashes = 1 AND p.hashed = p.n
            AND p.restarts_here = r.restarts)), []) AS nonidentical_prompts,
       any_value(runs.runs) AS runs, any_value(runs.distinct_pids) AS distinct_pids,
       any_value(runs.distinct_processes) AS distinct_processes, any_value(runs.evidence_ok) AS evidence_ok
FROM per_prompt p JOIN r USING (sweep, arm) LEFT JOIN runs USING (sweep, arm)
GROUP BY p.sweep, p.arm ORDER BY p.sweep, p.arm
"""

DISTINCT = """
WITH r AS (SELECT sweep, arm, count(DISTINCT restart) AS restarts FROM sequences GROUP BY ALL),
p AS (SELECT sweep, arm, prompt_index, count(DISTINCT sequence_hash) AS d, count(DISTINCT restart) AS rs
      FROM sequences GROUP BY ALL)
SELECT p.sweep, p.arm, any_value(r.restarts) AS restarts, count(*) AS prompts, max(p.d) AS max_distinct,
       avg(p.d) AS mean_distinct, count(*) FILTER (WHERE p.d > 1) AS prompts_several,
       count(*) FILTER (WHERE p.rs < r.restarts) AS prompts_incomplete,
       map_entries(histogram(p.d)) AS hist
FROM p JOIN r USING (sweep, arm) GROUP BY p.sweep, p.arm ORDER BY p.sweep, p.arm
"""

CROSS = """
WITH s AS (SELECT sweep, arm, prompt_index, prompt_hash, sequence_hash FROM sequences WHERE restart = 0),
arms AS (SELECT DISTINCT sweep, arm FROM s),
pairs AS (SELECT a.sweep, a.arm AS arm_a, b.arm AS arm_b FROM arms a JOIN arms b ON a.sweep = b.sweep AND a.arm < b.arm),
prompts AS (SELECT DISTINCT sweep, prompt_index FROM s),
runs AS (SELECT sweep, arm, string_agg(DISTINCT scales, ',' ORDER BY scales) AS scales,
                string_agg(DISTINCT configured_kernel, ',' ORDER BY configured_kernel) AS kernel
         FROM arm_runs GROUP BY ALL),
grid AS (
    SELECT p.sweep, p.arm_a, p.arm_b, q.prompt_index,
           x.sequence_hash IS NOT NULL AND x.sequence_hash = y.sequence_hash
               AND x.prompt_hash IS NOT DISTINCT FROM y.prompt_hash AS identical,
           x.arm IS NULL OR y.arm IS NULL AS missing,
           x.prompt_hash IS NOT NULL AND y.prompt_hash IS NOT NULL AND x.prompt_hash <> y.prompt_hash AS mismatch
    FROM pairs p JOIN prompts q USING (sweep)
    LEFT JOIN s x ON x.sweep = p.sweep AND x.arm = p.arm_a AND x.prompt_index = q.prompt_index
    LEFT JOIN s y ON y.sweep = p.sweep AND y.arm = p.arm_b AND y.prompt_index = q.prompt_index
    WHERE x.arm IS NOT NULL OR y.arm IS NOT NULL)
SELECT g.sweep, g.arm_a, g.arm_b, any_value(ra.scales) AS scales_a, any_value(rb.scales) AS scales_b,
       any_value(ra.kernel) AS kernel_a, any_value(rb.kernel) AS kernel_b,
       count(*) FILTER (WHERE g.identical) AS identical, count(*) AS total,
       count(*) FILTER (WHERE g.mismatch) AS prompt_mismatch, count(*) FILTER (WHERE g.missing) AS missing
FROM grid g LEFT JOIN runs ra ON ra.sweep = g.sweep AND ra.arm = g.arm_a
LEFT JOIN runs rb ON rb.sweep = g.sweep AND rb.arm = g.arm_b
GROUP BY g.sweep, g.arm_a, g.arm_b ORDER BY g.sweep, g.arm_a, g.arm_b
"""

# Every (pair, prompt, position) either arm generated at restart 0: the positions both generated by
# a join, the positions only one generated from the keys some arm lacks (a missing position differs).
PAIRS_GRID = """
CREATE TEMP TABLE cmp AS
WITH g AS (SELECT sweep, arm, prompt_index, position, token, margin FROM generations WHERE restart = 0),
arms AS (SELECT DISTINCT sweep, arm FROM g),
pairs AS (SELECT a.sweep, a.arm AS arm_a, b.arm AS arm_b FROM arms a JOIN arms b ON a.sweep = b.sweep AND a.arm < b.arm),
lacking AS (
    SELECT k.sweep, k.prompt_index, k.position
    FROM (SELECT sweep, prompt_index, position, count(DISTINCT arm) AS n FROM g GROUP BY ALL) k
    JOIN (SELECT sweep, count(*) AS n FROM arms GROUP BY ALL) a USING (sweep) WHERE k.n < a.n)
SELECT x.sweep, x.arm AS arm_a, y.arm AS arm_b, x.prompt_index, x.position, x.token AS token_a, y.token AS token_b,
       x.margin AS margin_a, y.margin AS margin_b, x.token IS DISTINCT FROM y.token AS differs
FROM g x JOIN g y ON x.sweep = y.sweep AND x.prompt_index = y.prompt_index AND x.position = y.position AND x.arm < y.arm
UNION ALL
SELECT p.sweep, p.arm_a, p.arm_b, q.prompt_index, q.position, x.token, y.token, x.margin, y.margin, true
FROM pairs p JOIN lacking q USING (sweep)
LEFT JOIN g x ON x.sweep = p.sweep AND x.arm = p.arm_a AND x.prompt_index = q.prompt_index AND x.position = q.position
LEFT JOIN g y ON y.sweep = p.sweep AND y.arm = p.arm_b AND y.prompt_index = q.prompt_index AND y.position = q.position
WHERE (x.arm IS NULL) <> (y.arm IS NULL)
"""

FIRST = """
SELECT sweep, arm_a, arm_b, prompt_index, count(*) AS positions, min(position) FILTER (WHERE differs) AS first_divergence,
       arg_min(token_a, position) FILTER (WHERE differs) AS token_a, arg_min(token_b, position) FILTER (WHERE differs) AS token_b,
       arg_min(margin_a, position) FILTER (WHERE differs) AS margin_a, arg_min(margin_b, position) FILTER (WHERE differs) AS margin_b
FROM cmp GROUP BY ALL ORDER BY sweep, arm_a, arm_b, prompt_index
"""

POSITIONS = """
WITH f AS (SELECT sweep, arm_a, arm_b, prompt_index, min(position) FILTER (WHERE differs) AS fd FROM cmp GROUP BY ALL)
SELECT c.sweep, c.arm_a, c.arm_b, c.position, count(*) AS prompts, count(*) FILTER (WHERE NOT c.differs) AS agreeing,
       count(*) FILTER (WHERE NOT c.differs) / count(*) AS agreement,
       count(*) FILTER (WHERE f.fd IS NULL OR f.fd > c.position) AS identical_prefix,
       count(*) FILTER (WHERE f.fd IS NULL OR f.fd > c.position) / count(*) AS prefix_agreement
FROM cmp c JOIN f USING (sweep, arm_a, arm_b, prompt_index) GROUP BY ALL ORDER BY c.sweep, c.arm_a, c.arm_b, c.position
"""


def distinct_completions(con: duckdb.DuckDBPyConnection, present: set[str]) -> list[dict[str, Any]]:
    if "sequences" not in present:
        return []
    out = rows(con, DISTINCT)
    for r in out:
        r["distribution"] = [{"distinct": int(e["key"]), "prompts": int(e["value"])}
                             for e in sorted(r.pop("hist"), key=lambda e: e["key"])]
    return out


def agreement(con: duckdb.DuckDBPyConnection, present: set[str], *, full: bool = True) -> dict[str, Any]:
    """The agreement figures; ``full=False``: those of ``report all`` (self, cross, distinct)."""
    out: dict[str, Any] = {"self_reproducibility": rows(con, SELF), "cross_arm": rows(con, CROSS),
                           "distinct_completions": distinct_completions(con, present)}
    if not full:
        return out
    con.execute(PAIRS_GRID)
    first = rows(con, FIRST)
    out["first_divergence"] = first
    out["position_agreement"] = rows(con, POSITIONS)
    by_pair: dict[tuple[Any, ...], list[int]] = {}
    for r in first:
        if r["first_divergence"] is not None:
            by_pair.setdefault((r["sweep"], r["arm_a"], r["arm_b"]), []).append(r["first_divergence"])
    for c in out["cross_arm"]:
        at = by_pair.get((c["sweep"], c["arm_a"], c["arm_b"]), [])
        c["diverged"] = len(at)
        c["first_divergence"] = {"min": min(at), "median": statistics.median(at), "max": max(at)} if at else None
    return out


# -- flips --------------------------------------------------------------------------------------------

def exact(k: int, n: int) -> list[float] | None:
    from scipy.stats import binomtest

    if n <= 0:
        return None
    ci = binomtest(k, n).proportion_ci(confidence_level=LEVEL, method="exact")
    return [float(ci.low), float(ci.high)]


def wilson(k: int, n: int) -> list[float]:
    try:
        from statsmodels.stats.proportion import proportion_confint
    except ImportError:
        from scipy.stats import binomtest

        ci = binomtest(k, n).proportion_ci(confidence_level=LEVEL, method="wilson")
        lo, hi = ci.low, ci.high
    else:
        lo, hi = proportion_confint(k, n, alpha=1.0 - LEVEL, method="wilson")
    return [max(0.0, float(lo)), min(1.0, float(hi))]


def needed(rate: float) -> int:
    return 1 if rate == 1.0 else math.ceil(math.log(1.0 - LEVEL) / math.log1p(-rate))


def bootstrap_ci(margin: np.ndarray, flip: np.ndarray, seq: np.ndarray, resamples: int, seed: int = 0) -> tuple[list[float] | None, int]:
    """Percentile interval of the AUC over ``resamples`` resamples of whole sequences: each resample's
    AUC numerator from per-sequence counts of non-flips between consecutive distinct flip margins."""
    from scipy import sparse

    n = margin.size
    _, dense = np.unique(seq, return_inverse=True)
    s = int(dense.max()) + 1
    u = np.unique(margin[flip])
    k = u.size
    fm, fs = margin[flip], dense[flip]
    nm, ns = margin[~flip], dense[~flip]
    f_mat = sparse.csr_matrix((np.ones(fm.size), (np.searchsorted(u, fm), fs)), shape=(k, s))
    at = np.searchsorted(u, nm, side="left")
    tie = (at < k) & (u[np.minimum(at, k - 1)] == nm)
    t_mat = sparse.csr_matrix((np.ones(int(tie.sum())), (at[tie], ns[tie])), shape=(k, s))
    above = np.searchsorted(u, nm, side="right") - 1
    keep = ~tie & (above >= 0)
    a_mat = sparse.csr_matrix((np.ones(int(keep.sum())), (above[keep], ns[keep])), shape=(k, s))
    pos = np.bincount(fs, minlength=s).astype(np.float64)
    neg = np.bincount(ns, minlength=s).astype(np.float64)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(resamples, 4_000_000 // max(n, 1)))  # the report's draws, chunk by chunk
    counts = []
    done = 0
    while done < resamples:
        b = min(chunk, resamples - done)
        draws = rng.integers(0, s, size=(b, s))
        counts.append(np.stack([np.bincount(d, minlength=s) for d in draws]).astype(np.float64))
        done += b
    all_w = np.concatenate(counts)
    aucs = []
    step = max(1, 1_000_000 // max(s, k))  # resamples at a time: the (resamples x margins) arrays stay small
    for i in range(0, resamples, step):
        w = all_w[i: i + step]
        f, e, a = (np.asarray(m @ w.T).T for m in (f_mat, t_mat, a_mat))
        rest = np.cumsum((a + e)[:, ::-1], axis=1)[:, ::-1] - e
        with np.errstate(invalid="ignore", divide="ignore"):
            aucs.append((f * (rest + 0.5 * e)).sum(axis=1) / ((w @ pos) * (w @ neg)))
    auc = np.concatenate(aucs)
    auc = auc[np.isfinite(auc)]
    if not auc.size:
        return None, 0
    lo, hi = np.quantile(auc, [(1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2])
    return [float(lo), float(hi)], int(auc.size)


def flip_pair(margin: np.ndarray, flip: np.ndarray, seq: np.ndarray, resamples: int) -> dict[str, Any]:
    from scipy.stats import binomtest
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    n, k = int(margin.size), int(flip.sum())
    out: dict[str, Any] = {"positions": n, "flips": k, "flip_rate": k / n if n else None, "flip_rate_ci": exact(k, n)}
    one_sided = float(binomtest(0, n, alternative="less").proportion_ci(confidence_level=LEVEL, method="exact").high) \
        if n and not k else None
    out["rate_ci"] = {"interval": out["flip_rate_ci"], "upper_one_sided": one_sided}
    basis = ([k / n, out["flip_rate_ci"][1]] if k else [one_sided]) if n else []
    out["power"] = {"rows": [{"rate": r, "positions_needed": needed(r)} for r in [*basis, 1e-3, 1e-4, 1e-5]
                             if r is not None and 0.0 < r <= 1.0]} if n else None
    both = 0 < k < n
    out["auc"] = float(roc_auc_score(flip, -margin)) if both else None
    out["auc_ci"] = bootstrap_ci(margin, flip, seq, resamples)[0] if both and k >= 10 and n - k >= 10 else None
    model = None
    if both:
        x = np.log10(margin + EPS)
        mu, sd = float(x.mean()), float(x.std())
        if sd > 0:
            clf = LogisticRegression(C=1.0, max_iter=1000).fit(((x - mu) / sd)[:, None], flip)
            slope = float(clf.coef_[0, 0]) / sd
            model = {"intercept": float(clf.intercept_[0]) - slope * mu, "slope": slope}
    out["model"] = model
    edges = np.array(DECADES)
    which = np.searchsorted(edges, margin, side="right") - 1
    pred = None if model is None else 1.0 / (1.0 + np.exp(-(model["intercept"] + model["slope"] * np.log10(margin + EPS))))
    calib = []
    for i in range(edges.size - 1):
        sel = which == i
        m = int(sel.sum())
        if m:
            kk = int(flip[sel].sum())
            calib.append({"positions": m, "flips": kk, "observed_rate": kk / m, "observed_ci": wilson(kk, m),
                          "predicted_rate": None if pred is None else float(pred[sel].mean())})
    out["calibration"] = calib
    conc = []
    if k:
        for share in (0.5, 0.9, 0.99):
            at = float(np.quantile(margin[flip], share, method="inverted_cdf"))
            below = margin <= at
            nb, kb = int(below.sum()), int((flip & below).sum())
            conc.append({"flip_share": share, "margin": at, "flips_at_or_below": kb, "positions_at_or_below": nb,
                         "share_of_positions": nb / n, "flip_rate_at_or_below": kb / nb,
                         "flip_rate_above": (k - kb) / (n - nb) if n > nb else None, "enrichment": (kb / nb) / (k / n)})
    out["concentration"] = conc
    out["concentration_margin"] = next((c["margin"] for c in conc if c["flip_share"] == 0.9), None)
    return out


def flips(con: duckdb.DuckDBPyConnection, present: set[str], resamples: int = 1000) -> dict[str, Any]:
    if "teacher_forced" not in present:
        return {"pairs": []}
    pairs = []
    keys = con.execute("SELECT DISTINCT sweep, ref_arm, arm FROM teacher_forced ORDER BY ALL").fetchall()
    for sweep, ref, arm in keys:
        d = con.execute("SELECT ref_margin, flip, ref_restart, prompt_index, ref_token, ref_argmax FROM teacher_forced "
                        "WHERE sweep = ? AND ref_arm = ? AND arm = ?", [sweep, ref, arm]).fetchnumpy()
        margin = np.ma.filled(np.ma.asarray(d["ref_margin"]).astype(np.float64), np.nan)
        flag = np.ma.asarray(d["flip"])
        has = ~np.ma.getmaskarray(flag)
        with np.errstate(invalid="ignore"):
            ok = has & np.isfinite(margin) & (margin >= 0)
        seq = np.ma.filled(np.ma.asarray(d["ref_restart"]).astype(np.int64), -1) * (1 << 32) \
            + np.ma.filled(np.ma.asarray(d["prompt_index"]).astype(np.int64), -1)
        mismatch = int(np.ma.filled(np.ma.asarray(d["ref_token"]) != np.ma.asarray(d["ref_argmax"]), False).sum())
        flip = np.ma.filled(flag, False).astype(bool)
        pairs.append({"sweep": sweep, "ref_arm": ref, "arm": arm,
                      **flip_pair(margin[ok], flip[ok], seq[ok], resamples),
                      "dropped": int((~ok).sum()), "ref_mismatch": mismatch})
    return {"pairs": pairs}


# -- K-depth ------------------------------------------------------------------------------------------

NEAR_ZERO = """
(CASE WHEN max(max_spacing) <= max(max_spacing_significant) THEN 0
      WHEN max(max_spacing_significant) = 0 THEN sum(hist_1 + hist_2 + hist_gt2)
      WHEN max(max_spacing_significant) = 1 THEN sum(hist_2 + hist_gt2)
      WHEN max(max_spacing_significant) = 2 THEN sum(hist_gt2) ELSE 1 END) AS near_zero_beyond,
max(max_spacing) <= max(max_spacing_significant) OR max(max_spacing_significant) <= 2 AS near_zero_beyond_exact,
CASE WHEN max(max_spacing) > max(max_spacing_significant) THEN max(max_spacing) END AS near_zero_max_spacing,
CASE WHEN max(max_spacing) > max(max_spacing_significant)
     THEN arg_max(abs(worst_a - worst_b), [max_spacing::DOUBLE, abs(worst_a - worst_b)]) END AS near_zero_worst_abs_error
"""

KDEPTH = f"""
SELECT sweep, dtype, out_dtype, comparison, impl_a, impl_b, scale_mode, k, count(DISTINCT seed) AS seeds,
       sum(elements) AS elements, sum(differing) AS differing, sum(differing) / sum(elements) AS frac_differing,
       max(max_spacing) AS max_spacing, max(max_spacing_significant) AS max_spacing_significant,
       sum(hist_0) AS hist_0, sum(hist_1) AS hist_1, sum(hist_2) AS hist_2, sum(hist_gt2) AS hist_gt2,
       sum(nonfinite_mismatch) AS nonfinite_mismatch, max(max_abs_error) AS max_abs_error, {NEAR_ZERO}
FROM kdepth GROUP BY ALL ORDER BY sweep, dtype, out_dtype, comparison DESC, impl_a, impl_b, scale_mode, k
"""

KDEPTH_BY_SEED = """
SELECT sweep, dtype, comparison, impl_a, impl_b, scale_mode, k, seed, sum(elements) AS elements,
       sum(differing) AS differing FROM kdepth GROUP BY ALL ORDER BY ALL
"""


def kdepth(con: duckdb.DuckDBPyConnection, present: set[str]) -> list[dict[str, Any]]:
    return rows(con, KDEPTH) if "kdepth" in present else []


def k_trend(per_k: list[tuple[int, int, int]]) -> dict[str, Any]:
    """rate ~ K^s over (K, seed) cells: the multinomial profile likelihood of the counts, its maximum and
    the quasi-likelihood interval (Pearson dispersion over the cells, at least 1; F(1, cells - 2) cut;
    chi2(1) with 2 cells or every difference at one end of K)."""
    from scipy.optimize import brentq, minimize_scalar
    from scipy.special import logsumexp
    from scipy.stats import chi2, f

    pts = sorted(p for p in per_k if p[2] > 0)
    x = np.log(np.array([p[0] for p in pts], dtype=np.float64))
    d = np.array([p[1] for p in pts], dtype=np.float64)
    lw = np.log(np.array([p[2] for p in pts], dtype=np.float64))
    total = float(d.sum())
    if total == 0 or len(set(x.tolist())) < 2:
        return {"slope": None, "slope_ci_low": None, "slope_ci_high": None}

    def nll(s: float) -> float:
        return -float(np.sum(d * (lw + s * x)) - total * logsumexp(lw + s * x))

    at_max, at_min = bool(d[x < x.max()].sum() == 0), bool(d[x > x.min()].sum() == 0)
    df = len(pts) - 2
    if at_max or at_min:
        s_hat = SLOPE_LIMIT if at_max else -SLOPE_LIMIT
        best, slope, cut = nll(s_hat), None, float(chi2.ppf(LEVEL, 1))
    else:
        res = minimize_scalar(nll, bounds=(-SLOPE_LIMIT, SLOPE_LIMIT), method="bounded", options={"xatol": 1e-10})
        s_hat, best = float(res.x), float(res.fun)
        slope = s_hat
        if df > 0:
            mu = total * np.exp(lw + s_hat * x - logsumexp(lw + s_hat * x))
            cut = max(1.0, float(np.sum((d - mu) ** 2 / mu)) / df) * float(f.ppf(LEVEL, 1, df))
        else:
            cut = float(chi2.ppf(LEVEL, 1))

    def excess(s: float) -> float:
        return 2.0 * (nll(s) - best) - cut

    lo = None if excess(-SLOPE_LIMIT) <= 0 or s_hat <= -SLOPE_LIMIT else float(brentq(excess, -SLOPE_LIMIT, s_hat))
    hi = None if excess(SLOPE_LIMIT) <= 0 or s_hat >= SLOPE_LIMIT else float(brentq(excess, s_hat, SLOPE_LIMIT))
    return {"slope": slope, "slope_ci_low": lo, "slope_ci_high": hi}


def certificate(con: duckdb.DuckDBPyConnection, present: set[str], kd: list[dict[str, Any]] | None = None,
                agree: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures of every certificate: per unordered kernel pair and scale mode, K-depth totals, per
    K, against the references, the trend; per arm pair identity and self-reproducibility; per
    teacher-forced pair its flips; the arms and the launches."""
    kd = kdepth(con, present) if kd is None else kd
    agree = agreement(con, present, full=False) if agree is None else agree
    refs: dict[tuple[str, str, int], tuple[int, int]] = {}
    for r in kd:
        if r["comparison"] == "reference":
            ref_key = (r["impl_a"], r["scale_mode"], r["k"])
            old = refs.get(ref_key, (0, 0))
            refs[ref_key] = (max(old[0], r["max_spacing"] or 0), max(old[1], r["max_spacing_significant"] or 0))
    sections: dict[str, dict[str, Any]] = {}
    for r in kd:
        if r["comparison"] != "pair":
            continue
        key = "|".join([*sorted((r["impl_a"], r["impl_b"])), r["scale_mode"]])
        sec = sections.setdefault(key, {"elements": 0, "differing": 0, "per_k": {}})
        sec["elements"] += r["elements"]
        sec["differing"] += r["differing"]
        pk = sec["per_k"].setdefault(r["k"], {"k": r["k"], "elements": 0, "differing": 0, "max_spacing": 0})
        pk["elements"] += r["elements"]
        pk["differing"] += r["differing"]
        pk["max_spacing"] = max(pk["max_spacing"], r["max_spacing"] or 0)
        ra, rb = refs.get((r["impl_a"], r["scale_mode"], r["k"])), refs.get((r["impl_b"], r["scale_mode"], r["k"]))
        pk["reference_max_spacing"] = None if ra is None or rb is None else max(ra[0], rb[0])
    # The K-trend's cells: differing and elements per (K, seed) of each section.
    by_seed: dict[str, dict[tuple[int, int], list[int]]] = {}
    for r in (rows(con, KDEPTH_BY_SEED) if "kdepth" in present else []):
        if r["comparison"] == "pair":
            cell = by_seed.setdefault("|".join([*sorted((r["impl_a"], r["impl_b"])), r["scale_mode"]]), {}) \
                .setdefault((int(r["k"]), int(r["seed"])), [0, 0])
            cell[0] += int(r["differing"])
            cell[1] += int(r["elements"])
    seed_cells = {key: [(k, dn[0], dn[1]) for (k, _), dn in sorted(c.items())] for key, c in by_seed.items()}
    for key, sec in sections.items():
        ci = exact(sec["differing"], sec["elements"])
        sec["ppm"] = 1e6 * sec["differing"] / sec["elements"] if sec["elements"] else None
        sec["ppm_ci_low"], sec["ppm_ci_high"] = (None, None) if ci is None else (1e6 * ci[0], 1e6 * ci[1])
        per_k = [sec["per_k"][k] for k in sorted(sec["per_k"])]
        sec["per_k"] = per_k
        sec["trend"] = k_trend(seed_cells.get(key) or [(p["k"], p["differing"], p["elements"]) for p in per_k])
    cross = {f"{c['arm_a']}|{c['arm_b']}": {"identical": c["identical"], "total": c["total"],
                                             "identical_ci": exact(c["identical"], c["total"])}
             for c in agree["cross_arm"]}
    tf = {}
    if "teacher_forced" in present:
        for r in rows(con, "SELECT sweep, ref_arm, arm, count(*) FILTER (WHERE flip IS NOT NULL AND isfinite(ref_margin) "
                           "AND ref_margin >= 0) AS positions, count(*) FILTER (WHERE flip AND isfinite(ref_margin) "
                           "AND ref_margin >= 0) AS flips FROM teacher_forced GROUP BY ALL ORDER BY ALL"):
            tf[f"{r['ref_arm']}|{r['arm']}"] = {"positions": r["positions"], "flips": r["flips"],
                                                "flip_rate_ci": exact(r["flips"], r["positions"])}
    arms = rows(con, "SELECT sweep, arm, string_agg(DISTINCT configured_kernel, ',') AS kernel, "
                     "string_agg(DISTINCT model, ',') AS model, list(DISTINCT weights_sha256) AS weights "
                     "FROM arm_runs GROUP BY ALL ORDER BY ALL") if "arm_runs" in present else []
    launches = rows(con, "SELECT * FROM launches") if "launches" in present else []
    return {"kdepth": sections, "cross": cross, "divergence": divergence(con, present),
            "self": {r["arm"]: {"identical": r["identical"], "total": r["total"]} for r in agree["self_reproducibility"]},
            "teacher_forced": tf, "arms": arms, "launches": len(launches),
            "distinct_completions": agree["distinct_completions"]}


# -- the certificate's divergence figures (issue #27) -------------------------------------------------

def _km_median(times: list[int], censored: list[int]) -> int | None:
    """The smallest event time t with Kaplan-Meier S(t) <= 0.5 (scipy.stats.ecdf, right-censored)."""
    import numpy as np
    from scipy.stats import CensoredData, ecdf

    if not times:
        return None
    sf = ecdf(CensoredData(uncensored=times, right=censored) if censored else np.asarray(times)).sf
    at = sorted(set(times))
    hit = [t for t, v in zip(at, sf.evaluate(np.asarray(at, dtype=float)), strict=True) if v <= 0.5 + 1e-12]
    return int(hit[0]) if hit else None


def _boot(data: tuple[Any, ...], stat: Any, resamples: int = 2000, seed: int = 0, paired: bool = False) -> tuple[list[float], float]:
    import numpy as np
    from scipy.stats import bootstrap

    res = bootstrap(data, stat, paired=paired, vectorized=True, n_resamples=resamples, confidence_level=LEVEL,
                    method="percentile", rng=np.random.default_rng(seed))
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)], float(res.standard_error)


def divergence(con: duckdb.DuckDBPyConnection, present: set[str], threshold: float = 0.015) -> dict[str, Any]:
    """Per arm pair (arm_a < arm_b): restart-0 sequences compared, diverged, the Kaplan-Meier median of
    the first divergence (from the token lists; a position one arm lacks differs) and the median over
    the diverged; TARr over all 2N runs with its exact interval. Per teacher-forced (ref_arm, arm): the
    mean and max |p_ref - p_arm|, k3 and KL per position (KL with a percentile bootstrap over reference
    sequences, 2000 resamples, seed 0, and the gate |mean| + 2 SE < 0.015), and the flips at p_ref in
    [0.1, 0.9) with their exact interval."""
    import numpy as np

    out: dict[str, Any] = {"pairs": {}, "teacher_forced": {}}
    if "sequences" not in present:
        return out
    first = rows(con, """
        WITH s AS (SELECT sweep, arm, prompt_index, tokens FROM sequences WHERE restart = 0),
        a AS (SELECT DISTINCT sweep, arm FROM s), q AS (SELECT DISTINCT sweep, prompt_index FROM s)
        SELECT arm_a, arm_b, greatest(len(ta), len(tb)) AS n,
               CASE WHEN ta = tb THEN NULL ELSE coalesce(nullif(list_position(list_transform(
                   range(least(len(ta), len(tb))), lambda i: ta[i + 1] <> tb[i + 1]), true), 0) - 1,
                   least(len(ta), len(tb))) END AS t
        FROM (SELECT pa.arm AS arm_a, pb.arm AS arm_b, coalesce(x.tokens, []) AS ta, coalesce(y.tokens, []) AS tb
              FROM a pa JOIN a pb ON pa.sweep = pb.sweep AND pa.arm < pb.arm JOIN q ON q.sweep = pa.sweep
              LEFT JOIN s x ON x.sweep = pa.sweep AND x.arm = pa.arm AND x.prompt_index = q.prompt_index
              LEFT JOIN s y ON y.sweep = pa.sweep AND y.arm = pb.arm AND y.prompt_index = q.prompt_index
              WHERE x.arm IS NOT NULL OR y.arm IS NOT NULL)
        WHERE greatest(len(ta), len(tb)) > 0""")
    by_pair: dict[str, dict[str, list[int]]] = {}
    for r in first:
        cell = by_pair.setdefault(f"{r['arm_a']}|{r['arm_b']}", {"times": [], "censored": []})
        if r["t"] is None:
            cell["censored"].append(r["n"] - 1)
        else:
            cell["times"].append(r["t"])
    runs = rows(con, """
        WITH r AS (SELECT sweep, arm, count(DISTINCT restart) AS restarts FROM sequences GROUP BY ALL)
        SELECT ra.arm AS arm_a, rb.arm AS arm_b, s.prompt_index,
               count(DISTINCT (s.arm, s.restart)) = any_value(ra.restarts) + any_value(rb.restarts)
                 AND count(s.sequence_hash) = count(*) AND count(DISTINCT s.prompt_hash) = 1
                 AND count(DISTINCT s.sequence_hash) = 1 AS agree
        FROM r ra JOIN r rb ON ra.sweep = rb.sweep AND ra.arm < rb.arm
        JOIN sequences s ON s.sweep = ra.sweep AND s.arm IN (ra.arm, rb.arm)
        GROUP BY ra.sweep, ra.arm, rb.arm, s.prompt_index""")
    tarr: dict[str, list[int]] = {}
    for r in runs:
        k = tarr.setdefault(f"{r['arm_a']}|{r['arm_b']}", [0, 0])
        k[0] += bool(r["agree"])
        k[1] += 1
    for key, cell in by_pair.items():
        times = cell["times"]
        out["pairs"][key] = {"sequences": len(times) + len(cell["censored"]), "diverged": len(times),
                             "km_median": _km_median(times, cell["censored"]),
                             "diverged_median": float(np.quantile(np.asarray(times, dtype=float), 0.5)) if times else None,
                             "tarr_2n": [*tarr.get(key, [0, 0]), exact(*tarr.get(key, [0, 0]))]}
    if "teacher_forced" not in present:
        return out
    seqs = rows(con, """
        SELECT ref_arm, arm, ref_restart, prompt_index, count(*) AS measured,
               sum(abs(ref_token_prob_ref - ref_token_prob_arm)) AS pd, max(abs(ref_token_prob_ref - ref_token_prob_arm)) AS pd_max,
               sum(k3_ref_arm) AS k3, sum(kl_ref_arm) AS kl
        FROM teacher_forced
        WHERE ref_token_prob_ref IS NOT NULL AND ref_token_prob_arm IS NOT NULL AND kl_ref_arm IS NOT NULL
          AND k3_ref_arm IS NOT NULL
        GROUP BY ALL ORDER BY ref_arm, arm, ref_restart, prompt_index""")
    mids = {(r["ref_arm"], r["arm"]): (r["flips"], r["n"]) for r in rows(con, """
        SELECT ref_arm, arm, count(*) FILTER (WHERE flip)::BIGINT AS flips, count(*)::BIGINT AS n FROM teacher_forced
        WHERE flip IS NOT NULL AND ref_token_prob_ref >= 0.1 AND ref_token_prob_ref < 0.9 GROUP BY ALL""")}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in seqs:
        groups.setdefault((r["ref_arm"], r["arm"]), []).append(r)
    for (ref, arm), g in groups.items():
        counts = np.array([r["measured"] for r in g], dtype=float)
        kl = np.array([r["kl"] for r in g], dtype=float)
        entry = {"positions": int(counts.sum()), "probs_diff_mean": float(sum(r["pd"] for r in g) / counts.sum()),
                 "probs_diff_max": float(max(r["pd_max"] for r in g)),
                 "k3_mean": float(sum(r["k3"] for r in g) / counts.sum()), "kl_mean": float(kl.sum() / counts.sum())}
        if len(g) >= 2:
            ci, se = _boot((kl, counts), lambda s, c, axis=-1: np.sum(s, axis=axis) / np.sum(c, axis=axis), paired=True)
            entry.update(kl_ci=ci, gate_passed=bool(abs(entry["kl_mean"]) + 2 * se < threshold))
        f, n = mids.get((ref, arm), (0, 0))
        entry["flips_p_ref_0.1_0.9"] = [f, n, exact(f, n)]
        out["teacher_forced"][f"{ref}|{arm}"] = entry
    return out


# -- units --------------------------------------------------------------------------------------------

def units(con: duckdb.DuckDBPyConnection, root: str) -> list[dict[str, Any]]:
    ledger = rows(con, "SELECT sweep, unit_id, kind, status, attempts, rows, duration_s, error, files FROM units "
                       "QUALIFY row_number() OVER (PARTITION BY sweep, unit_id ORDER BY finished_at DESC) = 1")
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in ledger:
        damaged = False
        for f in r["files"] or []:
            try:
                damaged |= os.stat(os.path.join(root, f["path"])).st_size != f["bytes"]
            except OSError:
                damaged = True
        g = groups.setdefault((r["sweep"], r["kind"], r["status"]),
                              {"sweep": r["sweep"], "kind": r["kind"], "status": r["status"], "units": 0, "attempts": 0,
                               "rows": 0, "seconds": 0.0, "damaged": 0, "example_error": None})
        g["units"] += 1
        g["attempts"] += r["attempts"] or 0
        g["rows"] += r["rows"] or 0
        g["seconds"] += r["duration_s"] or 0.0
        g["damaged"] += damaged
        if r["error"] is not None and (g["example_error"] is None or r["error"] < g["example_error"]):
            g["example_error"] = r["error"]
    out = [groups[k] for k in sorted(groups)]
    for g in out:
        g["seconds"] = round(g["seconds"], 2)
    return out


def main() -> None:
    root, what = sys.argv[1], sys.argv[2].split(",")
    con, present = connect(root)
    out: dict[str, Any] = {}
    if "query" in what:
        cur = con.execute(sys.argv[3])
        w = csv.writer(sys.stdout)
        w.writerow([d[0] for d in cur.description])
        while batch := cur.fetchmany(10_000):
            w.writerows(batch)
        return
    if "agreement" in what:
        out["agreement"] = agreement(con, present)
    if "flips" in what:
        out["flips"] = flips(con, present)
    if "kdepth" in what:
        out["kdepth"] = kdepth(con, present)
    if "units" in what:
        out["units"] = units(con, root)
    if "noise-floor" in what:
        out["noise-floor"] = {"kernels": [], "attention_kernels": [], "by_m": [], "model": [], "model_overall": [],
                              "distinct_completions": distinct_completions(con, present)}
        for t in ("batch_invariance", "batch_invariance_model", "batch_invariance_attention"):
            if t in present:
                raise SystemExit(f"table {t} is present: this baseline computes only what the gen_rows tree feeds")
    if "certificate" in what:
        out["certificate"] = certificate(con, present)
    if "all" in what:
        agree = agreement(con, present, full=False)
        kd = kdepth(con, present)
        out["all"] = {"agreement": agree, "flips": flips(con, present, resamples=500), "kdepth": kd,
                      "kdepth_by_seed": rows(con, KDEPTH_BY_SEED) if "kdepth" in present else [],
                      "certificate": certificate(con, present, kd, agree)}
    json.dump(out, sys.stdout, default=str, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
