"""Operand capture: replaying each captured layer through the model's kernel reproduces its output
bit for bit (so replay measures kernels and nothing else); the safetensors file round trip."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors import safe_open

from tasks.models import (
    build_model,
    capture_manifest,
    is_pow2,
    load_capture,
    quantize_activations,
    read_capture_meta,
    save_capture,
)
from tasks.numerics import distance

PROMPTS = [[random.Random(100 + i).randrange(3, 1024) for _ in range(5 + 3 * i)] for i in range(4)]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in (torch.bfloat16, torch.float16):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    if a.dtype == torch.float32:
        return torch.equal(a.view(torch.int32), b.view(torch.int32))
    return torch.equal(a, b)


CASES = [
    ("int8-cutlass-order", "real", {}),
    ("int8-triton-order", "real", {}),
    ("int8-cutlass-order", "pow2", {}),
    ("int8-triton-order", "pow2", {}),
    ("int8-cutlass-order", "real", {"attention_bias": True}),
    ("int8-triton-order", "real", {"attention_bias": True}),
]


@pytest.mark.parametrize(("kernel", "scales", "overrides"), CASES)
def test_replay_through_the_models_kernel_is_bit_exact(kernel, scales, overrides):
    model = build_model(kernel=kernel, scales=scales, overrides=overrides)
    seen_in: dict[str, list[torch.Tensor]] = {}
    seen_out: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, lin in model.linears().items():
        def hook(mod, args, out, name=name):
            seen_in.setdefault(name, []).append(args[0].detach().clone())
            seen_out.setdefault(name, []).append(out.detach().clone())
        hooks.append(lin.register_forward_hook(hook))
    try:
        with model.capture() as cap:
            model.forward_tokens(PROMPTS)
    finally:
        for h in hooks:
            h.remove()
    layers = cap.layers
    assert len(layers) == 7 * model.config.num_hidden_layers
    for c in layers:
        assert c.kernel == kernel and c.call == 0
        # The kernel the model ran with, on the captured operands: the captured output, bit for bit.
        assert same_bits(c.replay(), c.output), c.name
        # The captured output is what the layer handed on (exact up-cast to the fp32 stream) ...
        assert same_bits(c.output.to(torch.float32), seen_out[c.name][0].reshape(c.m, c.n))
        # ... and the captured operands are the layer input quantized as vLLM does.
        x = seen_in[c.name][0].reshape(c.m, c.k)
        x_q, x_scale = quantize_activations(x, scales)
        assert torch.equal(x_q, c.x_q) and same_bits(x_scale, c.x_scale)
        assert c.output.dtype == torch.bfloat16 and c.x_q.dtype == torch.int8
        assert c.x_scale.shape == (c.m, 1) and c.w_scale.shape == (c.n,)
        assert (c.bias is not None) == (bool(overrides) and c.layer_type in "qkvo")
        if scales == "pow2":
            assert bool(is_pow2(c.w_scale).all()) and bool(is_pow2(c.x_scale).all())


def test_pow2_capture_is_bit_identical_across_kernels_and_real_within_one_spacing():
    for scales in ("pow2", "real"):
        model = build_model(scales=scales)
        with model.capture() as cap:
            model.generate(PROMPTS, max_new_tokens=4)
        worst = 0
        for c in cap.layers:
            other = c.replay("int8-triton-order")
            if scales == "pow2":
                assert same_bits(other, c.output), c.key
            worst = max(worst, int(distance(other, c.output, "bf16").max()))
        assert worst <= 1


def test_save_and_load_round_trip(tmp_path):
    model = build_model(scales="real", overrides={"attention_bias": True})
    with model.capture() as cap:
        model.generate(PROMPTS, max_new_tokens=3)  # prefill + 2 decode steps: 3 calls per layer
    n_layers = 7 * model.config.num_hidden_layers
    assert len(cap.layers) == 3 * n_layers
    path = save_capture(cap, tmp_path / "unit.safetensors", meta={"unit": "abc"})
    loaded = load_capture(path)
    assert len(loaded) == len(cap.layers)
    for a, b in zip(cap.layers, loaded, strict=True):
        assert (a.name, a.index, a.layer_type, a.call, a.kernel, a.kernel_params) == (
            b.name, b.index, b.layer_type, b.call, b.kernel, b.kernel_params)
        for field in ("x_q", "x_scale", "w_q", "w_scale", "output"):
            assert same_bits(getattr(a, field), getattr(b, field)), (a.key, field)
        assert (a.bias is None) == (b.bias is None)
        if a.bias is not None:
            assert same_bits(a.bias, b.bias)
        assert same_bits(b.replay(), b.output)
    # Tensor names and metadata.
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        header = json.loads(f.metadata()["swapcheck.capture"])
    assert {"layers.3.self_attn.q_proj/x_q", "layers.3.self_attn.q_proj/x_scale",
            "layers.3.self_attn.q_proj/output", "layers.3.self_attn.q_proj/w_q",
            "layers.3.self_attn.q_proj/w_scale", "layers.3.self_attn.q_proj/bias",
            "layers.3.self_attn.q_proj@2/x_q"} <= keys
    assert "layers.3.mlp.up_proj/bias" not in keys
    assert sum(k.endswith("/w_q") for k in keys) == n_layers  # weights stored once per layer
    assert header == read_capture_meta(path)
    assert header["meta"]["unit"] == "abc" and header["meta"]["model"] == "tiny-qwen3"
    assert header["meta"]["weights_sha256"] == model.weights_sha256()
    assert [r["key"] for r in header["layers"]][:2] == ["layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj"]


def test_manifest_rows():
    model = build_model(overrides={"num_hidden_layers": 2})
    with model.capture() as cap:
        model.forward_tokens(PROMPTS)
    rows = capture_manifest(cap)
    assert len(rows) == 14
    m = len(PROMPTS) * max(len(p) for p in PROMPTS)
    q, down = rows[0], rows[6]
    assert q == {
        "layer": "layers.0.self_attn.q_proj", "layer_index": 0, "layer_type": "q", "call": 0,
        "m": m, "n": 128, "k": 128, "x_dtype": "int8", "w_dtype": "int8",
        "x_scale_layout": "per-token", "x_scale_shape": [m, 1],
        "w_scale_layout": "per-channel", "w_scale_shape": [128],
        "out_dtype": "bfloat16", "has_bias": False, "kernel": "int8-cutlass-order",
    }
    assert (down["layer_type"], down["n"], down["k"]) == ("down", 128, 384)
    assert [r["layer_type"] for r in rows[:7]] == ["q", "k", "v", "o", "gate", "up", "down"]
    assert capture_manifest(cap.layers) == rows


def test_capture_is_scoped_and_errors(tmp_path):
    model = build_model(overrides={"num_hidden_layers": 1})
    with model.capture() as cap:
        model.forward_tokens(PROMPTS[:1])
        with pytest.raises(RuntimeError, match="nested"):
            with model.capture():
                pass
    model.forward_tokens(PROMPTS[:1])  # outside the block: nothing recorded
    assert len(cap.layers) == 7
    with model.capture() as empty:
        pass
    with pytest.raises(ValueError, match="empty"):
        save_capture(empty, tmp_path / "x.safetensors")
    other = tmp_path / "other.safetensors"
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(1)}, str(other))
    with pytest.raises(ValueError, match="not a swapcheck capture"):
        load_capture(other)
