"""Bitwise agreement of generated sequences: each arm with itself across cold restarts, and arm pairs.

One definition per fact: ``self_reproducibility`` (k/N prompts identical across restarts),
``distinct_completions`` (distinct sequences the N cold restarts of an arm produce per prompt),
``cross_arm`` (k/N prompts whose restart-0 sequences are identical across two arms),
``first_divergence`` and ``position_agreement`` (storage/queries/*.sql). ``report conformance``, ``report
all`` and the nightly metrics read the same rows.
"""

from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING, Any

from reports.noise_floor import distinct_table

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["TABLE_KEYS", "agreement", "cross_table", "distinct_table", "divergence_table", "positions_table",
           "self_cell", "self_table"]

#: ``--table`` name -> the key of the agreement report holding its rows.
TABLE_KEYS = {"self": "self_reproducibility", "cross": "cross_arm", "divergence": "first_divergence",
              "positions": "position_agreement", "distinct": "distinct_completions"}


def agreement(cat: Catalog, sweep: str | None) -> dict[str, Any]:
    """The agreement report as one object: per-arm, per-pair (with first divergences), per-position."""
    self_rows = cat.named("self_reproducibility", sweep=sweep)
    cross = cat.named("cross_arm", sweep=sweep)
    first = cat.named("first_divergence", sweep=sweep)
    positions = cat.named("position_agreement", sweep=sweep)
    by_pair: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in first:
        if r["first_divergence"] is not None:
            by_pair.setdefault((r["sweep"], r["arm_a"], r["arm_b"]), []).append(
                {k: r[k] for k in ("prompt_index", "first_divergence", "token_a", "token_b", "margin_a", "margin_b")})
    for c in cross:
        divs = by_pair.get((c["sweep"], c["arm_a"], c["arm_b"]), [])
        at = [d["first_divergence"] for d in divs]
        c["diverged"] = len(divs)
        c["first_divergence"] = {"min": min(at), "median": median(at), "max": max(at)} if at else None
        c["first_divergences"] = divs
    return {"sweep": sweep, "self_reproducibility": self_rows, "cross_arm": cross, "position_agreement": positions,
            "first_divergence": first, "distinct_completions": cat.named("distinct_completions", sweep=sweep)}


def self_cell(identical: int | None, total: int, restarts: int | None) -> str:
    """Self-reproducibility as people read it: ``k/N`` prompts identical across the cold restarts, or
    that it was not measured when an arm ran once per prompt (``self_reproducibility.identical`` is
    NULL below 2 restarts: there is nothing to compare)."""
    if identical is None:
        return "not measured (one run per prompt)"
    return f"{identical}/{total}"


def processes(r: dict[str, Any]) -> str:
    """`2 (pids 101, 102)`; `2 (h1:201, h2:201)` where a pid repeats on another host."""
    if r["distinct_processes"] is None:
        return ""
    if r["distinct_pids"] == r["distinct_processes"]:
        return f"{r['distinct_processes']} (pids {', '.join(map(str, r['pids']))})"
    return f"{r['distinct_processes']} ({', '.join(r['processes'])})"


def fmt_margin(v: float | None) -> str:
    return "" if v is None else f"{v:.3g}"


def self_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"sweep": r["sweep"], "arm": r["arm"], "scales": r["scales"] or "",
             "kernel": r["configured_kernel"] or "",
             "identical": self_cell(r["identical"], r["total"], r["restarts"]),
             "restarts": r["restarts"],
             "processes": processes(r),
             "evidence": "" if r["evidence_ok"] is None else ("ok" if r["evidence_ok"] else "NO"),
             "not identical": ", ".join(map(str, r["nonidentical_prompts"][:8]))
             + (" ..." if len(r["nonidentical_prompts"]) > 8 else "")}
            for r in rows]


def cross_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        fd = r["first_divergence"]
        divs = r["first_divergences"]
        out.append({
            "sweep": r["sweep"], "pair": f"{r['arm_a']} vs {r['arm_b']}",
            "scales": (r["scales_a"] or "?") if r["same_scales"] else f"{r['scales_a'] or '?'} vs {r['scales_b'] or '?'}",
            "identical": f"{r['identical']}/{r['total']}",
            "first div min/med/max": f"{fd['min']} / {fd['median']:g} / {fd['max']}" if fd else "",
            "prompt@position": ", ".join(f"{d['prompt_index']}@{d['first_divergence']}" for d in divs[:6])
            + (" ..." if len(divs) > 6 else ""),
        })
    return out


def divergence_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"sweep": r["sweep"], "pair": f"{r['arm_a']} vs {r['arm_b']}", "prompt": r["prompt_index"],
             "positions": r["positions"],
             "first divergence": "" if r["first_divergence"] is None else r["first_divergence"],
             "tokens a / b": "" if r["first_divergence"] is None else f"{r['token_a']} / {r['token_b']}",
             "margins a / b": "" if r["first_divergence"] is None else
             f"{fmt_margin(r['margin_a'])} / {fmt_margin(r['margin_b'])}"}
            for r in rows]


def positions_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"sweep": r["sweep"], "pair": f"{r['arm_a']} vs {r['arm_b']}", "position": r["position"],
             "prompts": r["prompts"], "agreeing": r["agreeing"], "agreement": r["agreement"],
             "identical prefix": r["identical_prefix"], "prefix agreement": r["prefix_agreement"]}
            for r in rows]


def summary_tables(cat: Catalog, sweep: str | None) -> list[tuple[str, list[dict[str, Any]]]]:
    """The agreement tables of ``report all``: self-reproducibility and cross-arm (restart 0)."""
    self_rows = cat.named("self_reproducibility", sweep=sweep)
    if not self_rows:
        return []
    cross = cat.named("cross_arm", sweep=sweep)
    distinct = distinct_table(cat.named("distinct_completions", sweep=sweep))
    return [("Self-reproducibility across cold restarts",
             [{"arm": r["arm"], "identical": self_cell(r["identical"], r["total"], r.get("restarts")),
               "restarts": r.get("restarts")}
              for r in self_rows]),
            ("Cross-arm agreement (restart 0)",
             [{"pair": f"{r['arm_a']} vs {r['arm_b']}", "identical": f"{r['identical']}/{r['total']}"} for r in cross]),
            ("Distinct completions in N cold restarts, per arm", distinct)]
