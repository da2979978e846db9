"""``swapcheck numerics``: the exact-numerics library (tasks.numerics) by example."""

from __future__ import annotations

from enum import Enum

import typer

app = typer.Typer(
    help="Exact numerics: accumulation orders, their error models and bounds (tasks.numerics).",
    no_args_is_help=True,
)


class DemoFormat(str, Enum):
    """``numerics demo --format``: the four lines, or one JSON object."""

    text = "text"
    json = "json"


@app.command("demo")
def demo(
    k: int = typer.Option(64, "--k", min=1, help="Number of products for the error model."),
    fmt: DemoFormat = typer.Option(DemoFormat.text, "--format", help="text (four lines) or json (one object)."),
) -> None:
    """Add 300 bfloat16 ones three ways, then print a pairwise fp32 error model.

    The reference rounds the exact sum once (300).  Added one at a time in bfloat16 the sum sticks
    at 256, where bfloat16 values are 2 apart and adding 1 rounds back down; added as a balanced
    tree every partial sum fits and the answer is exact.  The error model of a pairwise fp32 sum of
    K rounded products is gamma_n * sum |A B| + N * eta (docs/numerics.md derives n = 8, N = 191 for
    K = 64).

    Example: swapcheck numerics demo --k 4096 --format json
    """
    import ml_dtypes
    import numpy as np

    from tasks.numerics import products

    ones = np.ones((1, 300), dtype=ml_dtypes.bfloat16)
    column = ones.reshape(300, 1)
    lines = [
        ("reference", products.matmul(ones, column).rounded.tolist()),
        ("sequential", products.matmul_sequential("bfloat16", fma=False).run(ones, column).tolist()),
        ("pairwise", products.matmul_pairwise("bfloat16", fma=False).run(ones, column).tolist()),
        ("error_model", str(products.matmul_pairwise("float32", fma=False).error_model(k))),
    ]
    if fmt is DemoFormat.json:
        from orchestrator.cli.report_options import write_json

        write_json({"k": k, **dict(lines)})
        return
    for name, value in lines:
        typer.echo(f"{'pairwise' if name == 'error_model' else name}: {value}")
