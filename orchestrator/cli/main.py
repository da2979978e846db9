"""swapcheck: can kernel A replace kernel B without changing what the model computes?"""

from __future__ import annotations

import typer

from orchestrator.cli import check, kernels, nightly, numerics, query, report, sweep

app = typer.Typer(
    name="swapcheck",
    help=__doc__ + "\n\nStart with `swapcheck sweep launch sweeps/kdepth-demo.toml`, then `swapcheck report kdepth`.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)


@app.callback()
def _main() -> None:
    # A user's kernel named "module:attr" lives in their project: import it from the current
    # directory, as `python -m` would (Ray workers of the embedded instance run there too).
    import os
    import sys

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


app.add_typer(sweep.app, name="sweep")
app.add_typer(kernels.app, name="kernels")
app.add_typer(report.app, name="report")
app.add_typer(check.app, name="check")
app.add_typer(numerics.app, name="numerics")
app.command("query")(query.query)
app.command("nightly")(nightly.nightly)


@app.command("version")
def version() -> None:
    """Print swapcheck's version."""
    from importlib.metadata import version as v

    typer.echo(v("swapcheck"))


if __name__ == "__main__":  # pragma: no cover
    app()
