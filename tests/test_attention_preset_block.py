"""The ``flash-cpu`` preset carries torch's CPU flash block size (512 keys): its bound is tight enough
at S = 1024 to catch a 1/l computed in bf16 on fp32 inputs (issue #26), and torch's own CPU flash
kernel still passes it there."""

from __future__ import annotations

import numpy as np
import torch

from tasks.attention import get_attention
from tasks.checks.attention import PRESETS, draw, parse_algorithm

SHAPE = (1, 1, 4, 1024, 128)  # B x H x L x S x D: 4 x 128 = 512 output elements


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    q, k, v, _, _ = draw(SHAPE, "randn", torch.float32, seed=1)
    return q, k, v, 1.0 / SHAPE[-1] ** 0.5


def _bf16_reciprocal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Flash attention with blocks of 512 keys whose final 1/l is rounded to bf16 (the planted defect)."""
    m = torch.full(q.shape[:-1] + (1,), float("-inf"))
    l_sum = torch.zeros(q.shape[:-1] + (1,))
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],))
    for j in range(0, k.shape[-2], 512):
        s = q @ k[..., j: j + 512, :].transpose(-1, -2) * scale
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        corr = torch.exp(m - m_new)
        l_sum = l_sum * corr + p.sum(-1, keepdim=True)
        acc = acc * corr + p @ v[..., j: j + 512, :]
        m = m_new
    inv = (1.0 / l_sum).to(torch.bfloat16).float()
    return acc * inv


def _outside(alg: object, out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> int:
    cover = alg.covers(out, q, k, v, None, False, scale)  # type: ignore[attr-defined]
    return int((~np.asarray(cover.out)).sum())


def test_flash_cpu_preset_has_the_block_size() -> None:
    assert PRESETS["flash-cpu"]["block_size"] == 512
    assert "block_size=512" in repr(parse_algorithm("flash-cpu", "float32")[1])


def test_bf16_reciprocal_is_caught_at_s1024_fp32_d128() -> None:
    q, k, v, scale = _inputs()
    out = _bf16_reciprocal(q, k, v, scale)
    _, preset = parse_algorithm("flash-cpu", "float32")
    outside = _outside(preset, out, q, k, v, scale)
    assert outside > 0, "the preset's bound lets a bf16 1/l through"
    # Without the block size the bound allows a rescale per key: looser, it lets (nearly) all of it through
    # (seeds 0-4: 0-3 of 512 outside against 52-164 with the preset).
    _, loose = parse_algorithm("online_softmax=true,reciprocal=true", "float32")
    assert _outside(loose, out, q, k, v, scale) < outside
    flash = get_attention("sdpa-flash-cpu")
    ok, _ = flash.available()
    if ok:
        good, _ = flash(q, k, v, scale=scale)
        assert _outside(preset, good, q, k, v, scale) == 0
