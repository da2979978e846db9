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


def _results_dir(results: str) -> None:
    from orchestrator.errors import UsageError
    from storage.store import open_store

    if not open_store(results).exists():
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
    results: str = typer.Option(DEFAULT_RESULTS, "--results", help=RESULTS_HELP),
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
    results: str = typer.Option(DEFAULT_RESULTS, "--results", help=RESULTS_HELP),
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
    results: str = typer.Option(DEFAULT_RESULTS, "--results", help=RESULTS_HELP),
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
    results: str = typer.Option(DEFAULT_RESULTS, "--results", help=RESULTS_HELP),
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
        from storage.store import open_store

        _results_dir(results)
        store = open_store(results)
        sweeps = [sweep] if sweep else store.sweeps()
        rows = [r for s in sweeps for r in prereg.score(results, store, s)]
        edited = sorted({r["file"] for r in rows if r["file_edited_after_registration"]})
        if fmt in (Format.json, Format.csv):
            emit_rows(rows, fmt)
        elif not rows:
            out.print("no pre-registered predictions")
        else:
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
            title = f"pre-registered predictions of {rows[0]['sweep']}" if one_sweep else "pre-registered predictions"
            emit_rows(table, fmt, title=title)
        if edited:
            from orchestrator.cli.common import err

            err.print(f"[bold red]error:[/] registered prediction file(s) edited after registration: {', '.join(edited)}; "
                      "the registered text was scored. Restore them and put changes in an amendment file.")
            raise typer.Exit(1)


def _agreement(results: str, sweep: str | None) -> dict:
    """The agreement report as one object: per-arm, per-pair (with first divergences), per-position."""
    from statistics import median

    from storage.catalog import run_named

    self_rows = run_named(results, "self_reproducibility", sweep=sweep).to_pylist()
    cross = run_named(results, "cross_arm", sweep=sweep).to_pylist()
    first = run_named(results, "first_divergence", sweep=sweep).to_pylist()
    positions = run_named(results, "position_agreement", sweep=sweep).to_pylist()
    by_pair: dict[tuple, list[dict]] = {}
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
            "first_divergence": first}


_AGREEMENT_TABLES = ("all", "self", "cross", "divergence", "positions")


@app.command("agreement")
def agreement(
    results: str = typer.Option(DEFAULT_RESULTS, "--results", help=RESULTS_HELP),
    sweep: str = typer.Option(None, "--sweep", help="Only this sweep (default: all)."),
    fmt: Format = typer.Option(Format.table, "--format", help="table, json, csv or markdown."),
    table: str = typer.Option("all", "--table", help="all, self, cross, divergence or positions (CSV: one of the last four)."),
) -> None:
    """Bitwise agreement of generated sequences: each arm with itself across cold restarts, and arm pairs.

    `self`: per arm, the prompts whose generated sequence is bit-identical in every cold restart (k/N),
    the worker processes of the restarts (fresh processes: distinct processes = restarts) and whether
    the kernel-selection evidence matched the configured kernel. `cross`: per pair of arms of a sweep,
    the prompts whose restart-0 sequences are identical (k/N), the arms' scales, and the first
    generated position (0-based) where the others diverge (min / median / max; `divergence` lists
    every prompt). `positions`: per generated position, the share of prompts whose tokens agree there
    and whose sequences are still identical up to it. JSON (`--table all`): one object with
    `self_reproducibility`, `cross_arm` (each pair with `diverged`, `first_divergence`,
    `first_divergences`), `first_divergence` and `position_agreement`; another `--table` gives its rows.

    Example: swapcheck report agreement --results results --sweep e2e-demo --format json
    """
    with user_errors():
        import json
        import sys

        from orchestrator.errors import UsageError

        _results_dir(results)
        if table not in _AGREEMENT_TABLES:
            raise UsageError(f"--table {table!r}: allowed: {', '.join(_AGREEMENT_TABLES)}")
        if fmt is Format.csv and table == "all":
            raise UsageError("--format csv holds one table: add --table self, cross, divergence or positions")
        rep = _agreement(results, sweep)
        key = {"self": "self_reproducibility", "cross": "cross_arm", "divergence": "first_divergence",
               "positions": "position_agreement"}
        if fmt is Format.json and table == "all":
            from orchestrator.cli.common import _json_default

            sys.stdout.write(json.dumps(rep, default=_json_default, indent=1) + "\n")
            return
        if fmt in (Format.json, Format.csv):
            emit_rows(rep[key[table]], fmt)
            return
        if not rep["self_reproducibility"] and not rep["cross_arm"]:
            out.print("no generated sequences yet")
            return
        if table in ("all", "self"):
            emit_rows([{"sweep": r["sweep"], "arm": r["arm"], "scales": r["scales"] or "",
                        "kernel": r["configured_kernel"] or "",
                        "identical": (f"{r['identical']}/{r['total']}" if r["identical"] is not None
                                      else f"- ({r['restarts']} restart)"),
                        "restarts": r["restarts"],
                        "processes": _processes(r),
                        "evidence": "" if r["evidence_ok"] is None else ("ok" if r["evidence_ok"] else "NO"),
                        "not identical": ", ".join(map(str, r["nonidentical_prompts"][:8]))
                        + (" ..." if len(r["nonidentical_prompts"]) > 8 else "")}
                       for r in rep["self_reproducibility"]], fmt,
                      title="self-reproducibility: sequences bit-identical across cold restarts")
        if table in ("all", "cross"):
            rows = []
            for r in rep["cross_arm"]:
                fd = r["first_divergence"]
                divs = r["first_divergences"]
                rows.append({
                    "sweep": r["sweep"], "pair": f"{r['arm_a']} vs {r['arm_b']}",
                    "scales": (r["scales_a"] or "?") if r["same_scales"] else f"{r['scales_a'] or '?'} vs {r['scales_b'] or '?'}",
                    "identical": f"{r['identical']}/{r['total']}",
                    "first div min/med/max": f"{fd['min']} / {fd['median']:g} / {fd['max']}" if fd else "",
                    "prompt@position": ", ".join(f"{d['prompt_index']}@{d['first_divergence']}" for d in divs[:6])
                    + (" ..." if len(divs) > 6 else ""),
                })
            emit_rows(rows, fmt, title="cross-arm agreement: restart-0 sequences bit-identical (positions 0-based)")
        if table == "divergence":
            emit_rows([{"sweep": r["sweep"], "pair": f"{r['arm_a']} vs {r['arm_b']}", "prompt": r["prompt_index"],
                        "positions": r["positions"],
                        "first divergence": "" if r["first_divergence"] is None else r["first_divergence"],
                        "tokens a / b": "" if r["first_divergence"] is None else f"{r['token_a']} / {r['token_b']}",
                        "margins a / b": "" if r["first_divergence"] is None else
                        f"{_fmt_margin(r['margin_a'])} / {_fmt_margin(r['margin_b'])}"}
                       for r in rep["first_divergence"]], fmt, title="first divergence per prompt (restart 0)")
        if table == "positions":
            emit_rows([{"sweep": r["sweep"], "pair": f"{r['arm_a']} vs {r['arm_b']}", "position": r["position"],
                        "prompts": r["prompts"], "agreeing": r["agreeing"], "agreement": r["agreement"],
                        "identical prefix": r["identical_prefix"], "prefix agreement": r["prefix_agreement"]}
                       for r in rep["position_agreement"]], fmt, title="per-position agreement (restart 0)")


def _processes(r: dict) -> str:
    """`2 (pids 101, 102)`; `2 (h1:201, h2:201)` where a pid repeats on another host."""
    if r["distinct_processes"] is None:
        return ""
    if r["distinct_pids"] == r["distinct_processes"]:
        return f"{r['distinct_processes']} (pids {', '.join(map(str, r['pids']))})"
    return f"{r['distinct_processes']} ({', '.join(r['processes'])})"


def _fmt_margin(v: float | None) -> str:
    return "" if v is None else f"{v:.3g}"


@app.command("flips")
def flips(
    results: str = typer.Option(DEFAULT_RESULTS, "--results", help=RESULTS_HELP),
    sweep: str = typer.Option(None, "--sweep", help="Only this sweep (default: all)."),
    ref_arm: str = typer.Option(None, "--ref-arm", help="Only this reference arm (default: all)."),
    arm: str = typer.Option(None, "--arm", help="Only this scored arm (default: all)."),
    fmt: Format = typer.Option(Format.table, "--format", help="table, json, csv (the calibration table) or markdown."),
    bins: str = typer.Option("decades", "--bins", help="Calibration bins: decades (fixed, 0/1e-6/.../10) or quantile (10)."),
    resamples: int = typer.Option(1000, "--resamples", help="Bootstrap resamples for the AUC interval."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    ci_unit: str = typer.Option("sequence", "--ci-unit", help="Bootstrap unit: sequence (whole reference sequences) or position (stratified)."),
) -> None:
    """Flip risk from teacher-forced replay: does the reference margin predict where the other arm flips?

    Over the selected teacher_forced positions (pooled, and a line per sweep and arm pair): the flip
    rate; the ROC-AUC of the reference arm's top-1/top-2 logit margin as a flip predictor (score =
    -margin) with a seeded 95% percentile-bootstrap interval (resampling whole reference sequences,
    or positions with `--ci-unit position`); a logistic model of flip on log10(margin + 1e-7); a
    calibration table by margin bin (observed flip rate with its Wilson interval vs the model's mean
    prediction); and the margins at or below which 50/90/99% of flips lie, with the share of all
    positions there. With no flips (or only flips) AUC is null with a note. JSON: one object
    (`positions`, `flips`, `flip_rate`, `auc`, `auc_ci`, `model`, `calibration`,
    `concentration_margin`, `concentration`, `pairs`, `notes`); CSV: the calibration table.

    Example: swapcheck report flips --results results --sweep e2e-demo --ref-arm cutlass --arm triton --format json
    """
    with user_errors():
        import json
        import sys

        from orchestrator.errors import UsageError

        _results_dir(results)
        if bins not in ("decades", "quantile"):
            raise UsageError(f"--bins {bins!r}: allowed: decades, quantile")
        if ci_unit not in ("sequence", "position"):
            raise UsageError(f"--ci-unit {ci_unit!r}: allowed: sequence, position")
        if resamples < 1:
            raise UsageError(f"--resamples {resamples}: must be at least 1")
        from storage.fliprisk import flip_report

        rep = flip_report(results, sweep=sweep, ref_arm=ref_arm, arm=arm, bins=bins, resamples=resamples,
                          seed=seed, ci_unit=ci_unit)
        if fmt is Format.json:
            from orchestrator.cli.common import _json_default

            sys.stdout.write(json.dumps(rep, default=_json_default, indent=1) + "\n")
            return
        calib = [{"bin": r["bin"], "positions": r["positions"], "flips": r["flips"],
                  "observed": r["observed_rate"],
                  "observed 95%": f"{r['observed_ci'][0]:.3g} - {r['observed_ci'][1]:.3g}",
                  "predicted": r["predicted_rate"]} for r in rep["calibration"]]
        if fmt is Format.csv:
            emit_rows(calib, fmt)
            return
        if not rep["positions"]:
            out.print("no teacher-forced positions yet" + (" for this selection" if sweep or ref_arm or arm else ""))
            return
        auc_txt = "undefined" if rep["auc"] is None else f"{rep['auc']:.4f}"
        if rep["auc_ci"]:
            auc_txt += f" (95% CI {rep['auc_ci'][0]:.4f} - {rep['auc_ci'][1]:.4f}, {rep['ci']['used']} resamples of {rep['ci']['unit']}s)"
        out.print(f"{rep['positions']} positions, {rep['flips']} flips (rate {rep['flip_rate']:.4g}); "
                  f"ROC-AUC of -margin: {auc_txt}", highlight=False)
        if rep["model"]:
            m = rep["model"]
            out.print(f"logistic model: P(flip) = 1 / (1 + exp(-({m['intercept']:.4g} + {m['slope']:.4g} * "
                      f"log10(margin + {m['eps']:g}))))", highlight=False)
        if rep["concentration_margin"] is not None:
            c = next(c for c in rep["concentration"] if c["flip_share"] == 0.9)
            out.print(f"90% of flips at margin <= {c['margin']:.4g}, where {100 * c['share_of_positions']:.3g}% "
                      f"of positions lie (flip rate there {c['flip_rate_at_or_below']:.3g}, "
                      f"{c['enrichment']:.3g}x the overall rate)", highlight=False)
        for note in rep["notes"]:
            out.print(f"note: {note}", highlight=False)
        if len(rep["pairs"]) > 1 or fmt is Format.markdown:
            emit_rows([{"sweep": p["sweep"], "ref arm": p["ref_arm"], "arm": p["arm"], "positions": p["positions"],
                        "flips": p["flips"], "rate": p["flip_rate"],
                        "AUC": "undefined" if p["auc"] is None else f"{p['auc']:.4f}",
                        "95% CI": f"{p['auc_ci'][0]:.4f} - {p['auc_ci'][1]:.4f}" if p["auc_ci"] else "",
                        "90% flips below": p["concentration_margin"]} for p in rep["pairs"]], fmt,
                      title="per arm pair")
        emit_rows(calib, fmt, title=f"calibration by margin bin ({rep['calibration_bins']})")
        if rep["concentration"]:
            emit_rows([{"flips": f"{100 * c['flip_share']:g}%", "margin <=": c["margin"],
                        "positions there": f"{100 * c['share_of_positions']:.3g}%",
                        "flip rate there": c["flip_rate_at_or_below"], "flip rate above": c["flip_rate_above"],
                        "enrichment": c["enrichment"]} for c in rep["concentration"]], fmt,
                      title="where flips concentrate")


@app.command("all")
def all_(
    results: str = typer.Option(DEFAULT_RESULTS, "--results", help=RESULTS_HELP),
    sweep: str = typer.Option(None, "--sweep", help="Only this sweep (default: all)."),
    fmt: Format = typer.Option(Format.markdown, "--format", help="html or markdown."),
    out_file: Path = typer.Option(None, "--out", help="Write here instead of standard output (required for html)."),
) -> None:
    """Everything in one document: K-depth curves, replay heatmap, ROC and calibration plots, tables.

    HTML embeds its images (no network needed to view it); Markdown carries the tables (conformance
    summary per kernel pair, agreement, prediction scorecard, provenance) for terminals and PRs.

    Example: swapcheck report all --results results --format html --out report.html
    """
    with user_errors():
        from orchestrator.errors import UsageError
        from storage.report import html_document, markdown_document

        _results_dir(results)
        if fmt not in (Format.html, Format.markdown):
            raise UsageError(f"--format {fmt.value}: `report all` writes html or markdown")
        if fmt is Format.html and out_file is None:
            raise UsageError("--format html needs --out FILE")
        text = html_document(results, sweep) if fmt is Format.html else markdown_document(results, sweep)
        if out_file is None:
            typer.echo(text)
        else:
            out_file.write_text(text, encoding="utf-8")
            out.print(f"wrote {out_file}")


@app.command("conformance")
def conformance(
    results: str = typer.Option(DEFAULT_RESULTS, "--results", help=RESULTS_HELP),
    sweep: str = typer.Option(None, "--sweep", help="Only this sweep (default: all)."),
    fmt: Format = typer.Option(Format.table, "--format", help="table, json, csv or markdown."),
) -> None:
    """One page per kernel pair: what each experiment says about swapping one kernel for the other.

    K-depth (bit-identical or ppm differing and the largest spacing, per dtype and scale mode),
    per-layer replay (k/N layers identical), end to end (k/N sequences identical across arms), and
    each kernel's check verdicts.

    Example: swapcheck report conformance --results results --sweep demo
    """
    with user_errors():
        from storage.report import check_rows
        from storage.report import conformance as summary

        _results_dir(results)
        emit_rows(summary(results, sweep), fmt, title="conformance summary per kernel pair")
        checks = check_rows(results, sweep)
        if checks and fmt not in (Format.json, Format.csv):
            emit_rows(checks, fmt, title="kernel checks (worst verdict over trials and shapes)")
