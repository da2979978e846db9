"""The ``precision`` check: exact-integer matmuls that expose a silent precision downgrade.

A kernel that claims fp32 accumulation (and, for fp32 operands, fp32 products) but computes in a
narrower format inside (TF32 or bf16 tensor-core inputs, a bf16 or fp16 accumulator, fp16 split-K
partials) returns the same answer as a correct kernel on most everyday operands, within the loose
tolerances of ``allclose``.  This check draws integer operands whose products and partial sums are
*all* exactly representable in the claimed format (so every correct kernel, in any accumulation
order, returns the exact integer bit for bit) but not in the narrower ones, so a downgraded kernel
gets outputs wrong.  Three operand families, each exposing its downgrade at **every** output, by
construction (``m`` significant bits: fp32 24, tf32 11, fp16 11, bf16 8):

``input-bits`` (plain fp32 kernels only)
    ``A[i, k] = 16 q + 1`` with ``q`` uniform in [128, 255] (odd integers in [2049, 4081]: 12
    significant bits, exact in fp32 but not in tf32, fp16 or bf16); ``B[k, j]`` uniform integers in
    [1, b] (``b`` the largest with ``K * 4081 * b < 2**24``; for ``K > 4111`` only the first 4111
    rows of B are nonzero), exact in every format.  Every product and partial sum is a nonnegative
    integer below ``2**24``: exact in fp32 in any order.  Rounding ``16 q + 1`` to 11 significant
    bits gives ``16 q`` (nearest-even, truncation) or ``16 q + 2`` (ties away); to 8 bits ``16 q``
    (nearest, truncation; spacing 16 in [2048, 4096)).  So under any one rounding mode every A entry
    moves by the same nonzero amount in the same direction, B is positive, and every output's error
    is a nonzero sum of same-signed terms: a kernel that rounds its inputs to tf32, fp16 or bf16
    gets every output wrong.  The diagnosis recomputes the sum exactly from A rounded to 11 and to 8
    significant bits and reports the one the kernel matches.

``sum-bits`` (output fp32)
    Term 0 is odd times odd (int8 and 16/32-bit operands: both in [65, 127], product >= 4225;
    fp8 e4m3: both in {9, 11, 13, 15}), term 1 is ``64 * 64 = 4096``, every other term is an even
    integer (A even) from values bounded so that the sum stays below ``2**24``.  Every operand has
    at most 7 significant bits (exact in bf16, fp16, tf32, int8; e4m3 values from its own
    integers), every partial sum is a nonnegative integer below ``2**24`` (exact in fp32 in any
    order), and every output is an **odd integer above 2**12**, which needs at least 13
    significant bits: no tf32, fp16 or bf16 value equals it.  A kernel whose accumulator, or whose
    final value before the fp32 store, is in one of those formats therefore gets every output
    wrong, whatever its order.

``absorb`` (every output format; the 16-bit-output case)
    ``+2**14`` at ``k = 0`` (``128 * 128``; int8: ``-128 * -128``), ``-2**14`` at ``k = K - 1``
    (int8: ``-128 * 127 = -16256``), ones at ``k = 1`` and ``k = K - 2`` and a 0 or 1 at one random
    middle k.  The exact output is 2 or 3 (int8: 130 or 131): exact in every output format, and
    every partial sum (at most ``2**14 + 3`` in magnitude) is exact in fp32 in any order.  At
    ``2**14`` a bf16 accumulator has spacing 128 and an fp16 or tf32 one spacing 16 (at 16256: 64
    and 8), so adding a 1, 2 or 3 to a partial sum holding ``+-2**14`` gives it back unchanged.
    Every order that sums contiguous ranges of K of at least two elements (sequential, pairwise,
    blocked, split-K with contiguous chunks, and their combinations) adds the one at ``k = 1`` to
    ``+2**14`` before it meets ``-2**14``: a narrow accumulator loses it, every output is wrong.
    This is the family that shows a 16-bit-in, 16-bit-out kernel "accumulating in fp32" that
    accumulates in bf16 (partial sums beyond ``2**8``) or fp16 (beyond ``2**11``).

Verdicts (:mod:`tasks.verdicts`): ``IDENTICAL`` when every output equals its exact integer;
``PRECISION_DOWNGRADE`` when outputs are wrong and each wrong output is what a narrower format
gives (input-bits: the exact sum of the inputs rounded to 11 or 8 bits; sum-bits: a value with at
most 11 significant bits; absorb: the exact value minus some of its small terms), with the format
named; ``INCORRECT`` for any other wrong output, with its cause where one is measured (int8 kernels:
every wrong output equal to int16-saturated pairs of u8 x s8 products, oneDNN's int8 path on a CPU
without VNNI); ``ERROR`` when the kernel raises.

Scaled kernels get unit scales and the families in their operand format (int8 or fp8 e4m3);
``input-bits`` needs fp32 operands, so it runs for plain fp32 kernels only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from tasks.kernels.onednn import saturated_pair_sums
from tasks.numerics import get_format
from tasks.verdicts import Verdict

from . import operands as ops_mod
from .result import CheckResult, TrialResult, element
from .subject import CheckInputError, Subject, run_once, shape_problem

__all__ = ["FAMILIES", "DEFAULT_PRECISION_TRIALS", "families_for", "draw", "run_precision", "round_significand"]

FAMILIES = ("input-bits", "sum-bits", "absorb")
#: Draws per shape and family: every draw exposes a downgrade at every output (see the module
#: docstring), so a few draws only vary the values.
DEFAULT_PRECISION_TRIALS = 2
#: fp32's exact-integer range: every partial sum stays below it.
FP32_EXACT = 2**24
#: The narrower formats the diagnosis names, by significand bits (implicit bit included).
NARROW = ((11, "tf32 or fp16 (11-bit significand)"), (8, "bf16 (8-bit significand)"))
_INPUT_MAX = 16 * 255 + 1  # 4081, the largest input-bits A entry
_INPUT_ROWS = (FP32_EXACT - 1) // _INPUT_MAX  # 4111 rows of B with b = 1


def round_significand(x: np.ndarray, bits: int, mode: str = "nearest") -> np.ndarray:
    """``x`` (float64) rounded to ``bits`` significant bits: ties to even ("nearest") or toward
    zero ("truncate"); no exponent range (the check's values are far inside every format's)."""
    mant, exp = np.frexp(np.asarray(x, dtype=np.float64))
    scaled = np.ldexp(mant, bits)
    r = np.round(scaled) if mode == "nearest" else np.trunc(scaled)
    return np.asarray(np.ldexp(r, exp - bits), dtype=np.float64)


def families_for(subject: Subject, dtype: torch.dtype) -> tuple[str, ...]:
    """The families that apply: input-bits for plain fp32, sum-bits for fp32 output, absorb always."""
    out = []
    if subject.plain and dtype == torch.float32:
        out.append("input-bits")
    if dtype == torch.float32:
        out.append("sum-bits")
    out.append("absorb")
    return tuple(out)


def _representable(values: np.ndarray, op_dtype: torch.dtype) -> np.ndarray:
    """Those of ``values`` (integers) exactly representable in ``op_dtype``."""
    if op_dtype == torch.int8:
        return np.asarray(values[(values >= -128) & (values <= 127)])
    t = torch.from_numpy(values.astype(np.float64))
    back = t.to(op_dtype).double().numpy()
    return np.asarray(values[back == values])


def _pick(values: np.ndarray, shape: tuple[int, ...], gen: torch.Generator) -> np.ndarray:
    idx = torch.randint(0, len(values), shape, generator=gen).numpy()
    return np.asarray(values[idx], dtype=np.float64)


def draw(family: str, m: int, k: int, n: int, op_dtype: torch.dtype, gen: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Integer operands ``A [M, K]``, ``B [K, N]`` (float64 holding integers) of one family."""
    if family == "input-bits":
        a = 16.0 * torch.randint(128, 256, (m, k), generator=gen).double().numpy() + 1.0
        rows = min(k, _INPUT_ROWS)
        bmax = max(1, (FP32_EXACT - 1) // (rows * _INPUT_MAX))
        b = np.zeros((k, n))
        b[:rows] = torch.randint(1, bmax + 1, (rows, n), generator=gen).double().numpy()
        return a, b
    fp8 = op_dtype == torch.float8_e4m3fn
    if family == "sum-bits":
        odd = np.array([9, 11, 13, 15]) if fp8 else np.arange(65, 128, 2)
        a, b = np.zeros((m, k)), np.zeros((k, n))
        a[:, 0], b[0, :] = _pick(odd, (m,), gen), _pick(odd, (n,), gen)
        if k >= 2:
            a[:, 1], b[1, :] = 64.0, 64.0
        if k > 2:
            budget = FP32_EXACT - 1 - 127 * 127 - 4096
            v = min(126, math.isqrt(budget // (k - 2)))
            pool = _representable(np.arange(0, v + 1), op_dtype)
            even = pool[pool % 2 == 0]
            a[:, 2:] = _pick(even, (m, k - 2), gen)
            b[2:, :] = _pick(pool, (k - 2, n), gen)
        return a, b
    if family == "absorb":
        a, b = np.zeros((m, k)), np.zeros((k, n))
        int8 = op_dtype == torch.int8
        a[:, 0], b[0, :] = (-128.0, -128.0) if int8 else (128.0, 128.0)
        a[:, k - 1], b[k - 1, :] = (-128.0, 127.0) if int8 else (-128.0, 128.0)
        a[:, 1] = b[1, :] = 1.0
        a[:, k - 2] = b[k - 2, :] = 1.0
        mid = int(torch.randint(2, k - 2, (1,), generator=gen))
        a[:, mid] = torch.randint(0, 2, (m,), generator=gen).double().numpy()
        b[mid, :] = torch.randint(0, 2, (n,), generator=gen).double().numpy()
        return a, b
    raise CheckInputError(f"unknown precision family {family!r}; allowed: {', '.join(FAMILIES)}")


def _saturation(a: np.ndarray, b: np.ndarray, obs: np.ndarray, bad: np.ndarray) -> str | None:
    """Whether every wrong output is what a GEMM on ``vpmaddubsw`` returns (int8 activations shifted
    to u8 by +128, adjacent u8 x s8 products added in int16 with saturation, the shift's
    compensation subtracted in int32): oneDNN's int8 path on an ISA without VNNI (tasks/kernels/onednn.py)."""
    if not (np.all((a >= -128) & (a <= 127)) and np.all((b >= -128) & (b <= 127))):
        return None
    wrong = obs[bad]
    if not np.all(np.isfinite(wrong)):
        return None
    ai, bi = a.astype(np.int64), b.astype(np.int64)
    model = (saturated_pair_sums(ai + 128, bi) - 128 * bi.sum(0)).astype(np.float64)
    if np.array_equal(wrong, model[bad]):
        return ("every wrong output is the sum of int16-saturated pairs of u8 x s8 products (activations "
                "shifted by +128: vpmaddubsw without VNNI, as oneDNN's AVX2 int8 path computes)")
    return None


def _diagnose(family: str, a: np.ndarray, b: np.ndarray, exact: np.ndarray, obs: np.ndarray,
              bad: np.ndarray) -> str | None:  # fmt: skip
    """Which narrower format explains every wrong output, or None."""
    wrong = obs[bad]
    inf = ~np.isfinite(wrong)
    if np.any(inf):
        # fp16's largest finite value is 65504: an fp16 accumulator overflows on larger exact sums
        if np.all(np.isinf(wrong[inf])) and np.all(np.abs(exact[bad][inf]) > 65504):
            rest = wrong[~inf]
            if rest.size == 0 or np.array_equal(round_significand(rest, 11), rest):
                return "exact sums above 65504 came back infinite, the rest as 11-bit values: fp16 accumulation"
        return None
    if family == "input-bits":
        for bits, name in NARROW:
            for mode in ("nearest", "truncate"):
                sim = round_significand(a, bits, mode) @ b  # exact: integers < 2**24
                if np.array_equal(wrong, sim[bad]):
                    return f"results match {name} input rounding ({'ties to even' if mode == 'nearest' else 'toward zero'})"
            up = round_significand(a + 0.5, bits, "truncate") @ b  # ties away: 16q+1 -> 16q+2 (11 bits)
            if bits == 11 and np.array_equal(wrong, up[bad]):
                return f"results match {name} input rounding (ties away from zero)"
        for bits, name in reversed(NARROW):
            if np.array_equal(round_significand(wrong, bits), wrong):
                return f"every wrong output is a {name} value: computed in {name.split(' ')[0]} (inputs and accumulator)"
        return None
    if family == "sum-bits":
        for bits, name in reversed(NARROW):
            if np.array_equal(round_significand(wrong, bits), wrong):
                return f"every wrong output is a {name} value (odd exact sums above 2**12 need 13+ bits): accumulator or result narrowed to {name.split(' ')[0]}"
        return None
    # absorb: the narrow accumulator drops some of the small terms (at most 3) next to +-2**14
    small = exact - (a[:, :1] @ b[:1, :] + a[:, -1:] @ b[-1:, :])
    lost = exact[bad] - wrong
    if np.all((lost >= 1) & (lost <= small[bad]) & (lost == np.round(lost))):
        return ("small terms next to a partial sum of 2**14 were lost (accumulator spacing there >= 8: "
                "bf16, fp16 or tf32 accumulation)")
    return None


def where_wrong(bad: np.ndarray) -> str | None:
    """The structure of the wrong outputs of an M x N result, when it has one that no precision model
    makes: whole columns (or rows) wrong and every other one exact -- an edge bug (a ragged N or M
    tail, a tile the kernel skips or mis-stores), not a narrower format, which the precision families
    make visible at **every** output. None when every output, or no whole column or row, is wrong."""
    if bad.ndim != 2 or bad.all() or not bad.any():
        return None
    for axis, what, dim in ((0, "columns", "N"), (1, "rows", "M")):
        whole, some = bad.all(axis=axis), bad.any(axis=axis)
        if not np.array_equal(whole, some):
            continue
        idx = np.flatnonzero(whole)
        size = whole.size
        across = "row" if axis == 0 else "column"
        if idx[-1] == size - 1 and np.array_equal(idx, np.arange(size - idx.size, size)):
            return (f"the last {idx.size} of {size} {what} are wrong in every {across}, every other output exact: "
                    f"an {dim}-edge bug (a ragged {dim} tail or its tile), not precision")
        one = what[:-1]
        return (f"{idx.size} whole {one if idx.size == 1 else what} of {size} {'is' if idx.size == 1 else 'are'} wrong "
                f"(e.g. {one} {idx[0]}), every other output exact: a {one}-dependent bug, not precision")
    return None


def precision_trial(subject: Subject, family: str, m: int, k: int, n: int, dtype: torch.dtype, trial: int,
                    seed: int = 0) -> TrialResult:  # fmt: skip
    """One draw of ``family`` for ``subject``, judged by exact equality at every output."""
    gen = ops_mod.generator("precision", family, seed, m, k, n, trial)
    op_dtype = subject.operand_dtype(dtype)
    a64, b64 = draw(family, m, k, n, op_dtype, gen)
    exact = a64 @ b64  # exact: integer partial sums below 2**53
    fmt = get_format(dtype)
    info: dict[str, Any] = {"inputs": family, "limit": FP32_EXACT, "output_dtype": fmt.name}
    a, b = torch.from_numpy(a64).to(op_dtype), torch.from_numpy(b64).to(op_dtype)
    sa = sb = None
    if not subject.plain:
        na, nb = subject.scale_numel(m, n, k)
        sa, sb = torch.ones(na, dtype=torch.float32), torch.ones(nb, dtype=torch.float32)
        info.update(scales="unit", scale_a_numel=na, scale_b_numel=nb)
    positions = m * n
    ran = run_once(subject, a, b, dtype, sa, sb, m, n)
    out, seconds = ran.out, ran.seconds
    if ran.error is not None:
        return TrialResult("precision", m, k, n, trial, seed, Verdict.ERROR, positions, info=info, error=ran.error)
    if ran.problem is not None:
        info["problem"] = ran.problem
        return TrialResult("precision", m, k, n, trial, seed, Verdict.INCORRECT, positions, seconds=seconds, info=info)
    obs = out.double().numpy()
    with np.errstate(invalid="ignore"):
        bad = ~((obs == exact) & (np.signbit(obs) == np.signbit(exact)))
    n_bad = int(bad.sum())
    first = worst_el = None
    verdict = Verdict.IDENTICAL
    if n_bad:
        flat = np.flatnonzero(bad)
        with np.errstate(invalid="ignore"):
            gap = np.where(bad, np.nan_to_num(np.abs(obs - exact), nan=np.inf), -1.0)
        first = element(int(flat[0]), n, exact, exact, obs)
        worst_el = element(int(np.argmax(gap)), n, exact, exact, obs)
        saturated = _saturation(a64, b64, obs, bad) if not subject.plain else None
        edge = None if saturated else where_wrong(bad)
        # Every family exposes a narrower format at every output (module docstring): a format that
        # explains only some outputs' values is not the evidence of a downgrade.
        found = None if saturated or edge or n_bad < positions else _diagnose(family, a64, b64, exact, obs, bad)
        verdict = Verdict.PRECISION_DOWNGRADE if found else Verdict.INCORRECT
        cause = found or saturated or edge
        if saturated or edge:
            info["cause"] = saturated or edge
        info["problem"] = (f"{cause}: " if cause else "incorrect, cause unknown: ") + f"{n_bad} of {positions} exact integers wrong"
    return TrialResult("precision", m, k, n, trial, seed, verdict, positions, positions, n_bad, n_bad,
                       None, first, worst_el, info, None, seconds)  # fmt: skip


def run_precision(
    subject: Subject,
    shapes: list[tuple[int, int, int]],
    dtype: torch.dtype = torch.float32,
    trials: int = DEFAULT_PRECISION_TRIALS,
    seed: int = 0,
    families: tuple[str, ...] | None = None,
) -> CheckResult:
    """Run ``trials`` draws of each applicable family per shape; the verdict is the worst trial's.

    Args:
        subject: the kernel (:func:`.subject.load_subject`).
        shapes: ``(M, K, N)`` problems, K >= 5 (absorb needs its five distinct positions).
        dtype: the claimed output format (fp32: every family; bf16 / fp16: absorb).
        trials: draws per shape and family (>= 1).
        seed: base seed.
        families: a subset of :func:`families_for` (default all that apply).

    Raises:
        CheckInputError: a bad shape, dtype, trial count or family, or a kernel that cannot run a
            problem here.
    """
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise CheckInputError(f"output dtype must be bfloat16, float16 or float32, got {dtype}")
    if trials < 1:
        raise CheckInputError(f"trials must be >= 1, got {trials}")
    if not shapes:
        raise CheckInputError("no shapes to check")
    allowed = families_for(subject, dtype)
    chosen = tuple(families) if families else allowed
    bad = [f for f in chosen if f not in allowed]
    if bad:
        raise CheckInputError(f"family {bad[0]!r} does not apply to {subject.ref} at {dtype}; allowed: {', '.join(allowed)}")
    for shape in shapes:
        problem = shape_problem(shape)
        if problem:
            raise CheckInputError(problem)
        if shape[1] < 5:
            raise CheckInputError(f"shape {shape[0]}x{shape[1]}x{shape[2]}: the precision check needs K >= 5")
        subject.preflight(shape[0], shape[2], shape[1])
    fmt = get_format(dtype)
    settings: dict[str, Any] = {
        "seed": seed,
        "families": list(chosen),
        "operands": fmt.name if subject.plain else subject.operands,
        "about_operands": (
            f"exact-integer operands in {fmt.name if subject.plain else subject.operands}"
            + ("" if subject.plain else " with unit scales")
            + "; every product and partial sum exact in fp32 in any order, every output an exact "
            f"integer in {fmt.name}; families {', '.join(chosen)} (docs/checks.md)"
        ),
    }
    result = CheckResult("precision", subject.ref, subject.describe(), fmt.name, trials, settings)
    for m, k, n in shapes:
        for family in chosen:
            for t in range(trials):
                r = precision_trial(subject, family, m, k, n, dtype, t, seed)
                result.results.append(r)
                if r.verdict is Verdict.ERROR:
                    break
    wrong = [r for r in result.results if r.verdict is Verdict.PRECISION_DOWNGRADE]
    absorb = [r for r in result.results if r.info.get("inputs") == "absorb"]
    if wrong and absorb and all(r.verdict is Verdict.IDENTICAL for r in absorb):
        # A narrow accumulator fails absorb at every output; exact there, the narrowing is of the result.
        for r in wrong:
            cause = str(r.info["problem"]).rsplit(": ", 1)[0]
            fmt_name = next((name for _bits, name in NARROW if f"is a {name} value" in cause), None)
            if fmt_name is not None:
                r.info["problem"] = (
                    f"every wrong output is a {fmt_name} value while the absorb family (which a narrow accumulator "
                    f"fails at every output) is exact: the result is rounded to {fmt_name.split(' ')[0]} before the "
                    f"store, the accumulator keeps fp32: " + str(r.info["problem"]).rsplit(": ", 1)[1])
    if wrong:
        finding = {str(r.info["problem"]).rsplit(": ", 1)[0] for r in wrong}
        total = sum(r.positions for r in result.results if r.info.get("inputs") in {w.info["inputs"] for w in wrong})
        settings["about_finding"] = (f"PRECISION DOWNGRADE: {'; '.join(sorted(finding))}: "
                                     f"{sum(r.mismatches for r in wrong)} of {total} exact integers wrong")  # fmt: skip
    explained = [r for r in result.results if r.verdict is Verdict.INCORRECT and r.info.get("cause")]
    if explained and not wrong:
        total = sum(r.positions for r in explained)
        settings["about_finding"] = (f"INCORRECT: {'; '.join(sorted({str(r.info['cause']) for r in explained}))}: "
                                     f"{sum(r.mismatches for r in explained)} of {total} exact integers wrong")  # fmt: skip
    unknown = [r for r in result.results if r.verdict is Verdict.INCORRECT and not r.info.get("cause")]
    if unknown and not wrong and not explained:
        total = sum(r.positions for r in unknown)
        settings["about_finding"] = ("INCORRECT, cause unknown (no narrower format, saturation or edge structure "
                                     f"explains them): {sum(r.mismatches for r in unknown)} of {total} exact "
                                     "integers wrong")
    return result
