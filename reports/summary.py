"""The first screen of ``report all``: each sweep's question and its answer, before any table.

A sweep's spec opens with the question it answers (``sweeps`` records it, with ``created_at``, the
first launch of the spec: named query ``sweep_questions``). The kernel pairs that question is about
come first, then the others from the most severe verdict down (``swapcheck_common.verdicts``'s
order); several sweeps appear in the order their specs were first launched.

Which pairs a question is about, read from its words: a pair whose two kernels the question names,
each by its full name (``int8-cutlass-order``) or by the parts of its name the other kernel's lacks
(``int8-cutlass-order`` vs ``int8-triton-order``: "cutlass" and "triton", as sweeps/demo.toml's
question says "vLLM's CUTLASS and Triton kernels"), case ignored. A question that names no pair has
none: its sweep's answer is then the count of its pairs per verdict.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any

from swapcheck_common.verdicts import VERDICT_ORDER

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["FIRST_COLUMNS", "about_question", "answers", "launch_order", "ordered", "questions"]

#: The verdict table's own columns; every other column of a verdict row goes to the detail below it.
FIRST_COLUMNS = ("pair", "verdict", "answer")
#: Not repeated in the detail under the verdict table (the pair names the kernels; a table is one sweep's).
NOT_DETAIL = frozenset({"sweep", "kernel_a", "kernel_b", "verdict", "answer"})


def questions(cat: Catalog, sweep: str | None) -> dict[str, dict[str, Any]]:
    """sweep -> {question, created_at} for the sweeps with a spec record, in launch order."""
    return {r["sweep"]: {"question": " ".join((r["question"] or "").split()), "created_at": r["created_at"]}
            for r in cat.named("sweep_questions", sweep=sweep)}


def launch_order(sweeps: list[str], asked: dict[str, dict[str, Any]]) -> list[str]:
    """The sweeps in the order their specs were first launched; those without a spec record last, by name."""
    known = [s for s in asked if s in sweeps]
    return known + sorted(s for s in sweeps if s not in asked)


def _kernels(row: dict[str, Any]) -> tuple[str, str]:
    if row.get("kernel_a") and row.get("kernel_b"):
        return str(row["kernel_a"]), str(row["kernel_b"])
    a, _, b = str(row.get("pair") or "").partition(" vs ")
    return a, b


def _parts(name: str) -> list[str]:
    return [p for p in re.split(r"[-_.:/ ]+", name.lower()) if p]


def _named(question: str, kernel: str, other: str) -> bool:
    """Whether the question names ``kernel``: in full, or by every part of its name ``other`` lacks."""
    q = question.lower()
    if re.search(rf"(?<![\w-]){re.escape(kernel.lower())}(?![\w-])", q):
        return True
    own = [p for p in _parts(kernel) if p not in _parts(other)]
    return bool(own) and all(re.search(rf"\b{re.escape(p)}\b", q) for p in own)


def about_question(question: str, row: dict[str, Any]) -> bool:
    """Whether the verdict row's pair is one the question is about (see the module docstring)."""
    a, b = _kernels(row)
    return bool(question and a and b) and _named(question, a, b) and _named(question, b, a)


def _severity(row: dict[str, Any]) -> int:
    verdict = str(row.get("verdict") or "")
    return VERDICT_ORDER.index(verdict) if verdict in VERDICT_ORDER else len(VERDICT_ORDER)


def ordered(rows: list[dict[str, Any]], question: str) -> list[dict[str, Any]]:
    """The question's pairs first (in their order), then the rest from the most severe verdict down."""
    asked = [r for r in rows if about_question(question, r)]
    rest = sorted((r for r in rows if not about_question(question, r)), key=lambda r: -_severity(r))
    return asked + rest


def answers(cat: Catalog, sweeps: list[str], rows: list[dict[str, Any]],
            asked: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per sweep (in ``sweeps``' order): its question, the pairs it is about (their verdict
    and one-line answer), the answer of each report that gives one (``Report.answer``: e.g.
    ``report localize``'s culprits), the count of every pair per verdict, and its verdict rows ordered for the
    table: ``first`` (pair, verdict, answer) and ``detail`` (the pair and every other column: the
    certificate's scale modes and spacing evidence)."""
    from reports.registry import reports

    out = []
    for sw in sweeps:
        question = asked.get(sw, {}).get("question", "")
        mine = ordered([r for r in rows if r.get("sweep") in (sw, None)], question)
        headline = [r for r in mine if about_question(question, r)]
        counts = Counter(str(r.get("verdict")) for r in mine)
        said = [(rep.name, rep.answer(cat, sw)) for rep in reports() if rep.answer is not None]
        out.append({
            "sweep": sw, "question": question, "created_at": asked.get(sw, {}).get("created_at"),
            "about": [{k: r[k] for k in FIRST_COLUMNS if k in r} for r in headline],
            "reports": [{"report": name, "answer": line} for name, line in said if line],
            "verdict_counts": {v: counts[v] for v in sorted(counts, key=lambda v: _severity({"verdict": v}))},
            "pairs": len(mine),
            "first": [{k: r[k] for k in FIRST_COLUMNS if k in r} for r in mine],
            "detail": [{k: v for k, v in r.items() if k not in NOT_DETAIL} for r in mine],
            "headline": [about_question(question, r) for r in mine],
        })
    return out
