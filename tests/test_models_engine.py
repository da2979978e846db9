"""The CPU W8A8 engine: determinism, kernel accounting, pow2 interchangeability, scoring."""

from __future__ import annotations

import random

import pytest
import torch

from tasks.models import LAYER_TYPES, build_model, is_pow2

PROMPTS = [[random.Random(i).randrange(3, 1024) for _ in range(4 + i % 7)] for i in range(8)]


@pytest.fixture(scope="module")
def model():
    return build_model("tiny-qwen3", kernel="int8-cutlass-order", scales="real", seed=0)


def test_tiny_config_and_layers(model):
    cfg = model.config
    assert cfg.model_type == "qwen3" and not cfg.tie_word_embeddings
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 128, 4, 2, 32)
    lins = model.linears()
    assert len(lins) == 7 * cfg.num_hidden_layers
    assert [lin.layer_type for lin in lins.values()][:7] == list(LAYER_TYPES)
    assert list(lins)[0] == "layers.0.self_attn.q_proj" and list(lins)[-1] == "layers.3.mlp.down_proj"
    for lin in lins.values():
        assert lin.weight.dtype == torch.int8 and lin.weight_scale.dtype == torch.float32
        assert int(lin.weight.abs().max()) <= 127
    # Non-linear parts stay fp32.
    assert model.hf.lm_head.weight.dtype == torch.float32
    assert model.hf.model.embed_tokens.weight.dtype == torch.float32


def test_generation_is_deterministic_and_not_degenerate(model):
    a = model.generate(PROMPTS, max_new_tokens=32)
    b = model.generate(PROMPTS, max_new_tokens=32)
    assert a.tokens == b.tokens and a.topk_logits == b.topk_logits and a.margins == b.margins
    assert len(a.tokens) == 8 and all(len(t) == 32 for t in a.tokens)
    for toks in a.tokens:
        assert len(set(toks)) >= 12, toks  # not one token (or a short loop) repeated
    assert len({tuple(t) for t in a.tokens}) == 8
    assert a.sequence_hashes() == b.sequence_hashes()
    # Same weights from the same seed in a fresh model; other seeds give other weights.
    assert build_model(seed=0).weights_sha256() == model.weights_sha256()
    assert build_model(seed=1).weights_sha256() != model.weights_sha256()


def test_generation_result_fields(model):
    g = model.generate(PROMPTS[:2], max_new_tokens=4, top_k=3)
    for b in range(2):
        for t in range(4):
            ids, logits = g.topk_ids[b][t], g.topk_logits[b][t]
            assert len(ids) == 3 and ids[0] == g.tokens[b][t]
            assert logits == sorted(logits, reverse=True)
            assert g.margins[b][t] == pytest.approx(logits[0] - logits[1], abs=1e-6) and g.margins[b][t] >= 0
    rows = g.rows()
    assert len(rows) == 8 and rows[0]["token"] == g.tokens[0][0]
    assert g.sequences()[0] == PROMPTS[0] + g.tokens[0]


def test_threads_restored(model):
    before = torch.get_num_threads()
    model.forward_tokens(PROMPTS[:1])
    assert torch.get_num_threads() == before


def test_kernel_calls_count_every_layer():
    for kernel in ("int8-cutlass-order", "int8-triton-order"):
        m = build_model(kernel=kernel)
        assert all(c == {} for c in m.kernel_calls().values())
        m.forward_tokens(PROMPTS)
        calls = m.kernel_calls()
        assert len(calls) == 28
        assert all(c == {kernel: 1} for c in calls.values()), calls
        m.generate(PROMPTS, max_new_tokens=5)  # prefill + 4 decode steps
        assert all(c == {kernel: 6} for c in m.kernel_calls().values())
        m.reset_kernel_calls()
        assert all(c == {} for c in m.kernel_calls().values())


def test_set_kernel_per_layer(model):
    m = build_model()
    m.set_kernel("int8-triton-order", ["layers.2.mlp.down_proj"])
    m.forward_tokens(PROMPTS[:2])
    calls = m.kernel_calls()
    assert calls["layers.2.mlp.down_proj"] == {"int8-triton-order": 1}
    assert calls["layers.0.self_attn.q_proj"] == {"int8-cutlass-order": 1}
    with pytest.raises(ValueError, match="unknown layer"):
        m.set_kernel("int8-triton-order", ["layers.9.mlp.down_proj"])


def test_pow2_generations_bit_identical_across_kernels():
    a = build_model(kernel="int8-cutlass-order", scales="pow2").generate(PROMPTS, max_new_tokens=32)
    b = build_model(kernel="int8-triton-order", scales="pow2").generate(PROMPTS, max_new_tokens=32)
    assert a.tokens == b.tokens
    assert a.topk_logits == b.topk_logits  # every logit, bit for bit (Python floats of fp32)


def test_pow2_weight_scales_are_powers_of_two():
    m = build_model(scales="pow2")
    for lin in m.linears().values():
        assert bool(is_pow2(lin.weight_scale).all()), lin.name
        assert lin.scales == "pow2"


def test_score_teacher_forced_matches_decoding_bit_for_bit(model):
    g = model.generate(PROMPTS, max_new_tokens=16)
    seqs = g.sequences()
    s = model.score(seqs, top_k=5)
    for b, seq in enumerate(seqs):
        # One array per sequence and field (int64 ids, float64 values); .tolist() gives Python values.
        assert s.argmax[b].shape == (len(seq),) and s.topk_ids[b].shape == s.topk_logits[b].shape == (len(seq), 5)
        assert s.targets[b].tolist() == seq[1:] + [-1]
        assert (s.topk_ids[b][:, 0] == s.argmax[b]).all()
        n = len(PROMPTS[b])
        # One unpadded pass over the whole sequence computes, position by position, what KV-cache
        # decoding of the padded batch computed: same tokens, same logits, bit for bit (fp64
        # attention and lm_head; tasks/models/invariance.py).
        assert s.argmax[b][n - 1 : n - 1 + 16].tolist() == g.tokens[b]
        assert s.topk_logits[b][n - 1 : n - 1 + 16].tolist() == g.topk_logits[b]
        assert s.margins[b][n - 1 : n - 1 + 16].tolist() == g.margins[b]
        assert s.target_logits[b][n - 1] == g.topk_logits[b][0][0]
    assert s.rows()[0]["target"] == seqs[0][1]
    again = model.score(seqs, top_k=5).margins
    assert all(x.tobytes() == y.tobytes() for x, y in zip(again, s.margins, strict=True))


def test_left_padding_masks_the_pad(model):
    # Prompt 0 is left-padded by 8 + len(PROMPTS[1]) - len(PROMPTS[0]) positions.  If the pad is
    # masked out of attention, what the pad token is cannot change prompt 0's logits at all.
    batch = [PROMPTS[0], PROMPTS[1] + [5] * 8]
    first = model.forward_tokens(batch)
    pad = model.config.pad_token_id
    try:
        model.config.pad_token_id = 77
        second = model.forward_tokens(batch)
    finally:
        model.config.pad_token_id = pad
    assert first.shape[1] == len(PROMPTS[1]) + 8
    n = len(PROMPTS[0])
    assert torch.equal(first[0, -n:], second[0, -n:])
    assert not torch.equal(first[0, :-n], second[0, :-n])  # the pad positions themselves did change
    assert torch.equal(first[1], second[1])
    # And a prompt alone computes what it computes in the padded batch, bit for bit.
    alone = model.forward_tokens([PROMPTS[0]])
    assert torch.equal(alone[0], first[0, -n:])
    gen_alone = model.generate([PROMPTS[0]], 12)
    gen_batch = model.generate(batch, 12)
    assert gen_alone.tokens[0] == gen_batch.tokens[0] and gen_alone.topk_logits[0] == gen_batch.topk_logits[0]


def test_fp32_reductions_option():
    m = build_model(reductions="fp32", overrides={"num_hidden_layers": 2})
    assert m.hf.config._attn_implementation == "eager" and m.identity()["reductions"] == "fp32"
    assert type(m.hf.lm_head) is torch.nn.Linear
    assert len(m.generate(PROMPTS[:2], 4).tokens[0]) == 4
    with pytest.raises(ValueError, match="reductions must be one of"):
        build_model(reductions="fp16")


def test_bad_input_is_refused():
    m = build_model()
    with pytest.raises(ValueError, match="outside"):
        m.generate([[1, 2, 5000]], 2)
    with pytest.raises(ValueError, match="empty"):
        m.generate([[]], 2)
    with pytest.raises(ValueError, match="scales must be one of"):
        build_model(scales="half")
    with pytest.raises(ValueError, match="int8 kernel"):
        build_model(kernel="fp8-sequential")
    with pytest.raises(ValueError, match="neither 'tiny-qwen3' nor a checkpoint"):
        build_model("no-such-model")
    with pytest.raises(ValueError, match="unknown Qwen3Config"):
        build_model(overrides={"hidden_sise": 3})


def test_kernel_dict_and_bias_override():
    m = build_model(kernel={"kernel": "int8-triton-order", "params": {"bias_mode": "output"}},
                    overrides={"attention_bias": True, "num_hidden_layers": 2})
    lins = m.linears()
    assert len(lins) == 14
    assert lins["layers.0.self_attn.q_proj"].bias is not None and lins["layers.0.mlp.up_proj"].bias is None
    assert lins["layers.0.self_attn.q_proj"].bias.dtype == torch.bfloat16
    assert m.kernel.params == {"bias_mode": "output"}
    m.generate(PROMPTS[:2], 3)
