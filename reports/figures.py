"""The figures of the HTML report, each answering one question, drawn with matplotlib.

A :class:`Figure` carries its question (the title), a caption saying how to read it, and a
``draw`` callable that returns the PNG as a data URI; the JSON report lists figures without
drawing them. One unit everywhere: parts per million (ppm) of outputs or positions.

* K-depth: one figure per (dtype, comparison), one small panel per kernel pair, log-log, the mean
  over seeds (pooled differing / pooled outputs) with the min–max band across seeds; a rate of
  exactly zero sits on a labelled "0 = identical" baseline below the log axis instead of vanishing.
* Replay: layers in forward order (layer index, then q, k, v, o, gate, up, down) against pair and
  scale mode; exactly zero is its own colour ("bit-identical"), nonzero ppm a sequential map,
  "not run" cells hatched.
* Flip risk, per (reference arm, arm) pair: ROC with the AUC and its bootstrap interval when one
  is given, and calibration (observed rate with its Wilson interval, the logistic model's rate).

Every number comes from the named queries ``kdepth_by_seed``, ``replay_by_layer`` and
``flip_positions`` through the ``Catalog`` given.
"""

from __future__ import annotations

import base64
import functools
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reports import fliprisk, replay

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["Figure", "all_figures", "flip_figures", "kdepth_figures", "ppm_label", "replay_figures"]

#: Forward order of the projections inside one transformer block.
LAYER_TYPE_ORDER = ("q", "k", "v", "o", "gate", "up", "down")
#: Colours: one per scale mode (K-depth), zero and "not run" cells (replay).
MODE_COLOURS = {"real": "#1f5fa8", "pow2": "#d95f02"}
IDENTICAL_COLOUR = "#4dac26"
NOT_RUN_COLOUR = "#ffffff"


@dataclass
class Figure:
    """One figure: an anchor id, the question it answers, how to read it, and how to draw it."""

    id: str
    title: str
    caption: str
    section: str
    draw: Callable[[], str] = field(repr=False)

    def summary(self) -> dict[str, str]:
        return {"id": self.id, "section": self.section, "title": self.title, "caption": self.caption}


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _subplots(nrows: int, ncols: int, width: float, height: float, **kw: Any) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 9, "axes.spines.top": False,
                         "axes.spines.right": False})
    return plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kw)


def _slug(*parts: str) -> str:
    return "-".join("".join(c if c.isalnum() else "-" for c in p.lower()).strip("-") for p in parts)


def ppm_label(v: float) -> str:
    """A ppm tick: 0.1, 1, 10, 100, 1k, 10k, 100k, 1M."""
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:g}"


# -- K-depth --------------------------------------------------------------------------------------

#: Per (dtype, comparison) -> per (impl_a, impl_b) -> per (scale mode, K): pooled counts, ppm per seed.
Series = dict[tuple[str, str], dict[tuple[str, str], dict[tuple[str, int], dict[str, Any]]]]


def _kdepth_series(rows: list[dict[str, Any]]) -> Series:
    """Per (dtype, comparison) -> per pair -> per (scale mode, K): pooled counts, ppm of each seed."""
    out: Series = {}
    for r in rows:
        if not r["elements"]:
            continue
        fam = out.setdefault((r["dtype"], r["comparison"]), {})
        pair = fam.setdefault((r["impl_a"], r["impl_b"]), {})
        pt = pair.setdefault((r["scale_mode"], r["k"]), {"d": 0, "e": 0, "seeds": []})
        pt["d"] += r["differing"]
        pt["e"] += r["elements"]
        pt["seeds"].append(1e6 * r["differing"] / r["elements"])
    return out


def _pair_title(a: str, b: str, comparison: str) -> str:
    return f"{a}\nvs the exact reference" if comparison == "reference" else f"{a}\nvs {b}"


def _draw_kdepth(comparison: str, pairs: dict[tuple[str, str], dict[tuple[str, int], dict[str, Any]]]) -> str:
    names = list(pairs)
    ncols = min(4, len(names))
    nrows = math.ceil(len(names) / ncols)
    positive = [v for p in pairs.values() for pt in p.values() for v in [*pt["seeds"], 1e6 * pt["d"] / pt["e"]] if v > 0]
    top = 10 ** math.ceil(math.log10(max(positive))) if positive else 10.0
    low = 10 ** math.floor(math.log10(min(positive))) if positive else 1.0
    zero_y = low / 10  # the "0 = identical" baseline, one decade below the smallest nonzero rate
    fig, axes = _subplots(nrows, ncols, 2.7 * ncols, 2.3 * nrows + 0.5, sharex=True, sharey=True)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names, strict=False):
        pts = pairs[name]
        ax.axhspan(zero_y / 2.2, zero_y * 2.2, color=IDENTICAL_COLOUR, alpha=0.12, lw=0)
        for mode in sorted({m for m, _ in pts}, key=lambda m: (m != "real", m)):
            ks = sorted(k for m, k in pts if m == mode)
            cells = [pts[(mode, k)] for k in ks]
            mean = [1e6 * c["d"] / c["e"] for c in cells]
            lo = [min(c["seeds"]) for c in cells]
            hi = [max(c["seeds"]) for c in cells]
            seeds = max(len(c["seeds"]) for c in cells)
            colour = MODE_COLOURS.get(mode, "#555555")
            y = [v if v > 0 else zero_y for v in mean]
            ax.fill_between(ks, [v if v > 0 else zero_y for v in lo], [v if v > 0 else zero_y for v in hi],
                            color=colour, alpha=0.18, lw=0)
            ax.plot(ks, y, color=colour, lw=1.4, label=f"{mode} scales ({seeds} seeds)")
            ax.plot([k for k, v in zip(ks, mean, strict=True) if v > 0], [v for v in mean if v > 0],
                    "o", color=colour, ms=3.5)
            ax.plot([k for k, v in zip(ks, mean, strict=True) if v == 0], [zero_y for v in mean if v == 0],
                    "o", mfc="white", mec=colour, ms=4.5, mew=1.3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(zero_y / 2.2, top * 1.5)
        ax.set_title(_pair_title(name[0], name[1], comparison), fontsize=8)
        ax.grid(True, which="major", alpha=0.25)
    ticks = [zero_y] + [10.0 ** e for e in range(round(math.log10(low)), round(math.log10(top)) + 1)]
    axes[0, 0].set_yticks(ticks, ["0 identical"] + [ppm_label(t) for t in ticks[1:]])
    axes[0, 0].minorticks_off()
    for ax in axes[:, 0]:
        ax.set_ylabel("ppm of outputs differing")
    for ax in axes[-1, :]:
        ax.set_xlabel("K (reduction depth)")
    for ax in axes.flat:
        if ax.get_visible():
            ax.tick_params(labelbottom=True)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), frameon=False,
               bbox_to_anchor=(0.5, 1.0 + 0.12 / nrows))
    fig.tight_layout()
    return _png(fig)


def kdepth_figures(cat: Catalog, sweep: str | None) -> list[Figure]:
    rows = cat.named("kdepth_by_seed", sweep=sweep)
    figs = []
    for (dtype, comparison), pairs in sorted(_kdepth_series(rows).items(), key=lambda kv: (kv[0][0], kv[0][1] != "reference")):
        n_seeds = {len(pt["seeds"]) for p in pairs.values() for pt in p.values()}
        seeds = f"{min(n_seeds)}" if len(n_seeds) == 1 else f"{min(n_seeds)}–{max(n_seeds)}"
        if comparison == "reference":
            title = f"How far is each {dtype} kernel from the exact reference as K grows?"
        else:
            title = f"How often do two {dtype} kernels disagree as K grows?"
        caption = (f"One panel per kernel pair ({len(pairs)}). Line and dots: ppm of outputs differing, summed "
                   f"over the {seeds} seeds of this sweep; shaded band: lowest to highest seed. Hollow dots on the green "
                   "'0 identical' baseline: every seed bit-identical at that K. Log-log axes, shared y.")
        figs.append(Figure(_slug("kdepth", dtype, comparison), title, caption, "kdepth",
                           functools.partial(_draw_kdepth, comparison, pairs)))
    return figs


# -- replay ---------------------------------------------------------------------------------------

def _layer_key(r: dict[str, Any]) -> tuple[Any, ...]:
    t = r.get("layer_type")
    return (r["layer_index"] is None, r["layer_index"] or 0,
            LAYER_TYPE_ORDER.index(t) if t in LAYER_TYPE_ORDER else len(LAYER_TYPE_ORDER), r["layer"])


def _replay_grid(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str], dict[tuple[str, str], float]]:
    """Layers in forward order, the row labels (pair and scale mode), ppm per (layer, row)."""
    layers: dict[str, dict[str, Any]] = {}
    cells: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        if r["comparison"] == "capture":
            col = f"capture check: {r['impl_b']} replay vs captured ({r['scale_mode']})"
        else:
            col = f"{r['impl_a']} vs {r['impl_b']} ({r['scale_mode']} scales)"
        layers.setdefault(r["layer"], r)
        c = cells.setdefault((r["layer"], col), [0, 0])
        c[0] += r["differing"] or 0
        c[1] += r["elements"] or 0
    order = sorted(layers.values(), key=_layer_key)
    labels = sorted({col for _, col in cells}, key=lambda c: (c.startswith("capture"), c))
    return order, labels, {k: 1e6 * d / e for k, (d, e) in cells.items() if e}


def _draw_replay(rows: list[dict[str, Any]]) -> str:
    import numpy as np
    from matplotlib.colors import ListedColormap, LogNorm
    from matplotlib.patches import Patch, Rectangle

    order, labels, ppms = _replay_grid(rows)
    grid = np.full((len(labels), len(order)), np.nan)
    for i, lab in enumerate(labels):
        for j, layer in enumerate(order):
            if (layer["layer"], lab) in ppms:
                grid[i, j] = ppms[(layer["layer"], lab)]
    fig, axes = _subplots(1, 1, min(13.0, 3.5 + 0.3 * len(order)), 1.6 + 0.42 * len(labels))
    ax = axes[0, 0]
    ax.set_facecolor(NOT_RUN_COLOUR)
    ax.imshow(np.where(np.isnan(grid), np.nan, 0.0), aspect="auto", interpolation="nearest",
              cmap=ListedColormap([IDENTICAL_COLOUR]), vmin=0, vmax=1)
    nonzero = np.where(grid > 0, grid, np.nan)
    legend = [Patch(facecolor=IDENTICAL_COLOUR, label="0 ppm: bit-identical"),
              Patch(facecolor=NOT_RUN_COLOUR, edgecolor="#999999", hatch="///", label="not run")]
    if np.isfinite(nonzero).any():
        import matplotlib.pyplot as plt

        cmap = ListedColormap(plt.get_cmap("OrRd")(np.linspace(0.3, 1.0, 256)))
        lo, hi = np.nanmin(nonzero), np.nanmax(nonzero)
        im = ax.imshow(nonzero, aspect="auto", interpolation="nearest", cmap=cmap,
                       norm=LogNorm(vmin=lo / 1.5, vmax=hi * 1.5 if hi == lo else hi))
        from matplotlib.ticker import FuncFormatter

        fig.colorbar(im, ax=ax, fraction=0.04, pad=0.01, label="ppm of outputs differing",
                     format=FuncFormatter(lambda v, _pos: ppm_label(v)))
    for i in range(len(labels)):
        for j in range(len(order)):
            if np.isnan(grid[i, j]):
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="#999999", lw=0))
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xticks(range(len(order)), [r.get("layer_type") or r["layer"] for r in order], fontsize=7)
    blocks: dict[Any, list[int]] = {}
    for j, r in enumerate(order):
        blocks.setdefault(r["layer_index"], []).append(j)
    for idx, js in blocks.items():
        if js[0] > 0:
            ax.axvline(js[0] - 0.5, color="black", lw=1.2)
        ax.text((js[0] + js[-1]) / 2, -0.62, f"layer {idx}" if idx is not None else "other",
                ha="center", va="bottom", fontsize=8, fontweight="bold")
    ax.set_yticks(np.arange(-0.5, len(labels)), minor=True)
    ax.set_xticks(np.arange(-0.5, len(order)), minor=True)
    ax.grid(which="minor", color="white", lw=0.8)
    ax.tick_params(which="minor", length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2, frameon=False, fontsize=8)
    fig.tight_layout()
    return _png(fig)


def replay_figures(cat: Catalog, sweep: str | None) -> list[Figure]:
    rows = replay.by_layer(cat, sweep)
    if not rows:
        return []
    order, labels, ppms = _replay_grid(rows)
    zero = sum(1 for v in ppms.values() if v == 0)
    caption = (f"{len(order)} layers in forward order (per block: q, k, v, o, gate, up, down) against "
               f"{len(labels)} comparisons. Green: bit-identical ({zero} of {len(ppms)} cells); orange to red: "
               "ppm of outputs differing (log scale); hatched: not run.")
    return [Figure("replay-heatmap", "Which layers stop being bit-identical when the kernel is swapped?", caption,
                   "replay", lambda: _draw_replay(rows))]


# -- flip risk ------------------------------------------------------------------------------------

def _ci_text(res: dict[str, Any]) -> str:
    if res.get("auc_ci"):
        lo, hi = res["auc_ci"]
        return f"AUC {res['auc']:.3f} (95% CI {lo:.3f}–{hi:.3f})"
    return f"AUC {res['auc']:.3f} (no interval: {res['flips']} flips, too few)"


def _draw_flip(data: fliprisk.FlipData, res: dict[str, Any]) -> str:
    from sklearn.metrics import roc_curve

    fig, axes = _subplots(1, 2, 10.0, 3.6)
    ax1, ax2 = axes[0]
    fpr, tpr, _ = roc_curve(data.flip, -data.margin)
    ax1.plot(fpr, tpr, color="#1f5fa8", lw=1.6, label=_ci_text(res))
    ax1.plot([0, 1], [0, 1], color="grey", linestyle=":", label="chance (AUC 0.5)")
    ax1.set_xlabel("false positive rate")
    ax1.set_ylabel("true positive rate")
    ax1.set_title("ROC of -margin as a flip predictor")
    ax1.legend(loc="lower right", fontsize=8)
    table = res["calibration"]
    mids, obs, err_lo, err_hi, pred = [], [], [], [], []
    for b in table:
        lo = b["margin_lo"] or 1e-7
        hi = b["margin_hi"] if b["margin_hi"] is not None else 10 * max(lo, 1.0)
        mid = math.sqrt(max(lo, 1e-7) * hi)
        mids.append(mid)
        obs.append(1e6 * b["observed_rate"])
        ci = b.get("observed_ci") or [b["observed_rate"], b["observed_rate"]]
        err_lo.append(1e6 * ci[0])
        err_hi.append(1e6 * ci[1])
        pred.append(None if b["predicted_rate"] is None else 1e6 * b["predicted_rate"])
    positive = [v for v in [*obs, *err_lo, *(p for p in pred if p)] if v and v > 0]
    zero_y = 10 ** math.floor(math.log10(min(positive))) / 10 if positive else 1.0
    ax2.axhspan(zero_y / 2, zero_y * 2, color=IDENTICAL_COLOUR, alpha=0.12, lw=0)
    y = [v if v > 0 else zero_y for v in obs]
    ax2.errorbar(mids, y, yerr=[[max(0.0, v - (lo if lo > 0 else zero_y)) for v, lo in zip(y, err_lo, strict=True)],
                                [max(0.0, h - v) for v, h in zip(y, err_hi, strict=True)]],
                 fmt="o", color="#1f5fa8", ms=4, capsize=2.5, lw=1, label="observed (95% Wilson interval)")
    if any(p is not None for p in pred):
        ax2.plot(mids, [p if p and p > 0 else zero_y for p in pred], "x--", color="#d95f02", ms=5, lw=1,
                 label="logistic model")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_ylim(zero_y / 2, 2e6)
    ticks = [zero_y] + [10.0 ** e for e in range(round(math.log10(zero_y)) + 1, 7)]
    ax2.set_yticks(ticks, ["0"] + [ppm_label(t) for t in ticks[1:]])
    ax2.minorticks_off()
    ax2.set_xlabel("reference top-1 minus top-2 logit margin (bin centre)")
    ax2.set_ylabel("flip rate (ppm of positions)")
    ax2.set_title(f"calibration: {res['flips']} flips in {res['positions']} positions")
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return _png(fig)


def ppm_number(v: float) -> str:
    """A ppm value in a table: three significant digits, no exponent (2140, not 2.14e+03)."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _interval(ci: list[float] | None, scale: float = 1.0, spec: str = ".3g") -> str:
    if not ci:
        return "none"
    if scale != 1.0:
        return f"{ppm_number(scale * ci[0])}–{ppm_number(scale * ci[1])}"
    return f"{ci[0]:{spec}}–{ci[1]:{spec}}"


def _flip_row(p: dict[str, Any], res: dict[str, Any]) -> dict[str, Any]:
    return {"reference arm": p["ref_arm"], "arm": p["arm"], "positions": res["positions"], "flips": res["flips"],
            "flip ppm": round(1e6 * res["flips"] / res["positions"], 1) if res["positions"] else None,
            "flip ppm 95% interval": _interval(res.get("flip_rate_ci"), 1e6),
            "ROC-AUC": None if res.get("auc") is None else round(res["auc"], 3),
            "AUC 95% interval": _interval(res.get("auc_ci"), spec=".3f"),
            "note": res.get("auc_note") or res.get("auc_ci_note") or ""}


def flip_figures(cat: Catalog, sweep: str | None) -> tuple[list[Figure], list[dict[str, Any]]]:
    """ROC and calibration per (sweep, reference arm, arm), and one table row per pair."""
    everything = fliprisk.load(cat, sweep=sweep)
    figs: list[Figure] = []
    rows: list[dict[str, Any]] = []
    for pid, p in enumerate(everything.pairs):
        data = everything.for_pair(pid)
        res = fliprisk.analyze(data, resamples=500)
        rows.append(_flip_row(p, res))
        if res.get("auc") is None:
            continue
        caption = (f"Left: ROC of the reference arm's logit margin as a predictor of a flip (a smaller margin, more "
                   f"risk); {_ci_text(res)}. Right: observed flip rate per margin decade with its 95% interval "
                   "and the logistic model's rate, in ppm of positions; '0' is a bin without flips.")
        figs.append(Figure(_slug("flips", p["sweep"], p["ref_arm"], p["arm"]),
                           f"Does a small logit margin predict where {p['arm']} flips against {p['ref_arm']}?",
                           caption, "flips", functools.partial(_draw_flip, data, res)))
    return figs, rows


def all_figures(cat: Catalog, sweep: str | None) -> tuple[list[Figure], list[dict[str, Any]]]:
    """Every figure, in report order, and the flip-risk rows per pair."""
    flips, rows = flip_figures(cat, sweep)
    return kdepth_figures(cat, sweep) + replay_figures(cat, sweep) + flips, rows
