"""Reports people would rather look at than read: one self-contained HTML page, or Markdown.

``html_document(results, sweep)`` draws, with matplotlib (images embedded as base64 PNG, so the page
needs no network): the K-depth curves (fraction of differing outputs vs K, log axes, per dtype and
pair), the per-layer replay heatmap, the ROC curve and calibration plot of the flip-risk model, and
the tables: agreement, the prediction scorecard, the conformance summary per kernel pair and the
run's provenance. ``markdown_document`` gives the same tables for terminals and pull requests.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from pathlib import Path
from typing import Any

SYMLOG_FLOOR = 1e-7


def _q(results: str | Path, sql: str) -> list[dict[str, Any]]:
    from storage.catalog import read_only_query

    return read_only_query(results, sql).to_pylist()


def _where(sweep: str | None, alias: str = "") -> str:
    return "true" if sweep is None else f"{alias}sweep = '" + sweep.replace("'", "") + "'"


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

def kdepth_figures(results: str | Path, sweep: str | None) -> list[tuple[str, str]]:
    rows = _q(results, f"""SELECT dtype, impl_a, impl_b, scale_mode, k, sum(differing) / sum(elements) AS frac
                            FROM kdepth WHERE {_where(sweep)} GROUP BY ALL ORDER BY dtype, impl_a, impl_b, scale_mode, k""")
    figs = []
    for dtype in sorted({r["dtype"] for r in rows}):
        fig, ax = _figure(7.5, 4.2)
        import matplotlib.pyplot as plt

        ax.set_prop_cycle(color=[plt.get_cmap("tab20")(i) for i in range(20)])
        series: dict[tuple, list] = {}
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


def replay_figure(results: str | Path, sweep: str | None) -> list[tuple[str, str]]:
    import numpy as np

    rows = _q(results, f"""SELECT layer, any_value(layer_index) AS li, impl_a || ' vs ' || impl_b || ' (' || scale_mode || ')' AS col,
                                  sum(differing) / sum(elements) AS frac
                           FROM replay WHERE {_where(sweep)} AND comparison = 'pair' GROUP BY layer, col ORDER BY li, layer, col""")
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


def flip_figures(results: str | Path, sweep: str | None) -> list[tuple[str, str]]:
    from sklearn.metrics import roc_curve

    from storage import fliprisk

    pairs = _q(results, f"SELECT DISTINCT sweep, ref_arm, arm FROM teacher_forced WHERE {_where(sweep)} ORDER BY ALL")
    figs = []
    for p in pairs:
        data = fliprisk.load(results, sweep=p["sweep"], ref_arm=p["ref_arm"], arm=p["arm"])
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

def conformance(results: str | Path, sweep: str | None) -> list[dict[str, Any]]:
    """One line per kernel pair: what every experiment says about swapping one for the other."""
    out: dict[tuple[str, str], dict[str, Any]] = {}

    def line(a: str, b: str) -> dict[str, Any]:
        return out.setdefault((a, b), {"pair": f"{a} vs {b}", "kdepth": "", "replay": "", "end to end": ""})

    for r in _q(results, f"""SELECT dtype, impl_a, impl_b, scale_mode, sum(differing)::BIGINT AS d, sum(elements)::BIGINT AS e,
                                    max(max_spacing_significant) AS ms FROM kdepth
                             WHERE {_where(sweep)} AND comparison = 'pair' GROUP BY ALL ORDER BY ALL"""):
        cell = line(r["impl_a"], r["impl_b"])
        verdict = "identical" if r["d"] == 0 else f"{1e6 * r['d'] / r['e']:.3g} ppm differ, max {r['ms']} sp"
        cell["kdepth"] += f"{r['dtype']}/{r['scale_mode']}: {verdict}; "
    for r in _q(results, f"""SELECT impl_a, impl_b, scale_mode, count(DISTINCT layer) AS n,
                                    count(DISTINCT layer) FILTER (WHERE bitwise_equal) AS k, max(max_spacing) AS ms
                             FROM replay WHERE {_where(sweep)} AND comparison = 'pair' GROUP BY ALL ORDER BY ALL"""):
        line(r["impl_a"], r["impl_b"])["replay"] += f"{r['scale_mode']}: {r['k']}/{r['n']} layers identical (max {r['ms']} sp); "
    for r in _q(results, f"""SELECT ra.configured_kernel AS ka, rb.configured_kernel AS kb, ra.scales AS scales,
                                    count(*) AS n, count(*) FILTER (WHERE a.sequence_hash = b.sequence_hash) AS k
                             FROM sequences a JOIN sequences b ON a.sweep = b.sweep AND a.prompt_index = b.prompt_index
                                  AND a.restart = 0 AND b.restart = 0 AND a.arm < b.arm
                             JOIN arm_runs ra ON ra.unit_id = a.unit_id JOIN arm_runs rb ON rb.unit_id = b.unit_id
                             WHERE {_where(sweep, "a.")} AND ra.scales = rb.scales AND ra.configured_kernel <> rb.configured_kernel
                             GROUP BY ALL ORDER BY ALL"""):
        a, b = sorted((r["ka"], r["kb"]))
        line(a, b)["end to end"] += f"{r['scales']}: {r['k']}/{r['n']} sequences identical; "
    return [{k: v.rstrip("; ") for k, v in d.items()} for d in out.values()]


def check_rows(results: str | Path, sweep: str | None) -> list[dict[str, Any]]:
    """Worst check verdict per (sweep, kernel, check, output format), from the nightly metrics."""
    from storage.store import open_store
    from storage.summary import check_metrics

    rows = []
    for sw in ([sweep] if sweep else open_store(results).sweeps()):
        for name, m in check_metrics(results, sw).items():
            _, table, rest = name.split("/", 2)
            kernel, dtype, _ = rest.rsplit("/", 2)
            rows.append({"sweep": sw, "kernel": kernel, "check": table, "output": dtype, "verdict": m["value"]})
    return rows


def tables(results: str | Path, sweep: str | None) -> list[tuple[str, list[dict[str, Any]]]]:
    from orchestrator import prereg
    from storage.catalog import run_named
    from storage.store import open_store

    out: list[tuple[str, list[dict[str, Any]]]] = [("Conformance summary per kernel pair", conformance(results, sweep))]
    checks = check_rows(results, sweep)
    if checks:
        out.append(("Kernel checks (worst verdict over trials and shapes)", checks))
    self_rows = run_named(results, "self_reproducibility", sweep=sweep).to_pylist()
    if self_rows:
        out.append(("Self-reproducibility across cold restarts",
                    [{"arm": r["arm"], "identical": f"{r['identical']}/{r['total']}", "restarts": r.get("restarts")}
                     for r in self_rows]))
        cross = run_named(results, "cross_arm", sweep=sweep).to_pylist()
        out.append(("Cross-arm agreement (restart 0)",
                    [{"pair": f"{r['arm_a']} vs {r['arm_b']}", "identical": f"{r['identical']}/{r['total']}"} for r in cross]))
    store = open_store(results)
    sweeps = [sweep] if sweep else store.sweeps()
    preds = [r for s in sweeps for r in prereg.score(results, store, s)]
    if preds:
        out.append(("Pre-registered predictions", [
            {"sweep": r["sweep"], "prediction": r["prediction"], "status": r["status"].upper(),
             "support": f"{r['support']} {r['noun'] or ''}".strip(), "counterexample": r["counterexample"] or "",
             "amended": "after results" if r["amended_after_results"] else ("yes" if r["amended"] else "")}
            for r in preds]))
    launches = _q(results, f"SELECT sweep, launch_id, status, n_units, n_ok, n_failed, provenance_json FROM launches WHERE {_where(sweep)} ORDER BY started_at")
    prov = []
    for r in launches:
        p = json.loads(r["provenance_json"] or "{}")
        v = p.get("versions", {})
        prov.append({"sweep": r["sweep"], "launch": r["launch_id"], "status": r["status"], "units": r["n_units"],
                     "ok": r["n_ok"], "failed": r["n_failed"], "host": p.get("host"), "cpu": p.get("cpu"),
                     "versions": ", ".join(f"{k} {val}" for k, val in v.items() if val)})
    if prov:
        out.append(("Provenance", prov))
    return out


# -- rendering -------------------------------------------------------------------------------------

def _md_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(r.get(c, "")).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def markdown_document(results: str | Path, sweep: str | None = None) -> str:
    parts = [f"# swapcheck report{'' if sweep is None else ': ' + sweep}\n"]
    for title, rows in tables(results, sweep):
        parts.append(f"## {title}\n\n{_md_table(rows)}")
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


def html_document(results: str | Path, sweep: str | None = None, preface_markdown: str | None = None) -> str:
    body = []
    if preface_markdown:
        body.append(markdown_to_html(preface_markdown))
    else:
        body.append(f"<h1>swapcheck report{'' if sweep is None else ': ' + html.escape(sweep)}</h1>")
    figures = kdepth_figures(results, sweep) + replay_figure(results, sweep) + flip_figures(results, sweep)
    if figures:
        body.append("<h2>Figures</h2>")
        for title, uri in figures:
            body.append(f"<h3>{html.escape(title)}</h3><img alt=\"{html.escape(title)}\" src=\"{uri}\">")
    for title, rows in tables(results, sweep):
        body.append(f"<h2>{html.escape(title)}</h2>" + markdown_to_html(_md_table(rows)))
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>swapcheck report</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
