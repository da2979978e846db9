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

The rows (one per generated position, millions in a real sweep) are built as Arrow columns
(:func:`position_table`), never as one Python dict per position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tasks.kinds.base import Kind, TableRows, UnitContext

if TYPE_CHECKING:
    import pyarrow as pa

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


def position_table(ref_arm: str, arm: str, generated: Sequence[Sequence[int]],
                   ref_argmax: Sequence[Sequence[int]], ref_margin: Sequence[Sequence[float]],
                   arm_argmax: Sequence[Sequence[int]], arm_margin: Sequence[Sequence[float]],
                   firsts: Sequence[int] | None = None) -> pa.Table:
    """The ``teacher_forced`` rows of one unit as an Arrow table: one row per generated position.

    ``generated[i]`` are prompt ``i``'s generated tokens. ``ref_argmax[i]`` (and the other three)
    are the two arms' predictions over sequence ``i``: position ``firsts[i] + p`` predicts generated
    token ``p`` (``firsts`` None: position ``p``). Lists as ``ScoreResult`` holds them are the fast
    path (flattened by slicing, converted once per column). ``flip`` is where the two argmax differ.
    """
    import numpy as np
    import pyarrow as pa

    lengths = [len(g) for g in generated]
    zeros = [0] * len(lengths)
    starts = zeros if firsts is None else list(firsts)
    n = sum(lengths)

    def flat(per_sequence: Sequence[Sequence[Any]], dtype: Any, starts: Sequence[int] = starts) -> Any:
        if len(per_sequence) != len(lengths):
            raise ValueError(f"{len(per_sequence)} sequences of predictions for {len(lengths)} prompts")
        if per_sequence and not isinstance(per_sequence[0], list | tuple):  # arrays or tensors: slice them
            parts = [np.asarray(seq[start: start + length], dtype=dtype)
                     for seq, start, length in zip(per_sequence, starts, lengths, strict=True)]
            out = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
        else:  # Python lists: one list of the generated positions, converted once
            values: list[Any] = []
            for seq, start, length in zip(per_sequence, starts, lengths, strict=True):
                values.extend(seq[start: start + length])
            out = np.array(values, dtype=dtype)
        if len(out) != n:
            raise ValueError(f"{len(out)} predictions for {n} generated positions")
        return out

    counts = np.array(lengths, dtype=np.int64)
    offsets = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(counts[:-1], out=offsets[1:])
    ra, aa = flat(ref_argmax, np.int64), flat(arm_argmax, np.int64)
    return pa.table({
        "ref_arm": pa.repeat(pa.scalar(ref_arm, pa.string()), n),
        "ref_restart": np.zeros(n, dtype=np.int32),
        "arm": pa.repeat(pa.scalar(arm, pa.string()), n),
        "prompt_index": np.repeat(np.arange(len(lengths), dtype=np.int32), counts),
        "position": (np.arange(n, dtype=np.int64) - np.repeat(offsets, counts)).astype(np.int32),
        "ref_token": flat(generated, np.int64, zeros),
        "ref_argmax": ra,
        "ref_margin": flat(ref_margin, np.float64),
        "arm_argmax": aa,
        "arm_margin": flat(arm_margin, np.float64),
        "flip": ra != aa,
    })


def _aligned(per_sequence: Sequence[Sequence[Any]], firsts: Sequence[int], generated: Sequence[Sequence[int]]) -> list[Any]:
    """Score positions ``first .. first + len(generated)`` of each sequence (the generated positions)."""
    return [per_sequence[i][f: f + len(g)] for i, (f, g) in enumerate(zip(firsts, generated, strict=True))]


def _run_vllm(params: dict[str, Any], ctx: UnitContext, generated: dict[int, list[int]]) -> pa.Table:
    from tasks.models.arms import build_vllm_engine, vllm_prompts

    ref = params["reference"]
    prompts = vllm_prompts(params)
    decoded = reference_decoding(ctx, ref["unit_id"])
    sequences = [prompts[i] + generated[i] for i in range(len(prompts))]
    engine = build_vllm_engine(params)
    scores = engine.score(sequences, top_k=2)
    engine.require_evidence()
    gen = [generated[i] for i in range(len(prompts))]
    firsts = [len(p) - 1 for p in prompts]  # the score position that predicts generated token 0
    ref_side = [[decoded[(i, p)] for p in range(len(g))] for i, g in enumerate(gen)]
    # The reference side is its own greedy decoding (aligned to the generated positions already).
    return position_table(ref["name"], params["arm"]["name"], gen,
                          [[a for a, _m in r] for r in ref_side], [[m for _a, m in r] for r in ref_side],
                          _aligned(scores.argmax, firsts, gen), _aligned(scores.margins, firsts, gen))


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, TableRows]:
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
    gen = [generated[i] for i in range(len(prompts))]
    firsts = [len(p) - 1 for p in prompts]  # the score position that predicts generated token 0
    return {"teacher_forced": position_table(ref["name"], params["arm"]["name"], gen, ref_scores.argmax,
                                             ref_scores.margins, arm_scores.argmax, arm_scores.margins, firsts)}


KIND = Kind(name="teacher_forced", version=VERSION, spec=None, tables=("teacher_forced",), describe=describe,
            run=run, doc=__doc__ or "")
