"""The ``teacher_forced`` task: score a reference arm's sequences with another arm.

The reference arm's restart-0 sequences are read from the results (DuckDB over the Parquet tree).
On the CPU engine both the reference arm and the other arm score every sequence (prompt + generated
tokens) in one forward pass per batch, in this one fresh process, so both sides of every position
come from the same teacher-forced computation. vLLM chooses kernels once per process, so on the vLLM
engine only the other arm scores here, and the reference side is the reference arm's own greedy
decoding (its argmax is the token it generated; its margin is from the `generations` table) — on
the CPU engine both are identical bit for bit, which tests/test_generate.py checks. Generated
position ``p`` is predicted after reading the prompt and the first ``p`` generated tokens. A flip is
a position where the two arms' argmax differ.
"""

from __future__ import annotations

from typing import Any


def reference_sequences(results: str, sweep: str, unit_id: str) -> dict[int, list[int]]:
    from storage.catalog import read_only_query

    rows = read_only_query(
        results,
        f"SELECT prompt_index, tokens FROM sequences WHERE sweep = '{sweep}' AND unit_id = '{unit_id}' ORDER BY prompt_index",
    ).to_pylist()
    return {r["prompt_index"]: list(r["tokens"]) for r in rows}


def reference_decoding(results: str, sweep: str, unit_id: str) -> dict[tuple[int, int], tuple[int, float]]:
    """(prompt, position) -> (token, margin) of the reference arm's own greedy decoding."""
    from storage.catalog import read_only_query

    rows = read_only_query(
        results,
        f"SELECT prompt_index, position, token, margin FROM generations WHERE sweep = '{sweep}' AND unit_id = '{unit_id}'",
    ).to_pylist()
    return {(r["prompt_index"], r["position"]): (r["token"], r["margin"]) for r in rows}


def _run_vllm(params: dict[str, Any], ctx: dict[str, Any], generated: dict[int, list[int]]) -> list[dict[str, Any]]:
    from tasks.generate import _vllm_prompts, build_vllm_engine

    ref = params["reference"]
    prompts = _vllm_prompts(params)
    decoded = reference_decoding(ctx["results"], ctx["sweep"], ref["unit_id"])
    sequences = [prompts[i] + generated[i] for i in range(len(prompts))]
    engine = build_vllm_engine(params)
    scores = engine.score(sequences, top_k=2)
    engine.require_evidence()
    rows = []
    for i, prompt in enumerate(prompts):
        first = len(prompt) - 1
        for p, token in enumerate(generated[i]):
            ra, rm = decoded[(i, p)]
            aa = scores.argmax[i][first + p]
            rows.append({"ref_arm": ref["name"], "ref_restart": 0, "arm": params["arm"]["name"], "prompt_index": i,
                         "position": p, "ref_token": token, "ref_argmax": ra, "ref_margin": rm, "arm_argmax": aa,
                         "arm_margin": scores.margins[i][first + p], "flip": ra != aa})
    return rows


def run(params: dict[str, Any], context: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    from tasks.generate import build_arm_model
    from tasks.prompts import prompts_from_payload

    ctx = context or {}
    if not ctx.get("results"):
        raise ValueError("teacher_forced reads the reference arm's sequences from the results: no results root given")
    ref = params["reference"]
    generated = reference_sequences(ctx["results"], ctx["sweep"], ref["unit_id"])
    if not generated:
        raise RuntimeError(f"no sequences of the reference arm {ref['name']!r} (unit {ref['unit_id']}) in the results: "
                           "its generate unit has not finished")
    if params["arm"].get("engine") == "vllm":
        return {"teacher_forced": _run_vllm(params, ctx, generated)}
    ref_model = build_arm_model({**params, "arm": ref})
    prompts = prompts_from_payload(params["prompts"], int(ref_model.config.vocab_size))
    if len(generated) != len(prompts):
        raise RuntimeError(f"the reference arm has {len(generated)} sequences for {len(prompts)} prompts")
    sequences = [prompts[i] + generated[i] for i in range(len(prompts))]
    ref_scores = ref_model.score(sequences, top_k=2)
    arm_scores = build_arm_model(params).score(sequences, top_k=2)
    rows = []
    for i, prompt in enumerate(prompts):
        first = len(prompt) - 1  # the score position that predicts generated token 0
        for p, token in enumerate(generated[i]):
            j = first + p
            ra, aa = ref_scores.argmax[i][j], arm_scores.argmax[i][j]
            rows.append({
                "ref_arm": ref["name"], "ref_restart": 0, "arm": params["arm"]["name"], "prompt_index": i,
                "position": p, "ref_token": token, "ref_argmax": ra, "ref_margin": ref_scores.margins[i][j],
                "arm_argmax": aa, "arm_margin": arm_scores.margins[i][j], "flip": ra != aa,
            })
    return {"teacher_forced": rows}
