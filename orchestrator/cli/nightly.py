"""``swapcheck nightly``: the regression job the cluster runs every night."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    ResultsOpt,
    UserKernelsOpt,
    allow_user_kernels,
    err,
    out,
    user_errors,
)


def nightly(
    suite: Path = typer.Argument(Path("sweeps/nightly.toml"), help="The conformance suite (a sweep spec)."),
    baseline: Path = typer.Option(..., "--baseline", help="Baseline metrics (JSON) to compare with."),
    results: ResultsOpt = DEFAULT_RESULTS,
    update_baseline: bool = typer.Option(False, "--update-baseline", help="Accept today's metrics as the new baseline."),
    address: str = typer.Option(None, "--address", help="Ray cluster to run on (default: an embedded local instance)."),
    num_cpus: int = typer.Option(None, "--num-cpus", min=1, help="CPUs of the embedded Ray instance."),
    user_kernels: UserKernelsOpt = False,
) -> None:
    """Run the suite as a dated sweep, compare its metrics with the baseline and the previous night.

    Writes report.md, report.html and report.json under RESULTS/nightly/<sweep>/ saying what changed.
    Exit 0 when nothing regressed, 1 on a regression (each metric named with its baseline and today's
    value), 2 on bad input or an infrastructure failure (never reported as a numerical regression).
    Kernels named by module:attr are refused unless --user-kernels is given: the suite runs
    unattended, so nothing outside swapcheck's own kernels is imported by default.

    Example: swapcheck nightly sweeps/nightly.toml --baseline baselines/nightly.json --results /results/nightly
    """
    with user_errors(), allow_user_kernels(user_kernels):
        from orchestrator.nightly import run_nightly
        outcome = run_nightly(suite, baseline, results, update_baseline=update_baseline, address=address,
                              num_cpus=num_cpus)
        for c in outcome.regressions:
            err.print(f"[bold red]REGRESSION[/] {c['metric']} ({c['rule']}): baseline {c['baseline']} -> today {c['today']}")
        verdict = "regression" if outcome.exit_code == 1 else ("baseline updated" if outcome.baseline_updated else "no regression")
        out.print(f"nightly {outcome.sweep}: {verdict}; {len(outcome.changes)} metric(s) changed since the baseline"
                  + (f", {len(outcome.since_previous)} since {outcome.previous}" if outcome.previous else "")
                  + f"; report in {outcome.report_dir}")
        raise typer.Exit(outcome.exit_code)
