"""Loading checkpoints: a float checkpoint quantized on load, a compressed-tensors W8A8 INT8
checkpoint loaded as is (hand-built with safetensors, and written by save_compressed)."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch
from safetensors.torch import save_file

from tasks.models import (
    build_model,
    is_pow2,
    read_checkpoint,
    save_compressed,
    tiny_qwen3_config,
    tiny_qwen3_float,
)
from tasks.models.checkpoint import COMPRESSED_TENSORS_W8A8

PROMPTS = [[random.Random(200 + i).randrange(3, 1024) for _ in range(6)] for i in range(4)]


def test_float_checkpoint_is_quantized_on_load(tmp_path):
    tiny_qwen3_float(seed=3).save_pretrained(tmp_path)
    loaded = build_model(str(tmp_path), seed=3)
    seeded = build_model("tiny-qwen3", seed=3)
    assert loaded.source == "float-checkpoint"
    assert loaded.weights_sha256() == seeded.weights_sha256()
    assert loaded.generate(PROMPTS, 8).tokens == seeded.generate(PROMPTS, 8).tokens


@pytest.mark.parametrize("scales", ["real", "pow2"])
def test_save_compressed_round_trip(tmp_path, scales):
    model = build_model(scales=scales, overrides={"attention_bias": True, "num_hidden_layers": 2})
    path = save_compressed(model, tmp_path / "ckpt")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    back = build_model(str(path), scales=scales)
    assert back.source == "compressed-tensors"
    for (name, a), (name_b, b) in zip(model.linears().items(), back.linears().items(), strict=True):
        assert name == name_b
        assert torch.equal(a.weight, b.weight) and torch.equal(a.weight_scale, b.weight_scale)
        assert (a.bias is None) == (b.bias is None)
        if a.bias is not None:
            assert torch.equal(a.bias, b.bias)
    assert back.weights_sha256() == model.weights_sha256()
    assert back.generate(PROMPTS, 8).topk_logits == model.generate(PROMPTS, 8).topk_logits


def _hand_built(tmp_path, **qc_changes):
    """A 1-layer compressed-tensors W8A8 checkpoint written tensor by tensor with safetensors."""
    cfg = tiny_qwen3_config(num_hidden_layers=1, vocab_size=256, attention_bias=True)
    g = torch.Generator().manual_seed(11)
    h, inter, heads, kv, hd, vocab = 128, 384, 4, 2, 32, 256
    shapes = {
        "self_attn.q_proj": (heads * hd, h), "self_attn.k_proj": (kv * hd, h),
        "self_attn.v_proj": (kv * hd, h), "self_attn.o_proj": (h, heads * hd),
        "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter),
    }
    t: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(vocab, h, generator=g),
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": torch.randn(vocab, h, generator=g) * 0.1,
        "model.layers.0.input_layernorm.weight": torch.ones(h),
        "model.layers.0.post_attention_layernorm.weight": torch.ones(h),
        "model.layers.0.self_attn.q_norm.weight": torch.ones(hd),
        "model.layers.0.self_attn.k_norm.weight": torch.ones(hd),
    }
    for proj, (n, k) in shapes.items():
        pre = f"model.layers.0.{proj}"
        t[f"{pre}.weight"] = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        if proj == "mlp.down_proj":  # a per-tensor scale
            t[f"{pre}.weight_scale"] = torch.tensor([3e-4], dtype=torch.float32)
        else:
            t[f"{pre}.weight_scale"] = (torch.rand(n, 1, generator=g) * 1e-3 + 1e-4).to(torch.float32)
        t[f"{pre}.weight_zero_point"] = torch.zeros(n, 1, dtype=torch.int8)
        if proj.startswith("self_attn"):
            t[f"{pre}.bias"] = (torch.randn(n, generator=g) * 0.01).to(torch.bfloat16)
    save_file(t, str(tmp_path / "model.safetensors"))
    d = cfg.to_dict()
    qc = copy.deepcopy(COMPRESSED_TENSORS_W8A8)
    for path, value in qc_changes.items():
        node = qc
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    d["quantization_config"] = qc
    (tmp_path / "config.json").write_text(json.dumps(d, default=str))
    return t


def test_hand_built_compressed_tensors_checkpoint(tmp_path):
    t = _hand_built(tmp_path)
    ck = read_checkpoint(tmp_path)
    assert ck.quantized and ck.config.model_type == "qwen3"
    model = build_model(str(tmp_path))
    lins = model.linears()
    assert len(lins) == 7
    q = lins["layers.0.self_attn.q_proj"]
    assert torch.equal(q.weight, t["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(q.weight_scale, t["model.layers.0.self_attn.q_proj.weight_scale"].reshape(-1))
    assert torch.equal(q.bias, t["model.layers.0.self_attn.q_proj.bias"])
    down = lins["layers.0.mlp.down_proj"]
    assert down.weight_scale.shape == (128,) and bool((down.weight_scale == 3e-4).all())
    assert torch.equal(model.hf.lm_head.weight, t["lm_head.weight"])
    g = model.generate([[5, 6, 7]], 4)
    assert len(g.tokens[0]) == 4
    with model.capture() as cap:
        model.forward_tokens([[5, 6, 7]])
    assert all(torch.equal(c.replay(), c.output) for c in cap.layers)
    # pow2: the int8 weights are moved onto power-of-two scales.
    p2 = build_model(str(tmp_path), scales="pow2")
    assert all(bool(is_pow2(lin.weight_scale).all()) for lin in p2.linears().values())
    assert any("power-of-two" in n for n in p2.notes)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"quant_method": "gptq"}, "quant_method 'gptq' is not supported"),
        ({"config_groups.group_0.input_activations.dynamic": False}, "dynamic per-token"),
        ({"config_groups.group_0.weights.num_bits": 4}, "8-bit symmetric int"),
        ({"config_groups.group_0.input_activations": None}, "only W8A8"),
    ],
)
def test_unsupported_quantization_configs_are_refused(tmp_path, change, message):
    _hand_built(tmp_path, **change)
    with pytest.raises(ValueError, match=message):
        build_model(str(tmp_path))


def test_checkpoint_errors(tmp_path):
    t = _hand_built(tmp_path)
    del t["model.layers.0.mlp.up_proj.weight_scale"]
    save_file(t, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="weight_scale is missing"):
        build_model(str(tmp_path))
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match="no config.json"):
        build_model(str(tmp_path))
    with pytest.raises(ValueError, match="overrides apply to 'tiny-qwen3' only"):
        build_model(str(tmp_path), overrides={"num_hidden_layers": 1})
