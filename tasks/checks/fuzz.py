"""``check fuzz``: a seeded hunt over shapes, values and scales, judged by both checks.

Fixed-shape checks miss defects that live at one kind of edge (a tail tile, a large-M
configuration, a split-K path); a seeded fuzzer with an exact reference finds them.  Each trial
``i`` draws, from a generator seeded by ``(seed, i)`` alone:

* a **shape** ``(M, K, N)`` aimed at kernel edges: K at every power-of-two boundary ``2**j +- 1`` up
  to :data:`MAX_K`, at ``16 j +- 1``, ``64 j +- 1``, ``128 j +- 1``, or log-uniform; M and N at 1, at
  tile sizes ``t +- 1`` (:data:`TILES`), small, or anywhere up to :data:`MAX_M` / ``MAX_N``;
  ``M * K * N`` at most :data:`MAX_WORK` (:data:`MAX_WORK_LARGE_K` above K = 4097), so a trial takes
  milliseconds to a second;
* a **value recipe** (:data:`RECIPES`) and, for a scaled kernel, a **scale kind**
  (:data:`SCALE_KINDS`); an operand **layout** (:data:`LAYOUTS`);
* exact match's **input kind** (:data:`EXACT_INPUTS`): binary, or (where the claimed accumulator is
  fp32 or wider) ``cancelling-runs``, dense small integers whose partial sums are large but exact
  in fp32 in any order, so that a 16-bit partial or accumulator is seen at any K.

The trial is judged by **both** checks of :mod:`tasks.checks`, through their own judges
(:func:`.exact_match.judge_exact_match`, :func:`.bounds.judge_bounds`): exact match on the trial's
exact inputs of that shape (power-of-two scales: its premise), and the bounds check on the recipe's
operands with the trial's scales.  Trials run until the time budget is spent (or ``max_trials``);
the budget only decides *how many* trials run — trial ``i`` is the same draw on every machine.

On a failure the fuzzer **shrinks** it (:func:`shrink`): the same trial's recipe is drawn again at
smaller shapes (the values are regenerated from ``(seed, i)`` and the shape), keeping any shape that
still fails the same check, until no smaller candidate fails.  The shrunk failure is saved as a
replayable artifact (:mod:`.artifact`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tasks.numerics import INT8_MAX_K, get_format
from tasks.seeds import stable_seed
from tasks.verdicts import Verdict, worst

from . import operands as ops_mod
from .bounds import algorithm as get_algorithm
from .bounds import judge_bounds
from .exact_match import judge_exact_match
from .result import Judged
from .sparsity import exact_limit, zero_probability
from .subject import CheckInputError, Subject

__all__ = [
    "DEFAULT_BUDGET_S",
    "MAX_M",
    "MAX_WORK",
    "MAX_WORK_LARGE_K",
    "MAX_K",
    "TILES",
    "LAYOUTS",
    "apply_layout",
    "boundary_classes",
    "coverage_text",
    "RECIPES",
    "EXACT_INPUTS",
    "RUNS_PROBABILITY",
    "runs_valid",
    "SCALE_KINDS",
    "INT8_NO_OVERFLOW_K",
    "TrialPlan",
    "Run",
    "TrialRecord",
    "Failure",
    "FuzzResult",
    "FuzzSettings",
    "plan_trial",
    "draw_operands",
    "run_check",
    "shrink",
    "fuzz",
]

#: The default time budget of ``check fuzz`` (seconds).
DEFAULT_BUDGET_S = 60.0
#: The largest M drawn ("large M": several 64- and 128-row blocks, the 256-row tile +- 1).
MAX_M = 300
#: The largest power-of-two exponent of K drawn at its boundary (2**j - 1, 2**j, 2**j + 1):
#: K reaches 2**15 + 1 = 32,769, beyond every split point a CPU or GPU kernel is known to use.
MAX_K_EXPONENT = 15
#: The largest K drawn (outside the int32-edge recipe) and N.
MAX_K = (1 << MAX_K_EXPONENT) + 1
MAX_N = 320
#: M * K * N of one trial is at most this (K <= 4097: the old generator's range) ...
MAX_WORK = 2**23
#: ... and at most this for K > 4097: when K is large, M and N shrink (the larger one halves first),
#: so one trial (both checks, any recipe) stays near half a second on 2 cores (K = 32,767: M * N <= 64).
MAX_WORK_LARGE_K = 2**21
#: The tile sizes whose boundaries (t - 1, t, t + 1) M and N are drawn at.
TILES = (16, 32, 64, 128, 256)
#: Operand layouts: the kernel gets the same values, in another memory layout.
LAYOUTS = {
    "contiguous": "A and B row-major and contiguous",
    "a-transposed": "A given as the transposed view of a contiguous K x M tensor (column-major A)",
    "b-transposed": "B given as the transposed view of a contiguous N x K tensor (column-major B)",
    "both-transposed": "A and B both column-major (transposed views)",
    "strided": "A and B every other column of a twice-as-wide tensor (row stride 2x, column stride 2)",
}
#: Exact-match draws expect at most this fraction of outputs above the exact range (the check's
#: default is 0.01): sparse enough that a trial of a few outputs is practically never INCONCLUSIVE.
EXACT_MATCH_OVERFLOW = 1e-6
#: The largest K for which int8 sums (|a| <= 127, |b| <= 128) cannot overflow int32 (defined once, in
#: tasks.numerics.formats).
INT8_NO_OVERFLOW_K = INT8_MAX_K

#: Value recipes (bounds check): what each stresses.
RECIPES = {
    "randn": "normal entries (int8: x32, fp8: x16): the everyday case",
    "outliers-k": "a few K-channels of A far larger than the rest (activation outliers along K)",
    "mixed-rows": "rows of A of very different magnitudes (2**-10..2**10; int8: peak 1..127)",
    "ties": "small integers (|x| <= 7): exact sums that land on rounding ties of the output format",
    "subnormal": "magnitudes whose products and outputs are subnormal in the output format",
    "int32-edge": "int8 only: K near the int32 no-overflow bound, +-127 aligned so sums near 2**31",
}
#: Exact match's input kinds.  ``cancelling-runs`` needs an fp32 (or wider) accumulator, the claim of
#: every registered CPU kernel (int8: exact int32; fp8: exact products, fp32 sums; plain matmuls at
#: the default ``--accumulate fp32``): :func:`runs_valid`.  Where it is not valid every trial is binary.
EXACT_INPUTS = {
    "binary": "zeros and ones, sparse enough that nearly every sum is exact in the output format",
    "cancelling-runs": "integers 1..3 in long runs of one sign whose pairs cancel: partial sums far beyond "
                       "256 (2048) in magnitude, every one exact in fp32, total a small integer "
                       "(tasks.checks.operands.cancelling_runs)",
}
#: The fraction of trials whose exact-match operands are cancelling-runs (where valid).
RUNS_PROBABILITY = 0.5
#: Scale kinds of a scaled kernel's bounds trial.
SCALE_KINDS = {
    "pow2": "powers of two 2**e, e in [-2, 2], per token and per channel",
    "unit": "all ones",
    "nonpow2": "16-bit significands times 2**e (never powers of two; scaled operands exact in fp32)",
    "tiny": "powers of two small enough that the outputs are subnormal (subnormal recipe)",
}

_EDGE_BASES = (16, 64, 128)


def _edges(limit: int) -> np.ndarray:
    """Sizes at kernel edges up to ``limit``: 16j, 64j, 128j and their neighbours, and 1..3."""
    pts = {1, 2, 3}
    for base in _EDGE_BASES:
        for j in range(1, limit // base + 2):
            pts.update((base * j - 1, base * j, base * j + 1))
    return np.array(sorted(x for x in pts if 1 <= x <= limit), dtype=np.int64)


_K_EDGES = _edges(MAX_K)
_N_EDGES = _edges(MAX_N)


@dataclass(frozen=True)
class TrialPlan:
    """What trial ``index`` draws: its shape, value recipe, scale kind ("none": plain matmul), operand
    layout (:data:`LAYOUTS`) and exact match's input kind (:data:`EXACT_INPUTS`)."""

    index: int
    m: int
    k: int
    n: int
    recipe: str
    scales: str
    layout: str = "contiguous"
    exact_inputs: str = "binary"

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.k}x{self.n}"

    def at(self, m: int, k: int, n: int) -> TrialPlan:
        """The same trial (recipe, scales, layout, exact inputs) at another shape: what shrinking tries."""
        return TrialPlan(self.index, m, k, n, self.recipe, self.scales, self.layout, self.exact_inputs)


def _pow2_boundary(rng: np.random.Generator, lo: int, hi: int) -> int:
    """``2**j + d``, j uniform in [lo, hi], d uniform in {-1, 0, +1} (at least 1)."""
    j, d = int(rng.integers(lo, hi + 1)), int(rng.integers(-1, 2))
    return max(1, (1 << j) + d)


def _tile_size(rng: np.random.Generator, limit: int) -> int:
    """M or N: 1 (15%), a tile boundary t - 1, t, t + 1 for t in :data:`TILES` (45%), 2..15 (10%),
    or uniform in [1, limit] (30%)."""
    u = rng.random()
    if u < 0.15:
        return 1
    if u < 0.6:
        return min(limit, int(rng.choice(TILES)) + int(rng.integers(-1, 2)))
    if u < 0.7:
        return int(rng.integers(2, 16))
    return int(rng.integers(1, limit + 1))


def _draw_k(rng: np.random.Generator) -> int:
    """K: a power-of-two boundary 2**j +- 1, j in 1..MAX_K_EXPONENT (50%); a 16/64/128-multiple
    edge up to MAX_K (25%); log-uniform in [1, MAX_K] (25%)."""
    u = rng.random()
    if u < 0.5:
        return _pow2_boundary(rng, 1, MAX_K_EXPONENT)
    if u < 0.75:
        return int(rng.choice(_K_EDGES))
    k = int(math.exp(float(rng.uniform(0.0, math.log(MAX_K + 1)))))
    return min(MAX_K, k)


def _fit_work(m: int, k: int, n: int) -> tuple[int, int]:
    """``(m, n)`` shrunk until ``m * k * n`` is at most :data:`MAX_WORK` (:data:`MAX_WORK_LARGE_K` for
    K > 4097): the larger of the two halves (rounding up)."""
    cap = MAX_WORK if k <= 4097 else MAX_WORK_LARGE_K
    while m * k * n > cap and (m > 1 or n > 1):
        if m >= n:
            m = (m + 1) // 2
        else:
            n = (n + 1) // 2
    return m, n


def runs_valid(accumulate: str) -> bool:
    """Whether exact match may use ``cancelling-runs`` for a kernel claiming accumulation format
    ``accumulate``: its partial sums reach ``9 K`` (below ``2**24``), exact only in fp32 or wider."""
    return get_format(accumulate).max_exact_integer >= 2**24


def plan_trial(seed: int, index: int, operands: str | None, accumulate: str = "fp32") -> TrialPlan:
    """Trial ``index``'s plan, from ``(seed, index)`` only.

    ``operands``: "int8", "fp8_e4m3", or None for a plain matmul (no scales, no int32-edge recipe).
    ``accumulate``: the accumulation format the kernel claims; exact match's input kind is drawn last
    (binary or cancelling-runs, :data:`RUNS_PROBABILITY`), so the shape, recipe, scales and layout
    are those of the fuzz kind's version 2, and it is binary where :func:`runs_valid` says no.
    """
    rng = np.random.default_rng(stable_seed("fuzz-plan-v2", seed, index))
    recipes = [r for r in RECIPES if r != "int32-edge" or operands == "int8"]
    weights = np.array([3.0 if r == "randn" else 0.5 if r == "int32-edge" else 2.0 for r in recipes])
    recipe = recipes[int(rng.choice(len(recipes), p=weights / weights.sum()))]
    if operands is None:
        scales = "none"
    elif recipe == "subnormal":
        scales = "tiny"
    else:
        scales = ("pow2", "nonpow2", "unit")[int(rng.choice(3, p=[0.4, 0.4, 0.2]))]
    names = list(LAYOUTS)
    layout = names[int(rng.choice(len(names), p=[0.6, 0.1, 0.1, 0.1, 0.1]))]
    if recipe == "int32-edge":
        k = int(rng.integers(INT8_NO_OVERFLOW_K - 2048, INT8_NO_OVERFLOW_K + 1))
        m, n = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    else:
        k = _draw_k(rng)
        m = _tile_size(rng, MAX_M)
        n = int(rng.choice(_N_EDGES)) if rng.random() < 0.2 else _tile_size(rng, MAX_N)
        m, n = _fit_work(m, k, n)
    runs = rng.random() < RUNS_PROBABILITY and runs_valid(accumulate)
    return TrialPlan(index, m, k, n, recipe, scales, layout, "cancelling-runs" if runs else "binary")


def apply_layout(a: torch.Tensor, b: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``a``, ``b`` with the same values in ``layout``'s memory layout (:data:`LAYOUTS`)."""

    def col_major(x: torch.Tensor) -> torch.Tensor:
        return x.t().contiguous().t()

    def strided(x: torch.Tensor) -> torch.Tensor:
        wide = torch.zeros(x.shape[0], 2 * x.shape[1], dtype=x.dtype)
        wide[:, ::2] = x
        return wide[:, ::2]

    if layout == "contiguous":
        return a, b
    if layout == "a-transposed":
        return col_major(a), b
    if layout == "b-transposed":
        return a, col_major(b)
    if layout == "both-transposed":
        return col_major(a), col_major(b)
    if layout == "strided":
        return strided(a), strided(b)
    raise CheckInputError(f"unknown operand layout {layout!r}; valid: {', '.join(LAYOUTS)}")


def boundary_classes(plan: TrialPlan) -> list[str]:
    """The boundary classes trial ``plan`` hits (the rows of the coverage table):

    * ``K=2^j-1``, ``K=2^j``, ``K=2^j+1`` (j >= 2) when K is one; else ``K other <= 4096`` or
      ``K other > 4096``; and ``K > 4096`` for every K above 4096 (past the old generator's cap);
    * ``M=1``; ``M=t-1`` / ``M=t`` / ``M=t+1`` for t in :data:`TILES`; else ``M 2..15`` or ``M other``;
    * ``N`` the same, plus its tail against 16-column tiles: ``N%16=0``, ``N%16=1``, ``N%16 in 2..15``;
    * ``layout <name>``.
    """
    out = []
    k = plan.k
    j = (k + 1).bit_length() - 1
    for e in (j - 1, j, j + 1):
        if e >= 2 and k - 2**e in (-1, 0, 1):
            d = k - 2**e
            out.append(f"K=2^{e}" + ("" if d == 0 else f"{d:+d}"))
            break
    else:
        out.append("K other <= 4096" if k <= 4096 else "K other > 4096")
    if k > 4096:
        out.append("K > 4096")
    for dim, v in (("M", plan.m), ("N", plan.n)):
        tile = next((f"{dim}={t}" + ("" if v == t else f"{v - t:+d}") for t in TILES if abs(v - t) <= 1), None)
        out.append(f"{dim}=1" if v == 1 else tile if tile else f"{dim} 2..15" if v < 16 else f"{dim} other")
    r = plan.n % 16
    out.append("N%16=0" if r == 0 else "N%16=1" if r == 1 else "N%16 in 2..15")
    out.append(f"layout {plan.layout}")
    return out


def _values(recipe: str, m: int, k: int, n: int, op: torch.dtype, out: torch.dtype,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Operands of ``recipe`` in the operand dtype ``op`` (a float dtype, int8 or e4m3)."""
    is_int8, is_fp8 = op == torch.int8, op == torch.float8_e4m3fn
    amp = 32.0 if is_int8 else 16.0 if is_fp8 else 1.0
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    if recipe == "randn":
        a, b = a * amp, b * amp
    elif recipe == "outliers-k":
        count = int(torch.randint(1, 5, (1,), generator=gen))
        cols = torch.randperm(k, generator=gen)[:count]
        base = 4.0 if is_int8 else amp
        a, b = a * base, b * amp
        a[:, cols] = a[:, cols].sign() * (127.0 if is_int8 else 2.0**6 if is_fp8 else 2.0**10) * (
            0.75 + 0.25 * torch.rand(m, len(cols), generator=gen)
        )
    elif recipe == "mixed-rows":
        lo, hi = (0, 7) if is_int8 else (-6, 6) if is_fp8 else (-10, 10)
        e = torch.randint(lo, hi + 1, (m, 1), generator=gen).float()
        a = a * (torch.exp2(e) / 4 if is_int8 else torch.exp2(e) * amp)
        b = b * amp
    elif recipe == "ties":
        a = torch.randint(-7, 8, (m, k), generator=gen).float()  # sums of a few hundred reach the
        b = torch.randint(-7, 8, (k, n), generator=gen).float()  # range where odd integers are bf16 ties
    elif recipe == "subnormal":
        if not (is_int8 or is_fp8):
            fmt = get_format(out)
            target = math.log2(fmt.min_normal) - 3 - 0.5 * math.log2(max(k, 1))  # log2 of a product
            ea, eb = math.floor(target / 2), math.ceil(target / 2)
            a, b = a * 2.0**ea, b * 2.0**eb
        else:
            a, b = a * amp, b * amp  # the scales make the outputs subnormal
    elif recipe == "int32-edge":
        sign = torch.where(torch.rand(k, generator=gen) < 0.5, -1.0, 1.0)
        a = torch.where(torch.rand(m, k, generator=gen) < 0.5, -1.0, 1.0) * 127.0
        a[0] = sign * 127.0
        b = sign.reshape(k, 1).expand(k, n).clone() * 127.0  # row 0 of A @ B: K * 127**2
    else:
        raise CheckInputError(f"unknown fuzz recipe {recipe!r}; valid: {', '.join(RECIPES)}")
    if is_int8:
        return a.round().clamp(-127, 127).to(op), b.round().clamp(-127, 127).to(op)
    if is_fp8:
        return a.clamp(-448, 448).to(op), b.clamp(-448, 448).to(op)
    return a.to(op), b.to(op)


def _scales(kind: str, m: int, k: int, n: int, numel: tuple[int, int], out: torch.dtype,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``scale_a [M or 1, 1]``, ``scale_b [N or 1]`` (float32) of scale ``kind``."""
    if kind in ("pow2", "unit"):
        return ops_mod.scales(kind, m, n, numel, gen)
    na, nb = numel
    ea = torch.randint(-2, 3, (na,), generator=gen).float()
    eb = torch.randint(-2, 3, (nb,), generator=gen).float()
    if kind == "nonpow2":
        ja = torch.randint(1, 2**15, (na,), generator=gen).float()
        jb = torch.randint(1, 2**15, (nb,), generator=gen).float()
        sa, sb = (1 + ja / 2**15) * torch.exp2(ea), (1 + jb / 2**15) * torch.exp2(eb)
    elif kind == "tiny":
        # outputs ~ 2**10 sqrt(K) * sa * sb (operands ~32 x 32): put them 3 binades below min_normal
        target = math.log2(get_format(out).min_normal) - 3 - 10 - 0.5 * math.log2(max(k, 1))
        sa = torch.exp2(ea + math.floor(target / 2))
        sb = torch.exp2(eb + math.ceil(target / 2))
    else:
        raise CheckInputError(f"unknown scale kind {kind!r}; valid: {', '.join(SCALE_KINDS)}")
    return sa.reshape(na, 1).float().contiguous(), sb.reshape(nb).float().contiguous()


@dataclass
class FuzzSettings:
    """How trials are judged: the output dtype and the bounds check's algorithm."""

    dtype: torch.dtype = torch.bfloat16
    algorithm: str = "any"
    accumulate: str = "fp32"
    fma: bool = True

    def describe(self) -> dict[str, Any]:
        return {"dtype": get_format(self.dtype).name, "algorithm": self.algorithm,
                "accumulate": self.accumulate, "fma": self.fma}  # fmt: skip


@dataclass
class Run:
    """One judged run of one check at one shape, with the operands it ran on."""

    check: str
    plan: TrialPlan
    judged: Judged
    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor | None
    scale_b: torch.Tensor | None
    info: dict[str, Any]

    @property
    def verdict(self) -> Verdict:
        return self.judged.result.verdict


def draw_operands(subject: Subject, check: str, plan: TrialPlan, seed: int, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, dict[str, Any]]:  # fmt: skip
    """``plan``'s operands for ``check``: ``(a, b, scale_a, scale_b, info)``, from (seed, trial, check,
    shape) only.  Exact match: the plan's exact inputs (binary or cancelling-runs), power-of-two
    scales; bounds: the recipe and the scale kind."""
    m, k, n = plan.m, plan.k, plan.n
    gen = torch.Generator().manual_seed(stable_seed("fuzz", seed, plan.index, check, m, k, n))
    op = subject.operand_dtype(dtype)
    sa = sb = None
    if check == "exact_match" and plan.exact_inputs == "cancelling-runs":
        ar, br = ops_mod.cancelling_runs(m, k, n, gen)
        a, b = ar.to(op), br.to(op)  # integers |x| <= 3: exact in every operand dtype
        info: dict[str, Any] = {"inputs": "cancelling-runs"}
        if not subject.plain:
            sa, sb = ops_mod.scales("pow2", m, n, subject.scale_numel(m, n, k), gen)
            info["scales"] = "pow2"
    elif check == "exact_match":
        p = zero_probability(k, exact_limit(get_format(dtype)), EXACT_MATCH_OVERFLOW)
        a01, b01 = ops_mod.binary(m, k, n, p, gen)
        a, b = a01.to(op), b01.to(op)
        info = {"p": p, "inputs": "binary"}
        if not subject.plain:
            sa, sb = ops_mod.scales("pow2", m, n, subject.scale_numel(m, n, k), gen)
            info["scales"] = "pow2"
    elif check == "bounds":
        a, b = _values(plan.recipe, m, k, n, op, dtype, gen)
        info = {"inputs": plan.recipe}
        if not subject.plain:
            sa, sb = _scales(plan.scales, m, k, n, subject.scale_numel(m, n, k), dtype, gen)
            info["scales"] = plan.scales
    else:
        raise CheckInputError(f"unknown check {check!r}; valid: exact_match, bounds")
    if plan.layout != "contiguous":  # the same values in another memory layout (not in ``info``: the
        a, b = apply_layout(a, b, plan.layout)  # check rows have no layout column; the plan and artifact have it)
    return a, b, sa, sb, info


def run_check(subject: Subject, check: str, plan: TrialPlan, seed: int, settings: FuzzSettings,
              alg: Any = None) -> Run:  # fmt: skip
    """Draw ``plan``'s operands for ``check`` ("exact_match" or "bounds") and judge the kernel."""
    a, b, sa, sb, info = draw_operands(subject, check, plan, seed, settings.dtype)
    if check == "exact_match":
        judged = judge_exact_match(subject, a, b, settings.dtype, sa, sb, trial=plan.index, seed=seed, info=info)
    else:
        if alg is None:
            alg = get_algorithm(settings.algorithm, settings.accumulate, settings.fma)
        judged = judge_bounds(subject, alg, a, b, settings.dtype, sa, sb, trial=plan.index, seed=seed, info=info)
    return Run(check, plan, judged, a, b, sa, sb, info)


def _candidates(d: int) -> list[int]:
    """Smaller sizes to try for one dimension, smallest first: 1..3, d/4, d/2, d - 2**i."""
    out = {1, 2, 3, d // 4, d // 2}
    out.update(d - 2**i for i in range(0, max(1, d.bit_length())))
    return sorted(x for x in out if 1 <= x < d)


def shrink(subject: Subject, run: Run, seed: int, settings: FuzzSettings, alg: Any = None,
           max_runs: int = 120) -> tuple[Run, int]:  # fmt: skip
    """The smallest shape (greedy, one dimension at a time) at which the trial still fails.

    For M, then N, then K, the candidates of :func:`_candidates` are tried smallest first with the
    trial's recipe drawn again at that shape; the first that still fails the same check with the same
    verdict (INCORRECT stays INCORRECT, ERROR stays ERROR) becomes the new shape; rounds repeat until none is smaller, or ``max_runs`` runs.
    Returns the shrunk run and the number of runs tried.
    """
    best, tried = run, 0
    changed = True
    while changed and tried < max_runs:
        changed = False
        for dim in ("m", "n", "k"):
            cur = getattr(best.plan, dim)
            for c in _candidates(cur):
                if tried >= max_runs:
                    break
                shape = {"m": best.plan.m, "k": best.plan.k, "n": best.plan.n, dim: c}
                try:
                    subject.preflight(shape["m"], shape["n"], shape["k"])
                except CheckInputError:
                    continue
                tried += 1
                r = run_check(subject, run.check, best.plan.at(shape["m"], shape["k"], shape["n"]), seed,
                              settings, alg)  # fmt: skip
                if r.verdict is run.verdict:
                    best, changed = r, True
                    break
    return best, tried


def k_dependence(subject: Subject, run: Run, seed: int, settings: FuzzSettings, alg: Any = None) -> str | None:
    """What the K of a shrunk failure says about its cause, from at most three more runs of the same
    trial at the same M and N: failing at a power-of-two K alone (K - 1 and K + 1 pass), or only past
    a power of two P >= 256 below K (K = P passes): the K boundaries where kernels split K. None when
    neither holds (no evidence about K) or K is small."""
    k = run.plan.k

    def passes(kk: int) -> bool | None:
        try:
            subject.preflight(run.plan.m, run.plan.n, kk)
        except CheckInputError:
            return None
        return run_check(subject, run.check, run.plan.at(run.plan.m, kk, run.plan.n), seed, settings,
                         alg).verdict.passed  # fmt: skip

    if k <= 256:
        return None
    if k & (k - 1) == 0 and passes(k - 1) and passes(k + 1):
        return (f"fails at K = {k} but passes at K = {k - 1} and {k + 1}: a path this power-of-two K alone "
                "takes (a K-specific tile or split configuration)")
    p = 1 << ((k - 1).bit_length() - 1)  # the largest power of two below K
    if p >= 256 and passes(p):
        return (f"passes at K = {p}, fails at K = {k}: the defect is past K = {p}, where kernels split K "
                "(split-K partials or a K-tail chunk)")
    return None


@dataclass
class TrialRecord:
    """One trial, as a row: its plan, both checks' verdicts, and the failure it found (if any)."""

    plan: TrialPlan
    exact_match: Verdict
    bounds: Verdict
    seconds: float
    failure: Failure | None = None

    @property
    def verdict(self) -> Verdict:
        return worst((self.exact_match, self.bounds))


@dataclass
class Failure:
    """A failing trial: the check that failed, the original run and its shrunk form."""

    check: str
    original: Run
    shrunk: Run
    shrink_runs: int
    artifact: str | None = None
    #: What K says about the cause (:func:`k_dependence`), or None.
    k_note: str | None = None


@dataclass
class FuzzResult:
    """What one fuzzing session did: trials run, their verdicts, the failures found."""

    kernel: str
    subject: str
    seed: int
    budget_s: float
    settings: dict[str, Any]
    trials: list[TrialRecord] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    stopped: str = ""
    skipped: int = 0
    skip_reason: str | None = None

    @property
    def verdict(self) -> Verdict:
        return worst(t.verdict for t in self.trials)

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def counts(self, what: str) -> dict[str, int]:
        """How many trials had each ``what``: "recipe", "scales", "layout", "exact_inputs", "exact_match",
        "bounds", "verdict"."""
        out: dict[str, int] = {}
        for t in self.trials:
            v = getattr(t.plan, what) if what in ("recipe", "scales", "layout", "exact_inputs") else getattr(t, what)
            key = v.value if isinstance(v, Verdict) else str(v)
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    def coverage(self) -> list[dict[str, Any]]:
        """The coverage table: per boundary class (:func:`boundary_classes`), in a fixed order, the
        trials that hit it and how many of those failed (worst verdict of the two checks not passing)."""
        hit: dict[str, list[int]] = {}
        for t in self.trials:
            for c in boundary_classes(t.plan):
                row = hit.setdefault(c, [0, 0])
                row[0] += 1
                row[1] += 0 if t.verdict.passed else 1
        return [{"class": c, "trials": v[0], "failed": v[1]} for c, v in sorted(hit.items(), key=lambda x: class_order(x[0]))]

    def failure_dicts(self) -> list[dict[str, Any]]:
        rows = []
        for f in self.failures:
            r = f.shrunk.judged.result
            o, s = f.original.plan, f.shrunk.plan
            rows.append({"trial": o.index, "check": f.check, "verdict": r.verdict.value,
                         "recipe": o.recipe if f.check == "bounds" else o.exact_inputs, "layout": o.layout,
                         "scales": f.shrunk.info.get("scales"),
                         "original_shape": o.shape, "shape": s.shape, "shrink_runs": f.shrink_runs,
                         "first": r.first.to_dict() if r.first else None, "error": r.error,
                         "problem": r.info.get("problem"), "k_note": f.k_note, "artifact": f.artifact})  # fmt: skip
        return rows

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``check fuzz``."""
        return {
            "check": "fuzz", "kernel": self.kernel, "subject": self.subject, "seed": self.seed,
            "budget_s": self.budget_s, "seconds": self.seconds, "stopped": self.stopped,
            "settings": self.settings, "trials": len(self.trials), "verdict": self.verdict.value,
            "passed": self.passed, "recipes": self.counts("recipe"), "scales": self.counts("scales"),
            "exact_match_verdicts": self.counts("exact_match"), "bounds_verdicts": self.counts("bounds"),
            "layouts": self.counts("layout"), "exact_match_inputs": self.counts("exact_inputs"), "skipped": self.skipped, "skip_reason": self.skip_reason,
            "coverage": self.coverage(), "failures": self.failure_dicts(),
        }  # fmt: skip

    def text(self) -> str:
        """What a person reads: trials, what was drawn, the verdicts, each failure and its artifact."""
        st = self.settings
        lines = [
            f"fuzz of {self.subject}, output {st['dtype']}, seed {self.seed}, budget {self.budget_s:g} s",
            "  each trial: exact match on binary or cancelling-runs operands (power-of-two scales) and bounds "
            f"({st['algorithm']} in {st['accumulate']}) on the trial's recipe and scales",
            f"  trials run: {len(self.trials)} in {self.seconds:.1f} s (stopped: {self.stopped})",
            *([f"  skipped: {self.skipped} trial(s) at shapes the kernel does not take (first: {self.skip_reason})"]
              if self.skipped else []),
            "  recipes: " + ", ".join(f"{k} {v}" for k, v in self.counts("recipe").items()),
        ]
        if any(t.plan.scales != "none" for t in self.trials):
            lines.append("  scales: " + ", ".join(f"{k} {v}" for k, v in self.counts("scales").items()))
        lines.append("  exact-match inputs: " + ", ".join(f"{k} {v}" for k, v in self.counts("exact_inputs").items()))
        lines.append("  exact-match verdicts: " + ", ".join(f"{k} {v}" for k, v in self.counts("exact_match").items()))
        lines.append("  bounds verdicts: " + ", ".join(f"{k} {v}" for k, v in self.counts("bounds").items()))
        lines.append("  layouts: " + ", ".join(f"{k} {v}" for k, v in self.counts("layout").items()))
        lines.append(coverage_text(self.coverage()))
        lines.append(f"  failures: {len(self.failures)}")
        for f in self.failure_dicts():
            lines.append(f"    trial {f['trial']}: {f['check'].replace('_', '-')} {f['verdict']} ({f['recipe']}"
                         + (f", {f['scales']} scales" if f["scales"] else "") + f", layout {f['layout']}"
                         + f"), shape {f['original_shape']} shrunk to {f['shape']} in {f['shrink_runs']} runs")
            r = next(x for x in self.failures if x.original.plan.index == f["trial"]).shrunk.judged.result
            if r.first is not None:
                lines.append(f"      first failing element: {r.first.describe()}")
            elif r.error or r.info.get("problem"):
                lines.append(f"      {r.error or r.info.get('problem')}")
            if f["k_note"]:
                lines.append(f"      K: {f['k_note']}")
            if f["artifact"]:
                lines.append(f"      artifact: {f['artifact']}")
                lines.append(f"      replay:   swapcheck check replay {f['artifact']}")
        lines.append(f"verdict: {self.verdict.value} ({'pass' if self.passed else 'FAIL'})")
        return "\n".join(lines)


def class_order(name: str) -> tuple[int, float, str]:
    """Sort key of a boundary class: K, M, N, N's tail, layout; sizes in numeric order."""
    group = 3 if name.startswith("N%16") else {"K": 0, "M": 1, "N": 2, "l": 4}.get(name[0], 5)
    size = 0.0
    if name[1:2] == "=":
        body = name[2:]
        base, sign, delta = body.partition("+") if "+" in body else body.partition("-")
        value = 2 ** int(base[2:]) if base.startswith("2^") else int(base)
        size = value + (int(delta) if sign == "+" else -int(delta) if sign == "-" else 0)
    elif "2..15" in name:
        size = 2
    elif "other" in name or ">" in name:
        size = 4096.5 if "<= 4096" in name else 10**9 if "other" in name else 10**9 + 1
    return group, size, name


def coverage_text(rows: list[dict[str, Any]]) -> str:
    """The coverage table as text: one line per boundary class, ``trials hitting it, of which failed``."""
    lines = ["  coverage of boundary classes (trials that hit the class / of those, trials that failed):"]
    lines += [f"    {r['class']:<22} trials {r['trials']:>5}  failed {r['failed']:>4}" for r in rows]
    return "\n".join(lines)


def fuzz(
    subject: Subject,
    budget_s: float = DEFAULT_BUDGET_S,
    seed: int = 0,
    settings: FuzzSettings | None = None,
    *,
    max_trials: int | None = None,
    max_failures: int = 1,
    save: Callable[[Failure], str | None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> FuzzResult:
    """Run trials 0, 1, 2, ... until ``budget_s`` seconds are spent (or ``max_trials`` run, or
    ``max_failures`` failures found); shrink each failure and hand it to ``save`` (which returns
    where the artifact went).

    Raises:
        CheckInputError: a bad budget, dtype or algorithm (before any trial runs).
    """
    settings = settings or FuzzSettings()
    if not budget_s > 0:
        raise CheckInputError(f"budget must be > 0 seconds, got {budget_s}")
    if max_trials is not None and max_trials < 1:
        raise CheckInputError(f"max_trials must be >= 1, got {max_trials}")
    if settings.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise CheckInputError(f"output dtype must be bfloat16, float16 or float32, got {settings.dtype}")
    alg = get_algorithm(settings.algorithm, settings.accumulate, settings.fma)
    if not subject.plain:  # shapes it does not take are skipped per trial; an absent kernel is bad input
        ok, reason = subject.kernel.available()
        if not ok:
            raise CheckInputError(f"kernel {subject.ref!r} is not available here: {reason}")
    result = FuzzResult(subject.ref, subject.describe(), seed, budget_s, settings.describe())
    t0 = clock()
    index = 0
    while True:
        if clock() - t0 >= budget_s:
            result.stopped = "budget"
            break
        if max_trials is not None and len(result.trials) >= max_trials:
            result.stopped = "max_trials"
            break
        plan = plan_trial(seed, index, subject.operands, settings.accumulate)
        index += 1
        try:
            subject.preflight(plan.m, plan.n, plan.k)
        except CheckInputError as exc:  # a shape this kernel does not take: not a failure
            result.skipped += 1
            result.skip_reason = result.skip_reason or f"{plan.shape}: {exc}"
            continue
        ts = time.perf_counter()
        runs = [run_check(subject, c, plan, seed, settings, alg) for c in ("exact_match", "bounds")]
        rec = TrialRecord(plan, runs[0].verdict, runs[1].verdict, time.perf_counter() - ts)
        failing = next((r for r in runs if not r.verdict.passed), None)
        if failing is not None:
            shrunk, tried = shrink(subject, failing, seed, settings, alg)
            fail = Failure(failing.check, failing, shrunk, tried,
                           k_note=k_dependence(subject, shrunk, seed, settings, alg))
            if save is not None:
                fail.artifact = save(fail)
            rec.failure = fail
            result.failures.append(fail)
        result.trials.append(rec)
        if len(result.failures) >= max_failures:
            result.stopped = "failures"
            break
    result.seconds = clock() - t0
    return result
