"""Kernel-selection evidence: did every quantized layer run the kernel its arm configured?

Shared by the kinds that run models (generate, teacher-forced) and by the vLLM selection logic, so
it lives with the models rather than in any one kind.
"""

from __future__ import annotations

__all__ = ["kernel_evidence"]


def kernel_evidence(calls: dict[str, dict[str, int]], configured: str) -> tuple[list[str], bool, str | None]:
    """(observed kernel names, ok, problem) from per-layer run-time call counts."""
    observed = sorted({k for per_layer in calls.values() for k, n in per_layer.items() if n > 0})
    silent = sorted(layer for layer, per_layer in calls.items() if not any(per_layer.values()))
    if silent:
        return observed, False, f"{len(silent)} W8A8 layers never ran (e.g. {silent[0]})"
    if observed != [configured]:
        return observed, False, f"configured kernel {configured!r} but the layers ran {observed}"
    return observed, True, None
