"""``swapcheck sweep``: validate, plan and launch sweep specs."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli import sweep_verify
from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    FormatOpt,
    ResultsOpt,
    TableFormat,
    UserKernelsOpt,
    allow_user_kernels,
    emit_rows,
    err,
    out,
    plural,
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
        out.print(f"{spec}: valid — sweep {plan.sweep!r}, {plural(len(loaded.experiments), 'experiment')}, "
                  f"{plural(len(plan.units), 'unit')}")


@app.command("plan")
def plan(
    spec: Path = SPEC_ARG,
    results: str = typer.Option(None, "--results", help="If given, show which units are already done there."),
    fmt: FormatOpt = TableFormat.table,
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
        emit_rows(rows, fmt, title=f"sweep {p.sweep}: {plural(len(rows), 'unit')}")
        if fmt is TableFormat.table:
            from orchestrator.gpu_time import estimate

            for line in estimate(p).lines():  # the GPU units' expected time on one H200, with its assumptions
                err.print(line, highlight=False, markup=False)


@app.command("launch")
def launch(
    spec: Path = SPEC_ARG,
    results: ResultsOpt = DEFAULT_RESULTS,
    address: str = typer.Option(None, "--address", help="Join this Ray cluster (ray://head:10001, head:6379 or auto) instead of starting a local one; "
                                 "default: $RAY_ADDRESS when set (as under `ray job submit`), else an embedded instance."),
    num_cpus: int = typer.Option(None, "--num-cpus", min=1, help="CPUs of the embedded Ray instance (default: all)."),
    progress: bool = typer.Option(True, "--progress/--no-progress",
                                  help="Show progress (a bar on a terminal, else a line every tenth of the units or 10 s)."),
    repair: bool = typer.Option(False, "--repair", help="First move aside the units `sweep verify` finds damaged, so exactly those are recomputed."),
    connect_timeout: float = typer.Option(30.0, "--connect-timeout", min=1, help="Seconds to reach --address before giving up (exit 2)."),
    user_kernels: UserKernelsOpt = True,
) -> None:
    """Run a sweep: one Ray task per unit, each writing its own Parquet file; finished units are skipped.

    Starts an embedded Ray instance on 127.0.0.1 unless --address (or RAY_ADDRESS) names a cluster to
    join; a joined cluster's address, alive nodes, CPUs and GPUs are printed before anything runs.
    One launcher per sweep: a second one exits 2 naming the first. Relaunching the same spec after an interruption (Ctrl-C,
    SIGTERM, a killed driver) finishes the sweep without recomputing committed units. Exit code 0
    when every unit succeeded, 1 when some unit failed (its error is in the `units` table), 2 for bad
    input or an infrastructure failure, 3 when the results store failed mid-sweep, 130/143 when
    interrupted (docs/reliability.md).

    Example: swapcheck sweep launch sweeps/kdepth-demo.toml --results results
    """
    with user_errors(), allow_user_kernels(user_kernels):
        from orchestrator.cli.progress import UnitProgress
        from orchestrator.runner import launch as run_launch
        from orchestrator.spec import load_spec

        loaded = load_spec(spec)
        on_event = UnitProgress(f"sweep {loaded.sweep.name}", enabled=progress)

        try:
            summary = run_launch(loaded, results, address=address, num_cpus=num_cpus, on_event=on_event,
                                 repair=repair, connect_timeout_s=connect_timeout)
        except KeyboardInterrupt:
            # Before Ray started or between two units being recorded: nothing half-written stays.
            raise Interrupted("SIGINT: stopped. Relaunch the same spec to resume.") from None
        finally:
            on_event.stop()
        err.print(f"sweep {summary.sweep}: {plural(summary.n_units, 'unit')} — {summary.n_skipped} skipped (done before), "
                  f"{summary.n_ok} ok, {summary.n_failed} failed — sweep time {summary.seconds:.1f} s — "
                  f"results in {summary.results}", highlight=False, markup=False)
        if not summary.n_ok and not summary.n_failed and summary.n_skipped and not repair:
            sweep_verify.hint_damage(summary.results, summary.sweep)
        if summary.n_failed:
            raise typer.Exit(1)


app.command("verify")(sweep_verify.verify)
