"""The human tables of ``report divergence`` (and its ``report all`` section) from
``reports.divergence.divergence``'s object: one row per arm pair (or per pair and bucket / position),
each interval beside its method, unit and counts."""

from __future__ import annotations

from typing import Any

from reports.divergence import CHANGE_METHOD, CURVE_AT

__all__ = ["machine_rows", "tables"]


def _g(v: float | None, spec: str = ".4g") -> str:
    return "" if v is None else format(v, spec)


def _ci(ci: list[float] | None, spec: str = ".3g") -> str:
    return "" if ci is None else f"[{ci[0]:{spec}}, {ci[1]:{spec}}]"


def _rate(r: dict[str, Any] | None) -> str:
    if r is None or not r["n"]:
        return ""
    return f"{r['k']}/{r['n']} = {r['rate']:.3g} {_ci(r['interval'])}"


def _pair(r: dict[str, Any]) -> str:
    return f"{r['arm_a']} vs {r['arm_b']}" if "arm_a" in r else f"{r['ref_arm']} -> {r['arm']}"


def first_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in rep["first_divergence"]:
        q, d = p["survival"]["quantiles"], p["diverged_positions"]
        out.append({"pair": _pair(p), "sequences": p["sequences"], "diverged": p["diverged"],
                    "identical to the end": p["identical"],
                    "KM q25 / median / q75": " / ".join("not reached" if q.get(k) is None else str(q[k])
                                                        for k in ("0.25", "0.5", "0.75")) if q else "",
                    "diverged: min / median / max": "" if d is None else f"{d['min']} / {d['median']:g} / {d['max']}"})
    return out


def survival_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in rep["first_divergence"]:
        curve, last = p["survival"]["curve"], p["last_position"]
        for t in sorted({x for x in CURVE_AT if x < last} | {last}):
            past = [c for c in curve if c["t"] <= t]
            s, lo, hi = (past[-1]["survival"], past[-1]["low"], past[-1]["high"]) if past else (1.0, None, None)
            out.append({"pair": _pair(p), "t": t, "identical through t": f"{s:.3f}",
                        "95% (Greenwood, log-log)": "" if lo is None or hi is None else f"[{lo:.3f}, {hi:.3f}]"})
    return out


def margin_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in rep["first_divergence"]:
        for m in p["margins"].values():
            out.append({"pair": _pair(p), "arm": m["arm"], "at divergence (n)": m["at_divergence"],
                        "median margin at divergence": _g(m["median_at_divergence"]),
                        "identical-prefix positions": m["prefix_positions"],
                        "median margin there": _g(m["median_prefix"]),
                        "P(div < prefix)": _g(m["p_lower"], ".3f"),
                        "prefix share <= div median": _g(m.get("prefix_share_at_or_below_median"), ".3f")})
    return out


def tarr_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    ta = rep["total_agreement"]
    rows = [{"arm(s)": a["arm"], "N": a["restarts"], "prompts": a["prompts"],
             "TARr@N [95% exact]": _rate(a["tarr"]) or a["note"],
             "distinct/prompt median / max": f"{_g(a['distinct']['median'], 'g')} / {a['distinct']['max']}",
             "distinct in all": f"{a['distinct']['total']} of {a['distinct']['completions']} completions"}
            for a in ta["arms"]]
    rows += [{"arm(s)": f"{p['arm_a']} + {p['arm_b']} (all 2N)", "N": f"{p['restarts_a']}+{p['restarts_b']}",
              "prompts": p["prompts"], "TARr@N [95% exact]": _rate(p["tarr"]),
              "distinct/prompt median / max": f"{_g(p['distinct']['median'], 'g')} / {p['distinct']['max']}",
              "distinct in all": f"{p['distinct']['total']} of {p['distinct']['completions']} completions"}
             for p in ta["pairs"]]
    return rows


def tarr_lines(rep: dict[str, Any]) -> list[str]:
    ans = rep["total_agreement"]["answers"]
    lines = ["TARr@N: prompts whose N cold-restart completions are identical token for token / prompts; interval: "
             "Clopper-Pearson (exact, scipy.stats.binomtest), unit: prompts"]
    if not ans["recorded"]:
        return [*lines, f"TARa@N: {ans['note']}"]
    lines += [f"{a['arm']}: accuracy {_rate(a['accuracy'])}; TARa@{a['restarts']} {_rate(a['tara'])}"
              for a in ans["arms"]]
    lines += [f"{p['arm_a']} + {p['arm_b']}: TARa over all runs of both {_rate(p['tara'])}" for p in ans["pairs"]]
    return [*lines, ans["note"]]


def change_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """The accuracy change per kernel swap: one row per arm pair of one experiment (restart 0, paired)."""
    ans = rep["total_agreement"]["answers"]
    out = []
    for c in ans.get("changes", []) if ans["recorded"] else []:
        d = c["discordant"]
        ci = c["conditional_interval"]
        out.append({"pair": f"{c['arm_a']} -> {c['arm_b']}", "experiment": c["experiment"], "n": c["n"],
                    "a_only": c["a_only"], "b_only": c["b_only"], "answers differ": c["answers_differ"],
                    "change (b_only - a_only)/n": _g(c["change"], "+.4g") if c["change"] else _g(c["change"], "g"),
                    "McNemar exact p": _g(c["mcnemar_p"], ".3g"),
                    "|change| 95% upper bound (CP)": "" if c["abs_change_bound"] is None else
                    f"{c['abs_change_bound']:.3g} ({d['k']}/{d['n']} discordant)",
                    "conditional 95%": "" if ci is None else f"[{ci[0]:+.3g}, {ci[1]:+.3g}]"})
    return out


def change_lines(rep: dict[str, Any]) -> list[str]:
    ans = rep["total_agreement"]["answers"]
    if not ans["recorded"]:
        return []
    lines = [f"{c['arm_a']} -> {c['arm_b']}: {c['note']}" for c in ans.get("changes", []) if c.get("note")]
    lines += [f"skipped {s['arm_a']} vs {s['arm_b']}: {s['reason']}" for s in ans.get("changes_skipped", [])]
    return [*lines, CHANGE_METHOD]


DIST_COLUMNS = ("probs_diff mean [95%]", "probs_diff max", "k3 KL mean [95%]", "mismatch KL / position [95%]",
                "mismatch KL / sequence [95%]", "gate")


def _gate_cell(g: dict[str, Any]) -> str:
    if g["passed"] is None:
        return g.get("note") or ""
    return (f"{'PASS' if g['passed'] else 'FAIL'}: {g['figure']} |{g['mean']:.3g}| + 2 x SE {g['se']:.2g} = "
            f"{g['bound']:.3g} {'<' if g['passed'] else '>='} {g['threshold']:g} ({g['positions']} positions)")


def distribution_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in rep["distribution"]:
        row: dict[str, Any] = {"pair": _pair(p), "sequences": p["measured_sequences"],
                               "positions": f"{p['measured_positions']} of {p['positions']}"}
        if "probs_diff" not in p:
            out.append({**row, **dict.fromkeys(DIST_COLUMNS, ""), "note": p.get("note", "")})
            continue
        kl = p.get("kl")
        unmeasured = "not measured (vLLM)"  # the reason in full: distribution_lines
        row.update({
            "probs_diff mean [95%]": f"{p['probs_diff']['mean_per_position']:.3g} {_ci(p['probs_diff']['per_position']['interval'])}",
            "probs_diff max": f"{p['probs_diff']['max']:.3g}",
            "k3 KL mean [95%]": f"{p['k3']['mean_per_position']:.3g} {_ci(p['k3']['per_position']['interval'])}",
            "mismatch KL / position [95%]": unmeasured if kl is None else
            f"{kl['mean_per_position']:.3g} {_ci(kl['per_position']['interval'])}",
            "mismatch KL / sequence [95%]": unmeasured if kl is None else
            f"{kl['mean_per_sequence']:.3g} {_ci(kl['per_sequence']['interval'])}",
            "gate": _gate_cell(p["gate"]),
            "note": "; ".join(n for n in (p.get("note"), p.get("kl_note")) if n)})
        out.append(row)
    return out


def distribution_lines(rep: dict[str, Any]) -> list[str]:
    boot = next((p["bootstrap"] for p in rep["distribution"] if "bootstrap" in p), None)
    if boot is None:
        return [p["note"] for p in rep["distribution"] if p.get("note")]
    gate = next(p["gate"] for p in rep["distribution"] if "gate" in p)
    return [f"intervals: {boot['level']:.0%} {boot['method']}, {boot['resamples']} resamples, seed {boot['seed']}; "
            "per position: sum over the resampled sequences / their positions; per sequence: mean of each sequence's "
            "summed KL; each figure over its own positions (probs_diff and k3: positions with both probabilities; "
            "mismatch KL: those with the KL too)",
            f"gate: {gate['rule']}; it reads the {gate['figure']} ({gate['metric']}): {gate['what']}",
            "k3 = r - 1 - log r, r = p_arm / p_ref of the reference token (Schulman's k3; it estimates KL(ref || arm) "
            "when the tokens are sampled from the reference: greedy tokens are not, so read k3 beside the exact KL)",
            *[f"{_pair(p)}: {p['logprobs']['line']}" for p in rep["distribution"] if p.get("logprobs")],
            *[f"{_pair(p)}: {p['note']}" for p in rep["distribution"] if p.get("note")],
            *[f"{_pair(p)}: mismatch KL {p['kl_not_measured']}" for p in rep["distribution"] if p.get("kl_not_measured")]]


def bucket_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in rep["flip_buckets"]:
        for b in [*p["buckets"], p["middle"], p["outside"]]:
            out.append({"pair": _pair(p), "p_ref bucket": b["bucket"], "positions": b["n"], "flips": b["k"],
                        "flip rate [95% exact]": _rate(b) if b["n"] else "no positions"})
    return out


def tables(rep: dict[str, Any]) -> list[tuple[str, str, list[dict[str, Any]], list[str]]]:
    """(``--table`` key, title, rows, lines) of every table of the report."""
    first_lines = ([f"method: {rep['first_divergence'][0]['survival']['method']}; unit: restart-0 sequence pairs "
                    "(one per prompt); a sequence identical to its end is right-censored at its last position"]
                   if rep["first_divergence"] else [])
    return [
        ("first", "first divergence per arm pair (restart 0; positions 0-based)", first_rows(rep), first_lines),
        ("survival", "survival: share of sequences identical through token t (Kaplan-Meier)", survival_rows(rep), []),
        ("margins", "top-1/top-2 margin at the first divergence vs where the sequences are still identical",
         margin_rows(rep), ["P(div < prefix): Mann-Whitney U / (n_div * n_prefix), scipy.stats.mannwhitneyu; "
                            "positions of one sequence are not independent: read it as a description, not a test"]),
        ("tarr", "TARr@N and distinct completions over N cold restarts (per arm, and per pair over all 2N)",
         tarr_rows(rep), tarr_lines(rep)),
        *([("tarr", "accuracy change per kernel swap (arm pairs of one experiment, paired on the same prompts, "
                    "restart 0)", change_rows(rep), change_lines(rep))]
          if rep["total_agreement"]["answers"]["recorded"] else []),
        ("distribution", "probs_diff, k3 KL and mismatch KL (teacher-forced, per (ref_arm, arm) pair)",
         distribution_rows(rep), distribution_lines(rep)),
        ("buckets", "flip rate by the reference token's probability under the reference arm", bucket_rows(rep),
         ["interval: Clopper-Pearson (exact), unit: teacher-forced positions; [0.1, 0.9) is the range where flips "
          "are reported to concentrate"]),
    ]


def _ci_cols(r: dict[str, Any] | None, prefix: str) -> dict[str, Any]:
    """``prefix_k``, ``_n``, ``_rate``, ``_ci_low``, ``_ci_high`` of a Clopper-Pearson object (None: all None)."""
    ci = (r or {}).get("interval") or (None, None)
    return {f"{prefix}_k": (r or {}).get("k"), f"{prefix}_n": (r or {}).get("n"), f"{prefix}_rate": (r or {}).get("rate"),
            f"{prefix}_ci_low": ci[0], f"{prefix}_ci_high": ci[1]}


def _boot_cols(b: dict[str, Any] | None, prefix: str) -> dict[str, Any]:
    ci = (b or {}).get("interval") or (None, None)
    return {f"{prefix}_ci_low": ci[0], f"{prefix}_ci_high": ci[1], f"{prefix}_se": (b or {}).get("se")}


def machine_rows(rep: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The rows of each ``--table`` for JSON and CSV: numbers, not formatted text (the same figures)."""
    sweep = rep["sweep"]
    first, survival, margins = [], [], []
    for p in rep["first_divergence"]:
        key = {"sweep": sweep, "arm_a": p["arm_a"], "arm_b": p["arm_b"]}
        q, d = p["survival"]["quantiles"], p["diverged_positions"] or {}
        first.append({**key, "sequences": p["sequences"], "diverged": p["diverged"], "identical": p["identical"],
                      "last_position": p["last_position"], "km_q25": q.get("0.25"), "km_median": q.get("0.5"),
                      "km_q75": q.get("0.75"), "diverged_min": d.get("min"), "diverged_median": d.get("median"),
                      "diverged_max": d.get("max")})
        survival += [{**key, **c} for c in p["survival"]["curve"]]
        margins += [{**key, **m} for m in p["margins"].values()]
    ta = rep["total_agreement"]
    tarr = [{"sweep": sweep, "arm_a": a["arm"], "arm_b": None, "restarts": a["restarts"], "prompts": a["prompts"],
             **_ci_cols(a["tarr"], "tarr"), "distinct_median": a["distinct"]["median"],
             "distinct_max": a["distinct"]["max"], "distinct_total": a["distinct"]["total"],
             "completions": a["distinct"]["completions"]} for a in ta["arms"]]
    tarr += [{"sweep": sweep, "arm_a": p["arm_a"], "arm_b": p["arm_b"], "restarts": p["restarts_a"] + p["restarts_b"],
              "prompts": p["prompts"], **_ci_cols(p["tarr"], "tarr"), "distinct_median": p["distinct"]["median"],
              "distinct_max": p["distinct"]["max"], "distinct_total": p["distinct"]["total"],
              "completions": p["distinct"]["completions"]} for p in ta["pairs"]]
    dist = []
    for p in rep["distribution"]:
        row: dict[str, Any] = {"sweep": sweep, "ref_arm": p["ref_arm"], "arm": p["arm"], "sequences": p["sequences"],
                               "positions": p["positions"], "measured_positions": p["measured_positions"]}
        has, kl = "probs_diff" in p, p.get("kl")
        row.update({"probs_diff_mean": p["probs_diff"]["mean_per_position"] if has else None,
                    **_boot_cols(p["probs_diff"]["per_position"] if has else None, "probs_diff"),
                    "probs_diff_max": p["probs_diff"]["max"] if has else None,
                    "k3_mean": p["k3"]["mean_per_position"] if has else None,
                    **_boot_cols(p["k3"]["per_position"] if has else None, "k3"),
                    "kl_positions": p["kl_positions"],
                    "kl_mean_per_position": kl["mean_per_position"] if kl else None,
                    **_boot_cols(kl["per_position"] if kl else None, "kl_per_position"),
                    "kl_mean_per_sequence": kl["mean_per_sequence"] if kl else None,
                    **_boot_cols(kl["per_sequence"] if kl else None, "kl_per_sequence"),
                    "kl_max": kl["max"] if kl else None,
                    "gate_metric": p["gate"]["metric"] if has else None, "gate_bound": p["gate"]["bound"] if has else None,
                    "gate_threshold": p["gate"]["threshold"] if has else None,
                    "gate_passed": p["gate"]["passed"] if has else None})
        dist.append(row)
    buckets = [{"sweep": sweep, "ref_arm": p["ref_arm"], "arm": p["arm"], "bucket": b["bucket"], **_ci_cols(b, "flips")}
               for p in rep["flip_buckets"] for b in [*p["buckets"], p["middle"], p["outside"]]]
    return {"first": first, "survival": survival, "margins": margins, "tarr": tarr, "distribution": dist,
            "buckets": buckets}
