"""``swapcheck check``: correctness checks of one kernel (exact match on binary inputs, bounds).

Thin over :mod:`tasks.checks`; runs in this process (no Ray).  Exit code 0 when the verdict passes,
1 when it does not, 2 for bad input (unknown kernel, import failure, wrong signature, bad option).
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any

import typer

from orchestrator.cli.common import err

app = typer.Typer(
    help="Check one kernel: exact match on binary inputs, error bounds on general inputs (docs/checks.md).",
    no_args_is_help=True,
)

#: Shapes checked when none is named: not multiples of typical tile sizes, one decode-like row.
DEFAULT_SHAPES = ("64x1000x48", "127x2049x65", "1x4096x33")
DTYPES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
    "half": "float16", "float32": "float32", "fp32": "float32",
}  # fmt: skip


class OutFormat(str, Enum):
    table = "table"
    json = "json"


KERNEL_HELP = "Kernel: a registry name, an entry-point name, or package.module:attr (a Kernel, a factory, or a plain f(A, B) -> C)."
DTYPE_HELP = "Output dtype (bfloat16, float16, float32); a plain f(A, B) gets its operands in it too."
SHAPE_HELP = f"Problem MxKxN; repeat for several. Default: {', '.join(DEFAULT_SHAPES)}."
PARAM_HELP = "Kernel parameter KEY=VALUE (VALUE read as JSON if it parses, else a string); repeatable."


class _BadInput(Exception):
    pass


def _shapes(shape: list[str] | None) -> list[tuple[int, int, int]]:
    out = []
    for s in shape or list(DEFAULT_SHAPES):
        parts = s.lower().replace("×", "x").split("x")
        try:
            m, k, n = (int(p) for p in parts)
        except ValueError:
            raise _BadInput(f"--shape {s!r}: expected MxKxN with three positive integers, e.g. 64x1000x48") from None
        if min(m, k, n) < 1:
            raise _BadInput(f"--shape {s!r}: M, K and N must be >= 1")
        out.append((m, k, n))
    return out


def _params(param: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in param or []:
        key, sep, value = p.partition("=")
        if not sep or not key.strip():
            raise _BadInput(f"--param {p!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def _dtype(dtype: str) -> Any:
    import torch

    key = dtype.strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        raise _BadInput(f"--dtype {dtype!r}: allowed bfloat16, float16, float32 (or bf16, fp16, fp32)")
    return getattr(torch, DTYPES[key])


def _inputs(inputs: list[str] | None) -> tuple[str, ...]:
    from tasks.checks import INPUT_KINDS

    kinds = [k.strip() for item in (inputs or []) for k in item.split(",") if k.strip()]
    return tuple(kinds) if kinds else INPUT_KINDS


def _run(fn: Any, fmt: OutFormat) -> None:
    """Run ``fn() -> list[CheckResult]``, print, exit 0/1; bad input exits 2."""
    from tasks.checks import CheckInputError, combined

    try:
        results = fn()
    except (_BadInput, CheckInputError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True)
        raise typer.Exit(2) from None
    if fmt is OutFormat.json:
        obj = results[0].to_dict() if len(results) == 1 else combined(results)
        sys.stdout.write(json.dumps(obj, default=str) + "\n")
    else:
        typer.echo("\n\n".join(r.text() for r in results))
        if len(results) > 1:
            overall = combined(results)
            typer.echo(f"\noverall: {overall['verdict']} ({'pass' if overall['passed'] else 'FAIL'})")
    ok = all(r.passed for r in results)
    raise typer.Exit(0 if ok else 1)


def _subject(kernel: str, param: list[str] | None, device: str | None, operands: str | None) -> Any:
    from tasks.checks import load_subject

    return load_subject(kernel, _params(param), device=device, operands=operands)


@app.command("exact-match")
def exact_match(
    kernel: str = typer.Option(..., "--kernel", "-k", help=KERNEL_HELP),
    dtype: str = typer.Option("bfloat16", "--dtype", help=DTYPE_HELP),
    trials: int = typer.Option(20, "--trials", help="Fresh draws of operands per shape."),
    shape: list[str] = typer.Option(None, "--shape", help=SHAPE_HELP),
    seed: int = typer.Option(0, "--seed", help="Base seed (each trial's operands derive from it)."),
    p: float = typer.Option(None, "--p", help="Force P(entry is 0) instead of deriving it from K and the output format."),
    overflow: float = typer.Option(0.01, "--overflow", help="Expected fraction of outputs allowed above the exact range when deriving p."),
    scales: str = typer.Option("pow2", "--scales", help="Scaled kernels: pow2 (random powers of two per token and channel) or unit."),
    operands: str = typer.Option(None, "--operands", help="Scaled kernels taking either: int8 (default) or fp8_e4m3."),
    device: str = typer.Option(None, "--device", help="cpu or cuda (default: the kernel's; cpu for a plain f(A, B))."),
    param: list[str] = typer.Option(None, "--param", help=PARAM_HELP),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object)."),
) -> None:
    """Exact match on binary inputs (CUDA-L2's check): 0/1 operands, sparse enough that the
    reference sums stay in the output format's exact-integer range (bf16 256, fp16 2048, fp32 2**24);
    every such output must equal the exact sum. Catches wrong tiles, dropped K-blocks and small scale
    errors; cannot see precision bugs (use `bounds`).

    Example: swapcheck check exact-match --kernel mypkg.kernels:my_matmul --dtype bfloat16 --trials 20
    """

    def go() -> list[Any]:
        from tasks.checks import run_exact_match

        subject = _subject(kernel, param, device, operands)
        return [run_exact_match(subject, _shapes(shape), _dtype(dtype), trials, seed, scales, p, overflow)]

    _run(go, fmt)


@app.command("bounds")
def bounds(
    kernel: str = typer.Option(..., "--kernel", "-k", help=KERNEL_HELP),
    algorithm: str = typer.Option("any", "--algorithm", "-a", help="any (default), sequential, pairwise, blocked-<b>, exact or slots16."),
    accumulate: str = typer.Option("fp32", "--accumulate", help="The algorithm's accumulation format (fp32, bf16, fp16)."),
    fma: bool = typer.Option(True, "--fma/--no-fma", help="Whether the algorithm fuses each product into its addition."),
    inputs: list[str] = typer.Option(None, "--inputs", help="Input kinds, in turn per trial: randn, uniform-positive, mixed-scale (default all)."),
    dtype: str = typer.Option("bfloat16", "--dtype", help=DTYPE_HELP),
    trials: int = typer.Option(20, "--trials", help="Fresh draws of operands per shape."),
    shape: list[str] = typer.Option(None, "--shape", help=SHAPE_HELP),
    seed: int = typer.Option(0, "--seed", help="Base seed (each trial's operands derive from it)."),
    scales: str = typer.Option("pow2", "--scales", help="Scaled kernels: pow2 (random powers of two per token and channel) or unit."),
    operands: str = typer.Option(None, "--operands", help="Scaled kernels taking either: int8 (default) or fp8_e4m3."),
    device: str = typer.Option(None, "--device", help="cpu or cuda (default: the kernel's; cpu for a plain f(A, B))."),
    param: list[str] = typer.Option(None, "--param", help=PARAM_HELP),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object)."),
) -> None:
    """Error bounds on general inputs: every output on randn and adversarial operands must be one
    the named accumulation algorithm could produce, rounded once to the output format. Catches the
    precision bugs exact match cannot see (a bf16 accumulator, bf16 split-K partials, a truncating
    epilogue).

    Example: swapcheck check bounds --kernel torch:matmul --algorithm any --dtype float16 --format json
    """

    def go() -> list[Any]:
        from tasks.checks import run_bounds

        subject = _subject(kernel, param, device, operands)
        return [run_bounds(subject, _shapes(shape), algorithm, _dtype(dtype), trials, seed,
                           _inputs(inputs), accumulate, fma, scales)]  # fmt: skip

    _run(go, fmt)


@app.command("all")
def all_(
    kernel: str = typer.Option(..., "--kernel", "-k", help=KERNEL_HELP),
    algorithm: str = typer.Option("any", "--algorithm", "-a", help="Bounds: any (default), sequential, pairwise, blocked-<b>, exact or slots16."),
    accumulate: str = typer.Option("fp32", "--accumulate", help="Bounds: the algorithm's accumulation format."),
    dtype: str = typer.Option("bfloat16", "--dtype", help=DTYPE_HELP),
    trials: int = typer.Option(20, "--trials", help="Fresh draws of operands per shape, for each check."),
    shape: list[str] = typer.Option(None, "--shape", help=SHAPE_HELP),
    seed: int = typer.Option(0, "--seed", help="Base seed."),
    scales: str = typer.Option("pow2", "--scales", help="Scaled kernels: pow2 or unit."),
    operands: str = typer.Option(None, "--operands", help="Scaled kernels taking either: int8 (default) or fp8_e4m3."),
    device: str = typer.Option(None, "--device", help="cpu or cuda."),
    param: list[str] = typer.Option(None, "--param", help=PARAM_HELP),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object with both checks)."),
) -> None:
    """Both checks (exact match, then bounds) on the shapes you name or a default set; the verdict
    is the worse of the two.

    Example: swapcheck check all --kernel int8-cutlass-order --shape 64x1000x48 --shape 1x4096x33
    """

    def go() -> list[Any]:
        from tasks.checks import run_bounds, run_exact_match

        subject = _subject(kernel, param, device, operands)
        shapes, dt = _shapes(shape), _dtype(dtype)
        return [
            run_exact_match(subject, shapes, dt, trials, seed, scales),
            run_bounds(subject, shapes, algorithm, dt, trials, seed, _inputs(None), accumulate, True, scales),
        ]

    _run(go, fmt)
