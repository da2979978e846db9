"""The tables and summary lines of ``report flips`` (the flip-risk report of ``reports.fliprisk``)."""

from __future__ import annotations

from typing import Any

__all__ = ["calibration_table", "concentration_table", "pair_table", "summary_lines"]


def calibration_table(rep: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"bin": r["bin"], "positions": r["positions"], "flips": r["flips"],
             "observed": r["observed_rate"],
             "observed 95%": f"{r['observed_ci'][0]:.3g} - {r['observed_ci'][1]:.3g}",
             "predicted": r["predicted_rate"]} for r in rep["calibration"]]


def summary_lines(rep: dict[str, Any]) -> list[str]:
    """Positions, flips and AUC; the logistic model; where 90% of flips lie; the notes."""
    auc_txt = "undefined" if rep["auc"] is None else f"{rep['auc']:.4f}"
    if rep["auc_ci"]:
        auc_txt += f" (95% CI {rep['auc_ci'][0]:.4f} - {rep['auc_ci'][1]:.4f}, {rep['ci']['used']} resamples of {rep['ci']['unit']}s)"
    lines = [f"{rep['positions']} positions, {rep['flips']} flips (rate {rep['flip_rate']:.4g}); "
             f"ROC-AUC of -margin: {auc_txt}"]
    if rep["model"]:
        m = rep["model"]
        lines.append(f"logistic model: P(flip) = 1 / (1 + exp(-({m['intercept']:.4g} + {m['slope']:.4g} * "
                     f"log10(margin + {m['eps']:g}))))")
    if rep["concentration_margin"] is not None:
        c = next(c for c in rep["concentration"] if c["flip_share"] == 0.9)
        lines.append(f"90% of flips at margin <= {c['margin']:.4g}, where {100 * c['share_of_positions']:.3g}% "
                     f"of positions lie (flip rate there {c['flip_rate_at_or_below']:.3g}, "
                     f"{c['enrichment']:.3g}x the overall rate)")
    lines += [f"note: {note}" for note in rep["notes"]]
    return lines


def pair_table(rep: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"sweep": p["sweep"], "ref arm": p["ref_arm"], "arm": p["arm"], "positions": p["positions"],
             "flips": p["flips"], "rate": p["flip_rate"],
             "AUC": "undefined" if p["auc"] is None else f"{p['auc']:.4f}",
             "95% CI": f"{p['auc_ci'][0]:.4f} - {p['auc_ci'][1]:.4f}" if p["auc_ci"] else "",
             "90% flips below": p["concentration_margin"]} for p in rep["pairs"]]


def concentration_table(rep: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"flips": f"{100 * c['flip_share']:g}%", "margin <=": c["margin"],
             "positions there": f"{100 * c['share_of_positions']:.3g}%",
             "flip rate there": c["flip_rate_at_or_below"], "flip rate above": c["flip_rate_above"],
             "enrichment": c["enrichment"]} for c in rep["concentration"]]
