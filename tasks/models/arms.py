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
    return build_model(params["model"], kernel={"kernel": arm["kernel"], "params": arm["params"]},
                       scales=arm["scales"], seed=params["model_seed"])


def build_vllm_engine(params: dict[str, Any]) -> Any:
    """The arm's vLLM engine (GPU nodes only): the kernel family forced per installed version."""
    from tasks.models.vllm_engine import VllmEngine

    arm = params["arm"]
    prompts = params["prompts"]
    longest = (max(len(p) for p in prompts["tokens"]) if "tokens" in prompts else prompts["synthetic"]["length"])
    return VllmEngine(params["model"], kernel=arm["kernel"], seed=params["model_seed"], env=arm["env"],
                      max_model_len=longest + params["max_new_tokens"] + 1)


def vllm_prompts(params: dict[str, Any], vocab_size: int | None = None) -> list[list[int]]:
    from tasks.prompts import prompts_from_payload

    # Synthetic ids stay below 1000 for vLLM checkpoints: every real vocabulary is larger.
    return prompts_from_payload(params["prompts"], vocab_size or 1000)
