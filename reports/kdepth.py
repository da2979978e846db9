"""K-depth results: the per-(pair, scale mode, K) table and the per-pair totals derived from it.

Every K-depth number of every report comes from ONE named query, ``kdepth_summary``
(``storage/queries/kdepth_summary.sql``: summed over seeds, one row per sweep, dtype, pair, scale
mode and K). :func:`pair_totals` sums it over K (and seeds) per kernel pair, so ``report
conformance``, the HTML curves and the nightly metrics show the same ``max_spacing`` (the true
largest distance in output spacings) and ``max_spacing_significant`` as ``report kdepth``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

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

    Each total carries ``keys``, ``elements`` and ``differing`` (sums), ``max_spacing`` and
    ``max_spacing_significant`` (maxima).
    """
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(r[c] for c in keys)
        t = out.setdefault(k, {**{c: r[c] for c in keys}, "elements": 0, "differing": 0,
                               "max_spacing": None, "max_spacing_significant": None})
        t["elements"] += r["elements"] or 0
        t["differing"] += r["differing"] or 0
        for m in ("max_spacing", "max_spacing_significant"):
            if r[m] is not None and (t[m] is None or r[m] > t[m]):
                t[m] = r[m]
    return [out[k] for k in sorted(out, key=_key)]


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
        "max sp": r["max_spacing"],
        "max sp >5%": r["max_spacing_significant"],
        "1 / 2 / >2 sp": f"{r['hist_1']} / {r['hist_2']} / {r['hist_gt2']}",
    }


def wide_rows(grp: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per pair and scale mode, one column per K, each cell ``ppm · max spacing``."""
    ks = sorted({r["k"] for r in grp})
    lines: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in grp:
        line = lines.setdefault((r["impl_a"], r["impl_b"], r["scale_mode"]), {
            "pair": f"{r['impl_a']} vs {r['impl_b']}", "scales": r["scale_mode"], **{f"K={k}": "" for k in ks}})
        line[f"K={r['k']}"] = f"{r['ppm']:.3g} · {r['max_spacing']}"
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
            out.append((title + " — cells: ppm differing · max spacings", wide_rows(grp)))
    return out
