"""INT8 kernels: bit-exact against Fraction oracles; the reference facts checked by test.

vllm-kernels.md §2.1/§2.2/§2.4 (epilogue orders), numerics.md §3 (int32 bounds), §4 (epilogue
order rates: ppm-level, at most one bf16 spacing; bit-identical under power-of-two scales).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _kernel_oracle import (
    bias_tensor,
    int8_matrix,
    int8_oracle,
    out_dtypes,
    same_bits,
    scale_tensors,
)
from _library_facts import fact, isa_fact
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.kernels import accumulator as acc_mod
from tasks.kernels import get_kernel
from tasks.kernels.accumulator import ACCUMULATOR_ENV, check_path, wrap_int32
from tasks.kernels.int8 import INT32_EXACT_K, int32_accumulator
from tasks.kernels.onednn import onednn_path, saturated_pair_sums
from tasks.numerics import distance

KINDS = {
    "int8-cutlass-order": ({}, "cutlass"),
    "int8-triton-order": ({"bias_mode": "fp32"}, "triton-fp32"),
    "int8-triton-order/output": ({"bias_mode": "output"}, "triton-output"),
    "int8-torch-channelwise": ({}, "channelwise"),
}


@st.composite
def int8_problem(draw):
    m, n, k = draw(st.integers(1, 5)), draw(st.integers(1, 5)), draw(st.integers(1, 40))
    a = draw(int8_matrix(m, k))
    b = draw(int8_matrix(k, n))
    sa, sb = draw(scale_tensors(m, n))
    out = draw(out_dtypes)
    bias = draw(bias_tensor(n, out, scale=draw(st.sampled_from([2.0**-10, 1.0, 2.0**10]))))
    return a, b, sa, sb, out, bias


@pytest.mark.parametrize("label", sorted(KINDS))
@settings(max_examples=250, deadline=None)
@given(problem=int8_problem())
def test_int8_kernels_match_oracle(label, problem):
    a, b, sa, sb, out, bias = problem
    params, kind = KINDS[label]
    kernel = get_kernel(label.split("/")[0], **params)
    got = kernel(a, b, sa, sb, out, bias)
    want = int8_oracle(a, b, sa, sb, out, bias, kind)
    assert same_bits(got, want), (got, want)


def test_cutlass_bias_uses_a_single_fma_rounding():
    # sa*t + bias with t = fl(sb*acc): a case where fl(fl(sa*t) + bias) differs from fma(sa, t, bias).
    a = torch.tensor([[1]], dtype=torch.int8)
    b = torch.tensor([[3]], dtype=torch.int8)
    sa = torch.tensor([1.0 + 2**-23], dtype=torch.float32)  # sa*3 needs 26 bits
    sb = torch.tensor([1.0])
    bias = torch.tensor([-3.0], dtype=torch.float32)
    got = get_kernel("int8-cutlass-order")(a, b, sa, sb, torch.float32, bias)
    assert got.item() == 3 * 2**-23  # exact: the FMA keeps the low bits fl(sa*3) would lose
    two_roundings = get_kernel("int8-torch-channelwise")(a, b, sa, sb, torch.float32, bias)
    assert two_roundings.item() != got.item()


def test_triton_bias_modes_differ_as_documented():
    # <= 0.31 adds the bias after rounding to bf16: double rounding (vllm-kernels.md §2.2).
    a = torch.tensor([[1]], dtype=torch.int8)
    b = torch.tensor([[1]], dtype=torch.int8)
    sa = torch.tensor(1.0 + 2**-8)  # 1 + 2^-8 is a bf16 tie: rn -> 1.0
    sb = torch.tensor(1.0)
    bias = torch.tensor([2**-8], dtype=torch.bfloat16)
    fp32 = get_kernel("int8-triton-order", bias_mode="fp32")(a, b, sa, sb, torch.bfloat16, bias)
    outm = get_kernel("int8-triton-order", bias_mode="output")(a, b, sa, sb, torch.bfloat16, bias)
    assert fp32.item() == 1.0 + 2**-7  # rn(1 + 2^-7) exact
    assert outm.item() == 1.0  # rn(rn(1 + 2^-8) + 2^-8) = rn(1 + 2^-8) = 1.0


def _vllm_like(m, k, n, seed, pow2=False):
    """Per-token activation and per-channel weight quantization (vllm-kernels.md §2.6)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * (1 + 5 * torch.rand(m, 1, generator=g))
    w = torch.randn(k, n, generator=g) * 0.02
    amax = x.abs().amax(dim=1, keepdim=True)
    sa = (amax / 127.0).float()
    a = torch.clamp(torch.round(x * (127.0 / amax)), -128, 127).to(torch.int8)
    wmax = w.abs().amax(dim=0, keepdim=True)
    sb = (wmax / 127.0).float()
    b = torch.clamp(torch.round(w / wmax * 127), -127, 127).to(torch.int8)
    if pow2:
        sa = torch.exp2(torch.round(torch.log2(sa)))
        sb = torch.exp2(torch.round(torch.log2(sb)))
    return a, b, sa, sb


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16])
def test_power_of_two_scales_all_orders_bit_identical(out):
    a, b, sa, sb = _vllm_like(128, 1000, 96, seed=1, pow2=True)
    ref = get_kernel("exact")(a, b, sa, sb, out)
    for name in ("int8-cutlass-order", "int8-triton-order", "int8-torch-channelwise"):
        assert same_bits(get_kernel(name)(a, b, sa, sb, out), ref), name
    onednn = get_kernel("int8-onednn", act_scale="split-rows")
    if onednn.available()[0] and onednn_path().exact:  # not exact without VNNI: see below
        assert same_bits(onednn(a, b, sa, sb, out), ref)


def test_real_scales_cutlass_vs_triton_ppm_and_one_spacing():
    a, b, sa, sb = _vllm_like(256, 1024, 256, seed=2)
    c = get_kernel("int8-cutlass-order")(a, b, sa, sb, torch.bfloat16)
    t = get_kernel("int8-triton-order")(a, b, sa, sb, torch.bfloat16)
    d = distance(c, t, "bf16")
    differ = d != 0
    assert differ.mean() < 1e-4
    assert np.all(d[differ] == 1)
    # the fp32 intermediates differ far more often (numerics.md §4: ~35 %), which is the mechanism
    acc = int32_accumulator(a, b).float()
    fp32_differ = ((sa * (sb * acc)) != (sb * (sa * acc))).float().mean().item()
    assert 0.2 < fp32_differ < 0.5


def test_int32_accumulator_exact_below_bound_and_wraps_above():
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-128, 128, (7, 3000), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (3000, 5), dtype=torch.int8, generator=g)
    assert torch.equal(int32_accumulator(a, b).long(), a.long() @ b.long())
    # extremes at the bounds of numerics.md §3
    for k, av, bv, exact in [
        (INT32_EXACT_K, -128, -128, True),  # 131071 * 16384 < 2^31
        (132104, -128, 127, True),
        (132105, -128, -127, False),
        (INT32_EXACT_K + 1, -128, -128, False),
    ]:
        a = torch.full((1, k), av, dtype=torch.int8)
        b = torch.full((k, 1), bv, dtype=torch.int8)
        true = av * bv * k
        got = int(int32_accumulator(a, b).item())
        assert (got == true) == exact
        assert got == ((true + 2**31) % 2**32) - 2**31  # wrapping int32, order-free


def test_int32_accumulator_when_int_mm_refuses_a_layout(monkeypatch):
    if check_path("int_mm") is not None:
        pytest.skip(f"torch._int_mm is not exact on this CPU: {check_path('int_mm')}")
    monkeypatch.setenv(ACCUMULATOR_ENV, "int_mm")
    acc_mod.reset_accumulator_path()
    assert acc_mod.accumulator_path().name == "int_mm"  # checked before _int_mm starts refusing
    g = torch.Generator().manual_seed(4)
    a = torch.full((2, 132105), -128, dtype=torch.int8)
    b = torch.randint(-128, 128, (132105, 3), dtype=torch.int8, generator=g)
    b[:, 0] = -127
    want = wrap_int32(torch.from_numpy(a.numpy().astype(np.int64) @ b.numpy().astype(np.int64)))

    def refuse(*args):
        raise RuntimeError("layout refused")

    monkeypatch.setattr(torch, "_int_mm", refuse)
    try:
        assert torch.equal(int32_accumulator(a, b), want)
    finally:
        monkeypatch.delenv(ACCUMULATOR_ENV)
        acc_mod.reset_accumulator_path()


# -- int8-onednn ------------------------------------------------------------------------------

onednn_available = get_kernel("int8-onednn").available()


#: Which order oneDNN's int8 matmul computes, as the kernel of the registry that computes the same bits,
#: per ISA level (brg_matmul:avx512_core_vnni on AVX512-VNNI). Checked on torch 2.13.0+cpu on an AMD EPYC
#: with AVX512-VNNI and on an AMX CPU with ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI; with AMX the fp32 outputs
#: differ (not recorded); without VNNI the accumulator is not exact (ONEDNN_EXACT).
ONEDNN_ORDER = {"AVX512-VNNI": "int8-torch-channelwise"}
#: Whether oneDNN's int8 accumulator is exact, per ISA level. Without VNNI (AVX2: gemm:jit, measured with
#: ONEDNN_MAX_CPU_ISA=AVX2 on an AVX512-VNNI CPU; reported on an AVX2-only AMD EPYC) adjacent u8 x s8
#: products are added in saturating int16 pairs (vpmaddubsw) first.
ONEDNN_EXACT = {"AMX": True, "AVX512-VNNI": True, "AVX2": False}
#: Whether oneDNN's int32 accumulator wraps past 2**31 as an int32 GEMM does (int32_accumulator's
#: rule).  Checked on torch 2.13.0+cpu, with and without AMX.
ONEDNN_INT32_WRAPS = {">=2.13,<2.14": True}


def test_onednn_says_which_path_runs_and_whether_it_is_exact():
    """swapcheck's behaviour on any CPU: the path is measured and named, and a path that is not exact
    says so with a cause the saturation model checked; what oneDNN does per ISA is a recorded fact."""
    if not onednn_available[0]:
        pytest.skip(str(onednn_available[1]))
    k = get_kernel("int8-onednn")
    path = onednn_path()
    assert path.impl and path.impl in k.code_path
    if path.exact:
        assert "NOT EXACT" not in (k.caveat() or "") and "exact int32 accumulator" in k.code_path
    else:
        caveat = k.caveat()
        assert "NOT EXACT" in k.code_path and caveat is not None and str(path.cause) in caveat
    assert path.exact == isa_fact(ONEDNN_EXACT, what="whether oneDNN's int8 accumulator is exact")
    if not path.exact:
        assert "int16 saturation" in str(path.cause)


def test_saturation_model_against_a_scalar_oracle():
    g = np.random.default_rng(0)
    u = g.integers(0, 256, (3, 9))
    w = g.integers(-128, 128, (9, 4))
    want = np.zeros((3, 4), dtype=np.int64)
    for i in range(3):
        for j in range(4):
            for k in range(0, 9, 2):
                pair = int(u[i, k]) * int(w[k, j]) + (int(u[i, k + 1]) * int(w[k + 1, j]) if k + 1 < 9 else 0)
                want[i, j] += max(-32768, min(32767, pair))
    assert np.array_equal(saturated_pair_sums(u, w), want)
    assert saturated_pair_sums(np.full((1, 2), 255), np.full((2, 1), 127))[0, 0] == 32767


@pytest.mark.skipif(not onednn_available[0], reason=str(onednn_available[1]))
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_within_one_spacing_of_exact(out, per_channel, with_bias):
    a, b, _, sb = _vllm_like(64, 700, 48, seed=5)
    sa = torch.tensor(0.0173)
    if not per_channel:
        sb = sb.reshape(-1)[:1].clone()
    bias = (
        (torch.randn(48, generator=torch.Generator().manual_seed(6)) * 0.1).to(out)
        if with_bias
        else None
    )
    got = get_kernel("int8-onednn")(a, b, sa, sb, out, bias)
    ref = get_kernel("exact")(a, b, sa, sb, out, bias)
    fmt = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[out]
    d = distance(got, ref, fmt)
    big = ref.abs() >= 0.05 * ref.abs().max()
    # bf16/fp16: at most one spacing.  fp32 output: the epilogue's own fp32 roundings (acc*sa, *sb,
    # +bias) are each up to half an fp32 spacing, so a few fp32 spacings.  (A correct kernel's bound,
    # not a fact about a version: which order oneDNN computes is recorded below.)  Where the kernel
    # says its accumulator is not exact here, the bound is not its contract: the test above checks
    # that it says so.
    if onednn_path().exact:
        assert d[big.numpy()].max() <= (1 if out != torch.float32 else 4)
    else:
        assert "NOT EXACT" in get_kernel("int8-onednn").code_path


@pytest.mark.skipif(not onednn_available[0], reason=str(onednn_available[1]))
def test_onednn_computes_a_recorded_order():
    order = isa_fact(ONEDNN_ORDER, what="the order of oneDNN's int8 matmul")
    for out in (torch.bfloat16, torch.float16, torch.float32):
        for per_channel in (True, False):
            for with_bias in (False, True):
                a, b, _, sb = _vllm_like(64, 700, 48, seed=5)
                sa = torch.tensor(0.0173)
                if not per_channel:
                    sb = sb.reshape(-1)[:1].clone()
                gen = torch.Generator().manual_seed(6)
                bias = (torch.randn(48, generator=gen) * 0.1).to(out) if with_bias else None
                got = get_kernel("int8-onednn")(a, b, sa, sb, out, bias)
                want = get_kernel(order)(a, b, sa, sb, out, bias)
                assert same_bits(got, want), (out, per_channel, with_bias)


@pytest.mark.skipif(not onednn_available[0], reason=str(onednn_available[1]))
def test_onednn_split_rows():
    a, b, sa, sb = _vllm_like(40, 300, 24, seed=7)
    k = get_kernel("int8-onednn", act_scale="split-rows")
    got = k(a, b, sa, sb, torch.bfloat16)
    for i in (0, 17, 39):  # each row equals a per-tensor call with that row's scale
        row = get_kernel("int8-onednn")(a[i : i + 1], b, sa[i], sb, torch.bfloat16)
        assert same_bits(got[i : i + 1], row)
    uniform = torch.full((40, 1), 0.02)
    assert same_bits(
        k(a, b, uniform, sb, torch.bfloat16),
        get_kernel("int8-onednn")(a, b, torch.tensor(0.02), sb, torch.bfloat16),
    )


@pytest.mark.skipif(not onednn_available[0], reason=str(onednn_available[1]))
def test_onednn_int32_extremes_wrap_like_int_mm():
    k = 132105
    a = torch.full((2, k), -128, dtype=torch.int8)
    b = torch.full((k, 3), -127, dtype=torch.int8)
    got = get_kernel("int8-onednn")(a, b, torch.tensor(1.0), torch.tensor(1.0), torch.float32)
    wrapped = int32_accumulator(a, b)  # ours: wraps (test_int_mm_exact_below_bound_and_wraps_above)
    wraps = fact("torch", ONEDNN_INT32_WRAPS, what="oneDNN's int8 matmul past the int32 range")
    assert torch.equal(got, wrapped.float()) == wraps
