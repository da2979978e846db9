"""Fuzzing hunts: the tables of ``report fuzz``.

Every number comes from the named queries ``fuzz_summary`` (one row per kernel hunt) and
``fuzz_failures`` (one row per saved failure); docs/checks.md, "Fuzzing and replay", says how a
hunt draws its trials and what an artifact holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reports.certificate import worst_verdict

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["failure_table", "failures", "summary", "summary_table"]


def summary(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    return cat.named("fuzz_summary", sweep=sweep)


def failures(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    return cat.named("fuzz_failures", sweep=sweep)


def summary_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per hunt: trials, each check's trials not IDENTICAL, the worst verdict, failures saved."""
    return [{"experiment": r["experiment"], "kernel": r["kernel"], "output": r["dtype"], "seed": r["seed"],
             "trials": r["trials"], "seconds": round(r["seconds"] or 0.0, 1),
             "exact match not identical": f"{r['em_not_identical']}/{r['trials']}",
             "bounds not identical": f"{r['bounds_not_identical']}/{r['trials']}",
             "worst verdict": worst_verdict(list(r["verdicts"])), "failures saved": r["failures"],
             "kernel errors": r["errors"]} for r in rows]


def _shape(m: Any, k: Any, n: Any) -> str:
    return "-" if m is None else f"{m}x{k}x{n}"


def failure_table(rows: list[dict[str, Any]], root: str | None = None) -> list[dict[str, Any]]:
    """One line per failure; ``replay`` is the command that reproduces it (``root``: the results root
    the artifact paths are relative to)."""
    out = []
    for r in rows:
        path = r["artifact"] if root is None else f"{root.rstrip('/')}/{r['artifact']}"
        where = ("-" if r["first_row"] is None else
                 f"C[{r['first_row']}, {r['first_col']}]: expected {r['first_expected']:.9g}, observed {r['first_observed']:.9g}")
        out.append({"experiment": r["experiment"], "kernel": r["kernel"], "output": r["dtype"], "trial": r["trial"],
                    "check": r["failed_check"], "verdict": r["verdict"], "drawn M x K x N": _shape(r["m"], r["k"], r["n"]),
                    "shrunk to": _shape(r["shrunk_m"], r["shrunk_k"], r["shrunk_n"]),
                    "first failing element": r["error"] or where, "replay": f"swapcheck check replay {path}"})
    return out
