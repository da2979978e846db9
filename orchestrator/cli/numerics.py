"""``swapcheck numerics``: the exact-numerics library (tasks.numerics) by example."""

from __future__ import annotations

from enum import Enum

import typer

app = typer.Typer(
    help="Exact numerics: accumulation orders, their error models and bounds (tasks.numerics).",
    no_args_is_help=True,
)


class DemoFormat(str, Enum):
    """``numerics demo --format``: the six lines (each value with what it is and its yardstick), or one JSON object."""

    text = "text"
    json = "json"


@app.command("demo")
def demo(
    k: int = typer.Option(64, "--k", min=1, help="Number of products for the error model."),
    fmt: DemoFormat = typer.Option(DemoFormat.text, "--format", help="text (six lines) or json (one object)."),
) -> None:
    """Add 300 bfloat16 ones three ways, print a pairwise fp32 error model, then the seed's
    attention tolerances.

    The reference rounds the exact sum once (300).  Added one at a time in bfloat16 the sum sticks
    at 256, where bfloat16 values are 2 apart and adding 1 rounds back down; added as a balanced
    tree every partial sum fits and the answer is exact.  The error model of a pairwise fp32 sum of
    K rounded products is gamma_n * sum |A B| + N * eta (docs/numerics.md derives n = 8, N = 191 for
    K = 64).  Last, the largest output tolerance of two attention algorithms on the seed's q, k, v
    of shape (1, 2, 64, 16): plain (the definition's bounds) and flash (online softmax in blocks of
    16 keys, bfloat16 weights), to 3 significant digits. Each line says what its value is and what to
    compare it with (the reference sum; the seed's digits; flash against plain); JSON keeps the values.

    Example: swapcheck numerics demo --k 4096 --format json
    """
    from tasks.numerics.demo import demo_lines

    lines = demo_lines(k)
    if fmt is DemoFormat.json:
        from orchestrator.cli.reading import write_json

        write_json({"k": k, **{key: value for key, _, value in lines}})
        return
    from tasks.numerics.demo import demo_notes

    notes = demo_notes(lines, k)
    for key, label, value in lines:
        text = f"{label}: {value:.3g}" if key.startswith("attention_") else f"{label}: {value}"
        typer.echo(f"{text}  -- {notes[key]}")
