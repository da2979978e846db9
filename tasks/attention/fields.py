"""An attention kernel named in a spec: its problems and its unit payload.

The evidence that it ran (layer calls counted by the engine) is the engine's:
:func:`tasks.models.hf_attention.attention_calls` and :func:`~tasks.models.hf_attention.require_attention_calls`.
"""

from __future__ import annotations

from typing import Any

from tasks.attention.registry import AttentionError, get_attention
from tasks.inputs import expansion_input

__all__ = ["attention_payload", "attention_problem", "callable_problem"]


def attention_problem(field: str, name: str, engine: str = "cpu") -> str | None:
    """Why ``name`` cannot be the attention of an arm on ``engine`` (None: it can).

    The CPU engine takes a CPU entry that runs here; the vLLM engine a vLLM backend entry (whether
    the GPU node can run it is decided there, like the arm's kernel family)."""
    try:
        kernel = get_attention(name)
    except AttentionError as exc:
        return f"{field}: {exc}"
    if engine == "vllm":
        if kernel.engine_backend is None:
            from tasks.attention.vllm import BACKENDS

            return f"{field}: {name!r} is not a vLLM attention backend; allowed on engine 'vllm': {', '.join(BACKENDS)}"
        return None
    if kernel.device != "cpu":
        return f"{field}: {name!r} runs on {kernel.device}; the CPU engine takes a cpu attention kernel (swapcheck kernels attention)"
    ok, why = kernel.available()
    return None if ok else f"{field}: attention kernel {name!r} is not available here: {why}"


def callable_problem(field: str, name: str) -> str | None:
    """Why ``name`` cannot be called on its own operands (None: it can), whatever its device.

    A kernel that is called directly (the ``attention_replay`` kind) may be a CUDA one: as a GEMM
    kernel with ``device = "cuda"``, it is accepted when it exists, its unit requests a GPU, and a
    launch where no GPU is refuses the unit before anything is written (exit 2, naming what is
    missing); where it runs, an unavailable one fails its unit with its reason.  A CPU kernel must be
    available here (it runs wherever the unit does), and an engine backend cannot be called at all."""
    try:
        kernel = get_attention(name)
    except AttentionError as exc:
        return f"{field}: {exc}"
    if kernel.compute is None:
        return (f"{field}: {name!r} is a vLLM engine backend ({kernel.engine_backend}), selected per arm on "
                "engine 'vllm'; it cannot be called on its own operands")
    if kernel.device == "cuda":
        return None
    ok, why = kernel.available()
    return None if ok else f"{field}: attention kernel {name!r} is not available here: {why}"


@expansion_input
def attention_payload(name: str) -> dict[str, Any]:
    """The attention kernel as unit parameters: its version is part of the unit id, and for a user's
    kernel the fingerprint of its code (``code``, with ``kernel``: the name the code is reported
    under; issue #36: an edited kernel reruns its units). Built-ins keep their pinned ids."""
    from tasks.fingerprint import code_fingerprint

    kernel = get_attention(name)
    payload = dict(kernel.identity)
    code = code_fingerprint(kernel.compute) if kernel.compute is not None else None
    if code is not None:
        payload.update(kernel=name, code=code)
    return payload
