"""``swapcheck sweep``: validate, plan and launch sweep specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from orchestrator.cli import sweep_verify
from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    Format,
    ResultsOpt,
    UserKernelsOpt,
    allow_user_kernels,
    emit_rows,
    err,
    out,
    user_errors,
)
from orchestrator.errors import Interrupted

app = typer.Typer(help="Validate, plan and launch sweeps (specs are TOML files under sweeps/).", no_args_is_help=True)

SPEC_ARG = typer.Argument(..., help="Sweep spec (TOML).", show_default=False)


@app.command("validate")
def validate(spec: Path = SPEC_ARG, user_kernels: UserKernelsOpt = True) -> None:
    """Check a spec: unknown keys, wrong types, unknown kernels and impossible parameters are errors.

    Example: swapcheck sweep validate sweeps/kdepth-demo.toml
    """
    with user_errors(), allow_user_kernels(user_kernels):
        from orchestrator.plan import make_plan
        from orchestrator.spec import load_spec
        loaded = load_spec(spec)
        plan = make_plan(loaded)
        out.print(f"{spec}: valid — sweep {plan.sweep!r}, {len(loaded.experiments)} experiment(s), {len(plan.units)} unit(s)")


@app.command("plan")
def plan(
    spec: Path = SPEC_ARG,
    results: str = typer.Option(None, "--results", help="If given, show which units are already done there."),
    fmt: Format = typer.Option(Format.table, "--format", help="table, json, csv or markdown."),
    user_kernels: UserKernelsOpt = True,
) -> None:
    """List the units a spec expands to, with their content-addressed ids; runs nothing.

    Example: swapcheck sweep plan sweeps/kdepth-demo.toml --format json
    """
    with user_errors(), allow_user_kernels(user_kernels):
        from orchestrator.plan import make_plan
        from orchestrator.spec import load_spec
        p = make_plan(load_spec(spec))
        done: set[str] = set()
        if results is not None:
            from storage.store import open_store

            done = open_store(results).done_units(p.sweep)
        rows = [
            {"unit_id": u.id, "experiment": u.experiment, "kind": u.kind, "unit": u.describe(),
             "resources": f"cpu={u.resources.num_cpus:g} gpu={u.resources.num_gpus:g}" + (" fresh-process" if u.fresh_process else ""),
             **({"status": "done" if u.id in done else "pending"} if results is not None else {})}
            for u in p.units
        ]
        emit_rows(rows, fmt, title=f"sweep {p.sweep}: {len(rows)} units")


@app.command("launch")
def launch(
    spec: Path = SPEC_ARG,
    results: ResultsOpt = DEFAULT_RESULTS,
    address: str = typer.Option(None, "--address", help="Join this Ray cluster instead of starting a local one (e.g. ray://head:10001, auto)."),
    num_cpus: int = typer.Option(None, "--num-cpus", min=1, help="CPUs of the embedded Ray instance (default: all)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    repair: bool = typer.Option(False, "--repair", help="First move aside the units `sweep verify` finds damaged, so exactly those are recomputed."),
    connect_timeout: float = typer.Option(30.0, "--connect-timeout", min=1, help="Seconds to reach --address before giving up (exit 2)."),
    user_kernels: UserKernelsOpt = True,
) -> None:
    """Run a sweep: one Ray task per unit, each writing its own Parquet file; finished units are skipped.

    Starts an embedded Ray instance on 127.0.0.1 unless --address is given. One launcher per sweep:
    a second one exits 2 naming the first. Relaunching the same spec after an interruption (Ctrl-C,
    SIGTERM, a killed driver) finishes the sweep without recomputing committed units. Exit code 0
    when every unit succeeded, 1 when some unit failed (its error is in the `units` table), 2 for bad
    input or an infrastructure failure, 3 when the results store failed mid-sweep, 130/143 when
    interrupted (docs/reliability.md).

    Example: swapcheck sweep launch sweeps/kdepth-demo.toml --results results
    """
    with user_errors(), allow_user_kernels(user_kernels):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        from orchestrator.runner import launch as run_launch
        from orchestrator.spec import load_spec
        loaded = load_spec(spec)
        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(), console=err,
                       disable=not progress)
        task_id = None

        def on_event(kind: str, info: dict[str, Any]) -> None:
            nonlocal task_id
            if kind == "start":
                err.print(f"sweep {loaded.sweep.name}: {info['total']} units, {info['skipped']} already done, {info['pending']} to run")
                if info["pending"]:
                    bar.start()
                    task_id = bar.add_task(loaded.sweep.name, total=info["pending"], failed=0)
            elif kind == "unit" and task_id is not None:
                failed = info["result"]["status"] != "ok"
                if failed:
                    bar.console.print(f"[red]failed[/] {info['unit'].describe()}: {(info['result']['error'] or '').splitlines()[0]}")
                bar.update(task_id, advance=1, failed=bar.tasks[0].fields["failed"] + int(failed))
            elif kind == "end":
                bar.stop()

        try:
            summary = run_launch(loaded, results, address=address, num_cpus=num_cpus, on_event=on_event,
                                 repair=repair, connect_timeout_s=connect_timeout)
        except KeyboardInterrupt:
            # Before Ray started or between two units being recorded: nothing half-written stays.
            raise Interrupted("SIGINT: stopped. Relaunch the same spec to resume.") from None
        finally:
            bar.stop()
        err.print(
            f"sweep {summary.sweep}: {summary.n_units} units — {summary.n_skipped} skipped (done before), "
            f"{summary.n_ok} ok, {summary.n_failed} failed — sweep time {summary.seconds:.1f} s — results in {summary.results}"
        )
        if summary.n_failed:
            raise typer.Exit(1)


app.command("verify")(sweep_verify.verify)
