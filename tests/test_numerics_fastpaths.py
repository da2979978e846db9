"""The fast exact paths of issue #14 against the Fraction oracle (tests/_numerics_oracle.py).

* ``matmul_slots16``: per-output int32 sort, (slot, sign) runs found by binary search, the runs
  interleaved with +0 where a sign has run out, one native add per step (orders._slots16_block),
  both through the products' output-major blocks and through a plain ``ArrayTerms``.
* ``matmul_exact_accumulation``: float64 BLAS matmul with a certified error bound, the undecided
  outputs summed again on a per-row lattice (products._split_sum), the rest in exact digits.

Edge cases: midpoints and ties to even (sums exactly on and next to a midpoint), subnormals, signed
zeros, overflow to inf, NaN and inf inputs, cancellation to an exact zero.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.numerics import FORMATS, products, round_to_format
from tasks.numerics import orders as orders_mod
from tests import _numerics_oracle as O
from tests._numerics_strategies import matrices, values

ACCS = ["fp32", "bf16", "fp16", "fp8_e4m3fn"]


def _tensor(x: np.ndarray, name: str) -> torch.Tensor:
    return torch.from_numpy(x).to(FORMATS[name].torch_dtype)


# ---------------------------------------------------------------------------------------------
# slots16


@pytest.mark.parametrize("acc", ACCS)
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_slots16_many_terms_match_oracle(acc: str, data) -> None:
    """Longer sums than the generic oracle test (several slots, uneven sign counts per slot)."""
    f = FORMATS[acc]
    a, b = data.draw(matrices(f, max_mn=4, max_k=40))
    r = data.draw(st.sampled_from(["nearest_even", "nearest_away"]))
    alg = products.matmul_slots16(f, rounding=r)
    got = alg.run(_tensor(a, acc), _tensor(b, acc))
    want = O.matmul(a, b, f, r, "slots16", False)
    assert O.same(got.double().numpy(), want), (a, b, got, want)


@pytest.mark.parametrize("acc", ["fp32", "bf16", "fp16"])
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_slots16_array_terms_match_oracle(acc: str, data) -> None:
    """The same engine on terms without output-major blocks (``ArrayTerms``, one column per
    output), with runs of zeros of both signs, ties and specials among the terms."""
    f = FORMATS[acc]
    n = data.draw(st.integers(1, 60))
    cols = data.draw(st.integers(1, 5))
    v = values(f)
    t = np.array(data.draw(st.lists(v, min_size=n * cols, max_size=n * cols))).reshape(n, cols)
    ar = orders_mod.Arith(f)
    got = orders_mod.slots16(orders_mod.ArrayTerms(torch.from_numpy(t).to(ar.dtype), False), ar)
    want = [O.slots16([float(x) for x in t[:, j]], f, "nearest_even") for j in range(cols)]
    assert O.same(got.double().numpy(), np.array(want)), (t, got, want)


def test_slots16_alternation_with_zeros_and_uneven_signs() -> None:
    """+0 counts as positive, -0 as negative: the alternation shifts with them (slot 0)."""
    f = FORMATS["fp32"]
    sub = f.min_subnormal
    cases = [
        [0.0, -3 * sub, 5 * sub, -7 * sub, 9 * sub],
        [-0.0, 0.0, 3 * sub, -5 * sub, -7 * sub, 11 * sub, 13 * sub],
        [2.0**24, 1.0, 1.0, -1.0, 1.0, 3.0, -(2.0**24)],  # one slot, ties to even on the way
        [3e38, 3e38, -3e38, -1.0, 1e-30, -1e-30],  # overflow inside slot 15
        [math.inf, -1.0, 2.0, -math.inf],
        [math.nan, 1.0],
    ]
    for terms in cases:
        t = torch.tensor(terms, dtype=torch.float32)[:, None].repeat(1, 3)
        ar = orders_mod.Arith(f)
        got = orders_mod.slots16(orders_mod.ArrayTerms(t, False), ar)
        want = O.slots16([float(x) for x in t[:, 0]], f, "nearest_even")
        assert O.same(got.double().numpy(), np.full(3, want)), (terms, got, want)


def test_slots16_randn_against_oracle_and_blocks() -> None:
    """randn fp32 at K = 257 (two or three slots per output), several output blocks."""
    g = torch.Generator().manual_seed(11)
    a = torch.randn(5, 257, generator=g) * torch.exp2(torch.randint(-30, 10, (5, 257), generator=g))
    b = torch.randn(257, 4, generator=g)
    alg = products.matmul_slots16("float32")
    old = orders_mod._SLOTS_ELEMENTS
    try:
        orders_mod._SLOTS_ELEMENTS = 257 * 4  # one output row per block
        got = alg.run(a, b)
    finally:
        orders_mod._SLOTS_ELEMENTS = old
    assert torch.equal(got, alg.run(a, b))
    want = O.matmul(a.double().numpy(), b.double().numpy(), FORMATS["fp32"], "nearest_even", "slots16",
                    False)  # fmt: skip
    assert O.same(got.double().numpy(), want)


# ---------------------------------------------------------------------------------------------
# exact accumulation


@pytest.mark.parametrize("pair", [("fp32", "fp32"), ("bf16", "fp32"), ("fp32", "bf16"), ("fp16", "fp16"),
                                  ("fp8_e4m3fn", "fp8_e4m3fn")], ids=lambda p: f"{p[0]}-in-{p[1]}")  # fmt: skip
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_exact_accumulation_finite_matches_oracle(pair, data) -> None:
    """Finite inputs take the certified path (specials the digits path, tested elsewhere)."""
    fin, f = FORMATS[pair[0]], FORMATS[pair[1]]
    a, b = data.draw(matrices(fin, max_mn=4, max_k=30, specials=False))
    r = data.draw(st.sampled_from(["nearest_even", "nearest_away"]))
    alg = products.matmul_exact_accumulation(f, rounding=r)
    got = alg.run(_tensor(a, pair[0]), _tensor(b, pair[0]))
    want = O.matmul(a, b, f, r, "exact", True)
    assert O.same(got.double().numpy(), want), (a, b, got, want)


def _exact_rounded(a: np.ndarray, b: np.ndarray, f, r: str) -> np.ndarray:
    return O.matmul(a, b, f, r, "exact", True)


@pytest.mark.parametrize("acc", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("rounding", ["nearest_even", "nearest_away"])
def test_exact_accumulation_ties_and_near_ties(acc: str, rounding: str) -> None:
    """Sums exactly on a midpoint (ties: even or away), a tiny amount above or below one (the
    first stage cannot decide them, the second must), exact zeros by cancellation (+0), negative
    sums that round to -0, overflow and subnormal results."""
    f = FORMATS[acc]
    p = f.precision
    half = 2.0**-p  # half an ulp of 1
    tiny = f.min_subnormal
    rows = [
        [1.0, half],  # exact tie: to even (1) or away (1 + 2 half)
        [1.0, 3 * half],  # exact tie with odd neighbour below
        [1.0, half, tiny],  # just above the tie
        [1.0, half, -tiny],  # just below the tie
        [1.0, half, 2.0**-60 if acc == "fp32" else tiny],
        [3.0, -3.0, 0.5, -0.5],  # exact zero: +0
        [-tiny / 2 if tiny / 2 > 0 else -tiny, 0.0, 0.0, 0.0],
        [f.max_finite, f.max_finite, -f.max_finite, 0.0],  # the exact sum is finite
        [f.max_finite, f.max_finite / 2, 0.0, 0.0],  # overflow
        [tiny, tiny, tiny, -tiny / 2 if tiny / 2 > 0 else 0.0],
    ]
    k = max(len(x) for x in rows)
    a = np.zeros((len(rows), k))
    for i, row in enumerate(rows):
        a[i, : len(row)] = row
    # every entry must be a value of the inputs' format: use fp32 inputs times 1.0
    a32 = round_to_format(a, "fp32")
    b = np.ones((k, 2))
    b[:, 1] = -1.0
    alg = products.matmul_exact_accumulation(f, rounding=rounding)
    got = alg.run(torch.from_numpy(a32).float(), torch.from_numpy(b).float())
    want = _exact_rounded(a32, b, f, rounding)
    assert O.same(got.double().numpy(), want), (got, want)


def test_exact_accumulation_randn_large_k_all_three_stages() -> None:
    """randn fp32 at K = 2000 and inputs with many exact ties: every output against Fractions."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 2000)).astype(np.float32)
    b = rng.standard_normal((2000, 5)).astype(np.float32)
    f = FORMATS["fp32"]
    got = products.matmul_exact_accumulation("float32").run(a, b)
    assert O.same(
        got, _exact_rounded(a.astype(np.float64), b.astype(np.float64), f, "nearest_even")
    )
    # integers summing to values of 26 bits or more: many exact ties (stages two and three)
    ai = rng.integers(-(2**12), 2**12, (6, 300)).astype(np.float32)
    bi = rng.integers(-4, 5, (300, 5)).astype(np.float32)
    ai[:, 0] = 2.0**24
    bi[0] = 4.0
    got = products.matmul_exact_accumulation("float32").run(ai, bi)
    assert O.same(
        got, _exact_rounded(ai.astype(np.float64), bi.astype(np.float64), f, "nearest_even")
    )


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_split_sum_bound_holds(data) -> None:
    """The second stage's claim: |s - exact| <= e (exact products, any magnitudes)."""
    f = FORMATS["fp32"]
    k = data.draw(st.integers(1, 50))
    rows = data.draw(st.integers(1, 3))
    v = values(f, specials=False)
    x = np.array(data.draw(st.lists(v, min_size=2 * rows * k, max_size=2 * rows * k))).reshape(
        2, rows, k
    )
    p = torch.from_numpy(x[0] * x[1])  # exact products of fp32 values
    s, e = products._split_sum(p)
    for i in range(rows):
        exact = sum((Fraction(float(t)) for t in p[i]), Fraction(0))
        assert abs(Fraction(float(s[i])) - exact) <= Fraction(float(e[i])), (p[i], s[i], e[i])
        if e[i] == 0:
            assert not math.copysign(1.0, float(s[i])) < 0 or exact != 0
