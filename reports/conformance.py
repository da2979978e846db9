"""What every experiment says about swapping one kernel for another: the matrix view of the certificates.

``report conformance`` is one row per (sweep, kernel pair, scale mode) of ``reports.certificate``:
the section's verdict and its numbers (K-depth ppm with its exact interval, the normal-range max
spacing with the near-zero outputs beyond it and the raw max, each beyond the reference's own error
(reports/spacing.py), the K-trend slope and interval, replay layers identical, sequences
identical), beside the certificate's one-line answer. The check verdicts (``check_verdicts``, the
worst verdict over trials and shapes, also a nightly metric) are defined in ``reports.certificate``
and re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reports import arbiter, spacing
from reports.certificate import (
    VERDICT_ORDER,
    certificates,
    check_verdicts,
    matrix_rows,
    worst_verdict,
)

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["VERDICT_ORDER", "check_rows", "check_verdicts", "conformance", "worst_verdict"]


def check_rows(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """Worst check verdict per (sweep, kernel, check, output format): the table people read."""
    return [{"sweep": r["sweep"], "kernel": r["kernel"], "check": r["check"], "output": r["dtype"],
             "verdict": r["verdict"]} for r in check_verdicts(cat, sweep)]


def conformance(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """One row per (sweep, kernel pair, scale mode): the certificates' matrix (``matrix_rows``)."""
    return matrix_rows(certificates(cat, sweep))


def _unprefix(r: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A matrix row's ``<prefix>*`` cells under their section names (``kdepth_max_spacing`` -> ``max_spacing``)."""
    return {k[len(prefix):]: v for k, v in r.items() if k.startswith(prefix)}


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The matrix for a terminal: one short line per (pair, scale mode); JSON and CSV keep every number."""
    def count(k: Any, n: Any, what: str) -> str:
        return "not run" if n is None else f"{k}/{n} {what}"

    out = []
    for r in rows:
        ran = r["kdepth_elements"] is not None
        slope = r["k_trend_slope"]
        trend = ("not run" if not ran else "identical at every K" if r["kdepth_differing"] == 0
                 else "one K only" if slope is None and r["k_trend_slope_ci_low"] is None
                 else f"K^{slope:.2g} [{r['k_trend_slope_ci_low']:.2g}, {r['k_trend_slope_ci_high']:.2g}]"
                 if slope is not None and r["k_trend_slope_ci_low"] is not None and r["k_trend_slope_ci_high"] is not None
                 else f"K^{slope:.2g}" if slope is not None else "grows (slope unbounded above)")
        lo, hi = r["k_trend_slope_ci_low"], r["k_trend_slope_ci_high"]
        if ran and lo is not None and hi is not None and lo <= 0 <= hi:
            trend += ": no clear trend"
        if ran and r.get("k_trend_dispersion") is not None:  # quasi-likelihood interval (certificate.k_trend)
            trend += f" (dispersion {r['k_trend_dispersion']:.3g}, {r['k_trend_cells']} K x seed cells)"
        out.append({
            "pair": f"{r['kernel_a']} vs {r['kernel_b']}", "scales": r["scale_mode"] or "", "verdict": r["verdict"],
            "K-depth ppm": f"{r['kdepth_ppm']:.3g}" if ran else "not run",
            spacing.NORMAL: spacing.normal_cell(_unprefix(r, "kdepth_")) if ran else "not run",
            spacing.RAW: r["kdepth_max_spacing"] if ran else "not run",
            "K-trend (slope, 95%)": trend,
            "replay": count(r["replay_identical_layers"], r["replay_layers"], "layers identical"),
            "end to end": count(r["e2e_identical"], r["e2e_total"], "sequences identical"),
            arbiter.COLUMN: arbiter.matrix_cell(r),
        })
    if len({r["sweep"] for r in rows}) > 1:
        for line, r in zip(out, rows, strict=True):
            line["sweep"] = r["sweep"]
    return out
