"""Prompt sets of the model tasks: synthetic token ids from a seed, or token ids from a JSONL file.

The planner puts either ``{"synthetic": {count, length, seed}}`` or ``{"tokens": [[...], ...]}`` into a
unit's parameters; a synthetic set is drawn here, in the worker, from the model's vocabulary, so the
same parameters give the same prompts in every process.
"""

from __future__ import annotations

import json
from typing import Any


def read_prompt_file(path: str) -> list[list[int]]:
    """Token-id prompts from JSONL: each line a JSON list of ints or an object with "tokens"."""
    prompts = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            tokens = obj.get("tokens") if isinstance(obj, dict) else obj
            if not (isinstance(tokens, list) and tokens and all(isinstance(t, int) and t >= 0 for t in tokens)):
                raise ValueError(f"{path}:{i}: expected a non-empty list of token ids (ints >= 0)")
            prompts.append(tokens)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def synthetic_prompts(count: int, length: int, seed: int, vocab_size: int) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids drawn uniformly from ``[0, vocab_size)``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (count, length), generator=g).tolist()


def prompts_from_payload(payload: dict[str, Any], vocab_size: int) -> list[list[int]]:
    if "tokens" in payload:
        prompts = [list(map(int, p)) for p in payload["tokens"]]
        bad = [i for i, p in enumerate(prompts) if any(t >= vocab_size for t in p)]
        if bad:
            raise ValueError(f"prompts {bad[:5]} hold token ids outside the model's vocabulary of {vocab_size}")
        return prompts
    p = payload["synthetic"]
    return synthetic_prompts(p["count"], p["length"], p["seed"], vocab_size)
