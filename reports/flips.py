"""The tables and summary lines of ``report flips`` (the flip-risk report of ``reports.fliprisk``).

Everything here takes one pair's object (an element of ``flip_report(...)["pairs"]``), except
``pair_table`` and ``calibration_rows``, which list every pair, one row per pair (or per pair and
bin): nothing is pooled across pairs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["calibration_rows", "calibration_table", "concentration_table", "pair_table", "pair_title",
           "summary_lines"]


def pair_title(p: dict[str, Any]) -> str:
    return f"{p['ref_arm']} -> {p['arm']} (sweep {p['sweep']})"


def _interval(ci: list[float] | None, digits: int = 3) -> str:
    return "" if ci is None else f"{ci[0]:.{digits}g} - {ci[1]:.{digits}g}"


def calibration_table(p: dict[str, Any]) -> list[dict[str, Any]]:
    """One pair's calibration bins; the observed interval is Wilson's, of flips over positions."""
    level = p["calibration_ci"]["level"]
    return [{"bin": r["bin"], "positions": r["positions"], "flips": r["flips"],
             "observed": r["observed_rate"],
             f"observed {level:.0%} (Wilson)": _interval(r["observed_ci"]),
             "predicted": r["predicted_rate"]} for r in p["calibration"]]


def calibration_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pair's calibration bins, each row naming its pair (the CSV of ``report flips``)."""
    return [{"sweep": p["sweep"], "ref_arm": p["ref_arm"], "arm": p["arm"], **row}
            for p in rep["pairs"] for row in calibration_table(p)]


def _rate_line(p: dict[str, Any]) -> str:
    rc = p["rate_ci"]
    if not p["positions"]:
        return "0 positions"
    return (f"{p['flips']} flips in {p['positions']} positions: rate {p['flip_rate']:.4g}, "
            f"{rc['level']:.0%} CI {_interval(rc['interval'])} (exact Clopper-Pearson, unit: positions, "
            f"{p['flips']}/{p['positions']})")


def _units(ci: dict[str, Any]) -> str:
    """What the bootstrap resampled, with its count where known: ``2,400 sequences`` or ``positions``."""
    return f"{ci['sequences']:,} sequences" if ci.get("sequences") else f"{ci['unit']}s"


def _auc_line(p: dict[str, Any]) -> str:
    if p["auc"] is None:
        return "ROC-AUC of -margin: undefined"
    txt = f"ROC-AUC of -margin: {p['auc']:.4f}"
    ci = p["ci"]
    if p["auc_ci"]:
        return txt + (f" ({ci['level']:.0%} CI {p['auc_ci'][0]:.4f} - {p['auc_ci'][1]:.4f}, {ci['method']}, "
                      f"{ci['used']} of {ci['resamples']} resamples of {_units(ci)}, seed {ci['seed']})")
    return txt + " (no interval: see the note)"


def summary_lines(p: dict[str, Any]) -> list[str]:
    """One pair: rate and its exact interval, AUC, the logistic model, where 90% of flips lie, power,
    the notes."""
    lines = [_rate_line(p), _auc_line(p)]
    if p["model"]:
        m = p["model"]
        lines.append(f"logistic model: P(flip) = 1 / (1 + exp(-({m['intercept']:.4g} + {m['slope']:.4g} * "
                     f"log10(margin + {m['eps']:g}))))")
    if p["concentration_margin"] is not None:
        c = next(c for c in p["concentration"] if c["flip_share"] == 0.9)
        lines.append(f"90% of flips at margin <= {c['margin']:.4g}, where {100 * c['share_of_positions']:.3g}% "
                     f"of positions lie (flip rate there {c['flip_rate_at_or_below']:.3g}, "
                     f"{c['enrichment']:.3g}x the pair's rate)")
    if p["power"]:
        lines.append(f"power: {p['power']['note']}")
    lines += [f"note: {note}" for note in p["notes"]]
    return lines


def pair_table(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per pair: counts, rate with its exact interval, AUC with its interval or why not."""
    rows = []
    for p in rep["pairs"]:
        rc = p["rate_ci"]
        rate_ci = _interval(rc["interval"]) if p["flips"] else (
            f"< {rc['upper_one_sided']:.3g} (one-sided)" if rc["upper_one_sided"] is not None else "")
        auc_ci = f"{p['ci']['level']:.0%} CI {_interval(p['auc_ci'], 4)}" if p["auc_ci"] else ""
        if p["auc_ci_note"]:
            few = p["flips"] < p["ci"]["min_flips"]
            auc_ci = f"none: too few {'flips' if few else 'unflipped'} ({p['flips'] if few else p['positions'] - p['flips']})"
        rows.append({"sweep": p["sweep"], "ref arm": p["ref_arm"], "arm": p["arm"], "positions": p["positions"],
                     "flips": p["flips"], "rate": p["flip_rate"], f"rate {rc['level']:.0%} (exact)": rate_ci,
                     "AUC": "undefined" if p["auc"] is None else f"{p['auc']:.4f}",
                     "AUC interval": auc_ci,
                     "90% flips below": p["concentration_margin"]})
    return rows


def concentration_table(p: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"flips": f"{100 * c['flip_share']:g}%", "margin <=": c["margin"],
             "positions there": f"{100 * c['share_of_positions']:.3g}%",
             "flip rate there": c["flip_rate_at_or_below"], "flip rate above": c["flip_rate_above"],
             "enrichment": c["enrichment"]} for c in p["concentration"]]
