"""Scoring pre-registered predictions: each prediction in force, confirmed or refuted, with support.

A prediction file (TOML, registered into the sweep at launch by ``orchestrator.prereg``; its model and
its one parser are ``storage.prereg``, re-exported here) holds, per
prediction, SQL fragments written by its author: ``where`` (which rows of ``table``), then either
``every`` (a condition each matching row must satisfy; a failing row is named by ``label``) or
``aggregate`` (one condition over all of them, with an optional ``measure``).

User SQL text is composed in ONE place, :func:`run_prediction`: it takes a statement template from
``storage/queries/prediction_*.sql``, fills only its ``{{table}}``, ``{{where}}``, ``{{every}}``,
``{{aggregate}}``, ``{{measure}}`` and ``{{label}}`` placeholders (the table name checked against
``storage.schemas.TABLES``), binds ``$sweep`` as a parameter, refuses anything but one SELECT
statement, and runs it on the catalog's read-only connection. Every other report query is a named
query with bound parameters.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storage.errors import QueryError
from storage.prereg import (
    Prediction,
    PredictionFile,
    PredictionFileError,
    parse,
    registrations,
    sha256,
)

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = [
    "Prediction",
    "PredictionFile",
    "PredictionFileError",
    "evaluate",
    "parse",
    "registrations",
    "run_prediction",
    "score",
    "scorecard",
    "sha256",
]

#: The placeholders of the prediction templates; nothing else of a template is ever replaced.
FRAGMENTS = ("table", "where", "every", "aggregate", "measure", "label")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def run_prediction(cat: Catalog, template: str, sweep: str, p: Prediction) -> list[dict[str, Any]]:
    """Fill ``storage/queries/<template>.sql`` with the prediction's fragments and run it read-only.

    The one place user SQL text is composed: only the ``{{...}}`` placeholders are replaced (in one
    pass, so a fragment's own text is never substituted again; the templates' comments are dropped
    first), ``table`` must be one of ``storage.schemas.TABLES``, ``$sweep`` is a bound parameter,
    and the result must be exactly one SELECT statement.
    """
    import duckdb

    from storage.catalog import named_query
    from storage.schemas import TABLES

    if p.table not in TABLES:
        raise QueryError(f"unknown table {p.table!r}; allowed: {', '.join(TABLES)}")
    fragments = {"table": f'"{p.table}"', "where": p.where, "every": p.every or "NULL",
                 "aggregate": p.aggregate or "NULL", "measure": p.measure or "NULL",
                 "label": p.label or "unit_id"}
    body = "\n".join(line for line in named_query(template).splitlines() if not line.lstrip().startswith("--"))
    sql = _PLACEHOLDER.sub(lambda m: fragments[m.group(1)], body)
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse the prediction: {exc}") from None
    if len(statements) != 1 or str(statements[0].type).rsplit(".", 1)[-1] != "SELECT":
        raise QueryError("a prediction's fragments must stay inside one read-only SELECT statement")
    try:
        rows: list[dict[str, Any]] = cat.query(sql, sweep=sweep).to_pylist()
    except duckdb.Error as exc:
        raise QueryError(f"{type(exc).__name__}: {exc}") from None
    return rows


def evaluate(cat: Catalog, sweep: str, p: Prediction) -> dict[str, Any]:
    """Score one prediction over the sweep's rows (read-only DuckDB)."""
    out: dict[str, Any] = {"counterexample": None, "measured": None}
    if p.every is not None:
        row = run_prediction(cat, "prediction_every", sweep, p)[0]
        n, k = int(row["n"]), int(row["k"])
        out.update(status="confirmed" if n > 0 and k == n else "refuted", support=f"{k}/{n}", matched=n)
        if k < n:
            bad = run_prediction(cat, "prediction_counterexample", sweep, p)
            out["counterexample"] = str(bad[0]["label"]) if bad else None
    else:
        row = run_prediction(cat, "prediction_aggregate", sweep, p)[0]
        n = int(row["n"])
        ok = bool(row["ok"]) and n > 0
        out.update(status="confirmed" if ok else "refuted", support=f"{'holds' if ok else 'fails'} over {n}", matched=n,
                   measured=row.get("measured"))
    return out


def score(cat: Catalog, sweep: str) -> list[dict[str, Any]]:
    """One row per prediction in force (amendments replace earlier predictions with the same id)."""
    in_force: dict[str, dict[str, Any]] = {}
    for reg in registrations(cat.store, sweep):
        pf = parse(reg["text"], reg["path"])
        on_disk = Path(reg["path"])
        edited = on_disk.is_file() and sha256(on_disk.read_text(encoding="utf-8")) != reg["sha256"]
        for p in pf.predictions:
            amended = p.id in in_force or pf.amends is not None
            in_force[p.id] = {
                "prediction": p.id, "statement": p.statement, "p": p, "file": reg["path"],
                "sha256": reg["sha256"], "amended": amended,
                "amended_after_results": bool(amended and reg["results_existed"]),
                "file_edited_after_registration": edited,
            }
    rows = []
    for entry in in_force.values():
        p = entry.pop("p")
        result = evaluate(cat, sweep, p)
        rows.append({"sweep": sweep, **entry, **result, "noun": p.noun if p.every is not None else None})
    return rows


def score_sweeps(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """``score`` over one sweep, or over every sweep of the results."""
    return [r for s in ([sweep] if sweep else cat.sweeps()) for r in score(cat, s)]


def scorecard(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The terminal table of ``report predictions``: a sweep column only when there are several."""
    one_sweep = len({r["sweep"] for r in rows}) == 1
    table = []
    for r in rows:
        line = {} if one_sweep else {"sweep": r["sweep"]}
        line.update({"prediction": r["prediction"], "status": r["status"].upper(),
                     "support": f"{r['support']} {r['noun']}" if r["noun"] else r["support"],
                     "measured": r["measured"]})
        if any(x["counterexample"] for x in rows):
            line["counterexample"] = r["counterexample"] or ""
        if any(x["amended"] for x in rows):
            line["amended"] = ("after results" if r["amended_after_results"] else "yes") if r["amended"] else ""
        table.append(line)
    return table


def report_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prediction table of ``report all``."""
    return [{"sweep": r["sweep"], "prediction": r["prediction"], "status": r["status"].upper(),
             "support": f"{r['support']} {r['noun'] or ''}".strip(), "counterexample": r["counterexample"] or "",
             "amended": "after results" if r["amended_after_results"] else ("yes" if r["amended"] else "")}
            for r in rows]
