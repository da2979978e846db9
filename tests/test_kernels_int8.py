"""INT8 kernels: bit-exact against Fraction oracles; the reference facts checked by test.

vllm-kernels.md §2.1/§2.2/§2.4 (epilogue orders), numerics.md §3 (int32 bounds), §4 (epilogue
order rates: ppm-level, at most one bf16 spacing; bit-identical under power-of-two scales).
"""

from __future__ import annotations

import os

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
from _library_facts import fact
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.kernels import get_kernel
from tasks.kernels.int8 import INT32_EXACT_K, int32_accumulator
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
    if onednn.available()[0]:
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


def test_int_mm_exact_below_bound_and_wraps_above():
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-128, 128, (7, 3000), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (3000, 5), dtype=torch.int8, generator=g)
    assert torch.equal(torch._int_mm(a, b).long(), a.long() @ b.long())
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


def test_int32_accumulator_fallback_matches_int_mm(monkeypatch):
    g = torch.Generator().manual_seed(4)
    a = torch.full((2, 132105), -128, dtype=torch.int8)
    b = torch.randint(-128, 128, (132105, 3), dtype=torch.int8, generator=g)
    b[:, 0] = -127
    want = torch._int_mm(a, b)

    def refuse(*args):
        raise RuntimeError("layout refused")

    monkeypatch.setattr(torch, "_int_mm", refuse)
    assert torch.equal(int32_accumulator(a, b), want)


# -- int8-onednn ------------------------------------------------------------------------------

onednn_available = get_kernel("int8-onednn").available()


#: Which order oneDNN's int8 matmul (torch's, brg_matmul avx512_core_vnni) computes on AVX512 without
#: AMX, as the kernel of the registry that computes the same bits.  Checked on torch 2.13.0+cpu (on an
#: AMX CPU, with ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI; with AMX the fp32 outputs differ).
ONEDNN_ORDER = {">=2.13,<2.14": "int8-torch-channelwise"}
#: Whether oneDNN's int32 accumulator wraps past 2**31 as torch._int_mm does (int32_accumulator's
#: rule).  Checked on torch 2.13.0+cpu, with and without AMX.
ONEDNN_INT32_WRAPS = {">=2.13,<2.14": True}


def _measured_isa() -> bool:
    """The ISA oneDNN's order was recorded on (AVX512, no AMX); elsewhere only the bound is checked.
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI gives it on an AMX CPU too."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() == "AVX512_CORE_VNNI":
        return torch.backends.cpu.get_cpu_capability() == "AVX512"
    try:  # torch 2.13 has it in torch.cpu; torch._C._cpu had it before
        probe = getattr(torch.cpu, "_is_amx_tile_supported", None) or torch._C._cpu._is_amx_tile_supported
        amx = bool(probe())
    except Exception:
        amx = True
    return torch.backends.cpu.get_cpu_capability() == "AVX512" and not amx


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
    # not a fact about a version: which order oneDNN computes is recorded below.)
    assert d[big.numpy()].max() <= (1 if out != torch.float32 else 4)


@pytest.mark.skipif(not onednn_available[0], reason=str(onednn_available[1]))
def test_onednn_computes_a_recorded_order():
    if not _measured_isa():
        pytest.skip("oneDNN's order is recorded for AVX512 without AMX only; "
                    f"this CPU: {torch.backends.cpu.get_cpu_capability()}, AMX or unknown")
    order = fact("torch", ONEDNN_ORDER, what="the order of oneDNN's int8 matmul on AVX512 without AMX")
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
