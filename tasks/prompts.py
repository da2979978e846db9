"""Prompt sets of the model tasks: synthetic token ids from a seed, or token ids from a JSONL file.

The planner puts either ``{"synthetic": {count, length, seed}}`` or ``{"tokens": [[...], ...]}`` into a
unit's parameters; a synthetic set is drawn here, in the worker, from the model's vocabulary, so the
same parameters give the same prompts in every process.
"""

from __future__ import annotations

import json
from typing import Any

from tasks.inputs import expansion_input


def _token_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v)


@expansion_input
def read_prompt_records(path: str) -> tuple[list[list[int]], list[list[int] | None]]:
    """Prompts and their expected answers from JSONL: each line a JSON list of token ids, or an
    object with "tokens" and optionally "answer" (the expected continuation, a non-empty list of
    token ids; other keys are ignored).  Returns ``(prompts, answers)``, ``answers[i]`` None when
    line ``i`` has none."""
    prompts: list[list[int]] = []
    answers: list[list[int] | None] = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            tokens: Any = obj.get("tokens") if isinstance(obj, dict) else obj
            if not _token_list(tokens):
                raise ValueError(f"{path}:{i}: expected a non-empty list of token ids (ints >= 0)")
            answer: Any = obj.get("answer") if isinstance(obj, dict) else None
            if answer is not None and not _token_list(answer):
                raise ValueError(f"{path}:{i}: \"answer\" must be a non-empty list of token ids (ints >= 0), got {answer!r}")
            prompts.append([int(t) for t in tokens])
            answers.append(None if answer is None else [int(t) for t in answer])
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts, answers


def read_prompt_file(path: str) -> list[list[int]]:
    """Token-id prompts from JSONL: each line a JSON list of ints or an object with "tokens"
    (and optionally "answer": :func:`read_prompt_records`)."""
    return read_prompt_records(path)[0]


def answers_from_payload(payload: dict[str, Any]) -> list[list[int] | None] | None:
    """The expected answers a unit's prompt payload carries (``"answers"``, one per prompt, None
    for a prompt without one), or None when it carries none (synthetic prompts, files without)."""
    answers = payload.get("answers")
    if answers is None:
        return None
    return [None if a is None else list(map(int, a)) for a in answers]


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
