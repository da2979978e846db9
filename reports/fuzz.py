"""Fuzzing hunts: the tables of ``report fuzz``.

Every number comes from the named queries ``fuzz_summary`` (one row per kernel hunt),
``fuzz_coverage`` (one row per hunt and boundary class) and ``fuzz_failures`` (one row per saved
failure); docs/checks.md, "Fuzzing and replay", says how a
hunt draws its trials and what an artifact holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reports.certificate import worst_verdict

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["coverage", "coverage_table", "failure_table", "failures", "summary", "summary_table"]


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
    """One line per failure; ``inputs`` is the bounds recipe or exact match's input kind (binary or
    cancelling-runs; binary in rows written before fuzz version 3), ``layout`` the operands' memory
    layout the artifact replays with; ``replay`` is the command that reproduces it (``root``: the
    results root the artifact paths are relative to)."""
    out = []
    for r in rows:
        path = r["artifact"] if root is None else f"{root.rstrip('/')}/{r['artifact']}"
        where = ("-" if r["first_row"] is None else
                 f"C[{r['first_row']}, {r['first_col']}]: expected {r['first_expected']:.9g}, observed {r['first_observed']:.9g}")
        inputs = r["recipe"] if r["failed_check"] == "bounds" else r.get("exact_inputs") or "binary"
        out.append({"experiment": r["experiment"], "kernel": r["kernel"], "output": r["dtype"], "trial": r["trial"],
                    "check": r["failed_check"], "verdict": r["verdict"], "inputs": inputs,
                    "layout": r.get("layout") or "contiguous (not recorded)",
                    "drawn M x K x N": _shape(r["m"], r["k"], r["n"]),
                    "shrunk to": _shape(r["shrunk_m"], r["shrunk_k"], r["shrunk_n"]),
                    "first failing element": r["error"] or where, "replay": f"swapcheck check replay {path}"})
    return out


def coverage(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    return cat.named("fuzz_coverage", sweep=sweep)


def _class_key(name: str) -> tuple[int, float, str]:
    """K, M, N, N's tail, layout; sizes in numeric order (``K=2^13+1`` after ``K=2^13``)."""
    group = 3 if name.startswith("N%16") else {"K": 0, "M": 1, "N": 2, "l": 4}.get(name[:1], 5)
    size = 0.0
    if name[1:2] == "=":
        body = name[2:]
        base, sign, delta = body.partition("+") if "+" in body else body.partition("-")
        size = float(2 ** int(base[2:]) if base.startswith("2^") else int(base))
        size += int(delta) if sign == "+" else -int(delta) if sign == "-" else 0
    elif "2..15" in name:
        size = 2
    elif "other" in name or ">" in name:
        size = 4096.5 if "<= 4096" in name else 1e9 if "other" in name else 1e9 + 1
    return group, size, name


def coverage_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (hunt, boundary class): trials that hit the class, and of those the trials that failed."""
    ordered = sorted(rows, key=lambda r: (r["experiment"], r["kernel"], r["dtype"], _class_key(r["class"])))
    return [{"experiment": r["experiment"], "kernel": r["kernel"], "output": r["dtype"],
             "boundary class": r["class"], "trials hitting it": r["trials"],
             "of those failed": r["failed"]} for r in ordered]
