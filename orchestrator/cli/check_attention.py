"""``swapcheck check attention``: an attention kernel against an attention algorithm's bounds.

Thin over :func:`tasks.checks.attention.run_attention_check`; registered on the ``check`` app in
:mod:`orchestrator.cli.check`.  Exit 0 when the verdict passes, 1 when it does not, 2 for bad input.
"""

from __future__ import annotations

from typing import Any

import typer

from orchestrator.cli.check_options import OutFormat, run_checks

ALGORITHM_HELP = ("The algorithm that describes the kernel: a preset (plain, flash, flash-cpu) or keywords of "
                  "AttentionAlgorithm, e.g. online_softmax=true,block_size=16,weights=bfloat16 (docs/attention.md).")
SHAPE_HELP = "Problem BxHxLxSxD (batch, heads, queries, keys, head dim); repeat for several. Default: 1x2x64x64x16, 2x4x33x70x32."
INPUTS_HELP = "Input kinds, comma-separated or repeated: randn, causal, alibi, padded, large-logits (default all)."
COMPUTE_HELP = ("The compute format of the kernel, for the bounds: fp32 (default), bf16 or fp64 (inputs wider than "
                "it are charged their conversion; docs/numerics.md, Attention: the options).")
STANDARD_HELP = ("Which order of the sums of the definition the bounds hold for: any-order (default) or sequential "
                 "(every sum in index order; with online_softmax both give the any-order bound).")
FTZ_HELP = ("The kernel may flush subnormal results (and inputs) to zero: the absolute error of each rounding "
            "grows to the smallest normal.")


def attention(
    kernel: str = typer.Option(..., "--kernel", "-k", help="An attention kernel (swapcheck kernels attention)."),
    algorithm: str = typer.Option("plain", "--algorithm", "-a", help=ALGORITHM_HELP),
    dtype: str = typer.Option("float32", "--dtype", help="Input and output dtype: float32, bfloat16 or float16."),
    trials: int = typer.Option(2, "--trials", help="Fresh draws of q, k, v per shape and input kind."),
    shape: list[str] = typer.Option(None, "--shape", help=SHAPE_HELP),
    inputs: list[str] = typer.Option(None, "--inputs", help=INPUTS_HELP),
    seed: int = typer.Option(0, "--seed", help="Base seed (each trial's q, k, v derive from it)."),
    ulps: float = typer.Option(0.0, "--ulps", help="Widen the output and logsumexp bounds by this many spacings."),
    compute_dtype: str = typer.Option("fp32", "--compute-dtype", help=COMPUTE_HELP),
    standard: str = typer.Option("any-order", "--standard", help=STANDARD_HELP),
    flush_to_zero: bool = typer.Option(False, "--flush-to-zero/--no-flush-to-zero", help=FTZ_HELP),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object)."),
) -> None:
    """Attention kernel vs an AttentionAlgorithm: every element of the kernel's output and logsumexp
    on seeded q, k, v (no mask, causal, ALiBi float mask, padding, large logits) must be one the
    algorithm allows; differences from the float64 attention rounded once end in IDENTICAL,
    EPILOGUE_ROUNDING or WITHIN_ALGORITHM_BOUND, an element outside the bound in INCORRECT.

    Example: swapcheck check attention --kernel sdpa-flash-cpu --algorithm flash-cpu --dtype bfloat16
    (a kernel computing in bf16 on fp32 inputs: --compute-dtype bf16; one that flushes subnormals: --flush-to-zero)
    """

    def go() -> list[Any]:
        from tasks.checks.attention import INPUT_KINDS, run_attention_check

        kinds = tuple(k.strip() for item in (inputs or []) for k in item.split(",") if k.strip()) or INPUT_KINDS
        return [run_attention_check(kernel, algorithm, dtype, shape or None, kinds, trials, seed, ulps,
                                    compute_dtype, standard, flush_to_zero)]

    run_checks(go, fmt)
