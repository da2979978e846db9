"""Per-layer replay results: the tables of ``report replay`` and per-pair totals.

Every replay number comes from the named queries ``replay_by_layer`` (one row per layer) and
``replay_by_type`` (per layer type: ``identical_layers`` of ``layers``); :func:`pair_totals` sums the
latter over layer types for ``report conformance`` and the nightly metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from reports import spacing

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["by_layer", "by_type", "layer_table", "pair_totals", "type_table"]


def by_layer(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    return cat.named("replay_by_layer", sweep=sweep)


def by_type(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    return cat.named("replay_by_type", sweep=sweep)


def _acc(v: bool | None) -> str:
    return "" if v is None else ("yes" if v else "NO")


def type_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"pair": f"{r['impl_a']} vs {r['impl_b']}", "scales": r["scale_mode"], "type": r["layer_type"],
             "identical": f"{r['identical_layers']}/{r['layers']} layers", "outputs": r["elements"],
             "differing": r["differing"], "ppm": round(1e6 * r["frac_differing"], 3),
             spacing.NORMAL: r.get("max_spacing_significant"), spacing.NEAR_ZERO: spacing.near_zero_cell(r),
             spacing.RAW: r["max_spacing"], "acc equal": _acc(r["accumulators_equal"])}
            for r in rows]


def layer_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"pair": f"{r['impl_a']} vs {r['impl_b']}", "scales": r["scale_mode"], "layer": r["layer"],
             "outputs": r["elements"], "differing": r["differing"], spacing.NORMAL: r.get("max_spacing_significant"),
             spacing.NEAR_ZERO: spacing.near_zero_cell(r), spacing.RAW: r["max_spacing"],
             "identical": "yes" if r["bitwise_equal"] else "no", "acc equal": _acc(r["accumulators_equal"])}
            for r in rows]


def pair_totals(rows: Iterable[dict[str, Any]],
                keys: Sequence[str] = ("comparison", "impl_a", "impl_b", "scale_mode")) -> list[dict[str, Any]]:
    """``replay_by_type`` rows summed over layer types: layers, identical_layers, elements, differing,
    the spacing fields of :func:`reports.spacing.add` (``max_spacing`` raw, ``max_spacing_significant``
    the normal-range max, ``near_zero_*``) and accumulators_equal (False if any layer type's is
    False), sorted by ``keys``."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(r[c] for c in keys)
        t = out.setdefault(k, {**{c: r[c] for c in keys}, "layers": 0, "identical_layers": 0, "elements": 0,
                               "differing": 0, **spacing.empty(), "accumulators_equal": True})
        for c in ("layers", "identical_layers", "elements", "differing"):
            t[c] += r[c] or 0
        spacing.add(t, r)
        if r["accumulators_equal"] is False:
            t["accumulators_equal"] = False
    return [spacing.public(out[k]) for k in sorted(out, key=lambda k: tuple((v is None, 0 if v is None else v) for v in k))]
