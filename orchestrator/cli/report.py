"""``swapcheck report``: the tables people read."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    RESULTS_HELP,
    Format,
    emit_rows,
    out,
    user_errors,
)

app = typer.Typer(help="Reports over the results (tables, JSON for machines).", no_args_is_help=True)

def _human_row(r: dict) -> dict:
    """The K-depth table as people read it: one line per pair, scale mode and K."""
    return {
        "pair": f"{r['impl_a']} vs {r['impl_b']}",
        "scales": r["scale_mode"],
        "K": r["k"],
        "outputs": r["elements"],
        "differing": r["differing"],
        "ppm": r["ppm"],
        "max sp": r["max_spacing"],
        "max sp >5%": r["max_spacing_significant"],
        "1 / 2 / >2 sp": f"{r['hist_1']} / {r['hist_2']} / {r['hist_gt2']}",
    }


def _results_dir(results: Path) -> None:
    from orchestrator.errors import UsageError

    if not results.is_dir():
        raise UsageError(f"--results {results}: no such directory (run `swapcheck sweep launch` first)")


def _wide_rows(grp: list[dict]) -> list[dict]:
    ks = sorted({r["k"] for r in grp})
    lines: dict[tuple, dict] = {}
    for r in grp:
        line = lines.setdefault((r["impl_a"], r["impl_b"], r["scale_mode"]), {
            "pair": f"{r['impl_a']} vs {r['impl_b']}", "scales": r["scale_mode"], **{f"K={k}": "" for k in ks}})
        line[f"K={r['k']}"] = f"{r['ppm']:.3g} · {r['max_spacing']}"
    return list(lines.values())


@app.command("kdepth")
def kdepth(
    results: Path = typer.Option(Path(DEFAULT_RESULTS), "--results", help=RESULTS_HELP),
    sweep: str = typer.Option(None, "--sweep", help="Only this sweep (default: all)."),
    fmt: Format = typer.Option(Format.table, "--format", help="table, json, csv or markdown."),
    long: bool = typer.Option(False, "--long", help="One line per (pair, scale mode, K) with the spacing histogram."),
) -> None:
    """The K-depth table by dtype, implementation pair, scale mode and K, summed over seeds.

    By default one line per pair and scale mode, one column per K, each cell `ppm · max`: differing
    outputs per million and the largest distance in output spacings. `--long` gives one line per K
    with `max sp >5%` (the largest distance over outputs with |reference| >= 5% of the largest) and
    the counts of outputs 1, 2 and more than 2 spacings apart. JSON and CSV carry every column.

    Example: swapcheck report kdepth --results results --format json
    """
    with user_errors():
        from storage.catalog import run_named

        _results_dir(results)
        rows = run_named(results, "kdepth_summary", sweep=sweep).to_pylist()
        if fmt is Format.json or fmt is Format.csv:
            emit_rows(rows, fmt)
            return
        groups: dict[tuple, list] = {}
        for r in rows:
            r["ppm"] = round(1e6 * r["differing"] / r["elements"], 3) if r["elements"] else 0.0
            groups.setdefault((r["sweep"], r["dtype"], r["out_dtype"], r["comparison"]), []).append(r)
        if not rows:
            out.print("no kdepth results yet")
        for (sw, dtype, out_dtype, comparison), grp in groups.items():
            what = "pairs of implementations" if comparison == "pair" else "each implementation vs the reference"
            seeds = max(r["seeds"] for r in grp)
            title = f"{sw}: {dtype} -> {out_dtype}, {what} ({seeds} seeds summed)"
            if long:
                emit_rows([_human_row(r) for r in grp], fmt, title=title)
            else:
                emit_rows(_wide_rows(grp), fmt, title=title + " — cells: ppm differing · max spacings")


@app.command("units")
def units(
    results: Path = typer.Option(Path(DEFAULT_RESULTS), "--results", help=RESULTS_HELP),
    sweep: str = typer.Option(None, "--sweep", help="Only this sweep (default: all)."),
    fmt: Format = typer.Option(Format.table, "--format", help="table, json, csv or markdown."),
) -> None:
    """The ledger: units per sweep and status, attempts, rows, time, and an example error.

    Example: swapcheck report units --results results
    """
    with user_errors():
        from storage.catalog import run_named

        _results_dir(results)
        emit_rows(run_named(results, "unit_status", sweep=sweep).to_pylist(), fmt, title="units")
