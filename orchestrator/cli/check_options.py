"""Options and helpers of ``swapcheck check`` (:mod:`orchestrator.cli.check`).

Options shared by the check commands are declared once, as ``Annotated`` types (as in
:mod:`orchestrator.cli.common`), so their flags and help texts cannot drift apart.  Bad input is a
:class:`~orchestrator.errors.UsageError`; :func:`run_checks` runs under
:func:`~orchestrator.cli.common.user_errors`, which turns it (and the checks' ``CheckInputError``)
into exit code 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.common import user_errors
from orchestrator.errors import UsageError
from tasks.checks.defaults import DEFAULT_SHAPES as CHECK_SHAPES
from tasks.checks.defaults import DEFAULT_TRIALS

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_SHAPES", "DEFAULT_TRIALS", "Dtype", "OutFormat", "Scales", "parse_dtype", "shapes", "params", "out_dtype",
    "input_kinds", "run_checks", "KernelOpt", "DtypeOpt", "TrialsOpt", "ShapeOpt", "SeedOpt",
    "ScalesOpt", "OperandsOpt", "DeviceOpt", "ParamOpt", "NoUserKernelsOpt",
]  # fmt: skip

#: Shapes checked when none is named (the harness's defaults, as MxKxN).
DEFAULT_SHAPES = tuple(f"{m}x{k}x{n}" for m, k, n in CHECK_SHAPES)


class OutFormat(str, Enum):
    table = "table"
    json = "json"


class Dtype(str, Enum):
    """Output dtypes a check judges; ``--dtype`` also takes bf16, fp16, half and fp32."""

    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


_DTYPE_ALIASES = {"bf16": Dtype.bfloat16, "fp16": Dtype.float16, "half": Dtype.float16, "fp32": Dtype.float32}


class Scales(str, Enum):
    """Scales of a scaled kernel's operands (tasks.checks.operands.SCALE_MODES)."""

    pow2 = "pow2"
    unit = "unit"


def parse_dtype(value: str | Dtype) -> Dtype:
    """``--dtype``: a :class:`Dtype` or an alias, any case, with or without ``torch.``."""
    if isinstance(value, Dtype):
        return value
    key = value.strip().lower().removeprefix("torch.")
    if key in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[key]
    try:
        return Dtype(key)
    except ValueError:
        raise typer.BadParameter(
            f"--dtype {value!r}: allowed bfloat16, float16, float32 (or bf16, fp16, fp32)"
        ) from None


def out_dtype(dtype: Dtype) -> torch.dtype:
    """The ``torch.dtype`` of ``--dtype`` (via :func:`tasks.numerics.formats.torch_dtype`)."""
    from tasks.numerics.formats import torch_dtype

    return torch_dtype(dtype.value)


def shapes(shape: list[str] | None) -> list[tuple[int, int, int]]:
    """``--shape MxKxN`` (repeatable; default :data:`DEFAULT_SHAPES`) as (M, K, N) tuples."""
    out = []
    for s in shape or list(DEFAULT_SHAPES):
        parts = s.lower().replace("×", "x").split("x")
        try:
            m, k, n = (int(p) for p in parts)
        except ValueError:
            raise UsageError(f"--shape {s!r}: expected MxKxN with three positive integers, e.g. 64x1000x48") from None
        if min(m, k, n) < 1:
            raise UsageError(f"--shape {s!r}: M, K and N must be >= 1")
        out.append((m, k, n))
    return out


def params(param: list[str] | None) -> dict[str, Any]:
    """``--param KEY=VALUE`` (repeatable): VALUE read as JSON if it parses, else a string."""
    out: dict[str, Any] = {}
    for p in param or []:
        key, sep, value = p.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param {p!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def input_kinds(inputs: list[str] | None) -> tuple[str, ...]:
    """``--inputs`` (repeatable, comma-separated); default every kind the bounds check knows."""
    from tasks.checks import INPUT_KINDS

    kinds = [k.strip() for item in (inputs or []) for k in item.split(",") if k.strip()]
    return tuple(kinds) if kinds else INPUT_KINDS


def run_checks(fn: Callable[[], list[Any]], fmt: OutFormat) -> None:
    """Run ``fn() -> list[CheckResult]``, print, exit 0 (pass) or 1 (fail); bad input exits 2."""
    from tasks.checks import combined

    with user_errors():
        results = fn()
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


KERNEL_HELP = ("Kernel: a registry name, an entry-point name, or package.module:attr (a Kernel subclass or instance, "
               "or a callable marked @kernel_function / @kernel_factory; docs/kernels.md).")
NO_USER_KERNELS_HELP = ("Refuse user kernels: only built-in names, no package.module:attr and no entry points "
                        "(also SWAPCHECK_USER_KERNELS=0).")
DTYPE_HELP = "Output dtype (bfloat16, float16, float32); a plain f(A, B) gets its operands in it too."
SHAPE_HELP = f"Problem MxKxN; repeat for several. Default: {', '.join(DEFAULT_SHAPES)}."
PARAM_HELP = "Kernel parameter KEY=VALUE (VALUE read as JSON if it parses, else a string); repeatable."
SCALES_HELP = "Scaled kernels: pow2 (random powers of two per token and channel) or unit."

KernelOpt = Annotated[str, typer.Option("--kernel", "-k", help=KERNEL_HELP)]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help=DTYPE_HELP, parser=parse_dtype)]
TrialsOpt = Annotated[int, typer.Option("--trials", help="Fresh draws of operands per shape.")]
ShapeOpt = Annotated[list[str] | None, typer.Option("--shape", help=SHAPE_HELP)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Base seed (each trial's operands derive from it).")]
ScalesOpt = Annotated[Scales, typer.Option("--scales", help=SCALES_HELP)]
OperandsOpt = Annotated[str | None, typer.Option("--operands", help="Scaled kernels taking either: int8 (default) or fp8_e4m3.")]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="cpu or cuda (default: the kernel's; cpu for a plain f(A, B)).")]
ParamOpt = Annotated[list[str] | None, typer.Option("--param", help=PARAM_HELP)]
NoUserKernelsOpt = Annotated[bool, typer.Option("--no-user-kernels", help=NO_USER_KERNELS_HELP)]
