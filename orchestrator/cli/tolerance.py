"""``swapcheck tolerance``: the error bound of a GEMM output for a dtype, K, algorithm and magnitudes."""

from __future__ import annotations

from enum import Enum
from typing import Any

import typer

from orchestrator.cli.common import user_errors
from orchestrator.errors import UsageError


class ToleranceFormat(str, Enum):
    """``tolerance --format``: a few lines of text, or one JSON object."""

    text = "text"
    json = "json"


def tolerance(
    dtype: str = typer.Option(..., "--dtype", help="Operand dtype: fp32, bf16, fp16, fp8_e4m3fn (e4m3) or int8."),
    k: int = typer.Option(..., "--k", help="Number of products per output (the GEMM's K), >= 1."),
    algorithm: str = typer.Option("any", "--algorithm", help="How the products are added: any, sequential, "
                                  "pairwise, blocked-<b>, exact, slots16 (docs/numerics.md)."),
    accumulate: str | None = typer.Option(None, "--accumulate", help="Accumulator format: fp32, bf16, fp16, "
                                          "int32 (default: int32 for int8, else fp32)."),
    out_dtype: str | None = typer.Option(None, "--out-dtype", help="Output dtype: fp32, bf16, fp16, fp8_e4m3fn, "
                                         "int32 (default: bf16 for fp8 and int8, else --dtype)."),
    max_abs_a: float | None = typer.Option(None, "--max-abs-a", help="Largest |a| (default 1; 128 for int8)."),
    max_abs_b: float | None = typer.Option(None, "--max-abs-b", help="Largest |b| (default 1; 127 for int8)."),
    sum_abs: float | None = typer.Option(None, "--sum-abs", help="Bound on sum_k |a_k b_k| of one output "
                                         "(default: K * max|a| * max|b|)."),
    logit: float | None = typer.Option(None, "--logit", help="Also the near-tie threshold of a logit of "
                                       "this magnitude (the output's |exact| value)."),
    fma: bool = typer.Option(False, "--fma/--no-fma", help="Products never rounded before they are added "
                             "(default: either, the wider bound)."),
    fmt: ToleranceFormat = typer.Option(ToleranceFormat.text, "--format", help="text or json (one object)."),
) -> None:
    """Print the error bound of one GEMM output: |out - exact| <= atol + rtol * |exact|, derived from
    the accumulation algorithm's error model and one rounding to the output dtype, with the
    derivation's version and the function that computes it (docs/tolerance.md). The bound is a
    worst case: an output of a kernel that does what the options say is never outside it.

    atol and rtol can replace a hand-picked tolerance of torch.testing.assert_close against an exact
    (or float64) reference; `bound` is their value at |exact| = --logit or, without it, at the
    largest |exact| the magnitudes allow. --logit adds the near-tie threshold: the margin (top-1
    minus top-2 logit, as the flip-risk model reads it) below which two kernels within the bound
    can disagree on the argmax. Bad input exits 2 naming the option and what is allowed.

    Example: swapcheck tolerance --dtype bf16 --k 4096 --format json
    """
    from tasks.checks.tolerance import ToleranceError
    from tasks.checks.tolerance import tolerance as compute

    with user_errors():
        try:
            result = compute(dtype, k, algorithm=algorithm, accumulate=accumulate, out_dtype=out_dtype,
                             max_abs_a=max_abs_a, max_abs_b=max_abs_b, sum_abs=sum_abs, logit=logit, fma=fma)
        except ToleranceError as exc:
            raise UsageError(f"--{exc.option.replace('_', '-')}: {exc.detail}") from None
    if fmt is ToleranceFormat.json:
        from orchestrator.cli.reading import write_json

        write_json(result)
        return
    for line in text_lines(result):
        typer.echo(line)


def text_lines(r: dict[str, Any]) -> list[str]:
    """The tolerance as a few lines: the bound, its two parts, the operands, the near tie, the source."""
    m = r["magnitudes"]
    rounded = r["rtol"] > 0
    lines = [f"bound: |out - exact| <= {r['atol']:.6g}" + (f" + {r['rtol']:.6g} * |exact|" if rounded else "")
             + f"  ({r['bound']:.6g} at |exact| = {r['magnitude']:.6g})"]
    lines.append(f"  accumulation: {r['model']} in {r['accumulate']}, K = {r['k']}: E = {r['accumulation']:.6g} "
                 f"(gamma_{r['roundings']} = {r['relative']:.6g} times S, plus {r['absolute']:.3g} for underflow)")
    lines.append(f"  output: {'one rounding to ' + r['out_dtype'] + ' (rtol = its unit roundoff)' if rounded else 'the accumulator itself (no rounding)'}")
    lines.append(f"  operands: {r['dtype']}, |a| <= {m['max_abs_a']:g}, |b| <= {m['max_abs_b']:g}, "
                 f"S = sum_k |a_k b_k| <= {m['sum_abs']:.6g} ({m['from']})")
    if r["overflow_possible"]:
        lines.append("  note: a partial sum or the output can overflow at these magnitudes (inf or NaN is possible)")
    tie = r.get("near_tie")
    if tie is not None:
        spacings = f" = {tie['threshold_spacings']:.3g} spacings of {r['out_dtype']}" if tie["spacing"] else ""
        lines.append(f"near tie at |logit| = {tie['logit']:g}: margins <= {tie['threshold']:.6g}{spacings} can flip "
                     f"between two kernels within the bound (<= {tie['vs_exact']:.6g} against the exact logits)")
    lines.append(f"derivation v{r['derivation_version']}: {r['source']}; {r['formula']}")
    return lines
