"""``swapcheck check``: correctness checks of one kernel (exact match on binary inputs, bounds).

Thin over :mod:`tasks.checks`; runs in this process (no Ray).  Exit code 0 when the verdict passes,
1 when it does not, 2 for bad input (unknown kernel, import failure, wrong signature, bad option).
``check fuzz`` and ``check replay`` live in :mod:`orchestrator.cli.check_fuzz` and join this group;
``check rl-metrics`` (the RL-metric semantics probe) in :mod:`orchestrator.cli.check_rl`.
"""

from __future__ import annotations

from typing import Any

import typer

from orchestrator.cli import check_attention, check_fuzz, check_precision, check_rl
from orchestrator.cli.check_options import (
    DEFAULT_TRIALS,
    DeviceOpt,
    Dtype,
    DtypeOpt,
    KernelOpt,
    NoUserKernelsOpt,
    OperandsOpt,
    OutFormat,
    ParamOpt,
    Scales,
    ScalesOpt,
    SeedOpt,
    ShapeOpt,
    TrialsOpt,
    input_kinds,
    out_dtype,
    params,
    run_checks,
    shapes,
)

app = typer.Typer(
    help="Check one kernel: exact match on binary inputs, error bounds on general inputs (docs/checks.md).",
    no_args_is_help=True,
)


def _subject(kernel: str, param: list[str] | None, device: str | None, operands: str | None,
             no_user_kernels: bool) -> Any:  # fmt: skip
    """The kernel under test; ``--no-user-kernels`` refuses module:attr and entry-point names."""
    from tasks.checks import load_subject
    from tasks.kernels import user_kernels, user_kernels_enabled

    with user_kernels(user_kernels_enabled() and not no_user_kernels):
        return load_subject(kernel, params(param), device=device, operands=operands, field="--kernel")


@app.command("exact-match")
def exact_match(
    kernel: KernelOpt,
    dtype: DtypeOpt = Dtype.bfloat16,
    trials: TrialsOpt = DEFAULT_TRIALS,
    shape: ShapeOpt = None,
    seed: SeedOpt = 0,
    p: float = typer.Option(None, "--p", help="Force P(entry is 0) instead of deriving it from K and the output format."),
    overflow: float = typer.Option(0.01, "--overflow", help="Expected fraction of outputs allowed above the exact range when deriving p."),
    scales: ScalesOpt = Scales.pow2,
    operands: OperandsOpt = None,
    device: DeviceOpt = None,
    param: ParamOpt = None,
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object)."),
    no_user_kernels: NoUserKernelsOpt = False,
) -> None:
    """Exact match on binary inputs (CUDA-L2's check): 0/1 operands, sparse enough that the
    reference sums stay in the output format's exact-integer range (bf16 256, fp16 2048, fp32 2**24);
    every such output must equal the exact sum. Catches wrong tiles, dropped K-blocks and small scale
    errors; cannot see precision bugs (use `bounds`).

    Example: swapcheck check exact-match --kernel mypkg.kernels:my_matmul --dtype bfloat16 --trials 20
    """

    def go() -> list[Any]:
        from tasks.checks import run_exact_match

        subject = _subject(kernel, param, device, operands, no_user_kernels)
        return [run_exact_match(subject, shapes(shape), out_dtype(dtype), trials, seed, scales.value, p, overflow)]

    run_checks(go, fmt)


@app.command("bounds")
def bounds(
    kernel: KernelOpt,
    algorithm: str = typer.Option("any", "--algorithm", "-a", help="any (default), sequential, pairwise, blocked-<b>, exact or slots16."),
    accumulate: str = typer.Option("fp32", "--accumulate", help="The algorithm's accumulation format (fp32, bf16, fp16)."),
    fma: bool = typer.Option(True, "--fma/--no-fma", help="Whether the algorithm fuses each product into its addition."),
    inputs: list[str] = typer.Option(None, "--inputs", help="Input kinds, in turn per trial: randn, uniform-positive, mixed-scale (default all)."),
    dtype: DtypeOpt = Dtype.bfloat16,
    trials: TrialsOpt = DEFAULT_TRIALS,
    shape: ShapeOpt = None,
    seed: SeedOpt = 0,
    scales: ScalesOpt = Scales.pow2,
    operands: OperandsOpt = None,
    device: DeviceOpt = None,
    param: ParamOpt = None,
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object)."),
    no_user_kernels: NoUserKernelsOpt = False,
) -> None:
    """Error bounds on general inputs: every output on randn and adversarial operands must be one
    the named accumulation algorithm could produce, rounded once to the output format. Catches the
    precision bugs exact match cannot see (a bf16 accumulator, bf16 split-K partials, a truncating
    epilogue).

    Example: swapcheck check bounds --kernel mypkg.kernels:torch_matmul --algorithm any --dtype float16 --format json
    """

    def go() -> list[Any]:
        from tasks.checks import run_bounds

        subject = _subject(kernel, param, device, operands, no_user_kernels)
        return [run_bounds(subject, shapes(shape), algorithm, out_dtype(dtype), trials, seed,
                           input_kinds(inputs), accumulate, fma, scales.value)]  # fmt: skip

    run_checks(go, fmt)


@app.command("all")
def all_(
    kernel: KernelOpt,
    algorithm: str = typer.Option("any", "--algorithm", "-a", help="Bounds: any (default), sequential, pairwise, blocked-<b>, exact or slots16."),
    accumulate: str = typer.Option("fp32", "--accumulate", help="Bounds: the algorithm's accumulation format."),
    dtype: DtypeOpt = Dtype.bfloat16,
    trials: int = typer.Option(DEFAULT_TRIALS, "--trials", help="Fresh draws of operands per shape, for each check."),
    shape: ShapeOpt = None,
    seed: int = typer.Option(0, "--seed", help="Base seed."),
    scales: Scales = typer.Option(Scales.pow2, "--scales", help="Scaled kernels: pow2 or unit."),
    operands: OperandsOpt = None,
    device: str = typer.Option(None, "--device", help="cpu or cuda."),
    param: ParamOpt = None,
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object with every check)."),
    no_user_kernels: NoUserKernelsOpt = False,
) -> None:
    """Exact match, bounds and the precision-downgrade probe (2 draws per shape and family) on the
    shapes you name or a default set; the verdict is the worst of the three.

    Example: swapcheck check all --kernel int8-cutlass-order --shape 64x1000x48 --shape 1x4096x33
    """

    def go() -> list[Any]:
        from tasks.checks import run_bounds, run_exact_match, run_precision

        subject = _subject(kernel, param, device, operands, no_user_kernels)
        sh, dt = shapes(shape), out_dtype(dtype)
        return [
            run_exact_match(subject, sh, dt, trials, seed, scales.value),
            run_bounds(subject, sh, algorithm, dt, trials, seed, input_kinds(None), accumulate, True, scales.value),
            run_precision(subject, sh, dt, min(trials, check_precision.PRECISION_TRIALS), seed),
        ]

    run_checks(go, fmt)


app.command("fuzz")(check_fuzz.fuzz)
app.command("replay")(check_fuzz.replay)
app.command("attention")(check_attention.attention)
app.command("precision")(check_precision.precision)
app.command("rl-metrics")(check_rl.rl_metrics)
