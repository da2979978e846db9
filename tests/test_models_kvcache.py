"""The float64 KV cache of generation and the top-k selection: faster, and the same bits as before.

``Fp64KVCache`` (tasks/models/invariance.py) keeps keys and values repeated to every query head and
in float64, appended step by step; the path it replaces converted transformers' fp32 cache at every
step.  ``predictions._top_sorted`` replaces a full stable sort of every logit row.  Both must leave
every generated token, logit and margin bit-identical.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
import torch

import tasks.models.engine as engine
from tasks.attention.registry import repeat_kv
from tasks.models import build_model
from tasks.models.invariance import FP64_ATTENTION, fp64_attention, kv_cache
from tasks.models.predictions import _top_sorted, predict

# Unequal lengths: the batch is left-padded, so the cache holds masked pad positions too.
PROMPTS = [[random.Random(100 + i).randrange(3, 1024) for _ in range(3 + (5 * i) % 11)] for i in range(7)]


def bits(x: Any) -> Any:
    """Floats as their IEEE bytes (so -0.0 != 0.0 and NaN == NaN compare as bits)."""
    if isinstance(x, float):
        return struct.pack("<d", x)
    if isinstance(x, list | tuple):
        return [bits(v) for v in x]
    return x


def uncached(model: Any, prompts: list[list[int]], n: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The generation as it ran before the float64 cache: transformers' fp32 DynamicCache, each
    step's keys and values repeated and converted to float64 inside fp64_attention."""
    with monkeypatch.context() as m:
        m.setattr(engine, "kv_cache", lambda config, capacity=0: None)
        return model.generate(prompts, n)


def same_generation(a: Any, b: Any) -> bool:
    return (a.tokens == b.tokens and a.topk_ids == b.topk_ids and bits(a.topk_logits) == bits(b.topk_logits)
            and bits(a.margins) == bits(b.margins))


@pytest.fixture(scope="module")
def model() -> Any:
    return build_model("tiny-qwen3", kernel="int8-cutlass-order", scales="real", seed=0)


def test_cached_generation_equals_uncached_bit_for_bit(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # batch > 1, left padding, 20 decode steps
    assert same_generation(model.generate(PROMPTS, 20), uncached(model, PROMPTS, 20, monkeypatch))


def test_a_new_sequence_after_a_finished_one_reuses_nothing(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Consecutive generations with other prompts, batch sizes and lengths: each equals its own
    # uncached run, so no keys or values of an earlier generation (or another layer) leak in.
    first = model.generate(PROMPTS, 12)
    for prompts, n in ((PROMPTS[2:5], 9), ([PROMPTS[6]], 15), (PROMPTS[::-1], 6), (PROMPTS, 12)):
        assert same_generation(model.generate(prompts, n), uncached(model, prompts, n, monkeypatch))
    assert same_generation(model.generate(PROMPTS, 12), first)


def test_pow2_and_other_head_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    # n_rep = 1 (as many KV heads as query heads) and n_rep = 4, pow2 scales, another kernel
    for overrides in ({"num_key_value_heads": 4}, {"num_key_value_heads": 1}):
        m = build_model(kernel="int8-triton-order", scales="pow2", overrides={**overrides, "num_hidden_layers": 2})
        assert same_generation(m.generate(PROMPTS[:4], 10), uncached(m, PROMPTS[:4], 10, monkeypatch))


def _reference_keys(steps: list[torch.Tensor], n_rep: int) -> torch.Tensor:
    return repeat_kv(torch.cat(steps, dim=-2), n_rep).to(torch.float64)


@pytest.mark.parametrize("capacity", [0, 5, 40])
def test_cache_layer_holds_exactly_the_converted_prefix(capacity: int) -> None:
    # capacity 0 and 5: the buffers grow (doubling) while decoding; 40: allocated once
    g = torch.Generator().manual_seed(3)
    cache = kv_cache(build_model(overrides={"num_hidden_layers": 2}).config, capacity=capacity)
    assert cache is not None
    module = type("M", (), {"num_key_value_groups": 2})()
    ks: list[list[torch.Tensor]] = [[], []]
    vs: list[list[torch.Tensor]] = [[], []]
    with torch.inference_mode():
        for step, q_len in enumerate([7, 1, 1, 1, 3, 1] + [1] * 20):
            for layer in range(2):
                k = torch.randn(3, 2, q_len, 32, generator=g)
                v = torch.randn(3, 2, q_len, 32, generator=g)
                ks[layer].append(k)
                vs[layer].append(v)
                ck, cv = cache.update(k, v, layer)
                rk, rv = _reference_keys(ks[layer], 2), _reference_keys(vs[layer], 2)
                assert ck.dtype == torch.float64 and ck.shape == rk.shape and torch.equal(ck, rk) and torch.equal(cv, rv)
                # fp64 attention over the cached tensors == over the fp32 cache, bit for bit
                q = torch.randn(3, 4, q_len, 32, generator=g)
                total = ck.shape[-2]
                mask = torch.zeros(3, 1, q_len, total)
                mask[0, :, :, :2] = torch.finfo(torch.float32).min  # a left-padded row
                fp32_k, fp32_v = torch.cat(ks[layer], dim=-2), torch.cat(vs[layer], dim=-2)
                got, _ = fp64_attention(module, q, ck, cv, mask, 32**-0.5)
                want, _ = fp64_attention(module, q, fp32_k, fp32_v, mask, 32**-0.5)
                assert got.dtype == torch.float32 and torch.equal(got.view(torch.int32), want.view(torch.int32)), step
            assert cache.get_seq_length() == sum(k.shape[-2] for k in ks[0])


def test_replaced_cache_tensors_are_not_overwritten() -> None:
    # transformers may replace a layer's keys (batch selection, reorder): the next update starts
    # from them, not from the stale buffer.
    cache = kv_cache(build_model(overrides={"num_hidden_layers": 1}).config, capacity=32)
    g = torch.Generator().manual_seed(5)
    with torch.inference_mode():
        k0, v0 = torch.randn(4, 2, 5, 32, generator=g), torch.randn(4, 2, 5, 32, generator=g)
        cache.update(k0, v0, 0)
        keep = torch.tensor([3, 1])
        cache.layers[0].batch_select_indices(keep)
        k1, v1 = torch.randn(2, 2, 1, 32, generator=g), torch.randn(2, 2, 1, 32, generator=g)
        ck, cv = cache.update(k1, v1, 0)
        assert torch.equal(ck, _reference_keys([k0[keep], k1], 2)) and torch.equal(cv, _reference_keys([v0[keep], v1], 2))
        cache.layers[0].crop(-2)  # a cropped view of the buffer: the next positions go after it
        k2, v2 = torch.randn(2, 2, 1, 32, generator=g), torch.randn(2, 2, 1, 32, generator=g)
        ck, cv = cache.update(k2, v2, 0)
        assert torch.equal(ck, _reference_keys([k0[keep][:, :, :4], k2], 2))
        assert torch.equal(cv, _reference_keys([v0[keep][:, :, :4], v2], 2))


def test_cache_only_for_fp64_full_attention() -> None:
    m = build_model(overrides={"num_hidden_layers": 2})
    assert m.config._attn_implementation == FP64_ATTENTION and kv_cache(m.config) is not None
    assert kv_cache(build_model(reductions="fp32", overrides={"num_hidden_layers": 2}).config) is None
    sliding = build_model(overrides={"num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"],
                                     "sliding_window": 4, "use_sliding_window": True})
    assert kv_cache(sliding.config) is None


def _stable_prefix(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    v, i = torch.sort(x, dim=-1, descending=True, stable=True)
    return v[:, :k], i[:, :k]


def test_top_sorted_equals_the_full_stable_sort() -> None:
    g = torch.Generator().manual_seed(11)
    for trial in range(400):
        rows, vocab = int(torch.randint(1, 40, (1,), generator=g)), int(torch.randint(2, 200, (1,), generator=g))
        k = int(torch.randint(2, min(vocab, 10) + 1, (1,), generator=g))
        kind = trial % 5
        if kind == 0:
            x = torch.randn(rows, vocab, generator=g)
        elif kind == 1:  # many exact ties, at and around the threshold
            x = torch.randint(-2, 3, (rows, vocab), generator=g).float()
        elif kind == 2:  # bf16-coarse values
            x = torch.randn(rows, vocab, generator=g).to(torch.bfloat16).float()
        elif kind == 3:  # signed zeros: equal under comparison, kept in column order
            x = torch.randn(rows, vocab, generator=g)
            x[x.abs() < 1.0] = -0.0
            x[:, ::3] = 0.0
        else:  # non-finite values (the full sort decides where NaN goes)
            x = torch.randn(rows, vocab, generator=g)
            x[0, int(torch.randint(0, vocab, (1,), generator=g))] = (float("nan"), float("inf"), float("-inf"))[trial % 3]
        got_v, got_i = _top_sorted(x, k)
        want_v, want_i = _stable_prefix(x, k)
        assert torch.equal(got_i, want_i), trial
        assert torch.equal(got_v.contiguous().view(torch.int32), want_v.contiguous().view(torch.int32)), trial


def test_predict_unchanged_on_ties_and_small_vocabularies() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, -0.0, 0.0, -1.0, 5.0]])
    am, ids, logits, margins = predict(x, 2)
    assert am == [1, 4] and ids == [[1, 2], [4, 0]] and logits == [[3.0, 3.0], [5.0, 0.0]] and margins == [0.0, 5.0]
    assert predict(x, 5)[1] == [[1, 2, 4, 3, 0], [4, 0, 1, 2, 3]]
    assert predict(torch.tensor([[2.0, 1.0]]), 1) == ([0], [[0]], [[2.0]], [1.0])


def test_activation_check_still_refuses_every_non_finite_element() -> None:
    # The check now reads the row maxima (amax propagates NaN and inf) instead of every element.
    from tasks.models import quantize_activations

    for value in (float("nan"), float("inf"), float("-inf")):
        for row, col in ((0, 0), (3, 77), (6, 127)):
            x = torch.randn(7, 128, generator=torch.Generator().manual_seed(row))
            x[row, col] = value
            for scales in ("real", "pow2"):
                with pytest.raises(ValueError, match="inf or NaN"):
                    quantize_activations(x, scales)
