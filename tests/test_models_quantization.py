"""W8A8 quantization: vLLM's per-token activation formula on crafted inputs, weights, pow2 scales."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.models import (
    is_pow2,
    pow2_up,
    quantize_activations,
    quantize_weight,
    requantize_weight_pow2,
)
from tasks.models.quantization import _round_sat


def vllm_int8_quant(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Independent numpy model of scaled_int8_quant (dynamic, symmetric, per token), all fp32."""
    x = x.astype(np.float32)
    q = np.zeros(x.shape, dtype=np.int8)
    s = np.zeros((x.shape[0], 1), dtype=np.float32)
    for i, row in enumerate(x):
        absmax = np.float32(np.max(np.abs(row)))
        s[i, 0] = absmax / np.float32(127.0)
        if absmax == 0:
            continue  # 127/0 = inf, 0*inf = NaN, cvt.rni.sat(NaN) = 0
        inv = np.float32(127.0) / absmax
        v = (row * inv).astype(np.float32)
        q[i] = np.clip(np.rint(v), -128, 127).astype(np.int8)  # rint: half to even
    return q, s


def test_ties_round_half_to_even():
    # absmax 127 -> inv = 1 exactly, so x * inv = x and every x.5 is an exact tie.
    x = torch.tensor([[127.0, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 1.5, 126.5]])
    q, s = quantize_activations(x)
    assert q.tolist() == [[127, 2, 4, -2, -4, 0, 0, 2, 126]]
    assert s.dtype == torch.float32 and s.shape == (1, 1) and s.item() == 1.0


def test_multiplies_by_127_over_absmax_not_divides_by_scale():
    # Values next to the rounding midpoints (k + 1/2) * absmax / 127, where x * fl(127/absmax) and
    # x / fl(absmax/127) can round to different integers: the quantizer must follow the multiply
    # (vllm-kernels.md §2.6).
    rng = np.random.default_rng(1)
    found = 0
    for a in rng.uniform(0.5, 2.0, 20).astype(np.float32):
        mids = np.array([(k + 0.5) * float(a) / 127 for k in range(126)], dtype=np.float32)
        near = np.concatenate([mids + d * np.spacing(mids) for d in range(-3, 4)]).astype(np.float32)
        row = np.concatenate([[a], near, -near]).astype(np.float32)
        mul = np.rint((row * (np.float32(127) / a)).astype(np.float32))
        div = np.rint((row / (a / np.float32(127))).astype(np.float32))
        found += int((mul != div).sum())
        q, _ = quantize_activations(torch.from_numpy(row[None, :]))
        assert q.numpy()[0].tolist() == np.clip(mul, -128, 127).astype(np.int8).tolist()
    assert found > 0


def test_saturation():
    assert _round_sat(torch.tensor([127.4, 127.5, 127.6, 300.0, -128.5, -128.6, -1e9]), -128, 127).tolist() == [
        127, 127, 127, 127, -128, -128, -128,
    ]
    # Rows whose absmax element lands above 127 after x * fl(127/absmax): it must come out 127.
    rng = np.random.default_rng(2)
    hits = 0
    for v in rng.uniform(0.1, 1000, 20000).astype(np.float32):
        if np.float32(v) * (np.float32(127) / np.float32(v)) > np.float32(127):
            q, _ = quantize_activations(torch.tensor([[float(v), -float(v), 0.0]]))
            assert q.tolist() == [[127, -127, 0]]
            hits += 1
    assert hits > 0


def test_matches_independent_model_on_random_rows():
    rng = np.random.default_rng(3)
    for scale in (1e-6, 1e-2, 1.0, 37.0, 1e4):
        x = (rng.standard_normal((17, 96)) * scale).astype(np.float32)
        x[3, :] = 0.0  # a zero row
        q, s = quantize_activations(torch.from_numpy(x))
        q_ref, s_ref = vllm_int8_quant(x)
        assert np.array_equal(q.numpy(), q_ref)
        assert np.array_equal(s.numpy().view(np.int32), s_ref.view(np.int32))


def test_bf16_input_is_converted_exactly():
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    q, s = quantize_activations(x)
    q_ref, s_ref = vllm_int8_quant(x.to(torch.float32).numpy())
    assert np.array_equal(q.numpy(), q_ref) and np.array_equal(s.numpy(), s_ref)


def test_zero_row_and_nonfinite():
    q, s = quantize_activations(torch.zeros(2, 8))
    assert q.abs().sum() == 0 and s.abs().sum() == 0
    q, s = quantize_activations(torch.zeros(2, 8), "pow2")
    assert q.abs().sum() == 0 and s.abs().sum() == 0
    with pytest.raises(ValueError, match="inf or NaN"):
        quantize_activations(torch.tensor([[1.0, float("inf")]]))
    with pytest.raises(ValueError, match="scales must be one of"):
        quantize_activations(torch.ones(1, 2), "ceil")


def test_pow2_up_exact():
    vals = torch.tensor([1.0, 1.0000001, 0.75, 0.5, 3.0, 4.0, 2.0**-126, 2.0**-140, 1.5 * 2.0**-140, 0.0])
    assert pow2_up(vals).tolist() == [1.0, 2.0, 1.0, 0.5, 4.0, 4.0, 2.0**-126, 2.0**-140, 2.0**-139, 0.0]
    assert is_pow2(torch.tensor([1.0, 0.5, 2.0**-140, 3.0, 0.0, -1.0, float("inf")])).tolist() == [
        True, True, True, False, False, False, False,
    ]


def test_pow2_activation_scales():
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(5)) * 3.7
    q, s = quantize_activations(x, "pow2")
    assert bool(is_pow2(s).all())
    real = x.abs().amax(dim=1, keepdim=True) / 127.0
    assert bool((s >= real).all()) and bool((s < 2 * real).all())
    # q = rn(x / s), exact: x / 2^e is exact in fp32 (no underflow here).
    assert torch.equal(q, torch.round(x / s).to(torch.int8))
    assert int(q.abs().max()) <= 127


def test_weight_quantization_real_and_pow2():
    w = torch.randn(48, 40, generator=torch.Generator().manual_seed(6)) * 0.05
    w[7] = 0.0
    q, s = quantize_weight(w)
    assert q.dtype == torch.int8 and s.shape == (48,) and s.dtype == torch.float32
    assert int(q.min()) >= -127 and int(q.max()) <= 127
    absmax = w.abs().amax(dim=1)
    assert torch.equal(s[absmax > 0], (absmax / 127.0)[absmax > 0])
    assert s[7].item() == 1.0 and q[7].abs().sum() == 0
    assert torch.equal(q, torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8))
    q2, s2 = quantize_weight(w, "pow2")
    assert bool(is_pow2(s2).all())
    assert int(q2.abs().max()) <= 127


def test_requantize_pow2():
    w = torch.randn(16, 24, generator=torch.Generator().manual_seed(7))
    q, s = quantize_weight(w)
    q2, s2 = requantize_weight_pow2(q, s)
    assert bool(is_pow2(s2).all())
    expect = torch.round(q.double() * s.double()[:, None] / s2.double()[:, None]).clamp(-127, 127)
    assert torch.equal(q2, expect.to(torch.int8))
    # Already on the pow2 grid: unchanged.
    qp, sp = quantize_weight(w, "pow2")
    q3, s3 = requantize_weight_pow2(qp, sp)
    assert torch.equal(q3, qp) and torch.equal(s3, sp)
