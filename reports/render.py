"""Reports people would rather look at than read: one self-contained HTML page, Markdown or JSON.

``document(cat, sweep)`` assembles the report once: the verdicts per kernel pair first (the
certificate table of ``reports.certificate`` when it exists, else the conformance summary), then
sections that each pair a question with its figures (``reports.figures``: K-depth small multiples
with the spread across seeds, the replay heatmap in forward layer order, ROC and calibration per
arm pair) and tables (kernel checks, flip risk, agreement, pre-registered predictions, the
conformance evidence), and the provenance and the date (UTC) at the end. Rates are in ppm
everywhere. ``html_document`` renders it through ``templates/report.html.j2`` (images embedded as
base64 PNG: the page needs no network), ``markdown_document`` through ``templates/report.md.j2``
(tables only), ``json_document`` as one JSON-able object (figures listed by title and caption).
Markdown passed in (the nightly report's preface) is turned into HTML by markdown-it-py.

This is the one Markdown/HTML renderer of swapcheck (the nightly report too: ``nightly_markdown``).
Every number comes from a reports function reading the one named query of its fact through the
``Catalog`` it is given; a document opens no connection of its own.
"""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reports import agreement, conformance, noise_floor, predictions
from reports.figures import all_figures

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["document", "html_document", "json_document", "markdown_document", "markdown_to_html",
           "md_table", "nightly_markdown", "provenance", "verdict_rows", "verdict_view"]

TEMPLATES = Path(__file__).with_name("templates")
NOT_RUN = "not run"

# -- the verdicts ----------------------------------------------------------------------------------

def verdict_rows(cat: Catalog, sweep: str | None) -> tuple[str, list[dict[str, Any]]]:
    """(source, rows): the certificate summary per kernel pair, or the conformance summary until the
    certificate module exists; a cell where nothing ran says "not run"."""
    try:
        cert = importlib.import_module("reports.certificate")
    except ImportError:
        cert = None
    if cert is not None and hasattr(cert, "summary_rows") and hasattr(cert, "certificates"):
        source, rows = "certificate", list(cert.summary_rows(cert.certificates(cat, sweep)))
    else:
        source, rows = "conformance", evidence_view(conformance.conformance(cat, sweep))
    return source, _not_run(rows)


#: How the verdict table's columns read in the documents (JSON keeps the rows as they are).
VERDICT_COLUMNS = {"max_spacing": "max spacings", "verdicts_by_scale": "per scale mode",
                   "max_spacing_beyond_reference_error": "max spacings beyond the reference's own error"}


def verdict_view(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The verdict rows as people read them: one sweep's name once (in the title), the pair once."""
    drop = {"kernel_a", "kernel_b", "scales"} if rows and "pair" in rows[0] else set()
    if len({r.get("sweep") for r in rows}) == 1:
        drop.add("sweep")
    return [{VERDICT_COLUMNS.get(k, k): v for k, v in r.items() if k not in drop} for r in rows]


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


def _g(v: Any, spec: str = ".3g") -> str:
    return "—" if v is None else format(v, spec)


def evidence_view(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``report conformance``'s matrix (one row per pair and scale mode) as people read it: each
    experiment's numbers in one cell, "not run" where the experiment did not cover the pair."""
    if not rows or "kdepth_elements" not in rows[0]:
        return _not_run(rows)
    one_sweep = len({r.get("sweep") for r in rows}) == 1
    out = []
    for r in rows:
        kd = NOT_RUN if not r.get("kdepth_elements") else (
            f"{_g(r['kdepth_ppm'])} ppm ({_g(r.get('kdepth_ppm_ci_low'))}–{_g(r.get('kdepth_ppm_ci_high'))}); "
            f"max {r.get('kdepth_max_spacing')} sp, {r.get('kdepth_max_spacing_beyond_reference_error')} beyond ref.")
        trend = NOT_RUN if not r.get("kdepth_elements") else (
            "no differing outputs" if r.get("k_trend_slope") is None else
            f"K^{_g(r['k_trend_slope'], '.2f')} ({_g(r.get('k_trend_slope_ci_low'), '.2f')} to "
            f"{_g(r.get('k_trend_slope_ci_high'), '.2f')})")
        rp = NOT_RUN if not r.get("replay_layers") else (
            f"{r['replay_identical_layers']}/{r['replay_layers']} layers identical, max {r.get('replay_max_spacing')} sp")
        e2e = NOT_RUN if not r.get("e2e_total") else f"{r['e2e_identical']}/{r['e2e_total']} sequences identical"
        out.append({**({} if one_sweep else {"sweep": r.get("sweep")}),
                    "pair": f"{r.get('kernel_a')} vs {r.get('kernel_b')}", "scales": r.get("scale_mode") or NOT_RUN,
                    "verdict": r.get("verdict"), "K-depth ppm (95% interval)": kd, "K-trend": trend,
                    "replay": rp, "end to end": e2e})
    return out


def _not_run(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: NOT_RUN if v is None or v == "" else v for k, v in r.items()} for r in rows]


# -- the document ----------------------------------------------------------------------------------

def _table(title: str, rows: list[dict[str, Any]], note: str = "") -> dict[str, Any]:
    return {"id": _anchor(title), "title": title, "rows": rows, "note": note}


def _anchor(title: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in title.lower()).split())


def document(cat: Catalog, sweep: str | None = None, *, draw: bool = True) -> dict[str, Any]:
    """The whole report as data: verdicts, sections (figures with captions, tables), provenance.

    ``draw=False`` lists the figures (id, title, caption) without drawing them.
    """
    source, verdicts = verdict_rows(cat, sweep)
    figs, flip_rows = all_figures(cat, sweep)

    def section(sid: str, title: str, intro: str, tabs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        items = [{**f.summary(), "uri": f.draw() if draw else None} for f in figs if f.section == sid]
        return {"id": sid, "title": title, "intro": intro, "figures": items, "tables": tabs or []}

    sections = [
        section("kdepth", "K-depth: outputs differing as the reduction grows",
                "Each kernel multiplies random matrices of growing reduction depth K; how many outputs differ "
                "between kernels (or from the exact reference), in ppm."),
        section("replay", "Per-layer replay", "Each layer's captured activations replayed through both kernels."),
        section("flips", "Flip risk", "Teacher-forced decoding: where the other arm's greedy token differs from "
                "the reference arm's, and whether the reference arm's logit margin predicts it.",
                [_table("Flip risk per arm pair", flip_rows)] if flip_rows else []),
    ]
    checks = conformance.check_rows(cat, sweep)
    if checks:
        sections.append(section("checks", "Kernel checks", "Worst verdict over trials and shapes.",
                                [_table("Kernel checks (worst verdict over trials and shapes)", checks)]))
    agree = [_table(t, rows) for t, rows in agreement.summary_tables(cat, sweep)]
    if agree:
        sections.append(section("agreement", "End-to-end agreement",
                                "Greedy sequences compared across cold restarts and across arms.", agree))
    floor = [_table(t["title"], t["rows"]) for t in noise_floor.document_tables(cat, sweep)]
    if floor:
        sections.append(section("noise-floor", "Batch invariance and the noise floor",
                                "What the same kernel changes by batch shape alone: each kernel's probe row in batches "
                                "of M rows vs the row alone, and the model's prompts in padded batches and decoded vs "
                                "scored alone (distinct completions per arm: End-to-end agreement).", floor))
    from reports import quantize as quantize_report

    qpairs = quantize_report.by_pair(cat, sweep)
    if qpairs:
        sections.append(section("quantizer-swaps", "Quantizer swaps",
                                "Two activation quantizers on the same activations, the GEMM kernel fixed: how "
                                "often the quantized values and scales differ, and what the GEMM makes of it.",
                                [_table(quantize_report.DOCUMENT_TITLE,
                                        _not_run(quantize_report.document_table(qpairs)),
                                        quantize_report.document_note(qpairs))]))
    preds = predictions.score_sweeps(cat, sweep)
    if preds:
        sections.append(section("predictions", "Pre-registered predictions",
                                "Hashed into the sweep before any unit ran; scored against the results.",
                                [_table("Pre-registered predictions", predictions.report_rows(preds))]))
    if source != "conformance":
        sections.append(section("evidence", "Conformance evidence", "What every experiment says per kernel pair.",
                                [_table("Conformance evidence per kernel pair and scale mode", evidence_view(conformance.conformance(cat, sweep)))]))
    sections = [s for s in sections if s["figures"] or s["tables"]]
    for n, f in enumerate((f for s in sections for f in s["figures"]), start=1):
        f["number"] = n
    now = datetime.now(UTC)
    return {
        "title": f"swapcheck report{'' if sweep is None else ': ' + sweep}",
        "sweep": sweep,
        "generated_at": now.isoformat(timespec="seconds"),
        "generated_date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "verdicts": {"id": "verdicts", "title": "Verdicts per kernel pair", "source": source, "rows": verdicts,
                     "view": verdict_view(verdicts)},
        "sections": sections,
        "provenance": provenance(cat, sweep),
    }


def json_document(cat: Catalog, sweep: str | None = None) -> dict[str, Any]:
    """``report all --format json``: one object with the certificate rows, every table, the figure
    list (id, title, caption), the provenance and generated_at."""
    doc = document(cat, sweep, draw=False)
    return {
        "title": doc["title"], "sweep": sweep, "generated_at": doc["generated_at"],
        "certificate": doc["verdicts"],
        "tables": [{"section": s["id"], **t} for s in doc["sections"] for t in s["tables"]],
        "figures": [{k: f[k] for k in ("id", "section", "title", "caption")} for s in doc["sections"] for f in s["figures"]],
        "provenance": doc["provenance"],
    }


# -- rendering -------------------------------------------------------------------------------------

def fmt_cell(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def md_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(fmt_cell(r.get(c)).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _cell_class(v: Any) -> str:
    text = fmt_cell(v).lower()
    if text == NOT_RUN:
        return "notrun"
    if text in ("identical", "pass", "confirmed", "yes") or text.startswith("identical"):
        return "good"
    if text in ("epilogue_rounding", "within_algorithm_bound", "inconclusive"):
        return "mid"
    if text in ("refuted", "fail", "no", "different", "incorrect", "error"):
        return "bad"
    return ""


def _env(autoescape: bool) -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=autoescape,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters.update(cell=fmt_cell, cell_class=_cell_class, md_table=md_table)
    return env


def markdown_to_html(md: str) -> str:
    """CommonMark with pipe tables (markdown-it-py); raw HTML in the input is escaped, not passed on."""
    from markdown_it import MarkdownIt

    return str(MarkdownIt("commonmark", {"html": False}).enable("table").render(md))


def markdown_document(cat: Catalog, sweep: str | None = None) -> str:
    """The report's tables in Markdown: verdicts, each section's tables, provenance, the date."""
    return str(_env(False).get_template("report.md.j2").render(doc=document(cat, sweep, draw=False)))


def html_document(cat: Catalog, sweep: str | None = None, preface_markdown: str | None = None) -> str:
    """The whole report as one self-contained HTML page; ``preface_markdown`` replaces the title."""
    from markupsafe import Markup

    preface = Markup(markdown_to_html(preface_markdown)) if preface_markdown else None
    return str(_env(True).get_template("report.html.j2").render(doc=document(cat, sweep), preface=preface))


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
