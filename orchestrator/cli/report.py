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


@app.command("replay")
def replay(
    results: Path = typer.Option(Path(DEFAULT_RESULTS), "--results", help=RESULTS_HELP),
    sweep: str = typer.Option(None, "--sweep", help="Only this sweep (default: all)."),
    fmt: Format = typer.Option(Format.table, "--format", help="table, json, csv or markdown."),
    by: str = typer.Option("both", "--by", help="type, layer or both (tables); JSON is always per layer."),
) -> None:
    """Per-layer operand replay: bitwise agreement of each kernel pair on identical captured operands.

    Per layer type: how many layers are bit-identical, the differing fraction and the largest
    distance in output spacings; per layer: the same plus the integer alibi (the int32 accumulators
    of both kernels agree). `capture` rows check that the capture kernel reproduces the model's own
    outputs from the saved operands.

    Example: swapcheck report replay --results results --format json
    """
    with user_errors():
        from orchestrator.errors import UsageError
        from storage.catalog import run_named

        _results_dir(results)
        if by not in ("type", "layer", "both"):
            raise UsageError(f"--by {by!r}: allowed: type, layer, both")
        per_layer = run_named(results, "replay_by_layer", sweep=sweep).to_pylist()
        if fmt in (Format.json, Format.csv):
            emit_rows(per_layer, fmt)
            return
        if not per_layer:
            out.print("no replay results yet")
            return
        if by in ("type", "both"):
            rows = run_named(results, "replay_by_type", sweep=sweep).to_pylist()
            emit_rows([{"pair": f"{r['impl_a']} vs {r['impl_b']}", "scales": r["scale_mode"], "type": r["layer_type"],
                        "identical": f"{r['identical_layers']}/{r['layers']} layers", "outputs": r["elements"],
                        "differing": r["differing"], "ppm": round(1e6 * r["frac_differing"], 3),
                        "max sp": r["max_spacing"],
                        "acc equal": "" if r["accumulators_equal"] is None else ("yes" if r["accumulators_equal"] else "NO")}
                       for r in rows], fmt, title="replay by layer type")
        if by in ("layer", "both"):
            emit_rows([{"pair": f"{r['impl_a']} vs {r['impl_b']}", "scales": r["scale_mode"], "layer": r["layer"],
                        "outputs": r["elements"], "differing": r["differing"], "max sp": r["max_spacing"],
                        "identical": "yes" if r["bitwise_equal"] else "no",
                        "acc equal": "" if r["accumulators_equal"] is None else ("yes" if r["accumulators_equal"] else "NO")}
                       for r in per_layer], fmt, title="replay by layer")


@app.command("predictions")
def predictions(
    results: Path = typer.Option(Path(DEFAULT_RESULTS), "--results", help=RESULTS_HELP),
    sweep: str = typer.Option(None, "--sweep", help="Only this sweep (default: every sweep with predictions)."),
    fmt: Format = typer.Option(Format.table, "--format", help="table, json, csv or markdown."),
) -> None:
    """Score the pre-registered predictions against the results: confirmed or refuted, with support.

    Each prediction was hashed into the sweep before any unit ran; amended predictions are marked,
    and so are amendments registered after results existed. A registered file edited on disk after
    registration is reported and makes the command exit 1 (the registered text is what is scored).

    Example: swapcheck report predictions --results results --format json
    """
    with user_errors():
        from orchestrator import prereg
        from storage.store import ResultStore

        _results_dir(results)
        store = ResultStore(results)
        sweeps = [sweep] if sweep else store.sweeps()
        rows = [r for s in sweeps for r in prereg.score(results, store, s)]
        edited = sorted({r["file"] for r in rows if r["file_edited_after_registration"]})
        if fmt in (Format.json, Format.csv):
            emit_rows(rows, fmt)
        elif not rows:
            out.print("no pre-registered predictions")
        else:
            emit_rows([{"sweep": r["sweep"], "prediction": r["prediction"],
                        "status": r["status"].upper(),
                        "support": f"{r['support']} {r['noun']}" if r["noun"] else r["support"],
                        "measured": r["measured"], "counterexample": r["counterexample"] or "",
                        "amended": ("after results" if r["amended_after_results"] else "yes") if r["amended"] else ""}
                       for r in rows], fmt, title="pre-registered predictions")
        if edited:
            from orchestrator.cli.common import err

            err.print(f"[bold red]error:[/] registered prediction file(s) edited after registration: {', '.join(edited)}; "
                      "the registered text was scored. Restore them and put changes in an amendment file.")
            raise typer.Exit(1)
