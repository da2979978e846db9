"""What every experiment says about swapping one kernel for another: one line per kernel pair.

Each cell is derived from the one definition of its fact: K-depth from ``kdepth_summary`` (summed over
K and seeds by ``reports.kdepth.pair_totals``: the largest distance is the true ``max_spacing``, as in
``report kdepth``), replay from ``replay_by_type``, end to end from ``cross_arm`` (arms of one
sweep under the same scales with different configured kernels), and the kernels' check verdicts from
``check_verdicts`` (the worst verdict over trials and shapes, also a nightly metric).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reports import kdepth, replay

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["VERDICT_ORDER", "check_rows", "check_verdicts", "conformance", "worst_verdict"]

#: Verdicts from most to least benign (tasks/verdicts.py): several trials end in the worst one.
VERDICT_ORDER = ["IDENTICAL", "EPILOGUE_ROUNDING", "WITHIN_ALGORITHM_BOUND", "DIFFERENT", "INCORRECT",
                 "INCONCLUSIVE", "ERROR"]


def worst_verdict(verdicts: list[str]) -> str:
    return max(verdicts, key=lambda v: VERDICT_ORDER.index(v) if v in VERDICT_ORDER else len(VERDICT_ORDER))


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


def check_rows(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """Worst check verdict per (sweep, kernel, check, output format): the table people read."""
    return [{"sweep": r["sweep"], "kernel": r["kernel"], "check": r["check"], "output": r["dtype"],
             "verdict": r["verdict"]} for r in check_verdicts(cat, sweep)]


def conformance(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """One line per kernel pair: what every experiment says about swapping one for the other."""
    out: dict[tuple[str, str], dict[str, Any]] = {}

    def line(a: str, b: str) -> dict[str, Any]:
        return out.setdefault((a, b), {"pair": f"{a} vs {b}", "kdepth": "", "replay": "", "end to end": ""})

    pairs = [r for r in kdepth.summary(cat, sweep) if r["comparison"] == "pair"]
    for t in kdepth.pair_totals(pairs):
        cell = line(t["impl_a"], t["impl_b"])
        d, e = t["differing"], t["elements"]
        verdict = "identical" if d == 0 else f"{1e6 * d / e:.3g} ppm differ, max {t['max_spacing']} sp"
        cell["kdepth"] += f"{t['dtype']}/{t['scale_mode']}: {verdict}; "
    layers = [r for r in replay.by_type(cat, sweep) if r["comparison"] == "pair"]
    for t in replay.pair_totals(layers, keys=("impl_a", "impl_b", "scale_mode")):
        line(t["impl_a"], t["impl_b"])["replay"] += (
            f"{t['scale_mode']}: {t['identical_layers']}/{t['layers']} layers identical (max {t['max_spacing']} sp); ")
    e2e: dict[tuple[str, str, str], list[int]] = {}
    for r in cat.named("cross_arm", sweep=sweep):
        if not r["same_scales"] or r["kernel_a"] is None or r["kernel_b"] is None or r["kernel_a"] == r["kernel_b"]:
            continue
        a, b = sorted((r["kernel_a"], r["kernel_b"]))
        k_n = e2e.setdefault((a, b, r["scales_a"] or ""), [0, 0])
        k_n[0] += r["identical"]
        k_n[1] += r["total"]
    for (a, b, scales), (k, n) in sorted(e2e.items()):
        line(a, b)["end to end"] += f"{scales}: {k}/{n} sequences identical; "
    return [{k: v.rstrip("; ") for k, v in d.items()} for d in out.values()]
