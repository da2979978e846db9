"""The ``generate`` task: one cold restart of one arm — a fresh process, greedy decoding, evidence.

The runner gives every generate unit a fresh worker process (Ray ``max_calls=1``), so no engine,
cache or kernel choice carries over between restarts. The arm's environment (variables that select
kernels) is applied before the model is built. Which kernel each layer actually called is counted at
run time; a unit whose observed kernels differ from the configured one fails with an error instead of
producing rows, because a run that did not test what it claims must never count.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from tasks.models.predictions import sequence_hash


def kernel_evidence(calls: dict[str, dict[str, int]], configured: str) -> tuple[list[str], bool, str | None]:
    """(observed kernel names, ok, problem) from per-layer run-time call counts."""
    observed = sorted({k for per_layer in calls.values() for k, n in per_layer.items() if n > 0})
    silent = sorted(layer for layer, per_layer in calls.items() if not any(per_layer.values()))
    if silent:
        return observed, False, f"{len(silent)} W8A8 layers never ran (e.g. {silent[0]})"
    if observed != [configured]:
        return observed, False, f"configured kernel {configured!r} but the layers ran {observed}"
    return observed, True, None


def build_arm_model(params: dict[str, Any]) -> Any:
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


def _vllm_prompts(params: dict[str, Any], vocab_size: int | None = None) -> list[list[int]]:
    from tasks.prompts import prompts_from_payload

    # Synthetic ids stay below 1000 for vLLM checkpoints: every real vocabulary is larger.
    return prompts_from_payload(params["prompts"], vocab_size or 1000)


def run(params: dict[str, Any], context: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    from tasks.kernels import get_kernel
    from tasks.prompts import prompts_from_payload

    arm = params["arm"]
    if arm["engine"] == "vllm":
        engine = build_vllm_engine(params)
        prompts = _vllm_prompts(params)
        engine.reset_kernel_calls()
        gen = engine.generate(prompts, params["max_new_tokens"], top_k=params["top_k"])
        evidence = engine.require_evidence()  # raises KernelEvidenceError: a run must test what it claims
        calls = engine.kernel_calls()
        configured = evidence["configured"]
        observed = sorted(evidence["layer_kernels"])
        weights = engine.weights_sha256()
    else:
        model = build_arm_model(params)
        prompts = prompts_from_payload(params["prompts"], int(model.config.vocab_size))
        model.reset_kernel_calls()
        gen = model.generate(prompts, params["max_new_tokens"], top_k=params["top_k"])
        calls = model.kernel_calls()
        configured = get_kernel(arm["kernel"], **arm["params"]).name
        observed, ok, problem = kernel_evidence(calls, configured)
        if not ok:
            raise RuntimeError(f"kernel-selection evidence does not match the arm {arm['name']!r}: {problem}")
        evidence = {"ok": True}
        weights = model.weights_sha256()
    ident = {"arm": arm["name"], "restart": params["restart"]}
    generations = [
        {**ident, "prompt_index": r["sequence"], "position": r["position"], "token": r["token"],
         "margin": r["margin"], "topk_ids": r["topk_ids"], "topk_logits": r["topk_logits"]}
        for r in gen.rows()
    ]
    sequences = [
        {**ident, "prompt_index": i, "prompt_hash": sequence_hash(p), "sequence_hash": sequence_hash(t),
         "n_tokens": len(t), "tokens": t}
        for i, (p, t) in enumerate(zip(gen.prompts, gen.tokens, strict=True))
    ]
    run_row = {
        **ident, "model": params["model"], "engine": arm["engine"], "configured_kernel": configured,
        "scales": arm["scales"], "env_json": json.dumps(arm["env"], sort_keys=True), "host": socket.gethostname(),
        "pid": os.getpid(), "observed_kernels": observed,
        "kernel_calls_json": json.dumps({"calls": calls, "evidence": evidence}, sort_keys=True, default=str),
        "evidence_ok": bool(evidence["ok"]), "weights_sha256": weights,
    }
    return {"generations": generations, "sequences": sequences, "arm_runs": [run_row]}
