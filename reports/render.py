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
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reports import arbiter, conformance, spacing

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["document", "first_word", "html_document", "identifying", "json_document", "markdown_document",
           "markdown_to_html", "md_table", "nightly_markdown", "provenance", "verdict_rows", "verdict_view"]

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
    return source, not_run(rows)


#: How the verdict table's columns read in the documents (JSON keeps the rows as they are).
VERDICT_COLUMNS = {"max_spacing_significant": spacing.NORMAL, "near_zero_beyond": spacing.NEAR_ZERO,
                   "max_spacing": spacing.RAW, "verdicts_by_scale": "per scale mode",
                   "max_spacing_significant_beyond_reference_error": f"{spacing.NORMAL} beyond the reference's own error",
                   "max_spacing_beyond_reference_error": f"{spacing.RAW} beyond the reference's own error"}


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


def _spacing_text(r: dict[str, Any], prefix: str) -> str:
    """The normal-range max spacing and the near-zero outputs beyond it of a matrix row's section."""
    sec = {k[len(prefix):]: v for k, v in r.items() if k.startswith(prefix)}
    ref = sec.get("max_spacing_significant_beyond_reference_error")
    return spacing.phrase(sec, ref) if prefix == "kdepth_" else spacing.phrase(sec)


def evidence_view(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``report conformance``'s matrix (one row per pair and scale mode) as people read it: each
    experiment's numbers in one cell, "not run" where the experiment did not cover the pair."""
    if not rows or "kdepth_elements" not in rows[0]:
        return not_run(rows)
    one_sweep = len({r.get("sweep") for r in rows}) == 1
    out = []
    for r in rows:
        kd = NOT_RUN if not r.get("kdepth_elements") else (
            f"{_g(r['kdepth_ppm'])} ppm ({_g(r.get('kdepth_ppm_ci_low'))}–{_g(r.get('kdepth_ppm_ci_high'))}); "
            f"{_spacing_text(r, 'kdepth_')}; raw max {r.get('kdepth_max_spacing')} sp, "
            f"{r.get('kdepth_max_spacing_beyond_reference_error')} beyond ref.")
        trend = NOT_RUN if not r.get("kdepth_elements") else (
            "no differing outputs" if r.get("k_trend_slope") is None else
            f"K^{_g(r['k_trend_slope'], '.2f')} ({_g(r.get('k_trend_slope_ci_low'), '.2f')} to "
            f"{_g(r.get('k_trend_slope_ci_high'), '.2f')})")
        rp = NOT_RUN if not r.get("replay_layers") else (
            f"{r['replay_identical_layers']}/{r['replay_layers']} layers identical, {_spacing_text(r, 'replay_')}")
        e2e = NOT_RUN if not r.get("e2e_total") else f"{r['e2e_identical']}/{r['e2e_total']} sequences identical"
        out.append({**({} if one_sweep else {"sweep": r.get("sweep")}),
                    "pair": f"{r.get('kernel_a')} vs {r.get('kernel_b')}", "scales": r.get("scale_mode") or NOT_RUN,
                    "verdict": r.get("verdict"), "K-depth ppm (95% interval)": kd, "K-trend": trend,
                    "replay": rp, "end to end": e2e,
                    **({arbiter.COLUMN: arbiter.matrix_cell(r)} if "arbiter" in r else {})})
    return out


def not_run(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: NOT_RUN if v is None or v == "" else v for k, v in r.items()} for r in rows]


# -- the document ----------------------------------------------------------------------------------

def _table(title: str, rows: list[dict[str, Any]], note: str = "") -> dict[str, Any]:
    return {"id": _anchor(title), "title": title, "rows": rows, "note": note}


def _anchor(title: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in title.lower()).split())


def document(cat: Catalog, sweep: str | None = None, *, draw: bool = True) -> dict[str, Any]:
    """The whole report as data: verdicts, sections (figures with captions, tables), provenance.

    One chapter per sweep (``sweep``, or every sweep of the results): each registered report
    (``reports.registry``) contributes its sections for that sweep alone, so no figure or table
    pools two sweeps; with several sweeps every section title and id names its sweep.
    ``draw=False`` lists the figures (id, title, caption) without drawing them.
    """
    from reports import summary
    from reports.registry import reports

    asked = summary.questions(cat, sweep)
    sweeps = [sweep] if sweep else summary.launch_order(cat.all_sweeps(), asked)
    several = len(sweeps) > 1
    source, verdicts = "certificate", []
    sections: list[dict[str, Any]] = []
    for sw in sweeps:
        source, rows = verdict_rows(cat, sw)
        verdicts += rows
        for rep in reports():
            for sec in rep.sections(cat, sw):
                prefix, ids = (f"{sw}: ", f"{_anchor(sw)}-") if several else ("", "")
                figs = [{**f.summary(), "id": ids + f.id, "title": prefix + f.title, "sweep": sw,
                         "uri": f.draw() if draw else None}
                        for f in sec.figures]
                tabs = [{**_table(prefix + t["title"], t["rows"], t.get("note", "")), "sweep": sw} for t in sec.tables]
                if figs or tabs:
                    sections.append({"id": ids + sec.id, "title": prefix + sec.title, "intro": sec.intro,
                                     "sweep": sw, "figures": figs, "tables": tabs})
    for n, f in enumerate((f for s in sections for f in s["figures"]), start=1):
        f["number"] = n
    now = datetime.now(UTC)
    return {
        "title": f"swapcheck report{'' if sweep is None else ': ' + sweep}",
        "sweep": sweep,
        "sweeps": sweeps,
        "generated_at": now.isoformat(timespec="seconds"),
        "generated_date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "verdicts": {"id": "verdicts", "title": "Verdicts per kernel pair", "source": source, "rows": verdicts,
                     "view": verdict_view(verdicts)},
        "answers": [{**a, "id": f"answer-{_anchor(a['sweep'])}", "table_id": f"verdicts-{_anchor(a['sweep'])}",
                     "first": not_run(a["first"]), "detail": verdict_view(not_run(a["detail"])),
                     "sections": [s for s in sections if s["sweep"] == a["sweep"]]}
                    for a in summary.answers(cat, sweeps, verdicts, asked)],
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
        "sweeps": doc["sweeps"],
        "summary": [{k: a[k] for k in ("sweep", "question", "created_at", "about", "reports", "verdict_counts", "pairs")}
                    for a in doc["answers"]],
        "tables": [{"section": s["id"], **t} for s in doc["sections"] for t in s["tables"]],
        "figures": [{**{k: f[k] for k in ("id", "title", "caption", "sweep")}, "section": s["id"]}
                    for s in doc["sections"] for f in s["figures"]],
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


def md_escape(text: str) -> str:
    """A Markdown table cell: ``|`` escaped, line breaks as spaces (a cell is one line)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", " ").replace("\n", " ")


def md_table(rows: list[dict[str, Any]], cell: Callable[[str, Any], str] | None = None) -> str:
    """The one Markdown table writer (documents here, ``--format markdown`` of every CLI table through
    ``orchestrator.cli.common.emit_rows``): header, separator, one line per row, every header and cell
    escaped (:func:`md_escape`); ``cell(column, value)`` formats a value (default :func:`fmt_cell`)."""
    if not rows:
        return "(no rows)\n"
    fmt = cell or (lambda _c, v: fmt_cell(v))
    cols = list(rows[0])
    lines = ["| " + " | ".join(md_escape(str(c)) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(md_escape(fmt(c, r.get(c))) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


#: Names whose column identifies a row: the first or last word of a column's name (``pair (A~B)``,
#: ``arm(s)``, ``kernel_a``, ``attention kernel``, ``first differing linear``) or the whole name. Such
#: cells are never cut: the terminal's tables keep them on one line (``orchestrator/cli/tables.py``),
#: the HTML does not wrap them.
ID_WORDS = frozenset({"sweep", "pair", "pairs", "arm", "arms", "kernel", "kernels", "impl", "ref", "layer",
                      "linear", "experiment", "name", "model", "quantizer", "prompt"})
ID_NAMES = frozenset({"culprit set s"})


def _words(column: str) -> list[str]:
    return [w for w in re.split(r"[\s_(~)]+", column.strip().lower()) if w] or [""]


def first_word(column: str) -> str:
    return _words(column)[0]


def identifying(column: str) -> bool:
    """Whether the column names what a row is about (sweep, pair, arm, kernel, layer, ...)."""
    words = _words(column)
    return column.strip().lower() in ID_NAMES or words[0] in ID_WORDS or words[-1] in ID_WORDS


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
    env.tests.update(identifying=identifying)
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
        lines.append(md_table([{"metric": f"`{c['metric']}`", "rule": c["rule"], "before": _fmt(c["baseline"]),
                                "today": _fmt(c["today"]), "change": c["kind"],
                                "regression": "**yes**" if c["regression"] else "no"} for c in changes]))
    if base:
        table("Since the baseline", outcome.changes)
    if outcome.previous:
        table(f"Since the previous night ({outcome.previous})", outcome.since_previous)
    lines += ["## Today's metrics", "",
              md_table([{"metric": f"`{k}`", "rule": m["rule"], "value": _fmt(m["value"])} for k, m in today.items()])]
    return "\n".join(lines) + "\n"
