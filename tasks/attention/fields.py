"""An attention kernel named in a spec: its problems, its unit payload and the evidence it ran."""

from __future__ import annotations

from typing import Any

from tasks.attention.registry import AttentionError, get_attention

__all__ = ["attention_calls", "attention_payload", "attention_problem", "require_attention_calls"]


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


def attention_payload(name: str) -> dict[str, Any]:
    """The attention kernel as unit parameters: its version is part of the unit id."""
    return dict(get_attention(name).identity)


def attention_calls() -> dict[str, int]:
    """Layer calls per attention kernel made through the engine in this process so far."""
    from tasks.attention.hf import CALLS

    return dict(CALLS)


def require_attention_calls(name: str, arm: str, before: dict[str, int] | None = None) -> None:
    """Raise unless the attention kernel ``name`` ran since ``before`` (:func:`attention_calls`): the
    evidence that a run tested the attention it claims (the default float64 path is the engine's own)."""
    from tasks.attention import DEFAULT_ATTENTION
    from tasks.attention.hf import CALLS

    if name != DEFAULT_ATTENTION and CALLS[name] <= (before or {}).get(name, 0):
        raise RuntimeError(f"attention evidence does not match the arm {arm!r}: attention kernel {name!r} "
                           "was configured but never called")
