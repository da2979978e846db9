"""``swapcheck nightly``: the regression job the cluster runs every night."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    ResultsOpt,
    UserKernelsOpt,
    allow_user_kernels,
    err,
    note,
    out,
    plural,
    user_errors,
)


def nightly(
    suite: Path = typer.Argument(Path("sweeps/nightly.toml"), help="The conformance suite (a sweep spec)."),
    baseline: Path = typer.Option(..., "--baseline", help="Baseline metrics (JSON) to compare with."),
    results: ResultsOpt = DEFAULT_RESULTS,
    update_baseline: bool = typer.Option(False, "--update-baseline", help="Accept today's metrics as the new baseline."),
    address: str = typer.Option(None, "--address", help="Ray cluster to run on (default: RAY_ADDRESS if set, else an embedded local instance)."),
    num_cpus: int = typer.Option(None, "--num-cpus", min=1, help="CPUs of the embedded Ray instance."),
    user_kernels: UserKernelsOpt = False,
) -> None:
    """Run the suite as a dated sweep, compare its metrics with the baseline and the previous night.

    Writes report.md, report.html and report.json under RESULTS/nightly/<sweep>/ saying what changed
    (give the results root: `--results results` gives results/nightly/<sweep>/). Progress goes to
    stderr even when it is not a terminal (a line every tenth of the units or 10 s; -q: none).
    Exit 0 when nothing regressed, 1 on a regression (each metric named with its baseline and today's
    value), 2 on bad input or an infrastructure failure (never reported as a numerical regression).
    Kernels named by module:attr are refused unless --user-kernels is given: the suite runs
    unattended, so nothing outside swapcheck's own kernels is imported by default.

    Example: swapcheck nightly sweeps/nightly.toml --baseline baselines/nightly.json --results results
    """
    with user_errors(), allow_user_kernels(user_kernels):
        from orchestrator.cli.progress import UnitProgress
        from orchestrator.nightly import run_nightly

        units = UnitProgress("nightly")

        def on_event(kind: str, info: dict[str, Any]) -> None:
            if kind != "nightly":
                units(kind, info)
            elif info["phase"] == "launch":
                units.label = f"nightly {info['sweep']}"
                note(f"nightly {info['sweep']}: launching {suite} (starting Ray first)")
            else:
                note(f"nightly {info['sweep']}: every unit ran; computing metrics, comparing and writing the report")

        try:
            outcome = run_nightly(suite, baseline, results, update_baseline=update_baseline, address=address,
                                  num_cpus=num_cpus, on_event=on_event)
        finally:
            units.stop()
        for c in outcome.regressions:
            err.print(f"[bold red]REGRESSION[/] {c['metric']} ({c['rule']}): baseline {c['baseline']} -> today {c['today']}")
        if outcome.baseline_created:
            verdict = f"baseline created with {plural(outcome.metrics, 'metric')} in {baseline}"
        else:
            verdict = ("regression" if outcome.exit_code == 1 else "baseline updated" if outcome.baseline_updated
                       else "no regression")
            changed = len(outcome.changes)
            verdict += f"; {plural(changed, 'metric')} changed since the baseline"
        out.print(f"nightly {outcome.sweep}: {verdict}"
                  + (f", {plural(len(outcome.since_previous), 'metric')} since {outcome.previous}" if outcome.previous else "")
                  + f"; report in {outcome.report_dir}", highlight=False)
        raise typer.Exit(outcome.exit_code)
