"""Where two arms part and the figures the field reads (``report divergence``, docs/divergence.md).

Per arm pair of one sweep, never pooled across pairs or sweeps:

- **first divergence** of the restart-0 generations (``first_divergence.sql``, the pairs the agreement
  report forms): its distribution as a Kaplan-Meier survival curve "identical through token t"
  (``scipy.stats.ecdf`` on right-censored data: a sequence identical to its end is censored there),
  its quantiles, and both arms' margins at the first divergence beside the margins at the positions
  where the two sequences are still identical (``divergence_prefix_margins.sql``);
- **TARr@N and distinct completions**: per arm over its N cold restarts (``self_reproducibility``,
  ``distinct_completions``) and per arm pair over all 2N runs (``divergence_pair_runs.sql``), with
  exact Clopper-Pearson intervals (``scipy.stats.binomtest``); accuracy and TARa@N (identical extracted
  answers) where the sequences record answers (``divergence_answers.sql``);
- **probs_diff, k3 KL and mismatch KL** from the teacher-forced replay (``divergence_sequences.sql``),
  with percentile-bootstrap intervals resampling reference sequences (``scipy.stats.bootstrap``) and a
  gate ``|mean| + 2 SE < threshold`` naming the figure it reads; each figure over its own positions
  (on vLLM arms: probs_diff and k3, the KL "not measured", :data:`KL_NOT_MEASURED`);
- **flip rate by the reference token's probability** (``divergence_prob_buckets.sql``), 0.1-0.9 called
  out, each bucket with its Clopper-Pearson interval.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["BUCKETS", "GATE_FIGURES", "GATE_METRICS", "INTERVALS", "KL_NOT_MEASURED", "LOGPROB_SEMANTICS", "clopper_pearson",
           "distribution", "divergence", "first_divergence", "flip_buckets", "for_certificate", "logprob_semantics",
           "pair_figures", "total_agreement"]

LEVEL = 0.95
#: Lower edges of the p_ref buckets of ``divergence_prob_buckets.sql`` and their labels.
BUCKETS = {0.0: "[0, 0.1)", 0.1: "[0.1, 0.5)", 0.5: "[0.5, 0.9)", 0.9: "[0.9, 1]"}
#: The per-position means the gate can read: name -> (sum column, what it is).
GATE_METRICS = {"kl": ("sum_kl", "mismatch KL(ref || arm), exact over the vocabulary, mean per position (nats)"),
                "k3": ("sum_k3", "k3 KL, mean per position of r - 1 - log r, r = p_arm / p_ref of the reference token"),
                "probs_diff": ("sum_abs_prob_diff", "probs_diff, mean per position of |p_ref - p_arm| of the "
                               "reference token")}
#: Survival-curve positions shown in the tables (every event time is in the JSON).
CURVE_AT = (0, 1, 3, 7, 15, 31, 63, 127, 255, 511, 1023)


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> dict[str, Any]:
    """``k / n`` with its exact (Clopper-Pearson) interval from ``scipy.stats.binomtest``; None for n = 0."""
    if n == 0:
        return {"k": 0, "n": 0, "rate": None, "interval": None, "method": "Clopper-Pearson (exact)", "level": level}
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return {"k": k, "n": n, "rate": k / n, "interval": [float(ci.low), float(ci.high)],
            "method": "Clopper-Pearson (exact)", "level": level}


def _pair_key(r: dict[str, Any], a: str = "arm_a", b: str = "arm_b") -> tuple[str, str, str]:
    return (r["sweep"], r[a], r[b])


# --- first divergence ----------------------------------------------------------------------------------------------

def _finite(v: Any) -> float | None:
    return float(v) if math.isfinite(v) else None


def _survival(times: list[int], censored: list[int]) -> dict[str, Any]:
    """Kaplan-Meier S(t) = P(identical through token t) from first-divergence positions (events) and the
    last positions of never-diverging sequences (right-censored there), with its Greenwood interval."""
    import numpy as np
    from scipy.stats import CensoredData, ecdf

    n = len(times) + len(censored)
    method = ("Kaplan-Meier (scipy.stats.ecdf on right-censored data), pointwise 95% interval: Greenwood, "
              "log-log")
    if not times:
        return {"method": method, "sequences": n, "events": 0, "curve": [], "quantiles": {}, "note":
                "no sequence diverged: S(t) = 1 through every generated position"}
    res = ecdf(CensoredData(uncensored=times, right=censored) if censored else np.asarray(times))
    sf = res.sf
    with warnings.catch_warnings():  # log-log is undefined where S(t) is 0 or 1: NaN there, shown as no bound
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = sf.confidence_interval(LEVEL, method="log-log")
    at = np.asarray(sorted(set(times)), dtype=float)
    curve: list[dict[str, Any]] = [{"t": int(t), "survival": float(s), "low": _finite(lo), "high": _finite(hi)}
             for t, s, lo, hi in zip(at, sf.evaluate(at), ci.low.evaluate(at), ci.high.evaluate(at), strict=True)]
    quantiles: dict[str, Any] = {}
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):  # smallest t with S(t) <= 1 - q: the q-quantile of the first divergence
        hit = [c["t"] for c in curve if c["survival"] <= 1 - q + 1e-12]
        quantiles[f"{q:g}"] = hit[0] if hit else None
    return {"method": method, "sequences": n, "events": len(times), "curve": curve, "quantiles": quantiles}


def _pairs_from_lists(tab: Any) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Per arm pair, from ``divergence_margins.sql`` (one row per pair, lists): the first divergence and
    the positions per prompt, and each arm's margins at the first divergences and at the identical prefix
    (numpy float64, NULLs dropped)."""
    import numpy as np
    import pyarrow.compute as pc

    def values(col: str, i: int) -> Any:
        cell = tab[col][i]  # a NULL list: no prompt of the pair diverged (FILTER matched no row)
        if not cell.is_valid:
            return np.zeros(0, dtype=np.float64)
        return pc.drop_null(cell.values).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)

    out = {}
    for i, k in enumerate(tab.select(["sweep", "arm_a", "arm_b"]).to_pylist()):
        out[_pair_key(k)] = {"first": tab["first_divergence"][i].as_py(), "positions": tab["positions"][i].as_py(),
                             "at": {s: values(f"margin_{s}", i) for s in ("a", "b")},
                             "prefix": {s: values(f"prefix_{s}", i) for s in ("a", "b")}}
    return out


def _pairs_from_rows(cat: Catalog, sweep: str, margins: bool) -> dict[tuple[str, str, str], dict[str, Any]]:
    """What :func:`_pairs_from_lists` gives, from one row per prompt (``first_divergence.sql``, margins
    at the identical prefix from ``divergence_prefix_margins.sql``: per-position joins) or, without the
    margins, from the sequences' token lists (``divergence_first_from_sequences.sql``)."""
    import numpy as np

    by_pair: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in cat.named("first_divergence" if margins else "divergence_first_from_sequences", sweep=sweep):
        by_pair[_pair_key(r)].append(r)
    prefix: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(lambda: {"a": [], "b": []})
    for r in cat.named("divergence_prefix_margins", sweep=sweep) if margins else []:
        for s in ("a", "b"):
            if r[f"margin_{s}"] is not None:
                prefix[_pair_key(r)][s].append(float(r[f"margin_{s}"]))
    out = {}
    for key, rows in by_pair.items():
        div = [r for r in rows if r["first_divergence"] is not None]
        out[key] = {"first": [r["first_divergence"] for r in rows], "positions": [int(r["positions"]) for r in rows],
                    "at": {s: np.asarray([float(r[f"margin_{s}"]) for r in div if r.get(f"margin_{s}") is not None])
                           for s in ("a", "b")},
                    "prefix": {s: np.asarray(prefix[key][s], dtype=np.float64) for s in ("a", "b")}}
    return out


def first_divergence(cat: Catalog, sweep: str, *, margins: bool = True) -> list[dict[str, Any]]:
    """Per arm pair: sequences compared, diverged, the survival curve and quantiles, the diverged ones'
    positions, and (``margins``) the margins at the first divergence vs at the identical-prefix positions.

    With the margins, every sequence's tokens and margins come as lists (``divergence_margins.sql``: one
    aggregation over the generations); where some sequence's positions are not 0 .. n-1 (a list index
    would not be its position), from the per-position queries instead -- the same numbers otherwise
    (tests/test_divergence.py). Without them (the certificate), from the sequences' token lists."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    pairs = None
    if margins:
        tab = cat.named_arrow("divergence_margins", sweep=sweep)
        if all(tab["contiguous"].to_pylist()):
            pairs = _pairs_from_lists(tab)
    if pairs is None:
        pairs = _pairs_from_rows(cat, sweep, margins)
    out = []
    for key, pair in sorted(pairs.items()):
        firsts, positions = pair["first"], pair["positions"]
        times = [int(f) for f in firsts if f is not None]
        censored = [n - 1 for f, n in zip(firsts, positions, strict=True) if f is None]
        surv = _survival(times, censored)
        diverged = None
        if times:
            q = np.quantile(np.asarray(times, dtype=float), [0.25, 0.5, 0.75])
            diverged = {"min": min(times), "q25": float(q[0]), "median": float(q[1]), "q75": float(q[2]),
                        "max": max(times), "method": "numpy.quantile (linear), diverged sequences only"}
        by_side: dict[str, Any] = {}
        for side in ("a", "b") if margins else ():
            at, pre = pair["at"][side], pair["prefix"][side]
            entry: dict[str, Any] = {"arm": key[1] if side == "a" else key[2], "at_divergence": len(at),
                                     "prefix_positions": len(pre),
                                     "median_at_divergence": float(np.median(at)) if len(at) else None,
                                     "median_prefix": float(np.median(pre)) if len(pre) else None,
                                     "p_lower": None}
            if len(at) and len(pre):
                u = mannwhitneyu(at, pre, alternative="two-sided").statistic
                # P(a margin at the first divergence < a margin at an identical-prefix position), ties count half
                entry["p_lower"] = 1.0 - float(u) / (len(at) * len(pre))
                entry["prefix_share_at_or_below_median"] = float(np.mean(pre <= entry["median_at_divergence"]))
            by_side[side] = entry
        out.append({"sweep": key[0], "arm_a": key[1], "arm_b": key[2], "sequences": len(firsts),
                    "last_position": max(positions) - 1,
                    "diverged": len(times), "identical": len(censored), "survival": surv, "diverged_positions": diverged,
                    "margins": by_side, "unit": "restart-0 sequence pairs (one per prompt)"})
    return out


# --- TARr@N, distinct completions ----------------------------------------------------------------------------------

def _distinct_stats(counts: list[int]) -> dict[str, Any]:
    import numpy as np

    if not counts:
        return {"median": None, "max": None, "total": 0}
    return {"median": float(np.median(counts)), "max": int(max(counts)), "total": int(sum(counts))}


def total_agreement(cat: Catalog, sweep: str) -> dict[str, Any]:
    """TARr@N per arm (prompts whose N cold-restart completions are all identical) and per arm pair
    (all 2N), each with its exact interval; distinct completions per prompt (median, max) and in all;
    accuracy and TARa@N where answers are recorded, else a line saying there are none."""
    arms = []
    distinct = {r["arm"]: r for r in cat.named("distinct_completions", sweep=sweep)}
    for r in cat.named("self_reproducibility", sweep=sweep):
        d = distinct.get(r["arm"])
        counts = [e["distinct"] for e in d["distribution"] for _ in range(e["prompts"])] if d else []
        tar = clopper_pearson(r["identical"], r["total"]) if r["identical"] is not None else None
        arms.append({"sweep": r["sweep"], "arm": r["arm"], "restarts": r["restarts"], "prompts": r["total"],
                     "tarr": tar, "note": None if tar else "one run per prompt: TARr@N needs N >= 2",
                     "distinct": {**_distinct_stats(counts), "completions": (r["restarts"] or 0) * r["total"],
                                  "incomplete_prompts": d["prompts_incomplete"] if d else 0}})
    pairs: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in cat.named("divergence_pair_runs", sweep=sweep):
        pairs[_pair_key(r)].append(r)
    pair_rows = []
    for key, rows in sorted(pairs.items()):
        ok = sum(1 for r in rows if r["complete"] and r["same_prompt"] and r["distinct_completions"] == 1)
        pair_rows.append({"sweep": key[0], "arm_a": key[1], "arm_b": key[2], "restarts_a": rows[0]["restarts_a"],
                          "restarts_b": rows[0]["restarts_b"], "prompts": len(rows), "tarr": clopper_pearson(ok, len(rows)),
                          "incomplete_prompts": sum(1 for r in rows if not r["complete"]),
                          "distinct": {**_distinct_stats([r["distinct_completions"] for r in rows]),
                                       "completions": sum(r["runs"] for r in rows)}})
    return {"arms": arms, "pairs": pair_rows, "answers": _answers(cat, sweep, pairs)}


def _answers(cat: Catalog, sweep: str, pairs: dict[tuple[str, str, str], list[dict[str, Any]]]) -> dict[str, Any]:
    """Accuracy per arm (sequences answered right / sequences whose prompt has an expected answer) and
    TARa@N (prompts whose N extracted answers are identical / prompts answered in every restart), per
    pair TARa@2N; or a line saying that no answers are recorded (never a made-up number)."""
    rows = [r for r in cat.named("divergence_answers", sweep=sweep) if r["checked"]]
    if not rows:
        return {"recorded": False, "note": "no answers recorded: no sequence of this sweep has an expected answer "
                                           "(`correct` / `extracted_answer` are NULL), so TARa@N and accuracy are "
                                           "not measured"}
    arms = [{"sweep": r["sweep"], "arm": r["arm"], "restarts": r["restarts"],
             "accuracy": clopper_pearson(r["correct"], r["checked"]),
             "tara": clopper_pearson(r["agreeing_prompts"], r["prompts"])} for r in rows]
    pair_rows = []
    for key, prs in sorted(pairs.items()):
        answered = [r for r in prs if r["complete"] and r["same_prompt"] and r["answered_runs"] == r["runs"]]
        if answered:
            pair_rows.append({"sweep": key[0], "arm_a": key[1], "arm_b": key[2],
                              "tara": clopper_pearson(sum(1 for r in answered if r["distinct_answers"] == 1),
                                                      len(answered))})
    changes, skipped = _accuracy_changes(cat, sweep)
    return {"recorded": True, "arms": arms, "pairs": pair_rows, "changes": changes, "changes_skipped": skipped,
            "note": "accuracy: correct / checked sequences (every restart), unit: sequences; TARa@N: prompts whose N "
                    "extracted answers are identical / prompts answered in every restart, unit: prompts; "
                    "Clopper-Pearson (exact)"}


CHANGE_METHOD = ("paired on the same prompts, restart 0; change = (b_only - a_only) / n; test: exact McNemar "
                 "(scipy.stats.binomtest(b_only, a_only + b_only, 0.5), two-sided); bound: |change| <= "
                 "(a_only + b_only) / n <= the upper end of its 95% Clopper-Pearson (exact) interval; "
                 "conditional interval: (2 pi - 1) * (a_only + b_only) / n over the 95% Clopper-Pearson interval "
                 "of pi = b_only / (a_only + b_only), given the discordant count; unit: prompts")


def _accuracy_change(n: int, a_only: int, b_only: int) -> dict[str, Any]:
    """The paired accuracy change ``(b_only - a_only) / n`` of one arm pair with the exact McNemar test,
    the Clopper-Pearson bound on the discordant rate that bounds ``|change|``, and (discordant prompts
    present) the change's interval conditional on their count (:data:`CHANGE_METHOD`)."""
    from scipy.stats import binomtest

    d = a_only + b_only
    discordant = clopper_pearson(d, n)
    bound = discordant["interval"][1] if discordant["interval"] else None
    out: dict[str, Any] = {"n": n, "a_only": a_only, "b_only": b_only, "discordant": discordant,
                           "change": (b_only - a_only) / n if n else None, "abs_change_bound": bound,
                           "mcnemar_p": None, "conditional_interval": None, "method": CHANGE_METHOD}
    if d:
        test = binomtest(b_only, d, 0.5)
        ci = test.proportion_ci(confidence_level=LEVEL, method="exact")
        out["mcnemar_p"] = float(test.pvalue)
        out["conditional_interval"] = [(2 * float(ci.low) - 1) * d / n, (2 * float(ci.high) - 1) * d / n]
    else:
        out["note"] = (f"no prompt changed its correctness (0 of {n} discordant); 95% upper confidence bound "
                       f"on |change|: {bound:.3g} (Clopper-Pearson, exact)" if bound is not None else "no paired prompts")
    return out


def _accuracy_changes(cat: Catalog, sweep: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per arm pair of one experiment (``divergence_accuracy_change.sql``): the paired counts and
    :func:`_accuracy_change`; and the arm pairs across two experiments, skipped (they compare two
    models or two prompt sets, not a kernel swap), each with the reason."""
    changes, skipped = [], []
    for r in cat.named("divergence_accuracy_change", sweep=sweep):
        pair = {"sweep": r["sweep"], "arm_a": r["arm_a"], "arm_b": r["arm_b"]}
        if not r["same_experiment"]:
            skipped.append({**pair, "experiment_a": r["experiment_a"], "experiment_b": r["experiment_b"],
                            "reason": f"arms of two experiments ({r['experiment_a']}, {r['experiment_b']}): they "
                                      "compare two models or prompt sets, not a kernel swap"})
            continue
        n = int(r["n"] or 0)
        changes.append({**pair, "experiment": r["experiment_a"], "prompts_a": r["prompts_a"],
                        "prompts_b": r["prompts_b"], "both_right": int(r["both_right"] or 0),
                        "answers_differ": int(r["answers_differ"] or 0),
                        **_accuracy_change(n, int(r["a_only"] or 0), int(r["b_only"] or 0))})
    return changes, skipped


# --- probs_diff, k3, mismatch KL -----------------------------------------------------------------------------------

def _bootstrap(sums: Any, counts: Any, per: str, resamples: int, seed: int) -> dict[str, Any]:
    """Percentile bootstrap over reference sequences of ``sum(sums) / sum(counts)`` (per position) or of
    ``mean(sums)`` (per sequence), with its standard error; None below 2 sequences."""
    import numpy as np
    from scipy.stats import bootstrap

    n = len(sums)
    if n < 2:
        return {"interval": None, "se": None, "note": f"{n} sequence(s): no bootstrap interval"}

    def ratio(s: Any, c: Any, axis: int = -1) -> Any:
        return np.sum(s, axis=axis) / np.sum(c, axis=axis)

    def mean(s: Any, axis: int = -1) -> Any:
        return np.mean(s, axis=axis)

    rng = np.random.default_rng(seed)
    if per == "position":
        res = bootstrap((sums, counts), ratio, paired=True, vectorized=True, n_resamples=resamples,
                        confidence_level=LEVEL, method="percentile", rng=rng)
    else:
        res = bootstrap((sums,), mean, vectorized=True, n_resamples=resamples, confidence_level=LEVEL,
                        method="percentile", rng=rng)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return {"interval": [lo, hi], "se": float(res.standard_error), "note": None}


#: What a pair whose probabilities are recorded but whose mismatch KL is NULL shows for the KL.
KL_NOT_MEASURED = ("not measured (vLLM: kernels are chosen once per process, so the reference arm's and the arm's "
                   "full-vocabulary distributions are never in one process; only the reference token's "
                   "log-probability travels from the reference arm's process, which gives probs_diff and k3, "
                   "not the exact KL)")
#: What the probabilities behind probs_diff, k3 and the KL are, per engine (``arm_runs.engine``):
#: (semantics, how). Raw = the model's own distribution, log_softmax of its logits at temperature 1;
#: processed = a sampler's, after temperature/top-k/top-p renormalisation (docs/rl-metrics.md).
#: ``swapcheck check rl-metrics`` measures the CPU engine's; tests/test_rl_metrics.py holds this
#: table to that measurement.
LOGPROB_SEMANTICS = {
    "cpu": ("raw", "log_softmax in float64 of the CPU engine's fp32 logits; it decodes greedily and applies no "
                   "temperature, top-p or top-k"),
    "vllm": ("raw", "log_softmax in float64 of the full-vocabulary logits captured from vLLM's compute_logits in a "
                    "teacher-forced prefill (engine logprobs_mode \"raw_logits\", temperature 0), never vLLM's "
                    "sampled logprobs (processed under logprobs_mode \"processed_logprobs\")"),
}


def logprob_semantics(engines: dict[str, str], ref_arm: str, arm: str) -> dict[str, Any]:
    """What the pair's probabilities are: each arm's engine and :data:`LOGPROB_SEMANTICS` entry, and
    one ``line`` ("engine logprobs: raw ..."), or "not determined" for an engine the table lacks."""
    sides = {}
    for side, name in (("ref_arm", ref_arm), ("arm", arm)):
        engine = engines.get(name)
        sem, how = LOGPROB_SEMANTICS.get(engine or "", (None, None))
        sides[side] = {"arm": name, "engine": engine, "semantics": sem, "how": how}
    kinds = {v["semantics"] for v in sides.values()}
    if None in kinds:
        unknown = ", ".join(f"{v['arm']} (engine {v['engine']!r})" for v in sides.values() if v["semantics"] is None)
        line = f"engine logprobs: not determined for {unknown}"
    elif len(kinds) == 1:
        engines_used = sorted({str(v["engine"]) for v in sides.values()})
        line = (f"engine logprobs: {kinds.pop()} on both arms ({'; '.join(str(LOGPROB_SEMANTICS[e][1]) for e in engines_used)}): "
                "probs_diff and k3 compare the models' own distributions, not a sampler's")
    else:
        line = "engine logprobs: " + ", ".join(f"{v['arm']} {v['semantics']}" for v in sides.values())
    return {**sides, "line": line}


#: Short names of the gate's figures, for the gate's own line.
GATE_FIGURES = {"kl": "mismatch KL per position", "k3": "k3 KL per position", "probs_diff": "probs_diff per position"}


#: The bootstrap intervals ``distribution`` can compute: each figure's per position, and the KL's per sequence.
INTERVALS = ("probs_diff", "k3", "kl", "kl_per_sequence")


def distribution(cat: Catalog, sweep: str, *, gate_metric: str = "kl", threshold: float = 0.015,
                 resamples: int = 2000, seed: int = 0, intervals: Collection[str] = INTERVALS) -> list[dict[str, Any]]:
    """Per teacher-forced (ref_arm, arm) pair: probs_diff (mean, max), k3 KL mean, mismatch KL per
    position and per sequence, each mean with a percentile-bootstrap interval over reference sequences,
    and the gate ``|mean| + 2 SE < threshold`` on ``gate_metric`` (SE: the bootstrap's).

    Each figure is over its own positions (``divergence_sequences.sql``): probs_diff and k3 over the
    positions whose probabilities are recorded (``measured_positions``), the KL over those whose KL is
    recorded too (``kl_positions``). On the vLLM engine the KL is never recorded: the pair has
    probs_diff and k3, no ``kl`` figure, ``kl_not_measured`` says why, and a gate on ``kl`` is not
    evaluated (it says so) rather than read from another figure.

    ``intervals``: the bootstrap intervals to compute (:data:`INTERVALS`; the gate's figure's always).
    A figure left out has no ``per_position`` (``per_sequence``) key at all -- never an empty interval
    that would read as "too few sequences". The certificate shows only the KL's and the gate's."""
    import numpy as np

    want = set(intervals) | {gate_metric}

    by_pair: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in cat.named("divergence_sequences", sweep=sweep):
        by_pair[_pair_key(r, "ref_arm", "arm")].append(r)
    engines = {r["arm"]: r["engine"] for r in cat.named("certificate_arms", sweep=sweep)} if by_pair else {}
    out = []
    for key, rows in sorted(by_pair.items()):
        meas = [r for r in rows if r["measured"]]
        kl_meas = [r for r in meas if r["measured_kl"]]
        entry: dict[str, Any] = {"sweep": key[0], "ref_arm": key[1], "arm": key[2], "sequences": len(rows),
                                 "positions": sum(r["positions"] for r in rows),
                                 "measured_positions": sum(r["measured"] for r in meas),
                                 "measured_sequences": len(meas),
                                 "kl_positions": sum(r["measured_kl"] for r in kl_meas), "kl_sequences": len(kl_meas),
                                 "logprobs": logprob_semantics(engines, key[1], key[2])}
        if entry["measured_positions"] < entry["positions"]:
            entry["note"] = (f"{entry['positions'] - entry['measured_positions']} positions without probabilities "
                             "(teacher_forced units written before the columns existed, or vLLM units whose "
                             "reference generate unit recorded no teacher_forced_token_logprob)")
        if not meas:
            out.append(entry)
            continue
        figures: dict[str, Any] = {}
        counts = np.array([r["measured"] for r in meas], dtype=float)
        for name, c in (("probs_diff", "sum_abs_prob_diff"), ("k3", "sum_k3")):
            sums = np.array([r[c] for r in meas], dtype=float)
            figures[name] = {"mean_per_position": float(sums.sum() / counts.sum()),
                             "positions": entry["measured_positions"], "sequences": len(meas)}
            if name in want:
                figures[name]["per_position"] = _bootstrap(sums, counts, "position", resamples, seed)
        figures["probs_diff"]["max"] = float(max(r["max_abs_prob_diff"] for r in meas))
        if kl_meas:
            kl_counts = np.array([r["measured_kl"] for r in kl_meas], dtype=float)
            kl = np.array([r["sum_kl"] for r in kl_meas], dtype=float)
            figures["kl"] = {"mean_per_position": float(kl.sum() / kl_counts.sum()),
                             "max": float(max(r["max_kl"] for r in kl_meas)), "mean_per_sequence": float(kl.mean()),
                             "positions": entry["kl_positions"], "sequences": len(kl_meas)}
            if "kl" in want:
                figures["kl"]["per_position"] = _bootstrap(kl, kl_counts, "position", resamples, seed)
            if "kl_per_sequence" in want:
                figures["kl"]["per_sequence"] = _bootstrap(kl, kl_counts, "sequence", resamples, seed)
            if entry["kl_positions"] < entry["measured_positions"]:
                entry["kl_note"] = (f"mismatch KL over {entry['kl_positions']} positions ({len(kl_meas)} sequences); "
                                    f"probs_diff and k3 over {entry['measured_positions']} ({len(meas)} sequences)")
        else:
            entry["kl_not_measured"] = KL_NOT_MEASURED
        entry.update(figures)
        entry["bootstrap"] = {"method": "percentile bootstrap (scipy.stats.bootstrap), resampling reference "
                                        "sequences (not positions)", "level": LEVEL, "resamples": resamples,
                              "seed": seed, "sequences": len(meas)}
        gate: dict[str, Any] = {"metric": gate_metric, "figure": GATE_FIGURES[gate_metric],
                                "what": GATE_METRICS[gate_metric][1], "threshold": threshold,
                                "rule": "|mean| + 2 SE < threshold, SE: bootstrap standard error over reference "
                                        "sequences"}
        g = figures.get(gate_metric)
        if g is None:
            gate.update(mean=None, se=None, bound=None, passed=None, positions=0, sequences=0,
                        note=f"not evaluated: the {GATE_FIGURES[gate_metric]} is not measured on vLLM arms (why: the "
                             "pair's kl_not_measured); --gate-metric k3 or probs_diff gates on what these positions "
                             "measure")
        else:
            mean, se = g["mean_per_position"], g["per_position"]["se"]
            bound = None if se is None else abs(mean) + 2 * se
            gate.update(mean=mean, se=se, bound=bound, passed=None if bound is None else bool(bound < threshold),
                        positions=g["positions"], sequences=g["sequences"])
        entry["gate"] = gate
        out.append(entry)
    return out


# --- flips by p_ref ------------------------------------------------------------------------------------------------

def flip_buckets(cat: Catalog, sweep: str, *, every_bucket: bool = True) -> list[dict[str, Any]]:
    """Per teacher-forced pair: flips / positions per bucket of the reference token's probability under
    the reference arm, each with its Clopper-Pearson interval, plus the 0.1-0.9 range and the rest
    (``every_bucket=False``: the 0.1-0.9 range alone, as the certificate shows it)."""
    by_pair: dict[tuple[str, str, str], dict[float, tuple[int, int]]] = defaultdict(dict)
    for r in cat.named("divergence_prob_buckets", sweep=sweep):
        by_pair[_pair_key(r, "ref_arm", "arm")][float(r["bucket_low"])] = (r["flips"], r["positions"])
    out = []
    for key, got in sorted(by_pair.items()):
        mid = [got.get(low, (0, 0)) for low in (0.1, 0.5)]
        row: dict[str, Any] = {
            "sweep": key[0], "ref_arm": key[1], "arm": key[2],
            "middle": dict(clopper_pearson(sum(f for f, _ in mid), sum(n for _, n in mid)), bucket="[0.1, 0.9)")}
        if every_bucket:
            rest = [got.get(low, (0, 0)) for low in (0.0, 0.9)]
            row["buckets"] = [dict(clopper_pearson(*got.get(low, (0, 0))), bucket=label) for low, label in BUCKETS.items()]
            row["outside"] = dict(clopper_pearson(sum(f for f, _ in rest), sum(n for _, n in rest)),
                                  bucket="[0, 0.1) and [0.9, 1]")
        out.append(row)
    return out


def divergence(cat: Catalog, sweep: str, *, gate_metric: str = "kl", threshold: float = 0.015, resamples: int = 2000,
               seed: int = 0, margins: bool = True, intervals: Collection[str] = INTERVALS,
               every_bucket: bool = True) -> dict[str, Any]:
    """The whole report for one sweep (JSON of ``report divergence``); ``margins=False`` leaves out the
    margins at the first divergence, ``intervals`` and ``every_bucket`` are :func:`distribution`'s and
    :func:`flip_buckets`'."""
    return {"sweep": sweep, "first_divergence": first_divergence(cat, sweep, margins=margins),
            "total_agreement": total_agreement(cat, sweep),
            "distribution": distribution(cat, sweep, gate_metric=gate_metric, threshold=threshold, resamples=resamples,
                                         seed=seed, intervals=intervals),
            "flip_buckets": flip_buckets(cat, sweep, every_bucket=every_bucket)}


def for_certificate(cat: Catalog, sweep: str) -> dict[str, Any]:
    """What :func:`pair_figures` reads, computed alone: :func:`divergence` without the margins at the
    first divergence, the intervals of probs_diff, k3 and the per-sequence KL, and the flip buckets
    other than 0.1-0.9 -- the same numbers for what it keeps (tests/test_divergence.py), at a quarter of
    the bootstrap work (issue #25: the certificate computed 56 bootstraps at 10M rows to show 14)."""
    return divergence(cat, sweep, margins=False, intervals=("kl",), every_bucket=False)


def pair_figures(rep: dict[str, Any], arm_a: str, arm_b: str) -> dict[str, Any]:
    """What a certificate shows of one arm pair (either order) from ``divergence``'s object: the first
    divergence (sequences, diverged, Kaplan-Meier median), TARr over all 2N runs, and per teacher-forced
    direction probs_diff, k3 KL, mismatch KL with its interval, the gate and the 0.1-0.9 flip rate."""
    pair = {arm_a, arm_b}
    first = next((p for p in rep["first_divergence"] if {p["arm_a"], p["arm_b"]} == pair), None)
    tarr = next((p for p in rep["total_agreement"]["pairs"] if {p["arm_a"], p["arm_b"]} == pair), None)
    middle = {(p["ref_arm"], p["arm"]): p["middle"] for p in rep["flip_buckets"]}
    teacher = []
    for p in rep["distribution"]:
        if {p["ref_arm"], p["arm"]} != pair or "probs_diff" not in p:
            continue
        kl = p.get("kl")  # None on vLLM: kl_note says why (never another figure in its place)
        teacher.append({"ref_arm": p["ref_arm"], "arm": p["arm"], "positions": p["measured_positions"],
                        "probs_diff_mean": p["probs_diff"]["mean_per_position"], "probs_diff_max": p["probs_diff"]["max"],
                        "k3_mean": p["k3"]["mean_per_position"], "kl_mean": None if kl is None else kl["mean_per_position"],
                        "kl_ci": None if kl is None else kl["per_position"]["interval"],
                        # what the interval rests on: a bootstrap over this many reference sequences
                        "kl_sequences": None if kl is None else kl["sequences"],
                        "kl_positions": p["kl_positions"], "kl_note": p.get("kl_not_measured") or p.get("kl_note"),
                        "gate": p["gate"], "flips_p_ref_0.1_0.9": middle.get((p["ref_arm"], p["arm"]))})
    ans = rep["total_agreement"]["answers"]
    answers = None if not ans["recorded"] else {
        "arms": {a["arm"]: {"accuracy": a["accuracy"], "tara": a["tara"]} for a in ans["arms"] if a["arm"] in pair},
        "tara_2n": next((p["tara"] for p in ans["pairs"] if {p["arm_a"], p["arm_b"]} == pair), None),
        "accuracy_change": next((c for c in ans.get("changes", []) if {c["arm_a"], c["arm_b"]} == pair), None)}
    return {"answers": answers, "first_divergence": None if first is None else {
                "sequences": first["sequences"], "diverged": first["diverged"],
                "km_median": first["survival"]["quantiles"].get("0.5"),
                "diverged_median": None if first["diverged_positions"] is None else first["diverged_positions"]["median"]},
            "tarr_2n": None if tarr is None else tarr["tarr"], "teacher_forced": teacher}
