"""``batch_invariance`` at the model level (table ``batch_invariance_model``): the CPU W8A8 engine's
padded prefill and KV-cache decode against each prompt scored alone (the package docstring, "Model
level").
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tasks.kinds.base import Rows, canonical_json
from tasks.kinds.batch_invariance.spec import BatchInvarianceExperiment
from tasks.kinds.fields import (
    Resources,
    axis_values,
    impl_payload,
    kernel_problem,
    model_and_prompt_problems,
    model_fingerprint,
    prompt_payload,
)

if TYPE_CHECKING:
    import numpy as np
    import torch


def problems(base: str, exp: BatchInvarianceExperiment) -> list[str]:
    """The model level's kernel, attention kernel, model and prompts."""
    out: list[str] = []
    p = kernel_problem(f"{base}.kernel", exp.model_impl(), "int8")
    out += [p] if p else []
    if exp.attention is not None:
        from tasks.attention.fields import attention_problem

        p = attention_problem(f"{base}.attention", exp.attention)
        out += [p] if p else []
    out += model_and_prompt_problems(base, exp.model, exp.prompts)
    return out


def expand(exp: BatchInvarianceExperiment) -> list[tuple[dict[str, Any], Resources]]:
    """One unit per reductions and batch size: its parameters and resources."""
    common = {"level": "model", "model": exp.model, "model_fingerprint": model_fingerprint(exp.model),
              "model_seed": exp.model_seed, "kernel": impl_payload(exp.model_impl()), "scales": exp.scales,
              "comparisons": list(exp.comparisons), "prompts": prompt_payload(exp.prompts),
              "new_tokens": exp.new_tokens}
    if exp.attention is not None:  # only when set: experiments without it keep their unit ids
        from tasks.attention.fields import attention_payload

        common["attention"] = attention_payload(exp.attention)
    return [({**common, "reductions": r, "batch": b}, exp.resources)
            for r, b in itertools.product(exp.reductions, axis_values(exp.batch_sizes))]


def describe(p: dict[str, Any]) -> str:
    att = f", attention {p['attention']['name']}" if p.get("attention") else ""
    return (f"batch invariance of {p['model']} ({p['kernel']['name']}{att}, {p['scales']} scales, "
            f"{p['reductions']} reductions) in batches of {p['batch']}: {', '.join(p['comparisons'])}")


def _random_sequences(count: int, lengths: tuple[int, int], vocab: int, *seed: object) -> list[list[int]]:
    """``count`` random token sequences, lengths uniform in ``lengths`` (inclusive), seeded by ``seed``."""
    import torch

    from tasks.seeds import stable_seed

    g = torch.Generator().manual_seed(stable_seed("batch_invariance", *seed))
    sizes = torch.randint(lengths[0], lengths[1] + 1, (count,), generator=g).tolist()
    return [torch.randint(0, vocab, (s,), generator=g).tolist() for s in sizes]


def alone_logits(model: Any, sequence: list[int]) -> torch.Tensor:
    """fp32 logits ``[T, V]`` of one sequence scored alone, the call ``W8A8Model.score`` makes."""
    import torch

    with _session(model):
        out: torch.Tensor = model.hf(input_ids=torch.tensor([sequence], dtype=torch.long),
                                     use_cache=False).logits[0].to(torch.float32).clone()
    return out


@contextmanager
def _session(model: Any) -> Iterator[None]:
    """Inference mode with the model's thread count, as the engine runs every entry point."""
    import torch

    prev = torch.get_num_threads()
    change = model.threads is not None and prev != model.threads
    if change:
        torch.set_num_threads(int(model.threads))
    try:
        with torch.inference_mode():
            yield
    finally:
        if change:
            torch.set_num_threads(prev)


def decode_logits(model: Any, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy decoding of one left-padded batch with the KV cache, as ``W8A8Model.generate`` runs
    it (prefill, then one token per sequence per step), keeping every step's full logits.

    Returns (generated tokens per prompt, fp32 logits ``[steps, V]`` per prompt).
    """
    import torch

    from tasks.models.invariance import kv_cache

    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    steps_logits: list[torch.Tensor] = []
    with _session(model):
        cache = kv_cache(model.config, capacity=width + steps)
        out = model.hf(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                       past_key_values=cache, logits_to_keep=1)
        for step in range(steps):
            logits = out.logits[:, -1, :].to(torch.float32).clone()
            steps_logits.append(logits)
            if step == steps - 1:
                break
            nxt = _argmax(logits)
            mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            out = model.hf(input_ids=nxt.unsqueeze(1), attention_mask=mask, position_ids=positions,
                           past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
    stacked = torch.stack(steps_logits, dim=1)  # [B, steps, V]
    tokens = [_argmax(stacked[i]).tolist() for i in range(len(prompts))]
    return tokens, [stacked[i] for i in range(len(prompts))]


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Greedy tokens of ``[P, V]`` logits with ties to the lower id (the engine's ``predict``)."""
    import torch

    from tasks.models.predictions import predict_arrays

    return torch.from_numpy(predict_arrays(logits, 2)[0])


def position_stats(ref: torch.Tensor, other: torch.Tensor) -> dict[str, np.ndarray]:
    """Per position of two ``[P, V]`` fp32 logit arrays: argmax, margins and distances in fp32 spacings."""
    import numpy as np

    from tasks.comparison import SIGNIFICANT
    from tasks.models.predictions import predict_arrays
    from tasks.numerics import distance

    d = np.asarray(distance(other.contiguous(), ref.contiguous(), "fp32")).reshape(ref.shape)
    # Spacing counts of logits near zero run through every tiny binade: also report the largest
    # distance over the logits of at least SIGNIFICANT x the position's largest |logit|, as compare() does.
    mag = np.abs(ref.double().numpy())
    big = mag >= SIGNIFICANT * np.where(np.isfinite(mag), mag, 0.0).max(axis=1, keepdims=True, initial=0.0)
    ref_am, _, _, ref_margin = predict_arrays(ref, 2)
    am, _, _, margin = predict_arrays(other, 2)
    rows = np.arange(ref.shape[0])
    return {"ref_argmax": ref_am, "argmax": am, "ref_margin": ref_margin, "margin": margin,
            "differing": (d != 0).sum(axis=1), "nonfinite_mismatch": (d < 0).sum(axis=1),
            "max_spacing": d.max(axis=1, initial=0), "max_spacing_significant": np.where(big, d, 0).max(axis=1, initial=0),
            "argmax_spacing": d[rows, ref_am]}


def _position_rows(base: dict[str, Any], stats: dict[str, np.ndarray], vocab: int) -> Rows:
    rows = []
    for p in range(len(stats["argmax"])):
        differing = int(stats["differing"][p])
        rows.append({**base, "position": p, "ref_argmax": int(stats["ref_argmax"][p]), "argmax": int(stats["argmax"][p]),
                     "argmax_equal": bool(stats["ref_argmax"][p] == stats["argmax"][p]),
                     "logits_equal": differing == 0, "vocab": vocab, "differing": differing,
                     "nonfinite_mismatch": int(stats["nonfinite_mismatch"][p]),
                     "max_spacing": int(stats["max_spacing"][p]),
                     "max_spacing_significant": int(stats["max_spacing_significant"][p]),
                     "argmax_spacing": int(stats["argmax_spacing"][p]),
                     "ref_margin": float(stats["ref_margin"][p]), "margin": float(stats["margin"][p])})
    return rows


def run_model(params: dict[str, Any]) -> dict[str, Rows]:
    """One model configuration and batch size: padded prefill and decode against each prompt alone."""
    from tasks.models import build_model
    from tasks.prompts import prompts_from_payload

    ki = params["kernel"]
    attention = (params.get("attention") or {}).get("name")
    model = build_model(params["model"], kernel={"kernel": ki["kernel"], "params": ki["params"]},
                        scales=params["scales"], seed=params["model_seed"], reductions=params["reductions"],
                        attention=attention)
    vocab = int(model.config.vocab_size)
    prompts = prompts_from_payload(params["prompts"], vocab)
    b = params["batch"]
    common = {"model": params["model"], "kernel": ki["name"], "attention": attention, "scales": params["scales"],
              "reductions": params["reductions"], "batch": b}
    seed_of = canonical_json(params["prompts"])  # the neighbours' seed: the prompts and the batch
    rows: Rows = []
    if "padded_prefill" in params["comparisons"]:
        for i, prompt in enumerate(prompts):
            slot = i % b
            others = _random_sequences(b - 1, (1, 2 * len(prompt)), vocab, "padded", i, b, seed_of)
            batch = [*others[:slot], prompt, *others[slot:]]
            width = max(len(s) for s in batch)
            logits = model.forward_tokens(batch)[slot, width - len(prompt):]
            stats = position_stats(alone_logits(model, prompt), logits)
            rows += _position_rows({**common, "comparison": "padded_prefill", "prompt_index": i, "slot": slot,
                                    "padding": width - len(prompt), "width": width}, stats, vocab)
    if "decode" in params["comparisons"]:
        steps = params["new_tokens"]
        for start in range(0, len(prompts), b):
            group = prompts[start: start + b]
            fill = _random_sequences(b - len(group), (len(group[-1]), len(group[-1])), vocab, "fill", start, b, seed_of)
            tokens, decoded = decode_logits(model, [*group, *fill], steps)
            width = max(len(s) for s in [*group, *fill])
            for j, prompt in enumerate(group):
                # Prefill alone of prompt + generated: position len(prompt) - 1 + t predicts token t.
                scored = alone_logits(model, prompt + tokens[j][:-1])[len(prompt) - 1:]
                stats = position_stats(scored, decoded[j])
                rows += _position_rows({**common, "comparison": "decode", "prompt_index": start + j, "slot": j,
                                        "padding": width - len(prompt), "width": width}, stats, vocab)
    if attention is not None:
        from tasks.models.hf_attention import require_attention_calls

        require_attention_calls(attention, f"batch_invariance {params['reductions']} B={b}")
    return {"batch_invariance_model": rows}
