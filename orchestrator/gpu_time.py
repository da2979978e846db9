"""The expected GPU time of a plan on one NVIDIA H200 (``swapcheck sweep plan``; issue #37).

Every unit that asks for a GPU gets a cost from a model per kind, each term either **measured** (with
where it was measured) or **assumed** (with the assumption said). No swapcheck unit has run on a GPU
yet (docs/gpu.md), so the vLLM terms are assumptions: they are stated, printed beside the total, and
meant to be replaced by the lease kit's measurements (issue #38). The CPU side of a GPU unit (the
exact K-depth reference) is measured on this project's CI CPU (docs/performance.md, bench_int8).

The units run one at a time on one GPU (every GPU unit asks for a whole GPU), so the total is their
sum. Units that need a fresh process (``generate``, ``teacher_forced``: a cold restart each) pay the
engine's start every time; units sharing a worker process pay a CUDA context once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.plan import Plan

__all__ = ["ASSUMPTIONS", "Estimate", "estimate"]

#: name -> (seconds or rate, "measured"/"assumed", what it rests on). Qwen3-1.7B W8A8 INT8 on vLLM 0.32,
#: enforce_eager (no CUDA graphs), one H200.
ASSUMPTIONS: dict[str, tuple[float, str, str]] = {
    "engine_start_s": (60.0, "assumed", "vLLM 0.32 LLM() in a fresh process for a 1.7B W8A8 checkpoint: import "
                       "(~15 s), weights (~5 s), memory profiling and KV cache (~10 s), margin; eager: no graph capture"),
    "decode_step_s": (0.015, "assumed", "one eager decode step of a batch <= 256 (28 layers, ~400 kernel launches)"),
    "prefill_tokens_per_s": (50_000.0, "assumed", "eager prefill throughput of a 1.7B W8A8 model"),
    "score_request_s": (0.05, "assumed", "one teacher-forced request (max_tokens=1, prompt logprobs, logits captured)"),
    "capture_copy_s": (0.2, "assumed", "copying every layer call's operands to the host for one captured sequence "
                       "(~1.7 GB at ~10 GB/s)"),
    "replay_gemm_s": (0.002, "assumed", "one captured layer GEMM replayed through one kernel (launch-bound)"),
    "cuda_context_s": (5.0, "assumed", "a CUDA context and the kernels' first compile per worker process"),
    "kdepth_cpu_s_per_gmac": (0.0894, "measured", "a K-depth unit's CPU side (the exact int8 reference and the "
                              "comparisons): 96 ms for M = N = 256, K = 16384 (1.07 GMAC), one thread, this "
                              "project's CPU (benchmarks/bench_int8.py, docs/performance.md)"),
    "kdepth_gpu_gemm_s": (0.01, "assumed", "one GPU GEMM of a K-depth unit with its copies"),
}


def _v(name: str) -> float:
    return ASSUMPTIONS[name][0]


def _tokens(params: dict[str, Any]) -> tuple[int, int]:
    """(sequences, prompt length) of a unit's prompts."""
    prompts = params.get("prompts") or {}
    if "synthetic" in prompts:
        return int(prompts["synthetic"]["count"]), int(prompts["synthetic"]["length"])
    tokens = prompts.get("tokens") or []
    return len(tokens), max((len(t) for t in tokens), default=0)


def _generate(params: dict[str, Any]) -> tuple[float, list[str]]:
    n, length = _tokens(params)
    new = int(params.get("max_new_tokens", 0))
    seconds = _v("engine_start_s") + n * length / _v("prefill_tokens_per_s") + new * _v("decode_step_s")
    if params.get("restart") == 0:  # restart 0 also scores its own generation (teacher-forced log-probabilities)
        seconds += n * _v("score_request_s")
    return seconds, ["engine_start_s", "prefill_tokens_per_s", "decode_step_s", "score_request_s"]


def _teacher_forced(params: dict[str, Any]) -> tuple[float, list[str]]:
    n, _ = _tokens(params)
    return _v("engine_start_s") + n * _v("score_request_s"), ["engine_start_s", "score_request_s"]


def _replay(params: dict[str, Any]) -> tuple[float, list[str]]:
    n, length = _tokens(params)
    kernels = sum(len(p) for p in params.get("pairs", [])) or 2
    modes = len(params.get("scale_modes", ["real"]))
    layers = 196  # Qwen3-1.7B: 28 decoder layers x 7 linears
    seconds = (_v("engine_start_s") + n * (_v("capture_copy_s") + length / _v("prefill_tokens_per_s"))
               + n * layers * kernels * modes * _v("replay_gemm_s"))
    return seconds, ["engine_start_s", "capture_copy_s", "replay_gemm_s", "prefill_tokens_per_s"]


def _kdepth(params: dict[str, Any]) -> tuple[float, list[str]]:
    gmac = int(params["m"]) * int(params["n"]) * int(params["k"]) / 1e9
    impls = len(params.get("implementations", []))
    seconds = gmac * _v("kdepth_cpu_s_per_gmac") + impls * _v("kdepth_gpu_gemm_s")
    return seconds, ["kdepth_cpu_s_per_gmac", "kdepth_gpu_gemm_s"]


_KINDS: dict[str, Callable[[dict[str, Any]], tuple[float, list[str]]]] = {
    "generate": _generate, "teacher_forced": _teacher_forced, "replay": _replay, "kdepth": _kdepth,
}


@dataclass
class Estimate:
    """The expected GPU time of a plan: per experiment, the total, and the terms it rests on."""

    per_experiment: dict[str, float] = field(default_factory=dict)
    units: int = 0
    unknown: list[str] = field(default_factory=list)  # GPU units of a kind with no cost model
    terms: set[str] = field(default_factory=set)
    seconds: float = 0.0

    def lines(self) -> list[str]:
        if not self.units and not self.unknown:
            return []
        out = [f"expected GPU time on one H200: {self.seconds / 60:.1f} min for {self.units} GPU unit(s), one at a "
               "time (" + ", ".join(f"{e} {s / 60:.1f} min" for e, s in self.per_experiment.items()) + ")"]
        measured = sorted(t for t in self.terms if ASSUMPTIONS[t][1] == "measured")
        assumed = sorted(t for t in self.terms if ASSUMPTIONS[t][1] == "assumed")
        for t in measured:
            out.append(f"  measured {t} = {ASSUMPTIONS[t][0]:g}: {ASSUMPTIONS[t][2]}")
        for t in assumed:
            out.append(f"  assumed  {t} = {ASSUMPTIONS[t][0]:g}: {ASSUMPTIONS[t][2]}")
        if self.unknown:
            out.append(f"  not counted: {len(self.unknown)} GPU unit(s) of kinds without a cost model "
                       f"({', '.join(sorted(set(self.unknown)))})")
        return out


def estimate(plan: Plan) -> Estimate:
    """:class:`Estimate` of ``plan``'s GPU units (CPU units are not counted)."""
    est = Estimate()
    contexts: set[str] = set()
    for u in plan.units:
        if u.resources.num_gpus <= 0:
            continue
        model = _KINDS.get(u.kind)
        if model is None:
            est.unknown.append(u.kind)
            continue
        seconds, terms = model(u.params)
        if not u.fresh_process and u.experiment not in contexts:  # one CUDA context per experiment (its units share workers)
            contexts.add(u.experiment)
            seconds += _v("cuda_context_s")
            terms = [*terms, "cuda_context_s"]
        est.units += 1
        est.seconds += seconds
        est.per_experiment[u.experiment] = est.per_experiment.get(u.experiment, 0.0) + seconds
        est.terms.update(terms)
    return est

