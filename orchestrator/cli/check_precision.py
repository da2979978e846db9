"""``swapcheck check precision``: exact-integer matmuls that expose a silent precision downgrade.

Thin over :func:`tasks.checks.precision.run_precision`; registered on the ``check`` app in
:mod:`orchestrator.cli.check`, which also runs it in ``check all``.  Exit 0 when the verdict passes,
1 when it does not (PRECISION_DOWNGRADE, INCORRECT, ERROR), 2 for bad input.
"""

from __future__ import annotations

from typing import Any

import typer

from orchestrator.cli.check_options import (
    DeviceOpt,
    Dtype,
    DtypeOpt,
    KernelOpt,
    NoUserKernelsOpt,
    OperandsOpt,
    OutFormat,
    ParamOpt,
    SeedOpt,
    ShapeOpt,
    out_dtype,
    params,
    run_checks,
    shapes,
)

#: Draws per shape and family (tasks.checks.precision.DEFAULT_PRECISION_TRIALS, kept light here).
PRECISION_TRIALS = 2
FAMILIES_HELP = ("Operand families, comma-separated or repeated: input-bits (plain fp32 kernels), sum-bits (fp32 "
                 "output), absorb (any output); default every one that applies.")


def families(values: list[str] | None) -> tuple[str, ...] | None:
    """``--families`` (repeatable, comma-separated); None for every family that applies."""
    out = tuple(v.strip() for item in (values or []) for v in item.split(",") if v.strip())
    return out or None


def precision(
    kernel: KernelOpt,
    dtype: DtypeOpt = Dtype.float32,
    trials: int = typer.Option(PRECISION_TRIALS, "--trials", help="Draws per shape and family (each exposes a downgrade at every output)."),
    shape: ShapeOpt = None,
    seed: SeedOpt = 0,
    family: list[str] = typer.Option(None, "--families", help=FAMILIES_HELP),
    operands: OperandsOpt = None,
    device: DeviceOpt = None,
    param: ParamOpt = None,
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object)."),
    no_user_kernels: NoUserKernelsOpt = False,
) -> None:
    """Silent precision downgrades: integer operands whose products and partial sums are exact in
    fp32 in any order, but not in tf32, fp16 or bf16. A correct kernel returns every output exactly;
    one that rounds its inputs to tf32/bf16 or accumulates in bf16/fp16 gets every output wrong and
    reads PRECISION_DOWNGRADE, with the format its results match.

    Example: swapcheck check precision --kernel mypkg.kernels:my_matmul --dtype float32
    """

    def go() -> list[Any]:
        from tasks.checks import load_subject, run_precision
        from tasks.kernels import user_kernels, user_kernels_enabled

        with user_kernels(user_kernels_enabled() and not no_user_kernels):  # --no-user-kernels, as in `check all`
            subject = load_subject(kernel, params(param), device=device, operands=operands, field="--kernel")
        return [run_precision(subject, shapes(shape), out_dtype(dtype), trials, seed, families(family))]

    run_checks(go, fmt)
