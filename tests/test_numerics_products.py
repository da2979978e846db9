"""Matmul algorithms: exact emulation against the Fraction oracle, bounds, and the seed's examples.

Input/accumulator pairs cover fp32, bf16, fp16 and e4m3 accumulators, inputs of the same format and
narrower inputs whose products are exact in fp32 (the fast paths), both roundings, fma on and off,
K = 1, odd K, K not a multiple of the block size, subnormals, overflow, signed zeros and NaN/inf.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.numerics import FORMATS, products, round_to_format
from tasks.numerics.exactsum import exact_matmul
from tests import _numerics_oracle as O
from tests._numerics_strategies import matrices

PAIRS = [("fp32", "fp32"), ("bf16", "fp32"), ("fp8_e4m3fn", "fp32"), ("fp16", "fp32"),
         ("bf16", "bf16"), ("fp16", "fp16"), ("fp8_e4m3fn", "fp8_e4m3fn"), ("fp32", "bf16")]  # fmt: skip
ORDERS = ["sequential", "pairwise", "blocked", "exact", "slots16"]
BLOCK = 3


def _algorithm(order: str, f, fma: bool, r: str):
    if order == "sequential":
        return products.matmul_sequential(f, fma=fma, rounding=r)
    if order == "pairwise":
        return products.matmul_pairwise(f, fma=fma, rounding=r)
    if order == "blocked":
        return products.matmul_blocked(f, BLOCK, fma=fma, rounding=r)
    if order == "exact":
        return products.matmul_exact_accumulation(f, rounding=r)
    return products.matmul_slots16(f, rounding=r)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}-in-{p[1]}")
@given(data=st.data())
@settings(max_examples=30, deadline=None)
def test_run_matches_oracle_and_is_covered(order: str, pair, data) -> None:
    fin, f = FORMATS[pair[0]], FORMATS[pair[1]]
    a, b = data.draw(matrices(fin))
    r = data.draw(st.sampled_from(["nearest_even", "nearest_away"]))
    fma = data.draw(st.booleans())
    alg = _algorithm(order, f, fma, r)
    ta = torch.from_numpy(a).to(fin.torch_dtype)
    tb = torch.from_numpy(b).to(fin.torch_dtype)
    got = alg.run(ta, tb)
    assert got.dtype == f.torch_dtype and got.shape == (a.shape[0], b.shape[1])
    want = O.matmul(a, b, f, r, order, fma, BLOCK)
    assert O.same(got.double().numpy(), want), (alg, a, b, got, want)
    assert alg.covers(got, ta, tb).all(), (alg, a, b, got, alg.tolerance(ta, tb))


@pytest.mark.parametrize("k", [1, 2, 7, 64, 65, 129])
@pytest.mark.parametrize("fma", [True, False])
def test_random_fp32_against_oracle(k: int, fma: bool) -> None:
    """randn inputs: the fp32 fast paths (native adds, float64 sum + midpoint test) at larger K,
    across pairwise chunk boundaries and several groups of blocks."""
    rng = np.random.default_rng(k)
    a = rng.standard_normal((3, k)).astype(np.float32)
    b = rng.standard_normal((k, 2)).astype(np.float32)
    f = FORMATS["fp32"]
    for order in ("sequential", "pairwise", "blocked"):
        alg = _algorithm(order, f, fma, "nearest_even")
        got = alg.run(a, b)
        assert got.dtype == np.float32
        want = O.matmul(a.astype(np.float64), b.astype(np.float64), f, "nearest_even", order, fma,
                        BLOCK)  # fmt: skip
        assert O.same(got, want), (order, k, fma)
        assert alg.covers(got, a, b).all()


def test_fp32_midpoint_flag_path() -> None:
    """acc + p lands exactly on an fp32 midpoint after float64 rounding: 1 + 2**-24 + 2**-80 rounds
    to the midpoint 1 + 2**-24 in float64; the exact sum is above it, so fp32 must round up."""
    a = np.array([[1.0, 2.0**-24 + 2.0**-47, 2.0**-33]], dtype=np.float32)
    b = np.array([[1.0], [1.0 + 2.0**-23], [2.0**-47]], dtype=np.float32)
    for fma in (True, False):
        alg = products.matmul_sequential("float32", fma=fma)
        want = O.matmul(a.astype(np.float64), b.astype(np.float64), FORMATS["fp32"],
                        "nearest_even", "sequential", fma)  # fmt: skip
        assert O.same(alg.run(a, b), want)


# ---------------------------------------------------------------------------------------------
# The seed's examples


def test_seed_three_hundred_bf16_ones() -> None:
    ones = np.ones((1, 300), dtype=ml_dtypes.bfloat16)
    column = ones.reshape(300, 1)
    assert products.matmul(ones, column).rounded.tolist() == [[300.0]]
    seq = products.matmul_sequential("bfloat16", fma=False).run(ones, column)
    assert seq.dtype == ml_dtypes.bfloat16 and seq.tolist() == [[256.0]]
    assert products.matmul_pairwise("bfloat16", fma=False).run(ones, column).tolist() == [[300.0]]
    t = torch.ones(1, 300, dtype=torch.bfloat16)
    assert products.matmul_sequential("bfloat16", fma=False).run(t, t.T).item() == 256.0


def test_seed_error_model_digits() -> None:
    m = products.matmul_pairwise("float32", fma=False).error_model(64)
    assert str(m) == "4.77e-07 * sum over k of |A[i,k] * B[k,j]| + 1.34e-43"
    assert (m.roundings, m.charged) == (8, 191)  # gamma_8; (3k - 1) * 2**-150
    assert f"{m.relative:.2e}" == "4.77e-07" and f"{m.absolute:.2e}" == "1.34e-43"


@pytest.mark.parametrize(
    "alg,k,n,charged",
    [
        (products.matmul_sequential("float32", fma=False), 64, 65, 191),
        (products.matmul_sequential("float32"), 64, 64, 64),
        (products.matmul_pairwise("float32"), 64, 6, 63),
        (products.matmul_pairwise("float32"), 1, 1, 1),
        (products.matmul_blocked("float32", 32, fma=False), 4096, 2 + 31 + 127, 3 * 4096 - 1),
        (products.matmul_blocked("float32", 32), 4096, 32 + 127, 4096 + 127),
        (products.matmul_exact_accumulation("float32"), 64, 1, 1),
        (products.matmul_slots16("float32"), 64, 65, 191),
        (products.matmul_sequential("float32"), 0, 0, 0),
    ],
)
def test_counts(alg, k: int, n: int, charged: int) -> None:
    m = alg.error_model(k)
    assert (m.roundings, m.charged) == (n, charged)


# ---------------------------------------------------------------------------------------------
# Bounds: hold on adversarial inputs, tight enough to reject a bf16 accumulator


def _all_algorithms(f: str):
    for fma in (True, False):
        for r in ("nearest_even", "nearest_away"):
            yield products.matmul_sequential(f, fma=fma, rounding=r)
            yield products.matmul_pairwise(f, fma=fma, rounding=r)
            yield products.matmul_blocked(f, 4, fma=fma, rounding=r)
    yield products.matmul_exact_accumulation(f)
    yield products.matmul_slots16(f)


def _adversarial() -> list[tuple[np.ndarray, np.ndarray]]:
    k = 64
    cases = []
    # every product rounds from (1 + 2**-20) 2**-150 up to 2**-149: the underflow term is needed
    cases.append((np.full((1, k), (1 + 2.0**-20) * 2.0**-75), np.full((k, 1), 2.0**-75)))
    # cancellation: 2**24 + 1 - 2**24 and friends
    cases.append((np.array([[2.0**24, 1.0, -(2.0**24), 1.0, 3.0]]), np.ones((5, 2))))
    # one big term then many lost ones, for every position of the big one
    a = np.ones((3, 40))
    a[0, 0], a[1, 20], a[2, 39] = 2.0**25, 2.0**25, 2.0**25
    cases.append((a, np.full((40, 1), 0.5)))
    # overflow of partial sums, NaN and inf inputs, signed zeros
    cases.append((np.array([[3e38, 3e38, -3e38], [1.0, math.nan, 2.0]]), np.ones((3, 1))))
    cases.append((np.array([[math.inf, 1.0], [-0.0, -0.0]]), np.array([[1.0, -0.0], [1.0, 0.0]])))
    # subnormal accumulations and mixed magnitudes
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 50)) * 2.0 ** rng.integers(-140, -100, (4, 50))
    y = rng.standard_normal((50, 3)) * 2.0 ** rng.integers(-30, 30, (50, 3))
    cases.append((x, y))
    return [(round_to_format(p, "fp32"), round_to_format(q, "fp32")) for p, q in cases]


def test_covers_own_output_adversarial() -> None:
    for a, b in _adversarial():
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        for alg in _all_algorithms("float32"):
            out = alg.run(a32, b32)
            assert alg.covers(out, a32, b32).all(), (alg, a, b, out)
        ref = products.matmul(a32, b32)
        assert ref.covers(ref.rounded).all()


def test_underflow_term_is_needed() -> None:
    a, b = _adversarial()[0]
    alg = products.matmul_pairwise("float32", fma=False)
    out = alg.run(a.astype(np.float32), b.astype(np.float32)).astype(np.float64)
    exact = products.matmul(a.astype(np.float32), b.astype(np.float32)).exact
    err = abs(out - exact)[0, 0]
    m = alg.error_model(64)
    assert err > m.relative * 64 * 2.0**-150 * 2  # the relative part alone is far too small
    assert err <= m.absolute


def test_covers_random_own_output() -> None:
    rng = np.random.default_rng(7)
    for f in ("float32", "bfloat16", "float16"):
        a = round_to_format(rng.standard_normal((5, 37)), f)
        b = round_to_format(rng.standard_normal((37, 4)), f)
        dt = FORMATS[_short(f)].numpy_dtype
        for alg in _all_algorithms(f):
            out = alg.run(a.astype(dt), b.astype(dt))
            assert alg.covers(out, a, b).all(), alg


def _short(name: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[name]


def test_bf16_accumulation_is_rejected_by_fp32_bound() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 4096, generator=g).bfloat16()
    b = torch.randn(4096, 16, generator=g).bfloat16()
    bf16_kernel = products.matmul_sequential("bfloat16", fma=False).run(a, b)
    fp32_bound = products.matmul_sequential("float32")
    covered = fp32_bound.covers(bf16_kernel, a, b)
    assert covered.mean() < 0.25  # measured: 14 % (the bound is a worst case, gamma_4097)
    # fp32-accumulating implementations are covered: the emulations and torch's own matmul
    for other in (products.matmul_pairwise("float32").run(a, b), a.float() @ b.float()):
        assert fp32_bound.covers(other, a, b).all()
    assert products.matmul(a.float(), b.float()).covers(a.float() @ b.float()).all()


def test_may_be_and_finite_range() -> None:
    a = np.array([[1.0, 2.0], [math.nan, 1.0], [6e4, 6e4], [1.0, -1.0]], dtype=np.float16)
    b = np.ones((2, 1), dtype=np.float16)
    alg = products.matmul_sequential("float16")
    nan, inf, zero = (alg.may_be(kind, a, b)[:, 0].tolist() for kind in ("nan", "inf", "zero"))
    assert nan == [False, True, False, False]
    assert inf == [False, False, True, False]
    assert zero == [False, False, False, True]
    low, high = alg.finite_range(a, b)
    assert low[0, 0] <= 3 <= high[0, 0] and low[1, 0] > high[1, 0]
    with pytest.raises(ValueError, match="kind"):
        alg.may_be("subnormal", a, b)


# ---------------------------------------------------------------------------------------------
# The operation's reference, the exact matmul, the fp8 kernels' orders, inputs


def test_reference_exact_and_rounded() -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 50)).astype(np.float32)
    b = rng.standard_normal((50, 2)).astype(np.float32)
    ref = products.matmul(a, b, "bfloat16")
    for i in range(3):
        for j in range(2):
            exact = O.exact([O.prod(float(a[i, q]), float(b[q, j])) for q in range(50)],
                            FORMATS["fp32"], "nearest_even")  # fmt: skip
            fr = ref.exact_fraction(i, j)
            assert float(fr) == pytest.approx(float(ref.exact[i, j]), rel=2.0**-52)
            assert abs(float(fr) - exact) <= abs(exact) * 2.0**-24
    assert ref.rounded.dtype == ml_dtypes.bfloat16
    assert ref.format.name == "bf16"
    assert ref.model().roundings == 51
    tol = ref.tolerance()
    assert tol.shape == (3, 2) and (tol > 0).all()
    assert ref.covers(ref.rounded).all()
    # bf16 inputs: the operation is bf16; a bf16 accumulator and torch's (fp32 inside) both rounding
    # only where a bf16 matmul may round are covered
    a16, b16 = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()
    ref16 = products.matmul(a16, b16)
    assert ref16.format.name == "bf16" and ref16.rounded.dtype == torch.bfloat16
    assert ref16.covers(products.matmul_sequential("bfloat16").run(a16, b16)).all()
    assert ref16.covers(a16 @ b16).all()


def test_exact_matmul_wide_range() -> None:
    rng = np.random.default_rng(5)
    a = round_to_format(rng.standard_normal((3, 20)) * 2.0 ** rng.integers(-149, 120, (3, 20)), "fp32")
    b = round_to_format(rng.standard_normal((20, 2)) * 2.0 ** rng.integers(-149, 5, (20, 2)), "fp32")
    e = exact_matmul(a, b)
    from fractions import Fraction

    for i in range(3):
        for j in range(2):
            assert e.fraction((i, j)) == sum(Fraction(a[i, q]) * Fraction(b[q, j]) for q in range(20))


def test_same_orders_as_fp8_kernels() -> None:
    """The fp8 kernels' fp32 accumulation orders (tasks/kernels/fp8.py) are these algorithms."""
    from tasks.kernels import fp8

    g = torch.Generator().manual_seed(1)
    a = (torch.randn(5, 301, generator=g) * 30).to(torch.float8_e4m3fn)
    b = (torch.randn(301, 4, generator=g) * 30).to(torch.float8_e4m3fn)
    at, bf = fp8.fp8_operands_fp32(a, b)
    pairs = [
        (fp8.accumulate_sequential(at, bf), products.matmul_sequential("float32")),
        (fp8.accumulate_pairwise(at, bf), products.matmul_pairwise("float32")),
        (fp8.accumulate_blocked(at, bf, 32), products.matmul_blocked("float32", 32)),
    ]
    for kernel, alg in pairs:
        assert torch.equal(kernel, alg.run(a, b))


def test_input_kinds_and_errors() -> None:
    a = np.array([[1.0, 2.0]])
    b = np.array([[3.0], [4.0]])
    out = products.matmul_pairwise("float16").run(a, b)  # float64 arrays of fp16 values
    assert out.dtype == np.float16 and out.tolist() == [[11.0]]
    with pytest.raises(ValueError, match="not fp16 values"):
        products.matmul_pairwise("float16").run(np.array([[0.1]]), np.array([[1.0]]))
    with pytest.raises(ValueError, match="K differs"):
        products.matmul_pairwise("float32").run(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="saturates"):
        products.matmul_blocked("float32", 8, rounding="toward_zero")
    with pytest.raises(ValueError, match="block_size"):
        products.matmul_blocked("float32", -1)
    assert products.matmul_sequential("float32").run(np.zeros((2, 0), np.float32),
                                                     np.zeros((0, 3), np.float32)).tolist() == [[0.0] * 3] * 2  # fmt: skip


def test_cli_demo_prints_the_seed_examples() -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    res = CliRunner().invoke(app, ["numerics", "demo"])
    assert res.exit_code == 0, res.output
    # Each line opens with the seed's text, then says what the value is and what to compare it with.
    values = [line.split("  -- ")[0] for line in res.output.splitlines()]
    notes = [line.split("  -- ")[1] for line in res.output.splitlines()]
    assert values == [
        "reference: [[300.0]]",
        "sequential: [[256.0]]",
        "pairwise: [[300.0]]",
        "pairwise: 4.77e-07 * sum over k of |A[i,k] * B[k,j]| + 1.34e-43",
        "plain: 1.37e-05",  # the seed prints 1.31e-05: docs/numerics.md, "Attention", says why
        "flash: 0.00544",  # the seed prints 0.00545: docs/numerics.md, "The seed's example"
    ]
    assert "44 below the reference" in notes[1] and "equal to the reference" in notes[2]
    assert "K = 64" in notes[3] and "the seed prints 1.31e-05" in notes[4]
    assert "398 x plain" in notes[5] and "the seed prints 0.00545" in notes[5]


@pytest.mark.parametrize("inputs", ["fp32", "bf16"])
@pytest.mark.parametrize("fma", [True, False])
def test_many_outputs_take_the_same_values(inputs: str, fma: bool) -> None:
    """Many outputs at once take other paths (per-block scans, smaller pairwise chunks, midpoint
    redo in checkpoints) than one column at a time; both are exact, so they agree bit for bit."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn(64, 200, generator=g).to(FORMATS[inputs].torch_dtype)
    b = torch.randn(200, 64, generator=g).to(FORMATS[inputs].torch_dtype)
    algs = [products.matmul_sequential("float32", fma=fma), products.matmul_pairwise("float32", fma=fma),
            products.matmul_blocked("float32", 128, fma=fma), products.matmul_blocked("float32", 7, fma=fma)]  # fmt: skip
    for alg in algs:
        whole = alg.run(a, b)
        cols = torch.cat([alg.run(a, b[:, j : j + 1]) for j in range(0, 64, 9)], dim=1)
        assert torch.equal(whole[:, 0:64:9], cols), alg
    want = O.matmul(a[:2].double().numpy(), b[:, :2].double().numpy(), FORMATS["fp32"],
                    "nearest_even", "blocked", fma, 128)  # fmt: skip
    assert O.same(algs[2].run(a, b)[:2, :2].numpy(), want)


def test_docs_examples_run() -> None:
    """Every python block of docs/numerics.md runs as written."""
    import re

    from tests.conftest import REPO

    text = (REPO / "docs" / "numerics.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "docs/numerics.md", "exec"), {})


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 300), st.integers(1, 5), st.sampled_from([127, 2**12, 2**20]), st.integers(0, 2**31))
def test_exact_matmul_of_small_integers_is_one_matmul_and_exact(m: int, k: int, n: int, top: int, seed: int) -> None:
    """Integers whose products' magnitudes sum below 2**53 (int8 GEMMs) take one float64 matmul
    (exactsum._integer_top), checked against Fractions; the windowed path is never entered."""
    from fractions import Fraction

    import tasks.numerics.exactsum as es

    rng = np.random.default_rng(seed)
    a = rng.integers(-top, top + 1, (m, k)).astype(np.float64)
    b = rng.integers(-top, top + 1, (k, n)).astype(np.float64)
    if k * top * top >= 2**53:
        return
    real = es.bit_range
    es.bit_range = lambda x: (_ for _ in ()).throw(AssertionError("the windowed path was taken"))  # type: ignore[assignment]
    try:
        e = exact_matmul(a, b)
    finally:
        es.bit_range = real
    for i in range(m):
        for j in range(n):
            assert e.fraction((i, j)) == sum(Fraction(int(a[i, q])) * Fraction(int(b[q, j])) for q in range(k))


def test_exact_matmul_takes_the_windows_past_2_53_or_off_the_integers() -> None:
    from fractions import Fraction

    from tasks.numerics.exactsum import _integer_top

    big = np.full((1, 4), 2.0**26)
    assert _integer_top(big, big.T.copy(), 4) is None  # 4 * 2**52 >= 2**53: windows
    assert _integer_top(np.array([[0.5, 1.0]]), np.array([[1.0], [2.0]]), 2) is None  # not integers
    assert _integer_top(np.array([[127.0, -128.0]]), np.array([[127.0], [127.0]]), 2) == 16  # 2 * 128 * 127 < 2**15
    e = exact_matmul(big, big.T.copy())
    assert e.fraction((0, 0)) == 4 * Fraction(2) ** 52
