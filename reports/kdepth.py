"""K-depth results: the per-(pair, scale mode, K) table and the per-pair totals derived from it.

Every K-depth number of every report comes from ONE named query, ``kdepth_summary``
(``storage/queries/kdepth_summary.sql``: summed over seeds, one row per sweep, dtype, pair, scale
mode and K). :func:`pair_totals` sums it over K (and seeds) per kernel pair, so ``report
conformance``, the HTML curves and the nightly metrics show the same ``max_spacing_significant``
(the normal-range max spacing, THE max spacing of every report), near-zero outputs beyond it
(``near_zero_*``) and raw ``max_spacing`` as ``report kdepth`` (reports/spacing.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from reports import spacing

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["curves", "human_row", "pair_totals", "summary", "tables", "wide_rows"]

#: The per-pair grouping of ``pair_totals`` by default.
PAIR_KEYS = ("dtype", "impl_a", "impl_b", "scale_mode")


def summary(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """``kdepth_summary``: one row per (sweep, dtype, pair, scale mode, K), summed over seeds."""
    return cat.named("kdepth_summary", sweep=sweep)


def _key(values: Iterable[Any]) -> tuple[tuple[bool, Any], ...]:
    """A sort key of group values (None last, as DuckDB orders NULLs)."""
    return tuple((v is None, 0 if v is None else v) for v in values)


def pair_totals(rows: Iterable[dict[str, Any]], keys: Sequence[str] = PAIR_KEYS) -> list[dict[str, Any]]:
    """``kdepth_summary`` rows summed over K (and whatever else is not in ``keys``), sorted by ``keys``.

    Each total carries ``keys``, ``elements`` and ``differing`` (sums), and the spacing fields of
    :func:`reports.spacing.add`: ``max_spacing`` (raw), ``max_spacing_significant`` (normal range),
    ``near_zero_beyond`` (summed), ``near_zero_max_spacing``, ``near_zero_worst_abs_error``, ``max_abs_error``.
    """
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(r[c] for c in keys)
        t = out.setdefault(k, {**{c: r[c] for c in keys}, "elements": 0, "differing": 0, **spacing.empty()})
        t["elements"] += r["elements"] or 0
        t["differing"] += r["differing"] or 0
        spacing.add(t, r)
    return [spacing.public(out[k]) for k in sorted(out, key=_key)]


def curves(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The K-depth curves: fraction of differing outputs per (dtype, pair, scale mode, K)."""
    return [{**t, "frac": t["differing"] / t["elements"] if t["elements"] else None}
            for t in pair_totals(rows, keys=(*PAIR_KEYS, "k"))]


def human_row(r: dict[str, Any]) -> dict[str, Any]:
    """The K-depth table as people read it: one line per pair, scale mode and K."""
    return {
        "pair": f"{r['impl_a']} vs {r['impl_b']}",
        "scales": r["scale_mode"],
        "K": r["k"],
        "outputs": r["elements"],
        "differing": r["differing"],
        "ppm": r["ppm"],
        spacing.NORMAL: r["max_spacing_significant"],
        spacing.NEAR_ZERO: spacing.near_zero_cell(r),
        spacing.RAW: r["max_spacing"],
        "1 / 2 / >2 sp": f"{r['hist_1']} / {r['hist_2']} / {r['hist_gt2']}",
    }


def wide_rows(grp: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per pair and scale mode, one column per K, each cell ``ppm · normal-range max spacing``,
    ``(+n near zero)`` where n near-zero outputs lie farther apart."""
    ks = sorted({r["k"] for r in grp})
    lines: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in grp:
        line = lines.setdefault((r["impl_a"], r["impl_b"], r["scale_mode"]), {
            "pair": f"{r['impl_a']} vs {r['impl_b']}", "scales": r["scale_mode"], **{f"K={k}": "" for k in ks}})
        nz = r.get("near_zero_beyond")
        line[f"K={r['k']}"] = (f"{r['ppm']:.3g} · {r['max_spacing_significant']}"
                               + (f" (+{spacing.near_zero_count(r)} near zero)" if nz else ""))
    return list(lines.values())


def tables(rows: list[dict[str, Any]], long: bool = False) -> list[tuple[str, list[dict[str, Any]]]]:
    """The terminal tables of ``report kdepth``: one per (sweep, dtype, out dtype, comparison)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        r = {**r, "ppm": round(1e6 * r["differing"] / r["elements"], 3) if r["elements"] else 0.0}
        groups.setdefault((r["sweep"], r["dtype"], r["out_dtype"], r["comparison"]), []).append(r)
    out = []
    for (sw, dtype, out_dtype, comparison), grp in groups.items():
        what = "pairs of implementations" if comparison == "pair" else "each implementation vs the reference"
        seeds = max(r["seeds"] for r in grp)
        title = f"{sw}: {dtype} -> {out_dtype}, {what} ({seeds} seeds summed)"
        if long:
            out.append((title, [human_row(r) for r in grp]))
        else:
            out.append((title + " — cells: ppm differing · max spacings in the normal range (outputs >= 5% of "
                        "the largest; +n near-zero outputs farther apart)", wide_rows(grp)))
    return out
