"""Building the model of one arm (a kernel, a scale mode, the environment that selects kernels).

Shared by the ``generate`` and ``teacher_forced`` kinds: the CPU W8A8 engine with a registry kernel,
or a vLLM engine (GPU nodes only) with a kernel family forced per installed version.
"""

from __future__ import annotations

import os
from typing import Any


def build_arm_model(params: dict[str, Any]) -> Any:
    """The CPU W8A8 model of ``params["arm"]``; the arm's environment is applied first."""
    from tasks.models import build_model

    arm = params["arm"]
    os.environ.update(arm["env"])
    attention = arm.get("attention")  # present only when the arm names one (unit ids unchanged otherwise)
    model = build_model(params["model"], kernel={"kernel": arm["kernel"], "params": arm["params"]},
                        scales=arm["scales"], seed=params["model_seed"],
                        attention=None if attention is None else attention["name"])
    quantizer = arm.get("quantizer")  # likewise: present only when the arm names one
    if quantizer is not None:
        from tasks.quantizers import get_quantizer
        from tasks.quantizers.model import install_quantizer

        install_quantizer(model, get_quantizer(quantizer["quantizer"], **quantizer["params"]))
    return model


def build_vllm_engine(params: dict[str, Any]) -> Any:
    """The arm's vLLM engine (GPU nodes only): the kernel family forced per installed version."""
    from tasks.models.vllm_engine import VllmEngine

    arm = params["arm"]
    prompts = params["prompts"]
    longest = (max(len(p) for p in prompts["tokens"]) if "tokens" in prompts else prompts["synthetic"]["length"])
    attention = None
    if arm.get("attention") is not None:  # a vLLM attention backend: LLM(attention_backend=...), then checked
        from tasks.attention.vllm import BACKENDS

        attention = BACKENDS[arm["attention"]["name"]]
    return VllmEngine(vllm_model(params["model"]), kernel=arm["kernel"], seed=params["model_seed"],
                      env=dict(arm["env"]), attention_backend=attention,
                      max_model_len=longest + params["max_new_tokens"] + 1)


def vllm_model(model: str) -> str:
    """What a vLLM arm loads for the experiment's ``model``: a shipped model's name (``answer-qwen3``)
    maps to its compressed-tensors W8A8 export in the model cache, written on first use and its files'
    sha256 checked on every use (``tasks.models.export.exported_model_dir``; the same int8 weights
    and scales the CPU engine quantizes on load); any other value is a checkpoint path or hub name,
    passed as it is."""
    from tasks.models.checkpoint import SHIPPED_MODELS
    from tasks.models.export import exported_model_dir

    return str(exported_model_dir(model)) if model in SHIPPED_MODELS else model


#: Synthetic prompt ids of a vLLM arm stay below this (and below the model's vocabulary).
SYNTHETIC_ID_BOUND = 1000


def checkpoint_vocab_size(model: str) -> int | None:
    """``vocab_size`` from a checkpoint directory's ``config.json`` (or its ``text_config``); None for a
    name that is not a local directory."""
    import json
    from pathlib import Path

    cfg_path = Path(model) / "config.json"
    if not cfg_path.is_file():
        return None
    cfg = json.loads(cfg_path.read_text())
    size = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return int(size) if size else None


def vllm_prompts(params: dict[str, Any], vocab_size: int | None = None) -> list[list[int]]:
    """The arm's prompts as token ids. Synthetic ids stay below :data:`SYNTHETIC_ID_BOUND` and below
    the model's vocabulary (``vocab_size``, else read from the checkpoint's ``config.json``): vLLM
    does not check prompt ids when it skips the tokenizer, and answer-qwen3 has 16 tokens, so ids up to
    999 had reached its embedding (issue #37). Given ids outside the vocabulary are refused."""
    from tasks.prompts import prompts_from_payload

    vocab = vocab_size or checkpoint_vocab_size(vllm_model(params["model"]))
    bound = min(SYNTHETIC_ID_BOUND, vocab) if vocab else SYNTHETIC_ID_BOUND
    if "tokens" in params["prompts"] and vocab:
        bound = vocab
    return prompts_from_payload(params["prompts"], bound)
