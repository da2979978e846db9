"""The ``bounds`` check: general inputs, every output within a named algorithm's error bound.

The exact-match check cannot see precision bugs (docs/reference/numerics.md §6.3): on binary inputs a
bf16 accumulator, split-K with bf16 partials and a truncating epilogue all return exact integers.
This check runs the kernel on randn and adversarial inputs (:mod:`.operands`) and asks, for every
output, whether the named accumulation algorithm (:mod:`tasks.numerics.products`) could have
produced it:

* the algorithm's bounds on ``A @ B`` (``alg.bounds(A, B)``: the exact result, its error model
  ``gamma_n * sum |A[i,k] B[k,j]| + N eta (1 + gamma_n)``, NaN/Inf rules) give the range
  ``[low, high]`` of results in the accumulation format;
* the kernel rounds that result once to its output format (round to nearest even, monotone), so an
  output ``o`` is covered when ``rn(low) <= o <= rn(high)``.  When the output format *is* the
  accumulation format this is exactly ``alg.covers(o, A, B)``, which is what is called then.

Scaled kernels get power-of-two (or unit) scales; the algorithm is run on the scaled operands
``A * sa`` and ``B * sb`` (exact), whose product is the kernel's exact result.

The verdict (:mod:`tasks.verdicts`): INCORRECT if any output is outside; else IDENTICAL if every
output equals the exact result rounded once; EPILOGUE_ROUNDING if the differences are rare and at
most one spacing; WITHIN_ALGORITHM_BOUND otherwise.

Algorithms (``--algorithm``), all in the accumulation format ``accumulate`` (default fp32):

==================  ===========================================================================
name                bound of
==================  ===========================================================================
``any``             any order of additions, products rounded or fused: sequential with rounded
                    products, the deepest order (k + 1 roundings, 3k - 1 charged), i.e. the bound
                    of the matmul *operation* (``tasks.numerics.products.matmul``); the default
``sequential``      one product at a time, in index order (``fma`` decides whether products round)
``pairwise``        a balanced tree
``blocked-<b>``     sequential within blocks of b, then across the block sums
``exact``           the exact sum rounded once to the accumulation format
``slots16``         products rounded, summed in 16 slots by magnitude
==================  ===========================================================================
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from tasks.numerics import distance, get_format, round_to_format
from tasks.numerics.formats import FloatFormat
from tasks.verdicts import Verdict, classify_differences

from . import operands as ops_mod
from .defaults import DEFAULT_TRIALS
from .result import CheckResult, Judged, TrialResult, element
from .subject import CheckInputError, Subject, run_once, shape_problem

__all__ = ["ALGORITHMS", "algorithm", "describe_algorithm", "bounds_trial", "judge_bounds", "run_bounds", "covered"]

ALGORITHMS = ("any", "sequential", "pairwise", "blocked-<b>", "exact", "slots16")
_BLOCKED = re.compile(r"^blocked-(\d+)$")


def algorithm(name: str, accumulate: str = "fp32", fma: bool = True) -> Any:
    """The :mod:`tasks.numerics.products` algorithm called ``name`` in format ``accumulate``.

    Raises:
        CheckInputError: an unknown name or format, naming the valid ones.
    """
    from tasks.numerics import products

    try:
        fmt = get_format(accumulate)
    except ValueError as exc:
        raise CheckInputError(f"accumulation format: {exc}") from exc
    key = name.strip().lower()
    if key == "any":
        return products.matmul_sequential(fmt, fma=False)
    if key == "sequential":
        return products.matmul_sequential(fmt, fma=fma)
    if key == "pairwise":
        return products.matmul_pairwise(fmt, fma=fma)
    if key == "exact":
        return products.matmul_exact_accumulation(fmt)
    if key == "slots16":
        return products.matmul_slots16(fmt)
    m = _BLOCKED.match(key)
    if m and int(m.group(1)) >= 1:
        return products.matmul_blocked(fmt, int(m.group(1)), fma=fma)
    raise CheckInputError(
        f"unknown algorithm {name!r}; valid: {', '.join(ALGORITHMS)} (e.g. blocked-128)"
    )


def describe_algorithm(name: str, alg: Any) -> str:
    """One line naming the algorithm, its format and its error model's form."""
    model = alg.error_model(1000)
    what = "any order (the operation's bound)" if name == "any" else repr(alg)
    return (
        f"{what} in {alg.format.name}: error <= gamma_n * sum_k |A[i,k] B[k,j]| + N*eta*(1+gamma_n), "
        f"n = {model.roundings} roundings at K = 1000, then one rounding to the output format"
    )


def covered(alg: Any, output: torch.Tensor, a: Any, b: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Elementwise coverage of ``output`` by ``alg`` on ``A @ B`` and the allowed ``(low, high)``.

    ``low``/``high`` are in the output's format (rounded once from the algorithm's range).
    """
    cov, low, high, _ = _judge(alg, output, a, b)
    return cov, low, high


def _judge(
    alg: Any, output: torch.Tensor, a: Any, b: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    out_fmt: FloatFormat = get_format(output.dtype)
    obs = output.double().numpy()
    bnd = alg.bounds(a, b)
    low, high = bnd.finite_range()
    if out_fmt == alg.format:  # no final rounding: the algorithm's own coverage
        return np.asarray(bnd.covers(obs)), low, high, bnd
    lo_o = round_to_format(low, out_fmt)
    hi_o = round_to_format(high, out_fmt)
    with np.errstate(invalid="ignore"):
        finite_ok = np.isfinite(obs) & (obs >= lo_o) & (obs <= hi_o)
        over = ((obs == np.inf) & (hi_o == np.inf)) | ((obs == -np.inf) & (lo_o == -np.inf))
    special = (np.isnan(obs) & bnd.may_be("nan")) | (np.isinf(obs) & bnd.may_be("inf"))
    return np.asarray(finite_ok | over | special), lo_o, hi_o, bnd


def _rounded(bnd: Any, out_fmt: FloatFormat, af: Any, bf: Any) -> tuple[np.ndarray, np.ndarray]:
    """The exact result (float64, within one float64 spacing) and its correct rounding to out_fmt.

    ``bnd.hi + bnd.lo`` is the exact finite result within ``bnd.err`` (:class:`errormodel.Bounds`);
    where ``err == 0`` it *is* the exact result and ``round_to_format(hi, fmt, lo)`` its correct
    rounding.  Otherwise (or with non-finite products) the reference ``matmul(A, B).rounded`` is used.
    """
    special = np.asarray(bnd.nan) | np.asarray(bnd.pinf) | np.asarray(bnd.ninf)
    if not bool(np.any(bnd.err)) and not bool(np.any(special)):
        return np.asarray(bnd.hi), round_to_format(bnd.hi, out_fmt, bnd.lo)
    from tasks.numerics.products import matmul

    ref = matmul(af, bf, out_fmt)
    return np.asarray(ref.exact), ref.rounded.double().numpy()


def bounds_trial(
    subject: Subject,
    alg: Any,
    m: int,
    k: int,
    n: int,
    dtype: torch.dtype,
    inputs: str,
    trial: int,
    seed: int = 0,
    scales: str = "pow2",
) -> TrialResult:
    """One fresh draw of ``inputs`` operands, every output judged against ``alg``'s bound."""
    gen = ops_mod.generator("bounds", seed, inputs, m, k, n, trial)
    op_dtype = subject.operand_dtype(dtype)
    a, b = ops_mod.general(inputs, m, k, n, op_dtype, gen)
    info: dict[str, Any] = {"inputs": inputs}
    sa = sb = None
    if not subject.plain:
        sa, sb = ops_mod.scales(scales, m, n, subject.scale_numel(m, n, k), gen)
        info["scales"] = scales
    return judge_bounds(subject, alg, a, b, dtype, sa, sb, trial=trial, seed=seed, info=info).result


def judge_bounds(
    subject: Subject,
    alg: Any,
    a: torch.Tensor,
    b: torch.Tensor,
    dtype: torch.dtype,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    *,
    trial: int = 0,
    seed: int = 0,
    info: dict[str, Any] | None = None,
) -> Judged:
    """Run ``subject`` on these operands and judge every output against ``alg``'s bound.

    For a scaled kernel, ``a * scale_a`` and ``b * scale_b`` must be exact in fp32 (int8 or e4m3
    values times powers of two, or times scales of at most 16 significant bits): the algorithm
    runs on them.  The trial harness above and the fuzzer (:mod:`.fuzz`) share it.
    """
    m, k = int(a.shape[0]), int(a.shape[1])
    n = int(b.shape[1])
    info = {**(info or {}), "algorithm": repr(alg)}
    if subject.plain or scale_a is None or scale_b is None:
        sa = sb = None
        af, bf = a, b
    else:
        sa, sb = scale_a, scale_b
        af = a.to(torch.float32) * sa.reshape(-1, 1)
        bf = b.to(torch.float32) * sb.reshape(1, -1)
        info.update(scale_a_numel=int(sa.numel()), scale_b_numel=int(sb.numel()))
    positions = m * n
    ran = run_once(subject, a, b, dtype, sa, sb, m, n)
    out, seconds = ran.out, ran.seconds
    if ran.error is not None:
        return Judged(TrialResult("bounds", m, k, n, trial, seed, Verdict.ERROR, positions, info=info,
                                  error=ran.error), None, None, None)  # fmt: skip
    if ran.problem is not None:
        info["problem"] = ran.problem
        return Judged(TrialResult("bounds", m, k, n, trial, seed, Verdict.INCORRECT, positions,
                                  seconds=seconds, info=info), out, None, None)  # fmt: skip
    out_fmt = get_format(out.dtype)
    info["output_dtype"] = out_fmt.name
    cov, low, high, bnd = _judge(alg, out, af, bf)
    exact, expected = _rounded(bnd, out_fmt, af, bf)
    d = distance(out, expected, out_fmt)
    obs = out.double().numpy()
    verdict = classify_differences(d, cov)
    outside = ~cov
    n_out = int(outside.sum())
    differing = d != 0
    first = worst_el = None
    dd = np.where(d < 0, np.iinfo(np.int64).max, d)
    if n_out:
        first = element(int(np.flatnonzero(outside)[0]), n, exact, expected, obs, d, low, high)
        worst_idx = int(np.argmax(np.where(outside, dd, -1)))
        worst_el = element(worst_idx, n, exact, expected, obs, d, low, high)
    elif differing.any():
        worst_el = element(int(np.argmax(dd)), n, exact, expected, obs, d, low, high)
    max_spacing = int(np.max(np.where(d < 0, 0, d))) if d.size else 0
    if bool((d < 0).any()):
        info["nan_mismatches"] = int((d < 0).sum())
    result = TrialResult("bounds", m, k, n, trial, seed, verdict, positions, positions, n_out,
                         int(differing.sum()), max_spacing, first, worst_el, info, None,
                         seconds)  # fmt: skip
    return Judged(result, out, np.asarray(expected, dtype=np.float64), np.asarray(exact, dtype=np.float64))


def run_bounds(
    subject: Subject,
    shapes: list[tuple[int, int, int]],
    algorithm_name: str = "any",
    dtype: torch.dtype = torch.bfloat16,
    trials: int = DEFAULT_TRIALS,
    seed: int = 0,
    inputs: tuple[str, ...] = ops_mod.INPUT_KINDS,
    accumulate: str = "fp32",
    fma: bool = True,
    scales: str = "pow2",
) -> CheckResult:
    """Run ``trials`` fresh draws per shape; the verdict is the worst trial's.

    Draw ``t`` of a shape uses input kind ``inputs[t % len(inputs)]`` (so 20 trials over the three
    default kinds are 7 randn, 7 uniform-positive and 6 mixed-scale draws).

    Raises:
        CheckInputError: a bad shape, dtype, algorithm, input kind, trial count or scale mode, or a
            kernel that cannot run a problem here.
    """
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise CheckInputError(f"output dtype must be bfloat16, float16 or float32, got {dtype}")
    if trials < 1:
        raise CheckInputError(f"trials must be >= 1, got {trials}")
    if scales not in ops_mod.SCALE_MODES:
        raise CheckInputError(f"scales must be one of {', '.join(ops_mod.SCALE_MODES)}, got {scales!r}")
    bad = [i for i in inputs if i not in ops_mod.INPUT_KINDS]
    if bad or not inputs:
        raise CheckInputError(
            f"unknown input kind(s) {', '.join(bad) or '(none given)'}; valid: {', '.join(ops_mod.INPUT_KINDS)}"
        )
    if not shapes:
        raise CheckInputError("no shapes to check")
    alg = algorithm(algorithm_name, accumulate, fma)
    for shape in shapes:
        problem = shape_problem(shape)
        if problem:
            raise CheckInputError(problem)
        subject.preflight(shape[0], shape[2], shape[1])
    fmt = get_format(dtype)
    settings: dict[str, Any] = {
        "seed": seed,
        "algorithm": algorithm_name,
        "accumulate": alg.format.name,
        "fma": fma,
        "inputs": list(inputs),
        "scales": None if subject.plain else scales,
        "operands": fmt.name if subject.plain else subject.operands,
        "about_algorithm": "bound: " + describe_algorithm(algorithm_name, alg),
        "about_inputs": f"inputs: {', '.join(inputs)} (in turn, one per trial); every output position is checked",
    }
    if not subject.plain:
        settings["about_blind_spot"] = ops_mod.SCALES_BLIND_SPOT.format(scales=scales)
    result = CheckResult("bounds", subject.ref, subject.describe(), fmt.name, trials, settings)
    for m, k, n in shapes:
        for t in range(trials):
            kind = inputs[t % len(inputs)]
            r = bounds_trial(subject, alg, m, k, n, dtype, kind, t, seed, scales)
            result.results.append(r)
            if r.verdict is Verdict.ERROR:
                break
    return result
