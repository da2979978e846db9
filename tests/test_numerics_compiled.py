"""The compiled (numba) paths of the ordered matmul algorithms (tasks/numerics/compiled.py) against
the torch engines (tasks/numerics/orders.py, run with the compiled paths switched off) and the
Fraction oracle (tests/_numerics_oracle.py), bit for bit: every order, format, rounding, fma, input
format, both kernels (float32 and float64), odd and even K, K = 0 and 1, K not a multiple of the
block, subnormals, overflow, signed zeros, NaN and inf.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.numerics import FORMATS, compiled, products
from tests import _numerics_oracle as O
from tests._numerics_strategies import matrices

pytest.importorskip("numba")

# accumulator -> input formats exercised (both kernels: "f32" needs products exact in fp32)
PAIRS = {
    "fp32": ["fp32", "bf16", "fp16"],
    "bf16": ["bf16", "fp16", "fp32"],
    "fp16": ["fp16", "bf16", "fp8_e4m3fn"],
    "fp8_e4m3fn": ["fp8_e4m3fn"],
}
CONFIGS = [(acc, inp) for acc, inputs in PAIRS.items() for inp in inputs]


def _alg(order: str, acc: str, fma: bool, rounding: str, block: int) -> products.MatmulAlgorithm:
    if order == "sequential":
        return products.matmul_sequential(acc, fma=fma, rounding=rounding)
    if order == "pairwise":
        return products.matmul_pairwise(acc, fma=fma, rounding=rounding)
    return products.matmul_blocked(acc, block, fma=fma, rounding=rounding)


def _as(x: np.ndarray, name: str, as_torch: bool) -> object:
    if as_torch:
        return torch.from_numpy(x).to(FORMATS[name].torch_dtype)
    return x.astype(FORMATS[name].numpy_dtype)


def _f64(x: object) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.double().numpy()
    return np.asarray(x).astype(np.float64)


def _check(alg: products.MatmulAlgorithm, a: np.ndarray, b: np.ndarray, inp: str, as_torch: bool,
           order: str, block: int) -> None:  # fmt: skip
    ta, tb = _as(a, inp, as_torch), _as(b, inp, as_torch)
    assert compiled.available()
    got = alg.run(ta, tb)
    assert isinstance(got, torch.Tensor) == as_torch
    with compiled.disabled():
        torch_path = alg.run(ta, tb)
    assert O.same(_f64(got), _f64(torch_path)), (alg, a, b, got, torch_path)
    want = O.matmul(a, b, alg.format, alg.rounding, order, alg.fma, block)
    assert O.same(_f64(got), want), (alg, a, b, got, want)


@pytest.mark.parametrize("order", ["sequential", "pairwise", "blocked"])
@given(data=st.data())
@settings(max_examples=120, deadline=None)
def test_compiled_matches_torch_and_oracle(order: str, data: st.DataObject) -> None:
    acc, inp = data.draw(st.sampled_from(CONFIGS))
    fma = data.draw(st.booleans())
    rounding = data.draw(st.sampled_from(["nearest_even", "nearest_away"]))
    block = data.draw(st.integers(1, 6))
    as_torch = data.draw(st.booleans())
    a, b = data.draw(matrices(FORMATS[inp], max_mn=4, max_k=40))
    _check(_alg(order, acc, fma, rounding, block), a, b, inp, as_torch, order, block)


@pytest.mark.parametrize("order", ["sequential", "pairwise", "blocked"])
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_compiled_float32_kernels_on_finite_midrange(order: str, data: st.DataObject) -> None:
    """Finite values of moderate size (every product exact in fp32): the bf16/fp16 accumulators
    take the float32 kernel here, which the special-heavy draws above mostly avoid."""
    acc = data.draw(st.sampled_from(["fp32", "bf16", "fp16"]))
    inp = data.draw(st.sampled_from(["bf16", "fp16"]))
    fma = data.draw(st.booleans())
    block = data.draw(st.integers(1, 9))
    m, n, k = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 45))
    small = st.integers(-255, 255).map(float)
    exps = st.integers(-20, 6)
    a = np.array(data.draw(st.lists(st.tuples(small, exps), min_size=m * k, max_size=m * k)))
    b = np.array(data.draw(st.lists(st.tuples(small, exps), min_size=k * n, max_size=k * n)))
    a = _round_in(np.ldexp(a[:, 0], a[:, 1].astype(int)).reshape(m, k), inp)
    b = _round_in(np.ldexp(b[:, 0], b[:, 1].astype(int)).reshape(k, n), inp)
    alg = _alg(order, acc, fma, "nearest_even", block)
    ta = torch.from_numpy(a).to(FORMATS[inp].torch_dtype)
    tb = torch.from_numpy(b).to(FORMATS[inp].torch_dtype)
    fa32, fb32 = ta.float().numpy(), tb.float().numpy()
    assert compiled.path(alg.format, "nearest_even", FORMATS[inp], FORMATS[inp], fa32, fb32) == "f32"
    _check(alg, a, b, inp, True, order, block)


def _round_in(x: np.ndarray, name: str) -> np.ndarray:
    return torch.from_numpy(x).to(FORMATS[name].torch_dtype).double().numpy()


@pytest.mark.parametrize("order", ["sequential", "pairwise", "blocked"])
@pytest.mark.parametrize("acc", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("fma", [False, True])
def test_compiled_randn_against_torch(order: str, acc: str, fma: bool) -> None:
    """Larger randn operands of widely spread magnitudes (several tiles, odd K, partial tiles)."""
    g = torch.Generator().manual_seed(3)
    inp = "fp32" if acc == "fp32" else acc
    scale = torch.exp2(torch.randint(-12, 12, (37, 301), generator=g).float())
    a = (torch.randn(37, 301, generator=g) * scale).to(FORMATS[inp].torch_dtype)
    b = torch.randn(301, 70, generator=g).to(FORMATS[inp].torch_dtype)
    alg = _alg(order, acc, fma, "nearest_even", 16)
    got = alg.run(a, b)
    with compiled.disabled():
        want = alg.run(a, b)
    assert O.same(got.double().numpy(), want.double().numpy())


def test_no_contraction_into_fma() -> None:
    """x = 1 + 2**-12: fl32(x * x) = 1 + 2**-11 (a tie to even), so without fma
    -(1 + 2**-11) + fl32(x * x) is 0, and an FMA (or a contraction of the multiply and the add)
    gives 2**-24.  Every order, with K = 2 (pairwise: the first tree level)."""
    x = 1 + 2.0**-12
    a = torch.tensor([[-(1 + 2.0**-11), x]], dtype=torch.float32)
    b = torch.tensor([[1.0], [x]], dtype=torch.float32)
    for order in ("sequential", "pairwise", "blocked"):
        assert float(_alg(order, "fp32", False, "nearest_even", 2).run(a, b)) == 0.0
        assert float(_alg(order, "fp32", True, "nearest_even", 2).run(a, b)) == 2.0**-24


def test_k_zero_and_one_and_signed_zeros() -> None:
    """K = 0 gives +0; K = 1 with a -0 product gives +0 (0 + -0), a negative product rounding to
    zero gives +0 after the accumulator's 0 + x (pairwise) or -0 (sequential: the add rounds it)."""
    for order in ("sequential", "pairwise", "blocked"):
        for acc in ("fp32", "bf16"):
            for fma in (False, True):
                alg = _alg(order, acc, fma, "nearest_even", 3)
                z = alg.run(torch.zeros(2, 0), torch.zeros(0, 3))
                assert z.shape == (2, 3) and not torch.signbit(z.float()).any()
                a = np.array([[-0.0], [2.0**-100], [-(2.0**-100)]], dtype=np.float32)
                b = np.array([[1.0, 2.0**-100, -0.0]], dtype=np.float32)
                got = _f64(alg.run(a, b))
                with compiled.disabled():
                    want = _f64(alg.run(a, b))
                assert O.same(got, want), (alg, got, want)
                assert O.same(got, O.matmul(a.astype(float), b.astype(float), alg.format,
                                            "nearest_even", order, fma, 3))  # fmt: skip


def test_specials_and_overflow() -> None:
    f = FORMATS["bf16"]
    a = np.array([[math.inf, 1.0, f.max_finite], [math.nan, -1.0, f.max_finite],
                  [0.0, math.inf, -math.inf]])  # fmt: skip
    b = np.array([[1.0, 0.0], [2.0, 3.0], [f.max_finite, -1.0]])
    for acc in ("fp32", "bf16", "fp16"):
        for order in ("sequential", "pairwise", "blocked"):
            for fma in (False, True):
                _check(_alg(order, acc, fma, "nearest_even", 2), a, b, "bf16", False, order, 2)


def test_thread_count_does_not_change_results() -> None:
    import numba

    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(40, 257, generator=g), torch.randn(257, 130, generator=g)
    old = numba.get_num_threads()
    try:
        for alg in (products.matmul_pairwise("fp32"), products.matmul_blocked("bf16", 7)):
            numba.set_num_threads(1)
            one = alg.run(a, b)
            numba.set_num_threads(old)
            assert torch.equal(one, alg.run(a, b))
    finally:
        numba.set_num_threads(old)


def test_paths_and_fallback() -> None:
    """Which kernel runs, and the torch engines when the compiled paths are off."""
    f32, bf16, fp16 = FORMATS["fp32"], FORMATS["bf16"], FORMATS["fp16"]
    ones = np.ones((2, 2), dtype=np.float32)
    assert compiled.path(f32, "nearest_even", f32, f32, ones, ones) == "f32"
    assert compiled.path(f32, "nearest_away", f32, f32, ones, ones) == "gen"
    assert compiled.path(bf16, "nearest_even", bf16, bf16, ones, ones) == "f32"
    assert compiled.path(bf16, "nearest_even", f32, f32, ones, ones) == "gen"  # 48-bit products
    tiny = np.full((2, 2), 2.0**-100, dtype=np.float32)  # products below fp32's normal range
    assert compiled.path(bf16, "nearest_even", bf16, bf16, tiny, tiny) == "gen"
    assert compiled.path(fp16, "nearest_even", fp16, fp16) == "f32"
    with compiled.disabled():
        assert not compiled.available()
        assert compiled.path(f32, "nearest_even", f32, f32) == "torch"
    assert compiled.available()


def test_errors_unchanged() -> None:
    alg = products.matmul_sequential("fp32")
    with pytest.raises(ValueError, match="K differs"):
        alg.run(torch.ones(2, 3), torch.ones(4, 2))
    with pytest.raises(ValueError, match="not fp32 values"):
        alg.run(np.array([[0.1]]), np.array([[1.0]]))
