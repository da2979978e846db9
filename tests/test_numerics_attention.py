"""Attention algorithms: every emulated kernel inside the bounds of the algorithm that describes it
(forward and backward), planted kernels outside, the emulations bit for bit against their Fraction
oracle, the exact reference inside the definition's bounds, and PyTorch's own CPU kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from _library_facts import fact
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.numerics import AttentionAlgorithm
from tasks.numerics.attention_emulate import DESCRIBED_BY as DESCRIBED
from tasks.numerics.attention_emulate import (
    KERNELS,
    PLANTED,
    AttentionKernel,
    exact_attention,
    exact_attention_backward,
)
from tasks.numerics.demo import demo_lines, seed_attention_inputs

A = AttentionAlgorithm
#: Which algorithm describes each emulated kernel (tasks.numerics.attention_emulate.DESCRIBED_BY).
DESCRIBED_BY: dict[str, AttentionAlgorithm] = {name: A(**kw) for name, kw in DESCRIBED.items()}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Case:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad: torch.Tensor
    kw: dict[str, Any]


@st.composite
def cases(draw: st.DrawFn, max_l: int = 5, max_s: int = 9, dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")) -> Case:
    """Small attention problems: random values (some with large logits), a dtype, and no mask,
    a causal mask, a boolean mask (some rows fully masked), or an ALiBi-style float mask (with
    some -inf); sometimes a given scale or grouped-query heads."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dt = DTYPES[draw(st.sampled_from(dtypes))]
    hk = draw(st.integers(1, 2))
    gqa = draw(st.booleans()) and hk == 1
    hq = 2 if gqa else hk
    lq, sk = draw(st.integers(1, max_l)), draw(st.integers(1, max_s))
    e, ev = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    logit = draw(st.sampled_from([0.5, 1.0, 3.0, 12.0]))  # 12: logits in the hundreds

    def t(*shape: int, s: float = 1.0) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape) * s).to(dt)

    kw: dict[str, Any] = {}
    mask = draw(st.sampled_from(["none", "causal", "bool", "alibi"]))
    if mask == "causal":
        kw["is_causal"] = True
    elif mask == "bool":
        kw["attn_mask"] = torch.from_numpy(rng.random((lq, sk)) < 0.7)
    elif mask == "alibi":
        slope = draw(st.sampled_from([0.0625, 0.5, 3.0, 2.0 ** (-8 / 12)]))  # the last: not a bf16 value
        i, j = np.arange(lq)[:, None], np.arange(sk)[None, :]
        m = -slope * np.abs(i - j).astype(np.float64)
        m[rng.random((lq, sk)) < 0.15] = -np.inf
        kw["attn_mask"] = torch.from_numpy(m).to(dt)
    if draw(st.booleans()):
        kw["scale"] = draw(st.sampled_from([0.3, 1.0, 0.0625]))
    if gqa:
        kw["enable_gqa"] = True
    return Case(t(1, hq, lq, e, s=logit), t(1, hk, sk, e, s=logit), t(1, hk, sk, ev), t(1, hq, lq, ev), kw)


def _check_kernel(name: str, c: Case) -> None:
    ker, alg = KERNELS[name], DESCRIBED_BY[name]
    fwd = ker.forward(c.q, c.k, c.v, **c.kw)
    cov = alg.covers(fwd.out, c.q, c.k, c.v, logsumexp=fwd.logsumexp, **c.kw)
    assert cov.out.all() and cov.logsumexp.all(), (name, c.kw)
    fused = ker.backward(c.q, c.k, c.v, c.grad, fwd.out, fwd.logsumexp, **c.kw)
    assert alg.backward_covers(fused, c.q, c.k, c.v, c.grad, fwd.out, fwd.logsumexp, **c.kw).all(), name
    again = ker.backward(c.q, c.k, c.v, c.grad, **c.kw)
    assert alg.backward_covers(again, c.q, c.k, c.v, c.grad, **c.kw).all(), name


# -- the seed's example -------------------------------------------------------------------------


def test_seed_example() -> None:
    lines = {key: value for key, _, value in demo_lines()}
    # the seed prints 0.00545 and 1.31e-05: its derivation is not ours (docs/numerics.md, "The seed's example")
    assert f"{lines['attention_flash']:.3g}" == "0.00544"
    assert f"{lines['attention_plain']:.3g}" == "1.37e-05"
    q, k, v = seed_attention_inputs()
    assert q.shape == k.shape == v.shape == (1, 2, 64, 16) and q.dtype == np.float32


# -- every kernel inside its algorithm's bounds -------------------------------------------------


@pytest.mark.slow  # default-suite budget (6 min on a clean clone); CI runs the slow set too
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.lists(st.sampled_from(sorted(DESCRIBED_BY)), min_size=4, max_size=4, unique=True))
def test_kernels_inside_their_algorithms(c: Case, names: list[str]) -> None:
    """100 inputs x 4 kernels, forward and both backwards: 400 kernel cases per run (the fast sibling
    of test_kernels_inside_their_algorithms_many, 1800 cases in the slow set)."""
    for name in names:
        _check_kernel(name, c)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # CI budget
@given(cases(max_l=8, max_s=24))
def test_kernels_inside_their_algorithms_many(c: Case) -> None:
    """150 inputs x all 12 kernels (1800 kernel cases), longer rows (several online blocks)."""
    for name in DESCRIBED_BY:
        _check_kernel(name, c)


def test_online_blocks_and_long_rows() -> None:
    """Rows of 40 keys: several blocks of 16 and of 4, one key per block, large logits."""
    g = torch.Generator().manual_seed(3)
    for s in (1.0, 6.0):
        c = Case(torch.randn(1, 2, 6, 8, generator=g) * s, torch.randn(1, 2, 40, 8, generator=g) * s,
                 torch.randn(1, 2, 40, 3, generator=g), torch.randn(1, 2, 6, 3, generator=g), {})  # fmt: skip
        for name in DESCRIBED_BY:
            _check_kernel(name, c)


# -- the emulations are exact -------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_l=3, max_s=5), st.sampled_from(sorted(KERNELS)))
def test_emulation_matches_fraction_oracle(c: Case, name: str) -> None:
    ker = KERNELS[name]
    fast = ker.forward(c.q, c.k, c.v, **c.kw)
    slow = ker.forward(c.q, c.k, c.v, **c.kw, arith="exact")
    assert np.array_equal(fast.out, slow.out) and np.array_equal(fast.logsumexp, slow.logsumexp)
    for args in ((fast.out, fast.logsumexp), ()):
        gf = ker.backward(c.q, c.k, c.v, c.grad, *args, **c.kw)
        gs = ker.backward(c.q, c.k, c.v, c.grad, *args, **c.kw, arith="exact")
        for a, b in zip((gf.dq, gf.dk, gf.dv), (gs.dq, gs.dk, gs.dv), strict=True):
            assert np.array_equal(a, b), name


def test_certified_exp_falls_back_to_decimal() -> None:
    """Arguments whose float64 exp cannot decide the rounding take the 60-digit path."""
    from fractions import Fraction

    from tasks.numerics import FORMATS, round_fraction
    from tasks.numerics.attention_emulate import _Fast
    from tasks.numerics.attention_reference import _dexp

    f = FORMATS["bf16"]
    xs = np.array([0.0, -1.0, -0.5, -87.5, -3.25, 1e-8])
    want = [round_fraction(_dexp(Fraction(float(x))), f) for x in xs]
    assert _Fast().exp(xs, f).tolist() == want


# -- the exact reference ------------------------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_l=3, max_s=6))
def test_exact_reference_inside_the_definition(c: Case) -> None:
    ref = exact_attention(c.q, c.k, c.v, **c.kw)
    cov = A().covers(ref.out, c.q, c.k, c.v, logsumexp=ref.logsumexp, **c.kw)
    assert cov.out.all() and cov.logsumexp.all()
    grads = exact_attention_backward(c.q, c.k, c.v, c.grad, **c.kw)
    assert A().backward_covers(grads, c.q, c.k, c.v, c.grad, **c.kw).all()


def test_exact_reference_against_float64_torch() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 4, 5, generator=g) for _ in range(3))
    ref = exact_attention(q, k, v, is_causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert np.array_equal(ref.out, want.float().double().numpy()) or np.abs(ref.out - want.numpy()).max() < 2e-7


# -- planted defects ----------------------------------------------------------------------------


def _big_case() -> Case:
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 16, 16, generator=g) for _ in range(3))
    k = torch.randn(1, 2, 64, 16, generator=g)
    v = torch.randn(1, 2, 64, 8, generator=g) + 3.0  # an offset makes every rounding of P V show
    return Case(q, k, v, torch.randn(1, 2, 16, 8, generator=g), {})


@pytest.mark.parametrize(("kernel", "claimed"), PLANTED)
def test_planted_defects_fall_outside(kernel: str, claimed: dict[str, Any]) -> None:
    c = _big_case()
    wrong = A(**claimed)
    ker = KERNELS[kernel]
    fwd = ker.forward(c.q, c.k, c.v)
    assert not wrong.covers(fwd.out, c.q, c.k, c.v).out.all()
    assert DESCRIBED_BY[kernel].covers(fwd.out, c.q, c.k, c.v, logsumexp=fwd.logsumexp).all()
    bwd = ker.backward(c.q, c.k, c.v, c.grad, fwd.out, fwd.logsumexp)
    assert not wrong.backward_covers(bwd, c.q, c.k, c.v, c.grad, fwd.out, fwd.logsumexp).all()
    assert DESCRIBED_BY[kernel].backward_covers(bwd, c.q, c.k, c.v, c.grad, fwd.out, fwd.logsumexp).all()


def test_bias_rounding_needs_its_method() -> None:
    """ALiBi slopes that are not bf16 values: rounding them is outside the plain bound."""
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 1, 8, 4, generator=g), torch.randn(1, 1, 8, 4, generator=g), torch.randn(1, 1, 8, 4, generator=g)
    i = torch.arange(8.0)
    mask = -(0.3 + 2**-12) * (i[:, None] - i[None, :]).abs() * 37
    out = KERNELS["math-bf16bias"].forward(q, k, v, attn_mask=mask).out
    assert not A().covers(out, q, k, v, attn_mask=mask).out.all()
    assert A(bias="bfloat16").covers(out, q, k, v, attn_mask=mask).out.all()


def test_covers_matrix() -> None:
    """covers() says which algorithms describe which kernels on one input."""
    c = _big_case()
    algs = {"plain": A(), "reciprocal": A(reciprocal=True), "flash": A(online_softmax=True, block_size=16),
            "flash-bf16w": A(online_softmax=True, block_size=16, weights="bfloat16"),
            "bf16acc": A(accumulate="bfloat16")}  # fmt: skip
    got = {}
    for kname in ("math", "math-reciprocal", "flash16", "flash4-bf16w", "math-bf16acc"):
        out = KERNELS[kname].forward(c.q, c.k, c.v).out
        got[kname] = {a for a, alg in algs.items() if alg.covers(out, c.q, c.k, c.v).out.all()}
    assert got["math"] == set(algs)
    assert got["math-reciprocal"] == set(algs)
    assert {"flash", "flash-bf16w", "bf16acc"} <= got["flash16"]
    assert got["flash4-bf16w"] == {"flash-bf16w", "bf16acc"}
    assert got["math-bf16acc"] == {"bf16acc"}


# -- torch's own CPU kernels --------------------------------------------------------------------
#
# Which algorithm describes a torch kernel is a fact about torch's version (tests/_library_facts.py);
# the algorithms' own bounds are asserted above, unconditionally.

#: docs/numerics.md, "Which algorithms describe PyTorch's CPU kernels": the math backend; the flash
#: kernel, which for bf16 / fp16 inputs rounds the weights to the inputs' format before P V, and whose
#: logsumexp then needs ``flash_lse_ulps`` spacings of that format.  Checked on torch 2.13.0+cpu.
TORCH_CPU_ATTENTION: dict[str, dict[str, Any]] = {
    ">=2.13,<2.14": {"math": {"reciprocal": True},
                     "flash": {"online_softmax": True, "block_size": 512, "reciprocal": True},
                     "flash_rounds_weights": True, "flash_lse_ulps": 8},
}  # fmt: skip


def _torch_case(dt: torch.dtype, s: float = 1.0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(2, 2, 12, 8, generator=g) * s).to(dt)
    k = (torch.randn(2, 2, 20, 8, generator=g) * s).to(dt)
    v = torch.randn(2, 2, 20, 8, generator=g).to(dt)
    return q, k, v, torch.randn(2, 2, 12, 8, generator=g).to(dt)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_math_backend_inside(dtype: str, causal: bool) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = DTYPES[dtype]
    q, k, v, grad = _torch_case(dt, 2.0)
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(grad)
    alg = A(**fact("torch", TORCH_CPU_ATTENTION, what="the CPU math attention backend")["math"])
    assert alg.covers(out, q, k, v, is_causal=causal).out.all()
    grads = (q.grad, k.grad, v.grad)
    assert alg.backward_covers(grads, q.detach(), k.detach(), v.detach(), grad, is_causal=causal).all()


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_cpu_flash_inside(dtype: str, causal: bool) -> None:
    rec = fact("torch", TORCH_CPU_ATTENTION, what="the CPU flash attention kernel")
    dt = DTYPES[dtype]
    q, k, v, grad = _torch_case(dt, 2.0)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)[:2]
    weights = dtype if dtype != "fp32" and rec["flash_rounds_weights"] else None
    alg = A(**rec["flash"], weights=weights)
    ulps = 0 if dtype == "fp32" else rec["flash_lse_ulps"]
    assert alg.covers(out, q, k, v, is_causal=causal).out.all()
    assert alg.covers(out, q, k, v, is_causal=causal, logsumexp=lse, ulps=ulps).logsumexp.all()
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, causal)
    assert alg.backward_covers((dq, dk, dv), q, k, v, grad, out, lse, is_causal=causal).all()
    if dtype != "fp32":  # rounded bf16 / fp16 weights are outside the bounds of the algorithm without them
        outside = not A(**rec["flash"]).covers(out, q, k, v, is_causal=causal).out.all()
        assert outside == rec["flash_rounds_weights"]


# -- fully masked rows and bad input ------------------------------------------------------------


def test_fully_masked_rows() -> None:
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(1, 1, 3, 4, generator=g), torch.randn(1, 1, 5, 4, generator=g), torch.randn(1, 1, 5, 2, generator=g)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    tol = A().tolerance(q, k, v, attn_mask=mask)
    assert (tol.out[0, 0, 1] == 0).all() and tol.logsumexp[0, 0, 1] == np.inf
    assert A().may_be("nan", q, k, v, attn_mask=mask).out[0, 0, 1].all()
    assert not A().may_be("nan", q, k, v, attn_mask=mask).out[0, 0, 0].any()
    nan_out = np.full((1, 1, 3, 2), np.nan)
    cov = A().covers(nan_out, q, k, v, attn_mask=mask)
    assert cov.out[0, 0, 1].all() and not cov.out[0, 0, 0].any()
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert A().covers(out, q, k, v, attn_mask=mask).out.all()


def test_bad_input_is_a_clear_error() -> None:
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match="feature size"):
        A().tolerance(q, torch.randn(1, 1, 3, 5), torch.randn(1, 1, 3, 2))
    with pytest.raises(ValueError, match="share a dtype"):
        A().tolerance(q, q.bfloat16(), q)
    with pytest.raises(ValueError, match="float64"):
        A().tolerance(q.double() + 1e-12, q, q)
    with pytest.raises(ValueError, match="block_size"):
        A(online_softmax=True, block_size=0)
    with pytest.raises(ValueError, match="unknown floating-point format"):
        A(weights="bfloat17")
    with pytest.raises(ValueError, match="enable_gqa"):
        A().tolerance(torch.randn(1, 2, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 2))
    with pytest.raises(ValueError, match="both out and logsumexp"):
        A().backward_tolerance(q, q, q, q, out=q)
    with pytest.raises(ValueError, match="kind"):
        A().may_be("big", q, q, q)
    with pytest.raises(ValueError, match="key_order"):
        AttentionKernel("x", key_order="sideways")


# -- step 7b, the cancellation bound, against its exact model -----------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.0, 3.0, -5.0]), st.sampled_from([1e-3, 2e-2]),
       st.integers(0, 3), st.sampled_from([1, 2]), st.booleans())  # fmt: skip
def test_cancellation_bound_against_exact_model(seed: int, offset: float, rho: float, r: int, ndiv: int,
                                                adversarial: bool) -> None:  # fmt: skip
    """Step 7b (docs/numerics.md) in exact arithmetic: weights with a common relative error eps_k
    (|eps_k| <= rho^c_k) and each sum's own factors at the ends of their intervals (adversarial:
    the signs that make each element's error largest; else random points), the output
    sum_k e_k (1+eps_k)(1+alpha_k) v_k / sum_k e_k (1+eps_k)(1+beta_k) computed with Fractions.
    Large units (rho up to 2e-2, u = 2^-8) make the second-order terms count: the bound must hold
    with them, and the adversarial errors must reach it to first order."""
    from fractions import Fraction as F

    from tasks.numerics.attention_bounds import _output_cancelled, _problem, _Units

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    k = rng.standard_normal((1, 1, 6, 4)).astype(np.float32) * 2
    v = (rng.standard_normal((1, 1, 6, 3)) + offset).astype(np.float32)
    p = _problem(q, k, v, None, False, None, False)
    uc, uw, gz, gpv = 2.0**-8, 2.0**-6, 0.01, 0.012
    un = _Units(uc, uc, uw, 0.0, 0.0, 0.0, 0.0, 2 * uc, r > 0, None, False, ndiv)
    rho_c = rho * rng.uniform(0.2, 1.0, p.p.shape)
    n = p.p.shape[-1]
    zeta = (p.p * ((1 + rho_c) * (1 + uc) ** r * (1 + gz) - 1)).sum(axis=-1)
    # the exact model: p normalised in Fractions, o = sum p v exactly; o_err = |p.o - o| rounded up
    lq, ev = p.o.shape[-2:]
    pf = [[F(float(x)) for x in p.p[0, 0, i]] for i in range(lq)]
    pf = [[x / sum(row, F(0)) for x in row] for row in pf]
    vf = [[F(float(x)) for x in p.v[0, 0, kk]] for kk in range(n)]
    of = [[sum((pf[i][kk] * vf[kk][j] for kk in range(n)), F(0)) for j in range(ev)] for i in range(lq)]
    o_err = np.array([[[[float(abs(F(float(p.o[0, 0, i, j])) - of[i][j])) * (1 + 2**-50) + 2**-1074
                         for j in range(ev)] for i in range(lq)]]])  # fmt: skip
    bound = _output_cancelled(p, un, o_err, rho_c, r, np.full((1, 1, lq, 1), gz), np.full((1, 1, lq, 1), gpv),
                              zeta, np.zeros_like(zeta), np.zeros_like(p.o))  # fmt: skip
    ends = {  # each sum's own factor, largest and smallest
        "pv": ((1 + F(uc)) ** r * (1 + F(uw)) * (1 + F(gpv)) * (1 + F(uc)) ** ndiv,
               (1 - F(uc)) ** r * (1 - F(uw)) * (1 - F(gpv)) * (1 - F(uc)) ** ndiv),
        "z": ((1 + F(uc)) ** r * (1 + F(gz)), (1 - F(uc)) ** r * (1 - F(gz))),
    }  # fmt: skip
    worst = 0.0
    for i in range(lq):
        for j in range(ev):
            if adversarial:
                sgn_o = 1 if of[i][j] >= 0 else -1
                eps = [F(float(rho_c[0, 0, i, kk])) * (1 if vf[kk][j] >= of[i][j] else -1) for kk in range(n)]
                fa = [ends["pv"][0 if vf[kk][j] >= 0 else 1] for kk in range(n)]
                fb = [ends["z"][1 if sgn_o > 0 else 0]] * n
            else:
                def pick(hi: F, lo: F) -> F:
                    return lo + (hi - lo) * F(int(rng.integers(0, 1001)), 1000)

                eps = [F(float(rho_c[0, 0, i, kk])) * F(int(rng.integers(-1000, 1001)), 1000) for kk in range(n)]
                fa = [pick(*ends["pv"]) for _ in range(n)]
                fb = [pick(*ends["z"]) for _ in range(n)]
            num = sum((pf[i][kk] * (1 + eps[kk]) * fa[kk] * vf[kk][j] for kk in range(n)), F(0))
            den = sum((pf[i][kk] * (1 + eps[kk]) * fb[kk] for kk in range(n)), F(0))
            assert abs(den - 1) <= F(float(zeta[0, 0, i]))  # zeta bounds the row sum's error
            err = abs(num / den - of[i][j])
            b = F(float(bound[0, 0, i, j]))
            assert err <= b, (i, j, float(err), float(b))
            worst = max(worst, float(err / b))
    if adversarial:
        assert worst > 0.9  # reached up to the second-order terms and 1 / (1 - zeta) (zeta <= 0.04)
