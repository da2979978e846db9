"""The hand-written baselines of ``bench_reads.py``: plain DuckDB and Python over the same Parquet files,
computing the same numbers as the report each is paired with, and printing them (as JSON).

    python benchmarks/reads_baseline.py RESULTS_ROOT WHAT[,WHAT...] [SQL]

``WHAT``: ``agreement``, ``flips``, ``kdepth``, ``units``, ``noise-floor``, ``certificate`` (also the
baseline of ``report conformance``: the same numbers, another layout), ``divergence``, ``all``
(everything ``report all`` computes, each fact once) or ``query`` (the SQL of the last argument,
printed as CSV).

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
* ``divergence``: every number ``report divergence --format json`` prints, at its defaults (2000
  resamples, seed 0, the gate on the mismatch KL at 0.015), per arm pair (two arms of one experiment
  of a sweep): the first divergence of the restart-0 generations (the per-position rows, gathered
  into each sequence's token and margin lists in position order and compared list against list; a
  position one arm lacks differs), the Kaplan-Meier curve at every event time with its log-log interval and the
  0.1/0.25/0.5/0.75/0.9 quantiles (``scipy.stats.ecdf`` on ``CensoredData``), the diverged positions'
  quartiles (``numpy.quantile``), each arm's margin at the divergence beside the identical-prefix
  margins (medians, ``scipy.stats.mannwhitneyu``'s U / (n_div n_prefix), the prefix share at or below
  the divergence median); TARr@N per arm and TARr@2N per pair with exact intervals and the distinct
  completions per prompt; accuracy, TARa@N, TARa@2N and the paired accuracy change with the exact
  McNemar p and its intervals where the sequences record answers (else ``recorded: false``); per
  teacher-forced pair probs_diff, k3 and mismatch KL per position (each over its own positions), the
  KL per sequence, each with its percentile-bootstrap interval and SE over reference sequences
  (``scipy.stats.bootstrap``, the same rng, seed and resamples, the sequences in the same order),
  the gate; the flips per p_ref bucket with exact intervals.
* ``all``: agreement, flips (as ``report all`` runs them: 500 resamples), the K-depth table and its
  per-seed series, the divergence figures (as ``report all``'s divergence section runs them: the
  defaults above) with the certificate's divergence figures read off them, the certificate figures,
  distinct completions and the launches, each once.
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
                agree: dict[str, Any] | None = None, div: dict[str, Any] | None = None) -> dict[str, Any]:
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
    return {"kdepth": sections, "cross": cross,
            "divergence": divergence(con, present) if div is None else certificate_divergence(div),
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
        entry: dict[str, Any] = {"positions": int(counts.sum()), "probs_diff_mean": float(sum(r["pd"] for r in g) / counts.sum()),
                 "probs_diff_max": float(max(r["pd_max"] for r in g)),
                 "k3_mean": float(sum(r["k3"] for r in g) / counts.sum()), "kl_mean": float(kl.sum() / counts.sum())}
        if len(g) >= 2:
            ci, se = _boot((kl, counts), lambda s, c, axis=-1: np.sum(s, axis=axis) / np.sum(c, axis=axis), paired=True)
            entry.update(kl_ci=ci, gate_passed=bool(abs(entry["kl_mean"]) + 2 * se < threshold))
        f, n = mids.get((ref, arm), (0, 0))
        entry["flips_p_ref_0.1_0.9"] = [f, n, exact(f, n)]
        out["teacher_forced"][f"{ref}|{arm}"] = entry
    return out


# -- report divergence (issue #27) --------------------------------------------------------------------

# Restart-0 generations as one row per (sweep, arm, prompt): the tokens and margins in position order.
GEN_LISTS = """
CREATE TEMP TABLE gen_lists AS
SELECT sweep, experiment, arm, prompt_index, count(*) AS n, min(position) AS lo, max(position) AS hi,
       list(token ORDER BY position) AS toks, list(margin ORDER BY position) AS margins
FROM generations WHERE restart = 0 GROUP BY sweep, experiment, arm, prompt_index
"""

# Per arm pair (arm_a < arm_b, two arms of one experiment of a sweep: arms of two experiments run other
# models or prompts and are never paired) and prompt either arm generated: n (positions either arm
# generated), the first position whose tokens differ (a position one arm lacks differs; NULL: identical
# to the end), both margins there, and the margins of the positions before it (the identical prefix).
PAIR_PROMPTS = """
CREATE TEMP TABLE pair_prompts AS
WITH arms AS (SELECT DISTINCT sweep, experiment, arm FROM gen_lists),
prs AS (SELECT x.sweep, x.experiment, x.arm AS arm_a, y.arm AS arm_b FROM arms x
        JOIN arms y ON x.sweep = y.sweep AND x.experiment = y.experiment AND x.arm < y.arm),
prompts AS (SELECT DISTINCT sweep, experiment, prompt_index FROM gen_lists),
j AS (
    SELECT prs.sweep, prs.arm_a, prs.arm_b, q.prompt_index,
           coalesce(a.toks, []) AS ta, coalesce(b.toks, []) AS tb,
           coalesce(a.margins, []) AS ma, coalesce(b.margins, []) AS mb
    FROM prs JOIN prompts q USING (sweep, experiment)
    LEFT JOIN gen_lists a ON a.sweep = prs.sweep AND a.experiment = prs.experiment AND a.arm = prs.arm_a
                         AND a.prompt_index = q.prompt_index
    LEFT JOIN gen_lists b ON b.sweep = prs.sweep AND b.experiment = prs.experiment AND b.arm = prs.arm_b
                         AND b.prompt_index = q.prompt_index
    WHERE a.arm IS NOT NULL OR b.arm IS NOT NULL),
d AS (
    SELECT *, greatest(len(ta), len(tb)) AS n,
           CASE WHEN ta = tb THEN NULL
                ELSE coalesce(nullif(list_position(list_transform(range(least(len(ta), len(tb))),
                                                                  lambda i: ta[i + 1] IS DISTINCT FROM tb[i + 1]), true), 0) - 1,
                              least(len(ta), len(tb))) END AS fd
    FROM j)
SELECT sweep, arm_a, arm_b, prompt_index, n, fd, ma[fd + 1] AS margin_a, mb[fd + 1] AS margin_b,
       list_slice(ma, 1, coalesce(fd, n)) AS prefix_a, list_slice(mb, 1, coalesce(fd, n)) AS prefix_b
FROM d
"""

SELF_RUNS = """
WITH r AS (SELECT sweep, arm, count(DISTINCT restart) AS restarts FROM sequences GROUP BY ALL),
p AS (SELECT sweep, arm, prompt_index, count(DISTINCT sequence_hash) AS d, count(sequence_hash) AS hashed,
             count(*) AS runs, count(DISTINCT restart) AS rs FROM sequences GROUP BY ALL)
SELECT p.sweep, p.arm, any_value(r.restarts) AS restarts, count(*) AS prompts,
       count(*) FILTER (WHERE p.d = 1 AND p.hashed = p.runs AND p.rs = r.restarts) AS identical,
       count(*) FILTER (WHERE p.rs < r.restarts) AS incomplete, list(p.d) AS ds
FROM p JOIN r USING (sweep, arm) GROUP BY p.sweep, p.arm ORDER BY p.sweep, p.arm
"""

# Per arm pair (of one experiment) and prompt over both arms' runs, then per pair: TARr@2N's count, the
# distinct completions per prompt, and (answers) the prompts whose 2N extracted answers agree.
PAIR_RUNS = """
WITH r AS (SELECT sweep, experiment, arm, count(DISTINCT restart) AS restarts FROM sequences GROUP BY ALL),
per AS (
    SELECT ra.sweep, ra.arm AS arm_a, rb.arm AS arm_b, any_value(ra.restarts) AS restarts_a,
           any_value(rb.restarts) AS restarts_b, count(*) AS runs, count(DISTINCT s.sequence_hash) AS d,
           count(DISTINCT (s.arm, s.restart)) = any_value(ra.restarts) + any_value(rb.restarts)
               AND count(s.sequence_hash) = count(*) AS complete,
           count(DISTINCT s.prompt_hash) = 1 AS one_prompt,
           count(s.extracted_answer) AS answered, count(DISTINCT s.extracted_answer) AS answers
    FROM r ra JOIN r rb ON ra.sweep = rb.sweep AND ra.experiment = rb.experiment AND ra.arm < rb.arm
    JOIN sequences s ON s.sweep = ra.sweep AND s.experiment = ra.experiment AND s.arm IN (ra.arm, rb.arm)
    GROUP BY ra.sweep, ra.arm, rb.arm, s.prompt_index)
SELECT sweep, arm_a, arm_b, any_value(restarts_a) AS restarts_a, any_value(restarts_b) AS restarts_b,
       count(*) AS prompts, count(*) FILTER (WHERE complete AND one_prompt AND d = 1) AS agreeing,
       count(*) FILTER (WHERE NOT complete) AS incomplete, list(d) AS ds, sum(runs) AS completions,
       count(*) FILTER (WHERE complete AND one_prompt AND answered = runs) AS answered_prompts,
       count(*) FILTER (WHERE complete AND one_prompt AND answered = runs AND answers = 1) AS answers_agreeing
FROM per GROUP BY sweep, arm_a, arm_b ORDER BY sweep, arm_a, arm_b
"""

# Per arm, over the sequences whose prompt has an expected answer: checked and correct sequences, and
# the prompts answered in every restart with their answers identical.
ANSWERS = """
WITH r AS (SELECT sweep, arm, count(DISTINCT restart) AS restarts, count(correct) AS checked,
                  count(*) FILTER (WHERE correct) AS correct FROM sequences GROUP BY ALL),
p AS (SELECT sweep, arm, prompt_index, count(DISTINCT restart) AS rs, count(extracted_answer) = count(*) AS all_answered,
             count(DISTINCT extracted_answer) = 1 AS one_answer
      FROM sequences WHERE extracted_answer IS NOT NULL OR correct IS NOT NULL GROUP BY ALL)
SELECT r.sweep, r.arm, any_value(r.restarts) AS restarts, any_value(r.checked) AS checked, any_value(r.correct) AS correct,
       count(p.prompt_index) FILTER (WHERE p.rs = r.restarts AND p.all_answered) AS prompts,
       count(p.prompt_index) FILTER (WHERE p.rs = r.restarts AND p.all_answered AND p.one_answer) AS agreeing
FROM r LEFT JOIN p USING (sweep, arm) GROUP BY r.sweep, r.arm HAVING any_value(r.checked) > 0 ORDER BY r.sweep, r.arm
"""

# The accuracy change of each arm pair: restart-0 correctness paired on the same prompt (index and hash).
CHANGES = """
WITH s AS (SELECT sweep, experiment, arm, prompt_index, prompt_hash, extracted_answer, correct FROM sequences
           WHERE restart = 0 AND correct IS NOT NULL),
a AS (SELECT sweep, experiment, arm, count(*) AS prompts FROM s GROUP BY ALL),
paired AS (
    SELECT u.sweep, u.arm AS arm_a, v.arm AS arm_b, count(*) AS n,
           count(*) FILTER (WHERE u.correct AND NOT v.correct) AS a_only,
           count(*) FILTER (WHERE v.correct AND NOT u.correct) AS b_only,
           count(*) FILTER (WHERE u.correct AND v.correct) AS both_right,
           count(*) FILTER (WHERE u.extracted_answer IS DISTINCT FROM v.extracted_answer) AS answers_differ
    FROM s u JOIN s v ON u.sweep = v.sweep AND u.prompt_index = v.prompt_index AND u.prompt_hash = v.prompt_hash
                     AND u.arm < v.arm
    GROUP BY ALL)
SELECT x.sweep, x.arm AS arm_a, y.arm AS arm_b, x.experiment AS experiment_a, y.experiment AS experiment_b,
       x.prompts AS prompts_a, y.prompts AS prompts_b, coalesce(p.n, 0) AS n, coalesce(p.a_only, 0) AS a_only,
       coalesce(p.b_only, 0) AS b_only, coalesce(p.both_right, 0) AS both_right,
       coalesce(p.answers_differ, 0) AS answers_differ
FROM a x JOIN a y ON x.sweep = y.sweep AND x.arm < y.arm
LEFT JOIN paired p ON p.sweep = x.sweep AND p.arm_a = x.arm AND p.arm_b = y.arm
ORDER BY x.sweep, x.arm, y.arm
"""

# Per teacher-forced (ref_arm, arm) pair and reference sequence: rows; the positions with both
# probabilities and the k3 term recorded (probs) and those with the exact KL too (kl), and their sums.
TF_SEQUENCES = """
SELECT sweep, ref_arm, arm, ref_restart, prompt_index, count(*) AS positions,
       count(*) FILTER (WHERE p) AS probs, count(*) FILTER (WHERE p AND kl_ref_arm IS NOT NULL) AS kls,
       sum(abs(ref_token_prob_ref - ref_token_prob_arm)) FILTER (WHERE p) AS pd,
       max(abs(ref_token_prob_ref - ref_token_prob_arm)) FILTER (WHERE p) AS pd_max,
       sum(k3_ref_arm) FILTER (WHERE p) AS k3,
       sum(kl_ref_arm) FILTER (WHERE p AND kl_ref_arm IS NOT NULL) AS kl,
       max(kl_ref_arm) FILTER (WHERE p AND kl_ref_arm IS NOT NULL) AS kl_max
FROM (SELECT *, ref_token_prob_ref IS NOT NULL AND ref_token_prob_arm IS NOT NULL AND k3_ref_arm IS NOT NULL AS p
      FROM teacher_forced)
GROUP BY ALL ORDER BY sweep, ref_arm, arm, ref_restart, prompt_index
"""

# Flips per bucket of the reference token's probability under the reference arm.
TF_BUCKETS = """
SELECT sweep, ref_arm, arm,
       CASE WHEN ref_token_prob_ref < 0.1 THEN '[0, 0.1)' WHEN ref_token_prob_ref < 0.5 THEN '[0.1, 0.5)'
            WHEN ref_token_prob_ref < 0.9 THEN '[0.5, 0.9)' ELSE '[0.9, 1]' END AS bucket,
       count(*) AS n, count(*) FILTER (WHERE flip) AS k
FROM teacher_forced WHERE ref_token_prob_ref IS NOT NULL AND flip IS NOT NULL GROUP BY ALL
"""
BUCKET_NAMES = ("[0, 0.1)", "[0.1, 0.5)", "[0.5, 0.9)", "[0.9, 1]")
GATE_SUMS = {"kl": "kl", "k3": "k3", "probs_diff": "probs_diff"}


def _cp(k: int, n: int) -> list[Any]:
    """[k, n, k / n, exact interval, level] (None where n = 0)."""
    return [k, n, k / n if n else None, exact(k, n), LEVEL]


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _survival(times: list[int], censored: list[int]) -> dict[str, Any]:
    """Kaplan-Meier S(t) at every event time with its pointwise log-log (Greenwood) interval, and the
    first-divergence quantiles (smallest t with S(t) <= 1 - q)."""
    import warnings

    from scipy.stats import CensoredData, ecdf

    if not times:
        return {"sequences": len(censored), "events": 0, "curve": [], "quantiles": {}}
    sf = ecdf(CensoredData(uncensored=times, right=censored) if censored else np.asarray(times)).sf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = sf.confidence_interval(LEVEL, method="log-log")
    at = np.asarray(sorted(set(times)), dtype=float)
    s, lo, hi = sf.evaluate(at), ci.low.evaluate(at), ci.high.evaluate(at)
    curve: list[list[Any]] = [[int(t), float(a), _finite(b), _finite(c)] for t, a, b, c in zip(at, s, lo, hi, strict=True)]
    quantiles = {}
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        hit = [c[0] for c in curve if c[1] <= 1 - q + 1e-12]
        quantiles[f"{q:g}"] = hit[0] if hit else None
    return {"sequences": len(times) + len(censored), "events": len(times), "curve": curve, "quantiles": quantiles}


def _margins(at: list[float], prefix: np.ndarray, arm: str) -> dict[str, Any]:
    from scipy.stats import mannwhitneyu

    out: dict[str, Any] = {"arm": arm, "at_divergence": len(at), "prefix_positions": int(prefix.size),
                           "median_at_divergence": float(np.median(at)) if at else None,
                           "median_prefix": float(np.median(prefix)) if prefix.size else None, "p_lower": None}
    if at and prefix.size:
        u = float(mannwhitneyu(at, prefix, alternative="two-sided").statistic)
        out["p_lower"] = 1.0 - u / (len(at) * prefix.size)
        out["prefix_share_at_or_below_median"] = float(np.mean(prefix <= out["median_at_divergence"]))
    return out


def _distinct(ds: list[int]) -> dict[str, Any]:
    return {"median": float(np.median(ds)), "max": int(max(ds)), "total": int(sum(ds))} if ds else \
        {"median": None, "max": None, "total": 0}


def _change(n: int, a_only: int, b_only: int) -> dict[str, Any]:
    """The paired accuracy change (b_only - a_only) / n: exact McNemar p (binomtest of b_only among the
    discordant at 0.5), the discordant rate's exact interval (its upper end bounds |change|), and the
    change's interval given the discordant count."""
    from scipy.stats import binomtest

    d = a_only + b_only
    disc = _cp(d, n)
    out: dict[str, Any] = {"n": n, "a_only": a_only, "b_only": b_only, "discordant": disc,
                           "change": (b_only - a_only) / n if n else None,
                           "abs_change_bound": disc[3][1] if disc[3] else None, "mcnemar_p": None,
                           "conditional_interval": None}
    if d:
        t = binomtest(b_only, d, 0.5)
        ci = t.proportion_ci(confidence_level=LEVEL, method="exact")
        out["mcnemar_p"] = float(t.pvalue)
        out["conditional_interval"] = [(2 * float(ci.low) - 1) * d / n, (2 * float(ci.high) - 1) * d / n]
    return out


def _figure(sums: np.ndarray, counts: np.ndarray, resamples: int, seed: int) -> dict[str, Any]:
    """A per-position mean (sum over sequences / their positions) with its percentile-bootstrap
    interval and SE over reference sequences (None below two sequences)."""
    out: dict[str, Any] = {"mean": float(sums.sum() / counts.sum()), "positions": int(counts.sum()),
                           "sequences": int(sums.size), "interval": None, "se": None}
    if sums.size >= 2:
        out["interval"], out["se"] = _boot((sums, counts), lambda s, c, axis=-1: np.sum(s, axis=axis) / np.sum(c, axis=axis),
                                           resamples, seed, paired=True)
    return out


def report_divergence(con: duckdb.DuckDBPyConnection, present: set[str], *, resamples: int = 2000, seed: int = 0,
                      threshold: float = 0.015, gate_metric: str = "kl") -> dict[str, Any]:
    """Every number of ``report divergence`` (its defaults: 2000 resamples, seed 0, the gate on the
    mismatch KL at 0.015), keyed ``sweep|arm_a|arm_b`` (``sweep|ref_arm|arm`` for teacher-forced pairs)."""
    out: dict[str, Any] = {"first_divergence": {}, "tarr_arms": {}, "tarr_pairs": {},
                           "answers": {"recorded": False}, "distribution": {}, "flip_buckets": {}}
    if "generations" in present:
        con.execute(GEN_LISTS)
        gaps = con.execute("SELECT count(*) FROM gen_lists WHERE lo <> 0 OR hi <> n - 1").fetchone()
        if gaps and gaps[0]:
            raise SystemExit("generations: positions not 0..n-1 in some sequence: this baseline reads the token "
                             "lists by index and computes only what the gen_rows tree feeds")
        con.execute(PAIR_PROMPTS)
        by_pair: dict[str, list[tuple[int, int | None, float | None, float | None]]] = {}
        for sw, a, b, n, fd, ma, mb in con.execute(
                "SELECT sweep, arm_a, arm_b, n, fd, margin_a, margin_b FROM pair_prompts").fetchall():
            by_pair.setdefault(f"{sw}|{a}|{b}", []).append((n, fd, ma, mb))
        for key, prs in sorted(by_pair.items()):
            sw, a, b = key.split("|")
            times = [fd for _, fd, _, _ in prs if fd is not None]
            censored = [n - 1 for n, fd, _, _ in prs if fd is None]
            diverged = None
            if times:
                q = np.quantile(np.asarray(times, dtype=float), [0.25, 0.5, 0.75])
                diverged = {"min": min(times), "q25": float(q[0]), "median": float(q[1]), "q75": float(q[2]),
                            "max": max(times)}
            margins = {}
            for side, arm, col in (("a", a, 2), ("b", b, 3)):
                pre = con.execute(f"SELECT m FROM (SELECT unnest(prefix_{side}) AS m FROM pair_prompts WHERE sweep = ? "
                                  "AND arm_a = ? AND arm_b = ?) WHERE m IS NOT NULL", [sw, a, b]).fetchnumpy()["m"]
                at = [float(m) for r in prs if r[1] is not None and (m := r[col]) is not None]
                margins[side] = _margins(at, np.asarray(pre, dtype=float), arm)
            out["first_divergence"][key] = {
                "sequences": len(prs), "last_position": max(n for n, _, _, _ in prs) - 1, "diverged": len(times),
                "identical": len(censored), "survival": _survival(times, censored), "diverged_positions": diverged,
                "margins": margins}
    if "sequences" in present:
        for r in rows(con, SELF_RUNS):
            out["tarr_arms"][f"{r['sweep']}|{r['arm']}"] = {
                "restarts": r["restarts"], "prompts": r["prompts"],
                "tarr": _cp(r["identical"], r["prompts"]) if r["restarts"] >= 2 else None,
                "distinct": {**_distinct(r["ds"]), "completions": r["restarts"] * r["prompts"],
                             "incomplete_prompts": r["incomplete"]}}
        pair_rows = rows(con, PAIR_RUNS)
        for r in pair_rows:
            out["tarr_pairs"][f"{r['sweep']}|{r['arm_a']}|{r['arm_b']}"] = {
                "restarts_a": r["restarts_a"], "restarts_b": r["restarts_b"], "prompts": r["prompts"],
                "tarr": _cp(r["agreeing"], r["prompts"]), "incomplete_prompts": r["incomplete"],
                "distinct": {**_distinct(r["ds"]), "completions": int(r["completions"])}}
        answered = rows(con, ANSWERS)
        if answered:
            changes, skipped = {}, {}
            for r in rows(con, CHANGES):
                key = f"{r['sweep']}|{r['arm_a']}|{r['arm_b']}"
                if r["experiment_a"] != r["experiment_b"]:
                    skipped[key] = [r["experiment_a"], r["experiment_b"]]
                else:
                    changes[key] = {"experiment": r["experiment_a"], "prompts_a": r["prompts_a"],
                                    "prompts_b": r["prompts_b"], "both_right": r["both_right"],
                                    "answers_differ": r["answers_differ"], **_change(r["n"], r["a_only"], r["b_only"])}
            out["answers"] = {
                "recorded": True,
                "arms": {f"{r['sweep']}|{r['arm']}": {"restarts": r["restarts"], "accuracy": _cp(r["correct"], r["checked"]),
                                                      "tara": _cp(r["agreeing"], r["prompts"])} for r in answered},
                "pairs": {f"{r['sweep']}|{r['arm_a']}|{r['arm_b']}": _cp(r["answers_agreeing"], r["answered_prompts"])
                          for r in pair_rows if r["answered_prompts"]},
                "changes": changes, "changes_skipped": skipped}
    if "teacher_forced" not in present:
        return out
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows(con, TF_SEQUENCES):
        groups.setdefault(f"{r['sweep']}|{r['ref_arm']}|{r['arm']}", []).append(r)
    for key, g in groups.items():
        probs = [r for r in g if r["probs"]]
        kls = [r for r in probs if r["kls"]]
        entry: dict[str, Any] = {"sequences": len(g), "positions": sum(r["positions"] for r in g),
                                 "measured_positions": sum(r["probs"] for r in probs), "measured_sequences": len(probs),
                                 "kl_positions": sum(r["kls"] for r in kls), "kl_sequences": len(kls)}
        out["distribution"][key] = entry
        if not probs:
            continue
        counts = np.array([r["probs"] for r in probs], dtype=float)
        entry["probs_diff"] = {**_figure(np.array([r["pd"] for r in probs], dtype=float), counts, resamples, seed),
                               "max": float(max(r["pd_max"] for r in probs))}
        entry["k3"] = _figure(np.array([r["k3"] for r in probs], dtype=float), counts, resamples, seed)
        if kls:
            kl = np.array([r["kl"] for r in kls], dtype=float)
            kl_counts = np.array([r["kls"] for r in kls], dtype=float)
            entry["kl"] = {**_figure(kl, kl_counts, resamples, seed), "max": float(max(r["kl_max"] for r in kls)),
                           "mean_per_sequence": float(kl.mean()), "per_sequence_interval": None, "per_sequence_se": None}
            if kl.size >= 2:
                entry["kl"]["per_sequence_interval"], entry["kl"]["per_sequence_se"] = _boot(
                    (kl,), lambda s, axis=-1: np.mean(s, axis=axis), resamples, seed)
        entry["bootstrap"] = {"level": LEVEL, "resamples": resamples, "seed": seed, "sequences": len(probs)}
        fig = entry.get(GATE_SUMS[gate_metric])
        bound = None if fig is None or fig["se"] is None else abs(fig["mean"]) + 2 * fig["se"]
        entry["gate"] = {"metric": gate_metric, "threshold": threshold, "mean": None if fig is None else fig["mean"],
                         "se": None if fig is None else fig["se"], "bound": bound,
                         "passed": None if bound is None else bool(bound < threshold),
                         "positions": 0 if fig is None else fig["positions"],
                         "sequences": 0 if fig is None else fig["sequences"]}
    cells: dict[str, dict[str, tuple[int, int]]] = {}
    for r in rows(con, TF_BUCKETS):
        cells.setdefault(f"{r['sweep']}|{r['ref_arm']}|{r['arm']}", {})[r["bucket"]] = (int(r["k"]), int(r["n"]))
    for key, got in sorted(cells.items()):
        kn = {b: got.get(b, (0, 0)) for b in BUCKET_NAMES}
        mid = [kn["[0.1, 0.5)"], kn["[0.5, 0.9)"]]
        rest = [kn["[0, 0.1)"], kn["[0.9, 1]"]]
        out["flip_buckets"][key] = {**{b: _cp(*v) for b, v in kn.items()},
                                    "[0.1, 0.9)": _cp(sum(k for k, _ in mid), sum(n for _, n in mid)),
                                    "[0, 0.1) and [0.9, 1]": _cp(sum(k for k, _ in rest), sum(n for _, n in rest))}
    return out


def certificate_divergence(full: dict[str, Any]) -> dict[str, Any]:
    """The certificate's divergence figures (:func:`divergence`'s keys) read off :func:`report_divergence`'s
    (``all``: each figure computed once, as the report computes it)."""
    out: dict[str, Any] = {"pairs": {}, "teacher_forced": {}}
    for key, f in full["first_divergence"].items():
        _, a, b = key.split("|")
        t = full["tarr_pairs"].get(key)
        out["pairs"][f"{a}|{b}"] = {"sequences": f["sequences"], "diverged": f["diverged"],
                                    "km_median": f["survival"]["quantiles"].get("0.5"),
                                    "diverged_median": f["diverged_positions"]["median"] if f["diverged_positions"] else None,
                                    "tarr_2n": [t["tarr"][0], t["tarr"][1], t["tarr"][3]] if t else [0, 0, None]}
    for key, d in full["distribution"].items():
        _, ref, arm = key.split("|")
        if "kl" not in d:
            continue
        mid = full["flip_buckets"].get(key, {}).get("[0.1, 0.9)", [0, 0, None, None])
        entry = {"positions": d["measured_positions"], "probs_diff_mean": d["probs_diff"]["mean"],
                 "probs_diff_max": d["probs_diff"]["max"], "k3_mean": d["k3"]["mean"], "kl_mean": d["kl"]["mean"]}
        if d["kl"]["interval"] is not None:
            entry.update(kl_ci=d["kl"]["interval"], gate_passed=d["gate"]["passed"])
        entry["flips_p_ref_0.1_0.9"] = [mid[0], mid[1], mid[3]]
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
    if "divergence" in what:
        out["divergence"] = report_divergence(con, present)
    if "all" in what:
        agree = agreement(con, present, full=False)
        kd = kdepth(con, present)
        div = report_divergence(con, present)
        out["all"] = {"agreement": agree, "flips": flips(con, present, resamples=500), "kdepth": kd,
                      "kdepth_by_seed": rows(con, KDEPTH_BY_SEED) if "kdepth" in present else [],
                      "divergence": div, "certificate": certificate(con, present, kd, agree, div)}
    json.dump(out, sys.stdout, default=str, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
