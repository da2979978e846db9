"""The ``exact_match`` check: binary operands, an exact reference, exact equality in range.

The procedure of CUDA-L2's correctness check (seed 000), done for every output format:

1. Derive the zero-probability ``p`` from K and the output format's exact-integer range ``L``
   (:mod:`.sparsity`): nearly every reference sum stays in ``[0, L]``.
2. Draw ``A [M, K]`` and ``B [K, N]`` of zeros and ones (0 with probability p), fresh each trial.
   A plain matmul ``f(A, B)`` gets them in the check's dtype; a scaled kernel gets them as int8 or
   fp8 e4m3 with power-of-two (or unit) per-token and per-channel scales.
3. The exact reference: ``S = A @ B`` in float64 (exact: integers at most K <= 2**53), times the
   scales (exact: powers of two).
4. Wherever ``S <= L`` the output must *equal* the reference (same value and same sign of zero):
   every partial sum of such an output is an integer in ``[0, L]``, exact in the format in any
   order, so any correct kernel returns it bit for bit.  Positions with ``S > L`` are ignored.
5. The fraction of positions checked must be at least :data:`MIN_CHECKED_FRACTION` (else the
   trial is INCONCLUSIVE); any mismatch makes it INCORRECT.

What it catches and misses (docs/reference/numerics.md §6.3): structural and additive bugs (a dropped or
duplicated K-block, a transposed or misplaced tile, wrong indexing) and small multiplicative errors
that ``allclose`` lets through (a tile scaled by 1 + 2**-8, a wrong per-channel scale); it cannot
see precision bugs (a bf16 accumulator, bf16 split-K partials, a truncating epilogue), because 0, 1
and small integers are exact in every format.  The ``bounds`` check covers those.
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.numerics import distance, get_format
from tasks.verdicts import Verdict

from . import operands as ops_mod
from .defaults import DEFAULT_TRIALS
from .result import CheckResult, Judged, TrialResult, element
from .sparsity import DEFAULT_FLOOR, DEFAULT_OVERFLOW, exact_limit, zero_probability
from .subject import FORMAT_DTYPES, CheckInputError, Subject, run_once, shape_problem

__all__ = ["MIN_CHECKED_FRACTION", "run_exact_match", "exact_match_trial", "judge_exact_match"]

#: A trial must check at least this fraction of its positions (issue 4: "at least half").
MIN_CHECKED_FRACTION = 0.5


def exact_match_trial(
    subject: Subject,
    m: int,
    k: int,
    n: int,
    dtype: torch.dtype,
    p: float,
    trial: int,
    seed: int = 0,
    scales: str = "pow2",
) -> TrialResult:
    """One fresh draw of binary operands for ``subject``, judged by exact equality where in range."""
    gen = ops_mod.generator("exact_match", seed, m, k, n, trial)
    a01, b01 = ops_mod.binary(m, k, n, p, gen)
    info: dict[str, object] = {"p": p}
    if subject.plain:
        a, b = a01.to(dtype), b01.to(dtype)
        sa = sb = None
    else:
        op_dtype = subject.operand_dtype(dtype)
        a, b = a01.to(op_dtype), b01.to(op_dtype)
        sa, sb = ops_mod.scales(scales, m, n, subject.scale_numel(m, n, k), gen)
        info["scales"] = scales
    return judge_exact_match(subject, a, b, dtype, sa, sb, trial=trial, seed=seed, info=info).result


def judge_exact_match(
    subject: Subject,
    a: torch.Tensor,
    b: torch.Tensor,
    dtype: torch.dtype,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    *,
    trial: int = 0,
    seed: int = 0,
    info: dict[str, object] | None = None,
) -> Judged:
    """Run ``subject`` on these binary (0/1) operands and judge its output by exact equality.

    ``a [M, K]`` and ``b [K, N]`` hold zeros and ones in the operand dtype; ``scale_a`` /
    ``scale_b`` (scaled kernels) must be powers of two, so that the reference is exact.  The trial
    harness above and the fuzzer (:mod:`.fuzz`, whose artifacts replay through here) share it.
    """
    m, k = int(a.shape[0]), int(a.shape[1])
    n = int(b.shape[1])
    fmt = get_format(dtype)
    limit = exact_limit(fmt)
    s = a.double() @ b.double()  # exact: integers <= K
    info = {**(info or {}), "limit": limit, "output_dtype": fmt.name}
    if subject.plain or scale_a is None or scale_b is None:
        sa = sb = None
        scale = torch.ones(1, 1, dtype=torch.float64)
    else:
        sa, sb = scale_a, scale_b
        scale = sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)  # exact: powers of two
        info.update(scale_a_numel=int(sa.numel()), scale_b_numel=int(sb.numel()))
    p = float(info.get("p") or 0.0)  # type: ignore[arg-type]
    expected = (s * scale).numpy()
    exact = s.numpy() * scale.numpy()
    positions = m * n
    ran = run_once(subject, a, b, dtype, sa, sb, m, n)
    out, seconds = ran.out, ran.seconds
    if ran.error is not None:
        return Judged(TrialResult("exact_match", m, k, n, trial, seed, Verdict.ERROR, positions,
                                  info=info, error=ran.error), None, expected, exact)  # fmt: skip
    if ran.problem is not None:
        info["problem"] = ran.problem
        return Judged(TrialResult("exact_match", m, k, n, trial, seed, Verdict.INCORRECT, positions,
                                  seconds=seconds, info=info), out, expected, exact)  # fmt: skip
    info["output_dtype"] = get_format(out.dtype).name if out.dtype in FORMAT_DTYPES else str(out.dtype)
    obs = out.double().numpy()
    checked = s.numpy() <= limit
    with np.errstate(invalid="ignore"):
        equal = (obs == expected) & (np.signbit(obs) == np.signbit(expected))
    bad = checked & ~equal
    n_checked = int(checked.sum())
    n_bad = int(bad.sum())
    spacings = None
    if out.dtype == dtype:
        spacings = np.where(checked, distance(out, torch.from_numpy(expected).to(dtype), fmt), 0)
    first = worst_el = None
    max_spacing = None
    if n_bad:
        flat = np.flatnonzero(bad)
        if spacings is not None:
            d = np.where(bad, np.where(spacings < 0, np.iinfo(np.int64).max, spacings), -1)
            worst_idx = int(np.argmax(d))
            max_spacing = int(spacings.reshape(-1)[worst_idx])
        else:
            with np.errstate(invalid="ignore"):
                gap = np.where(bad, np.nan_to_num(np.abs(obs - expected), nan=np.inf), -1.0)
            worst_idx = int(np.argmax(gap))
        first = element(int(flat[0]), n, exact, expected, obs, spacings)
        worst_el = element(worst_idx, n, exact, expected, obs, spacings)
    elif spacings is not None:
        max_spacing = 0
    if n_bad:
        verdict = Verdict.INCORRECT
    elif n_checked < MIN_CHECKED_FRACTION * positions:
        verdict = Verdict.INCONCLUSIVE
        info["problem"] = (
            f"only {n_checked} of {positions} positions had a reference within the exact range "
            f"[0, {limit}] (p = {p:.4f} is too small for K = {k})"
        )
    else:
        verdict = Verdict.IDENTICAL
    result = TrialResult("exact_match", m, k, n, trial, seed, verdict, positions, n_checked, n_bad,
                         n_bad, max_spacing, first, worst_el, info, None, seconds)  # fmt: skip
    return Judged(result, out, expected, exact)


def run_exact_match(
    subject: Subject,
    shapes: list[tuple[int, int, int]],
    dtype: torch.dtype = torch.bfloat16,
    trials: int = DEFAULT_TRIALS,
    seed: int = 0,
    scales: str = "pow2",
    p: float | None = None,
    overflow: float = DEFAULT_OVERFLOW,
    floor: float = DEFAULT_FLOOR,
) -> CheckResult:
    """Run ``trials`` fresh draws per shape; the verdict is the worst trial's.

    Args:
        subject: the kernel (:func:`.subject.load_subject`).
        shapes: ``(M, K, N)`` problems.
        dtype: the output dtype (bf16, fp16 or fp32); for a plain matmul also the operands'.
        trials: fresh draws per shape (>= 1).
        seed: base seed; trial t of shape (M, K, N) is drawn from a hash of (seed, M, K, N, t).
        scales: "pow2" (default) or "unit", for scaled kernels.
        p: force the zero-probability (default: derived per K, :func:`.sparsity.zero_probability`).
        overflow, floor: the derivation's parameters.

    Raises:
        CheckInputError: a bad shape, dtype, trial count, p or scale mode, or a kernel that cannot
            run a problem here.
    """
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise CheckInputError(f"output dtype must be bfloat16, float16 or float32, got {dtype}")
    if trials < 1:
        raise CheckInputError(f"trials must be >= 1, got {trials}")
    if scales not in ops_mod.SCALE_MODES:
        raise CheckInputError(f"scales must be one of {', '.join(ops_mod.SCALE_MODES)}, got {scales!r}")
    if p is not None and not 0.0 <= p < 1.0:
        raise CheckInputError(f"p must be in [0, 1), got {p}")
    if not 0.0 < overflow < 1.0:
        raise CheckInputError(f"overflow must be in (0, 1), got {overflow}")
    if not shapes:
        raise CheckInputError("no shapes to check")
    fmt = get_format(dtype)
    limit = exact_limit(fmt)
    for shape in shapes:
        problem = shape_problem(shape)
        if problem:
            raise CheckInputError(problem)
        subject.preflight(shape[0], shape[2], shape[1])
    settings = {
        "seed": seed,
        "limit": limit,
        "overflow": overflow,
        "floor": floor,
        "p": p,
        "scales": None if subject.plain else scales,
        "operands": fmt.name if subject.plain else subject.operands,
        "about_operands": (
            "binary (0/1) operands; p = P(entry is 0) "
            + ("as given" if p is not None else
               f"derived per K: at most {overflow:g} of the outputs expected above {limit}, "
               f"p >= {floor:g}")
            + f"; exact equality required where the exact sum is <= {limit} (exact in {fmt.name})"
        ),
    }
    if not subject.plain:
        settings["about_scales"] = (
            f"{subject.operands} operands, {scales} scales (per token and per channel where the "
            "kernel takes them): the reference is exact"
        )
        settings["about_blind_spot"] = ops_mod.SCALES_BLIND_SPOT.format(scales=scales)
    result = CheckResult("exact_match", subject.ref, subject.describe(), fmt.name, trials, settings)
    for m, k, n in shapes:
        pk = p if p is not None else zero_probability(k, limit, overflow, floor)
        for t in range(trials):
            r = exact_match_trial(subject, m, k, n, dtype, pk, t, seed, scales)
            result.results.append(r)
            if r.verdict is Verdict.ERROR:
                break
    return result
