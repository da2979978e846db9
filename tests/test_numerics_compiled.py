"""The compiled (numba) paths of the ordered matmul algorithms (tasks/numerics/compiled.py) against
the torch engines (tasks/numerics/orders.py, run with the compiled paths switched off) and the
Fraction oracle (tests/_numerics_oracle.py), bit for bit: every order, format, rounding, fma, input
format, both kernels (float32 and float64), odd and even K, K = 0 and 1, K not a multiple of the
block, subnormals, overflow, signed zeros, NaN and inf.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.numerics import FORMATS, compiled, products
from tests import _numerics_oracle as O
from tests._numerics_strategies import matrices

# numba is a dependency: where it is missing or broken these tests fail (test_compiled_paths_are_on),
# they skip only when the compiled paths are switched off on purpose.
pytestmark = pytest.mark.skipif(os.environ.get("SWAPCHECK_NUMBA") == "0", reason="SWAPCHECK_NUMBA=0")


def test_compiled_paths_are_on() -> None:
    assert compiled.available(), "numba (a dependency) cannot be imported: the torch engines would run instead"

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


@pytest.mark.parametrize("order", ["sequential", pytest.param("pairwise", marks=pytest.mark.slow),
                                   pytest.param("blocked", marks=pytest.mark.slow)])
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


# ---------------------------------------------------------------------------------------------
# The scalar roundings of the bf16/fp16 float32 kernels (tasks/numerics/_nbkernels.py)


def _nb() -> tuple[object, ...]:
    """njit wrappers applying the kernels' scalar roundings elementwise (compiled once)."""
    import numba

    from tasks.numerics import _nbkernels as K

    if not hasattr(_nb, "fns"):
        @numba.njit
        def unary(x: np.ndarray, out: np.ndarray, which: int) -> None:
            for i in range(x.shape[0]):
                if which == 0:
                    out[i] = K._fp16(x[i])
                elif which == 1:
                    out[i] = K._rnd_fp16_soft(x[i])
                else:
                    out[i] = K._bf16(x[i])

        @numba.njit
        def binary(x: np.ndarray, y: np.ndarray, out: np.ndarray, bf16: bool) -> None:
            for i in range(x.shape[0]):
                out[i] = K._sum_bf16(x[i], y[i]) if bf16 else K._sum_fp16(x[i], y[i])

        _nb.fns = (unary, binary)  # type: ignore[attr-defined]
    return _nb.fns  # type: ignore[attr-defined,no-any-return]


def _bits_same(x: np.ndarray, y: np.ndarray) -> bool:
    """float32 arrays equal bit for bit, any NaN equal to any NaN."""
    nan = np.isnan(x)
    return bool(np.array_equal(nan, np.isnan(y)) and np.array_equal(x.view(np.uint32)[~nan],
                                                                     y.view(np.uint32)[~nan]))  # fmt: skip


def _fp16_probe_patterns() -> np.ndarray:
    """fp32 values around every fp16 value and midpoint (+-1 and +-2 fp32 steps), fp16's overflow
    threshold, subnormals of both formats, specials, and random patterns."""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    h = h[np.isfinite(h)].astype(np.float64)
    with np.errstate(over="ignore"):
        up = np.nextafter(h.astype(np.float16), np.float16(np.inf)).astype(np.float64)
    mids = ((h + up) / 2).astype(np.float32)  # exact (fp16 neighbours' mean has 12 bits)
    base = np.concatenate([h.astype(np.float32), mids, np.float32([65520.0, -65520.0, 2.0**-25])])
    u = base.view(np.uint32).astype(np.int64)
    near = np.concatenate([u + d for d in (-2, -1, 1, 2)]) & 0xFFFFFFFF
    rng = np.random.default_rng(0)
    rand = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64)
    tiny = rng.integers(0, 1 << 23, 4096, dtype=np.uint64)  # fp32 subnormals
    specials = np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0, 3.4e38, -3.4e38]).view(np.uint32)
    pats = np.concatenate([u, near, rand, tiny, tiny | (1 << 31), specials]).astype(np.uint32)
    return pats.view(np.float32)


def test_fp16_hardware_rounding_matches_the_bit_method() -> None:
    """_fp16 (fptrunc/fpext, F16C here) and _rnd_fp16_soft (the fallback where a target has no
    conversion) agree bit for bit, and with numpy's float32 -> float16 cast."""
    from tasks.numerics import _nbkernels as K

    unary, _ = _nb()
    x = _fp16_probe_patterns()
    hw, soft = np.empty_like(x), np.empty_like(x)
    unary(x, hw, 0)  # type: ignore[operator]
    unary(x, soft, 1)  # type: ignore[operator]
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).astype(np.float32)
    assert _bits_same(hw, soft) and _bits_same(soft, ref)
    assert isinstance(K.HW_F16, bool)


def test_bf16_rounding_against_numpy() -> None:
    """_bf16 against ml_dtypes' float32 -> bfloat16 cast on bf16 values, midpoints and their
    neighbours, random patterns and specials (NaNs with low 16 bits 0: what the kernels see)."""
    import ml_dtypes

    unary, _ = _nb()
    rng = np.random.default_rng(1)
    hi = (rng.integers(0, 1 << 16, 1 << 18, dtype=np.uint64) << 16).astype(np.int64)
    near = np.concatenate([hi + d for d in (0, 0x7FFF, 0x8000, 0x8001, 0xFFFF)])
    rand = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.int64)
    pats = np.concatenate([near, rand]).astype(np.uint64).astype(np.uint32)
    x = pats.view(np.float32)
    x = x[~np.isnan(x) | ((pats & 0xFFFF) == 0)]
    got = np.empty_like(x)
    unary(x, got, 2)  # type: ignore[operator]
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert _bits_same(got, want)


@st.composite
def _f32_pairs(draw: st.DrawFn, bf16: bool) -> tuple[float, float]:
    """Two fp32 values whose sum lands on or near a midpoint of the format: x on a midpoint,
    a format value or random, y from x's scale down to far below it (or random, or special)."""
    shape = draw(st.sampled_from(["mid", "value", "random"]))
    bits = draw(st.integers(0, (1 << 32) - 1))
    if shape == "mid":
        bits = (bits & 0xFFFF0000) | 0x8000 if bf16 else (bits & 0xFFFFE000) | 0x1000
    elif shape == "value":
        bits &= 0xFFFF0000 if bf16 else 0xFFFFE000
    x = float(np.uint32(bits).view(np.float32))
    if not math.isfinite(x) or x == 0:
        x = draw(st.sampled_from([1.0, -1.5, 2.0**-130, 65504.0]))
    kind = draw(st.sampled_from(["scaled", "random", "special"]))
    if kind == "scaled":
        m = draw(st.integers(-(1 << 24) + 1, (1 << 24) - 1))
        e = math.frexp(x)[1] - 24 - draw(st.integers(-2, 60))
        y = float(np.float32(math.ldexp(m, e)))
    elif kind == "random":
        y = float(np.uint32(draw(st.integers(0, (1 << 32) - 1))).view(np.float32))
        if math.isnan(y):
            y = math.nan
    else:
        y = draw(st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, -x, 3.4e38]))
    return (x, y) if draw(st.booleans()) else (y, x)


@pytest.mark.parametrize("bf16", [True, False])
@given(data=st.data())
@settings(max_examples=400, deadline=None)
def test_sum_roundings_against_oracle(bf16: bool, data: st.DataObject) -> None:
    """_sum_bf16 / _sum_fp16 (``x + y`` of fp32 values rounded once to the format: the fma steps
    and pairwise leaves) against the Fraction oracle, batches of stressed pairs."""
    _, binary = _nb()
    pairs = data.draw(st.lists(_f32_pairs(bf16), min_size=1, max_size=64))
    x = np.array([p[0] for p in pairs], dtype=np.float32)
    y = np.array([p[1] for p in pairs], dtype=np.float32)
    got = np.empty_like(x)
    binary(x, y, got, bf16)  # type: ignore[operator]
    f = FORMATS["bf16" if bf16 else "fp16"]
    want = [O.add(float(p), float(q), f, "nearest_even") for p, q in zip(x, y, strict=True)]
    assert O.same(got.astype(np.float64), want), (x, y, got, want)


def test_widen_fp16_and_abs_range() -> None:
    """The fp16 -> fp32 operand conversion is exact on every pattern (a NaN stays NaN); abs_range
    finds the smallest and largest finite nonzero magnitudes."""
    from tasks.numerics import _nbkernels as K

    if K.HW_F16:
        pats = np.arange(1 << 16, dtype=np.uint16)
        out = np.empty(1 << 16, dtype=np.float32)
        K.widen_fp16(pats, out)
        assert _bits_same(out, pats.view(np.float16).astype(np.float32))
        t = torch.from_numpy(pats.view(np.int16)).view(torch.float16).reshape(256, 256)
        assert _bits_same(compiled.operands32(t)[0].reshape(-1), out)  # type: ignore[index]
    rng = np.random.default_rng(2)
    for _ in range(100):
        v = (rng.standard_normal(40) * 2.0 ** rng.integers(-150, 128, 40)).astype(np.float32)
        v[rng.integers(0, 40, 6)] = rng.choice([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45], 6)
        if rng.random() < 0.1:
            v[:] = rng.choice([0.0, np.inf, np.nan])
        m = np.abs(v.astype(np.float64))
        m = m[(m > 0) & np.isfinite(m)]
        assert K.abs_range(v) == ((m.min(), m.max()) if m.size else (math.inf, 0.0))


def test_bf16_accumulator_keeps_fp16_nan_payloads_nan() -> None:
    """fp16 NaNs whose fp32 pattern has high payload bits (0x7FFF, 0xFFFF, ...) would round to
    -0 or inf in the bf16 bit rounding; run_ordered replaces them by the default NaN first."""
    nans = np.array([0x7FFF, 0xFFFF, 0x7E01, 0xFDFF, 0x7C01], dtype=np.uint16).view(np.float16)
    a = np.ones((5, 3), dtype=np.float16)
    a[:, 1] = nans
    b = np.full((3, 2), 2.0, dtype=np.float16)
    for order in ("sequential", "pairwise", "blocked"):
        for fma in (False, True):
            got = _f64(_alg(order, "bf16", fma, "nearest_even", 2).run(a, b))
            assert np.isnan(got).all(), (order, fma, got)
    _check(_alg("sequential", "bf16", True, "nearest_even", 2), a.astype(np.float64),
           b.astype(np.float64), "fp16", False, "sequential", 2)  # fmt: skip
