"""The ``teacher_forced`` kind: score a reference arm's sequences with another arm.

The reference arm's restart-0 sequences are read from the results through the unit context (the
rows its ``generate`` unit wrote). ``generate`` plans these units (stage 1): the kind has no spec
model of its own.
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

from tasks.kinds.base import Kind, Rows, UnitContext

VERSION = "1"


def describe(p: dict[str, Any]) -> str:
    return f"teacher-forced {p['arm']['name']} on {p['reference']['name']}'s sequences"


def reference_sequences(ctx: UnitContext, unit_id: str) -> dict[int, list[int]]:
    rows = ctx.read_unit("sequences", unit_id, ["prompt_index", "tokens"])
    return {r["prompt_index"]: list(r["tokens"]) for r in sorted(rows, key=lambda r: r["prompt_index"])}


def reference_decoding(ctx: UnitContext, unit_id: str) -> dict[tuple[int, int], tuple[int, float]]:
    """(prompt, position) -> (token, margin) of the reference arm's own greedy decoding."""
    rows = ctx.read_unit("generations", unit_id, ["prompt_index", "position", "token", "margin"])
    return {(r["prompt_index"], r["position"]): (r["token"], r["margin"]) for r in rows}


def _run_vllm(params: dict[str, Any], ctx: UnitContext, generated: dict[int, list[int]]) -> Rows:
    from tasks.models.arms import build_vllm_engine, vllm_prompts

    ref = params["reference"]
    prompts = vllm_prompts(params)
    decoded = reference_decoding(ctx, ref["unit_id"])
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


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    from tasks.models.arms import build_arm_model
    from tasks.prompts import prompts_from_payload

    if context is None:
        raise ValueError("teacher_forced reads the reference arm's sequences from the results: no unit context given")
    ctx = context
    ref = params["reference"]
    generated = reference_sequences(ctx, ref["unit_id"])
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


KIND = Kind(name="teacher_forced", version=VERSION, spec=None, tables=("teacher_forced",), describe=describe,
            run=run, doc=__doc__ or "")
