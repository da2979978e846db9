"""Reports people would rather look at than read: one self-contained HTML page, or Markdown.

``html_document(cat, sweep)`` draws, with matplotlib (images embedded as base64 PNG, so the page
needs no network): the K-depth curves (fraction of differing outputs vs K, log axes, per dtype and
pair), the per-layer replay heatmap, the ROC curve and calibration plot of the flip-risk model, and
the tables: agreement, the prediction scorecard, the conformance summary per kernel pair and the
run's provenance. ``markdown_document`` gives the same tables for terminals and pull requests.

This is the one Markdown/HTML renderer of swapcheck (the nightly report too: ``nightly_markdown``).
Every number comes from a reports function reading the one named query of its fact through the
``Catalog`` it is given; a document opens no connection of its own.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from typing import TYPE_CHECKING, Any

from reports import agreement, conformance, fliprisk, kdepth, predictions, replay

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["figures", "flip_figures", "html_document", "kdepth_figures", "markdown_document", "markdown_to_html",
           "md_table", "nightly_markdown", "replay_figure", "tables"]

SYMLOG_FLOOR = 1e-7

def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width, height))


# -- the pictures ----------------------------------------------------------------------------------

def kdepth_figures(cat: Catalog, sweep: str | None) -> list[tuple[str, str]]:
    rows = kdepth.curves(kdepth.summary(cat, sweep))
    figs = []
    for dtype in sorted({r["dtype"] for r in rows}):
        fig, ax = _figure(7.5, 4.2)
        import matplotlib.pyplot as plt

        ax.set_prop_cycle(color=[plt.get_cmap("tab20")(i) for i in range(20)])
        series: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
        for r in rows:
            if r["dtype"] == dtype:
                series.setdefault((r["impl_a"], r["impl_b"], r["scale_mode"]), []).append((r["k"], r["frac"]))
        for (a, b, mode), pts in series.items():
            ks, fr = zip(*pts, strict=True)
            ax.plot(ks, fr, marker="o", linestyle="--" if mode == "pow2" else "-",
                    label=f"{a} vs {b} ({mode})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=SYMLOG_FLOOR)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("K (reduction depth)")
        ax.set_ylabel("fraction of outputs differing")
        ax.set_title(f"K-depth: {dtype} (0 plotted on a linear segment below {SYMLOG_FLOOR:g})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        figs.append((f"K-depth curves, {dtype}", _png(fig)))
    return figs


def _replay_cells(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """Fraction of differing outputs per (layer, pair and scale mode), from ``replay_by_layer``."""
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for r in replay.by_layer(cat, sweep):
        if r["comparison"] != "pair":
            continue
        col = f"{r['impl_a']} vs {r['impl_b']} ({r['scale_mode']})"
        c = cells.setdefault((r["layer"], col), {"layer": r["layer"], "li": r["layer_index"], "col": col, "d": 0, "e": 0})
        c["d"] += r["differing"] or 0
        c["e"] += r["elements"] or 0
    rows = [{**c, "frac": c["d"] / c["e"] if c["e"] else None} for c in cells.values()]
    return sorted(rows, key=lambda c: (c["li"] is None, c["li"] or 0, c["layer"], c["col"]))


def replay_figure(cat: Catalog, sweep: str | None) -> list[tuple[str, str]]:
    import numpy as np

    rows = _replay_cells(cat, sweep)
    if not rows:
        return []
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    cols = sorted({r["col"] for r in rows})
    grid = np.full((len(layers), len(cols)), np.nan)
    for r in rows:
        grid[layers.index(r["layer"]), cols.index(r["col"])] = r["frac"]
    from matplotlib.colors import SymLogNorm

    fig, ax = _figure(2.5 + 1.6 * len(cols), 1.2 + 0.22 * len(layers))
    im = ax.imshow(grid, aspect="auto", cmap="magma_r", norm=SymLogNorm(linthresh=SYMLOG_FLOOR, vmin=0, vmax=max(1e-4, np.nanmax(grid))))
    ax.set_yticks(range(len(layers)), layers, fontsize=6)
    ax.set_xticks(range(len(cols)), cols, fontsize=7, rotation=20, ha="right")
    ax.set_title("Per-layer replay: fraction of outputs differing (white = bit-identical)")
    fig.colorbar(im, ax=ax, fraction=0.05)
    return [("Per-layer replay heatmap", _png(fig))]


def flip_figures(cat: Catalog, sweep: str | None) -> list[tuple[str, str]]:
    from sklearn.metrics import roc_curve

    everything = fliprisk.load(cat, sweep=sweep)
    figs = []
    for pid, p in enumerate(everything.pairs):
        data = everything.subset(everything.pair == pid)
        if not data.flip.any() or data.flip.all():
            continue
        fig, (ax1, ax2) = _figure(9.5, 3.8, ncols=2)
        fpr, tpr, _ = roc_curve(data.flip, -data.margin)
        auc = fliprisk.auc(data.margin, data.flip)
        ax1.plot(fpr, tpr, label=f"-margin, AUC {auc:.3f}")
        ax1.plot([0, 1], [0, 1], color="grey", linestyle=":")
        ax1.set_xlabel("false positive rate")
        ax1.set_ylabel("true positive rate")
        ax1.set_title(f"ROC: flips of {p['arm']} on {p['ref_arm']}")
        ax1.legend(loc="lower right")
        model = fliprisk.fit_logistic(data.margin, data.flip)
        table = fliprisk.calibration(data.margin, data.flip, model)
        mids = [((b["margin_lo"] or 1e-8) * (b["margin_hi"] if b["margin_hi"] not in (None, float("inf")) else 10 * (b["margin_lo"] or 1))) ** 0.5 for b in table]
        ax2.plot(mids, [b["observed_rate"] for b in table], marker="o", label="observed")
        ax2.plot(mids, [b["predicted_rate"] for b in table], marker="x", linestyle="--", label="logistic model")
        ax2.set_xscale("log")
        ax2.set_yscale("symlog", linthresh=1e-4)
        ax2.set_ylim(bottom=0)
        ax2.set_xlabel("reference top-1/top-2 logit margin")
        ax2.set_ylabel("flip rate")
        ax2.set_title(f"calibration ({data.flip.sum()} flips / {len(data)} positions)")
        ax2.legend()
        figs.append((f"Flip risk: {p['ref_arm']} vs {p['arm']} ({p['sweep']})", _png(fig)))
    return figs


# -- the tables ------------------------------------------------------------------------------------

def provenance(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """One line per launch: status, unit counts, host, cpu and library versions (``launches``)."""
    prov = []
    for r in cat.named("launches", sweep=sweep):
        p = json.loads(r["provenance_json"] or "{}")
        v = p.get("versions", {})
        prov.append({"sweep": r["sweep"], "launch": r["launch_id"], "status": r["status"], "units": r["n_units"],
                     "ok": r["n_ok"], "failed": r["n_failed"], "host": p.get("host"), "cpu": p.get("cpu"),
                     "versions": ", ".join(f"{k} {val}" for k, val in v.items() if val)})
    return prov


def tables(cat: Catalog, sweep: str | None) -> list[tuple[str, list[dict[str, Any]]]]:
    out: list[tuple[str, list[dict[str, Any]]]] = [
        ("Conformance summary per kernel pair", conformance.conformance(cat, sweep))]
    checks = conformance.check_rows(cat, sweep)
    if checks:
        out.append(("Kernel checks (worst verdict over trials and shapes)", checks))
    out += agreement.summary_tables(cat, sweep)
    preds = predictions.score_sweeps(cat, sweep)
    if preds:
        out.append(("Pre-registered predictions", predictions.report_rows(preds)))
    prov = provenance(cat, sweep)
    if prov:
        out.append(("Provenance", prov))
    return out


# -- rendering -------------------------------------------------------------------------------------

def md_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(r.get(c, "")).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def markdown_document(cat: Catalog, sweep: str | None = None) -> str:
    parts = [f"# swapcheck report{'' if sweep is None else ': ' + sweep}\n"]
    for title, rows in tables(cat, sweep):
        parts.append(f"## {title}\n\n{md_table(rows)}")
    return "\n".join(parts)


def _inline(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def markdown_to_html(md: str) -> str:
    """The Markdown subset swapcheck itself writes: headings, pipe tables, paragraphs."""
    out: list[str] = []
    table: list[str] = []

    def flush() -> None:
        if table:
            rows = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in table if not set(line) <= set("|-: ")]
            head, body = rows[0], rows[1:]
            out.append("<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</tbody></table>")
            table.clear()
    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        m = re.match(r"^(#{1,4}) (.*)", line)
        if m:
            n = len(m.group(1)) + 1
            out.append(f"<h{n}>{_inline(m.group(2))}</h{n}>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(out)


STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}code{background:#f6f6f6;padding:0 3px}img{max-width:100%;border:1px solid #eee;margin:.5em 0}
h1{font-size:1.5em}h2{font-size:1.25em;margin-top:1.5em}h3{font-size:1.1em}"""


def figures(cat: Catalog, sweep: str | None) -> list[tuple[str, str]]:
    """Every figure of the HTML report: (title, data URI of the PNG)."""
    return kdepth_figures(cat, sweep) + replay_figure(cat, sweep) + flip_figures(cat, sweep)


def html_document(cat: Catalog, sweep: str | None = None, preface_markdown: str | None = None) -> str:
    body = []
    if preface_markdown:
        body.append(markdown_to_html(preface_markdown))
    else:
        body.append(f"<h1>swapcheck report{'' if sweep is None else ': ' + html.escape(sweep)}</h1>")
    figs = figures(cat, sweep)
    if figs:
        body.append("<h2>Figures</h2>")
        for title, uri in figs:
            body.append(f"<h3>{html.escape(title)}</h3><img alt=\"{html.escape(title)}\" src=\"{uri}\">")
    for title, rows in tables(cat, sweep):
        body.append(f"<h2>{html.escape(title)}</h2>" + markdown_to_html(md_table(rows)))
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>swapcheck report</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


# -- the nightly report ----------------------------------------------------------------------------

def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "—" if v is None else str(v)


def nightly_markdown(outcome: Any, today: dict[str, Any], base: dict[str, Any] | None) -> str:
    """The nightly report (``orchestrator.nightly.NightlyOutcome``): verdict, changes, today's metrics."""
    verdict = ("REGRESSION" if outcome.regressions else "no regression") if base else "baseline created"
    lines = [f"# Nightly {outcome.sweep}: {verdict}", ""]
    if base:
        lines += [f"Baseline: sweep `{base.get('sweep')}` ({base.get('created_at', '?')}); "
                  f"{len(today)} metrics today, {len(outcome.changes)} changed, {len(outcome.regressions)} regressed.", ""]
    if outcome.baseline_updated:
        lines += ["The baseline was updated to today's metrics (--update-baseline).", ""]

    def table(title: str, changes: list[dict[str, Any]]) -> None:
        lines.extend([f"## {title}", ""])
        if not changes:
            lines.extend(["No change.", ""])
            return
        lines.extend(["| metric | rule | before | today | change | regression |", "|---|---|---|---|---|---|"])
        for c in changes:
            lines.append(f"| `{c['metric']}` | {c['rule']} | {_fmt(c['baseline'])} | {_fmt(c['today'])} | {c['kind']} | "
                         f"{'**yes**' if c['regression'] else 'no'} |")
        lines.append("")
    if base:
        table("Since the baseline", outcome.changes)
    if outcome.previous:
        table(f"Since the previous night ({outcome.previous})", outcome.since_previous)
    lines += ["## Today's metrics", "", "| metric | rule | value |", "|---|---|---|"]
    lines += [f"| `{k}` | {m['rule']} | {_fmt(m['value'])} |" for k, m in today.items()]
    return "\n".join(lines) + "\n"
