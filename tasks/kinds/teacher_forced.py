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

Each position also carries what the two arms' distributions say about it (docs/divergence.md): the
reference token's probability under the reference arm and under the arm (``ref_token_prob_ref``,
``ref_token_prob_arm``), the exact KL(ref || arm) over the whole vocabulary (``kl_ref_arm``) and the
k3 term of the reference token (``k3_ref_arm`` = r - 1 - log r, r = p_arm / p_ref).

* CPU engine (:func:`distribution_columns`): all four, from one more unpadded forward pass per arm
  and sequence (``forward_tokens``), checked to give the scoring pass's logit of every reference
  token bit for bit.
* vLLM engine (:func:`vllm_table`): the arm's side from the full-vocabulary logits its scoring pass
  captures (``VllmEngine.score_logprobs``), the reference side from the reference arm's own process:
  its restart-0 generate unit scores its sequences teacher-forced the same way and records each
  generated token's log-probability in the ``generations`` column
  ``tasks.models.vllm_rows.TEACHER_FORCED_LOGPROB``. So
  ``ref_token_prob_ref``, ``ref_token_prob_arm`` and ``k3_ref_arm`` are measured (k3 from the two
  float64 log-probabilities exactly as on the CPU, :func:`k3_from_logprobs`), and ``kl_ref_arm``
  stays NULL: the exact KL needs both full distributions in one process, and only the reference
  token's log-probability travels between the two. A reference generate unit written before that
  column existed (or a position it left NULL) leaves all four NULL, and the unit logs why.

The rows (one per generated position, millions in a real sweep) are built as Arrow columns from
the engines' score arrays (:func:`scores_table`, :func:`position_table`: numpy slices and one
concatenation per column), never as one Python object per position.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tasks.kinds.base import Kind, TableRows, UnitContext

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from tasks.models.predictions import ScoreResult

VERSION = "1"

#: One entry per sequence: a numpy array (as ``ScoreResult`` holds scores), a list or a tuple.
PerSequence = Sequence[Any]


def describe(p: dict[str, Any]) -> str:
    return f"teacher-forced {p['arm']['name']} on {p['reference']['name']}'s sequences"


def reference_sequences(ctx: UnitContext, unit_id: str) -> dict[int, list[int]]:
    rows = ctx.read_unit("sequences", unit_id, ["prompt_index", "tokens"])
    return {r["prompt_index"]: list(r["tokens"]) for r in sorted(rows, key=lambda r: r["prompt_index"])}


#: (prompt, position) -> (token, margin, teacher-forced log-probability or None).
Decoding = dict[tuple[int, int], tuple[int, float, float | None]]


def reference_decoding(ctx: UnitContext, unit_id: str) -> tuple[Decoding, bool]:
    """The reference arm's own greedy decoding, (prompt, position) -> (token, margin, log-probability
    of the token under its teacher-forced pass, ``TEACHER_FORCED_LOGPROB``), and whether its
    ``generations`` file has that column at all (False: written before it existed; every
    log-probability None)."""
    import pyarrow as pa

    from tasks.models.vllm_rows import TEACHER_FORCED_LOGPROB as REF_LOGPROB

    columns = ["prompt_index", "position", "token", "margin"]
    try:
        rows = ctx.read_unit("generations", unit_id, [*columns, REF_LOGPROB])
        present = True
    except pa.ArrowInvalid as exc:  # pyarrow: "No match for FieldRef.Name(<column>) in ..."
        if REF_LOGPROB not in str(exc):
            raise
        rows, present = ctx.read_unit("generations", unit_id, columns), False
    decoded = {(r["prompt_index"], r["position"]): (r["token"], r["margin"], r.get(REF_LOGPROB)) for r in rows}
    return decoded, present


def _flat(what: str, per_sequence: Sequence[Any], dtype: Any, starts: Sequence[int], lengths: Sequence[int],
          n: int) -> np.ndarray:
    """One array of ``per_sequence[i][starts[i]: starts[i] + lengths[i]]`` over every sequence ``i``
    (numpy arrays: views and one concatenation; Python lists: one conversion of all their values)."""
    if len(per_sequence) != len(lengths):
        raise ValueError(f"{len(per_sequence)} sequences of {what} for {len(lengths)} prompts")
    parts = [seq[start: start + length] for seq, start, length in zip(per_sequence, starts, lengths, strict=True)]
    return _concat(what, parts, dtype, n)


def _concat(what: str, parts: Sequence[Any], dtype: Any, n: int) -> np.ndarray:
    import numpy as np

    got = sum(map(len, parts))
    if got != n:  # a slice is never longer than asked: a shortfall anywhere shows in the total
        raise ValueError(f"{got} {what} for {n} generated positions")
    if not parts:
        return np.zeros(0, dtype=dtype)
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts).astype(dtype, copy=False)
    if all(isinstance(p, list | tuple) for p in parts):
        return np.fromiter(itertools.chain.from_iterable(parts), dtype=dtype, count=n)
    return np.concatenate([np.asarray(p, dtype=dtype) for p in parts])  # tensors, mixed


def position_table(ref_arm: str, arm: str, generated: PerSequence, ref_argmax: PerSequence, ref_margin: PerSequence,
                   arm_argmax: PerSequence, arm_margin: PerSequence, firsts: Sequence[int] | None = None) -> pa.Table:
    """The ``teacher_forced`` rows of one unit as an Arrow table: one row per generated position.

    ``generated[i]`` are prompt ``i``'s generated tokens. ``ref_argmax[i]`` (and the other three)
    are the two arms' predictions over sequence ``i``: position ``firsts[i] + p`` predicts generated
    token ``p`` (``firsts`` None: position ``p``). Each argument is one numpy array per sequence (as
    :class:`tasks.models.ScoreResult` holds them: the fast path) or one list; every column is built
    with vectorized numpy operations, none per row. ``flip`` is where the two argmax differ.
    """
    import numpy as np
    import pyarrow as pa

    lengths = [len(g) for g in generated]
    starts = [0] * len(lengths) if firsts is None else firsts
    counts = np.array(lengths, dtype=np.int64)
    n = int(counts.sum())
    index = np.int32 if n < 2**31 else np.int64  # row numbers (position = row - the sequence's first row)
    offsets = np.zeros(len(lengths), dtype=index)
    np.cumsum(counts[:-1], out=offsets[1:])
    position = np.arange(n, dtype=index)
    np.subtract(position, np.repeat(offsets, counts), out=position)
    ra = _flat("ref_argmax predictions", ref_argmax, np.int64, starts, lengths, n)
    aa = _flat("arm_argmax predictions", arm_argmax, np.int64, starts, lengths, n)
    return pa.table({
        "ref_arm": pa.repeat(pa.scalar(ref_arm, pa.string()), n),
        "ref_restart": np.zeros(n, dtype=np.int32),
        "arm": pa.repeat(pa.scalar(arm, pa.string()), n),
        "prompt_index": np.repeat(np.arange(len(lengths), dtype=np.int32), counts),
        "position": position.astype(np.int32, copy=False),
        "ref_token": _concat("generated tokens", generated, np.int64, n),
        "ref_argmax": ra,
        "ref_margin": _flat("ref_margin predictions", ref_margin, np.float64, starts, lengths, n),
        "arm_argmax": aa,
        "arm_margin": _flat("arm_margin predictions", arm_margin, np.float64, starts, lengths, n),
        "flip": ra != aa,
    })


def scores_table(ref_arm: str, arm: str, ref: ScoreResult, other: ScoreResult, firsts: Sequence[int],
                 lengths: Sequence[int]) -> pa.Table:
    """:func:`position_table` from both arms' teacher-forced scores of the same sequences (prompt
    ``i`` + its ``lengths[i]`` generated tokens; ``firsts[i]`` the position predicting generated token
    0). The reference token of a position is the token that follows it (``ref.targets``), which is
    the generated token itself, so no token leaves the score arrays.
    """
    if len(ref.targets) != len(lengths):
        raise ValueError(f"{len(ref.targets)} scored sequences for {len(lengths)} prompts")
    short = [i for i, (t, f, k) in enumerate(zip(ref.targets, firsts, lengths, strict=True)) if f + k >= len(t)]
    if short:  # the last generated token follows position f + k - 1: the sequence has f + k + 1 tokens
        raise ValueError(f"sequences {short[:5]} are shorter than their prompt and generated tokens")
    tokens = [t[f: f + k] for t, f, k in zip(ref.targets, firsts, lengths, strict=True)]
    return position_table(ref_arm, arm, tokens, ref.argmax, ref.margins, other.argmax, other.margins, firsts)


#: The distribution columns (float64, NULL where not measured) in the order the table holds them.
DISTRIBUTION = ("ref_token_prob_ref", "ref_token_prob_arm", "kl_ref_arm", "k3_ref_arm")


def distribution_arrays(ref_logits: Any, arm_logits: Any, tokens: Any) -> dict[str, np.ndarray]:
    """The :data:`DISTRIBUTION` columns of ``P`` positions from both arms' logits ``[P, V]`` (torch
    or numpy, any float dtype) and the reference token of each position (``[P]``).

    Everything in float64: log-softmax of each arm's logits, ``p_ref`` / ``p_arm`` of the reference
    token, ``KL(ref || arm) = sum_v p_ref(v) (log p_ref(v) - log p_arm(v))`` over the whole
    vocabulary (terms with p_ref(v) = 0 are 0), and ``k3 = r - 1 - log r`` with ``log r = log p_arm
    - log p_ref`` of the reference token, computed as ``expm1(log r) - log r`` (no cancellation near
    r = 1). The formulas and their directions are :mod:`tasks.numerics.rl_metrics`' (raw
    log-probabilities, KL(ref || arm), k3 with the reference arm as the sampler).
    """
    import numpy as np
    import torch

    from tasks.numerics import rl_metrics

    ref = torch.as_tensor(ref_logits).to(torch.float64)
    arm = torch.as_tensor(arm_logits).to(torch.float64)
    if ref.shape != arm.shape or ref.ndim != 2:
        raise ValueError(f"logits of shapes {tuple(ref.shape)} and {tuple(arm.shape)}: both must be [positions, vocab]")
    tok = np.asarray(tokens, dtype=np.int64)
    if tok.shape != (ref.shape[0],):
        raise ValueError(f"{tok.shape} reference tokens for {ref.shape[0]} positions")
    lp_ref = rl_metrics.raw_logprobs(ref)
    lp_arm = rl_metrics.raw_logprobs(arm)
    at_ref = rl_metrics.token_logprobs(lp_ref, tok)
    at_arm = rl_metrics.token_logprobs(lp_arm, tok)
    return {"ref_token_prob_ref": at_ref.exp().numpy(), "ref_token_prob_arm": at_arm.exp().numpy(),
            "kl_ref_arm": rl_metrics.kl_exact(lp_ref, lp_arm).numpy(),
            "k3_ref_arm": rl_metrics.k3(at_arm, at_ref).numpy()}


def distribution_columns(ref_model: Any, arm_model: Any, sequences: Sequence[Sequence[int]], firsts: Sequence[int],
                         lengths: Sequence[int], ref: ScoreResult, other: ScoreResult) -> dict[str, np.ndarray]:
    """:func:`distribution_arrays` over the generated positions of every sequence, in
    :func:`position_table`'s row order, from one ``forward_tokens`` pass per arm and sequence.

    The pass must be the computation the scores came from: each arm's logit of every reference token
    equals the scoring pass's ``target_logits`` bit for bit, else this raises (the columns would
    describe other logits than the flips).
    """
    import numpy as np

    parts: dict[str, list[np.ndarray]] = {c: [] for c in DISTRIBUTION}
    for i, (seq, f, k) in enumerate(zip(sequences, firsts, lengths, strict=True)):
        if k == 0:
            continue
        lr = ref_model.forward_tokens([list(seq)])[0][f: f + k]
        la = arm_model.forward_tokens([list(seq)])[0][f: f + k]
        tokens = np.asarray(seq[f + 1: f + k + 1], dtype=np.int64)
        for side, logits, scores in (("reference", lr, ref), ("arm", la, other)):
            got = logits.gather(1, _index(tokens)).squeeze(1).double().numpy()
            want = scores.target_logits[i][f: f + k]
            if not np.array_equal(got.view(np.uint64), want.view(np.uint64)):
                raise RuntimeError(f"sequence {i}: the {side} arm's full-vocabulary pass gives other logits than its "
                                   "scoring pass; the probability columns would not describe the flips")
        for c, v in distribution_arrays(lr, la, tokens).items():
            parts[c].append(v)
    return {c: np.concatenate(v) if v else np.zeros(0) for c, v in parts.items()}


def _index(tokens: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(tokens).unsqueeze(1)


def with_distribution(table: pa.Table, columns: dict[str, Any] | None) -> pa.Table:
    """``table`` with the :data:`DISTRIBUTION` columns appended: ``columns`` (one value per row: a
    numpy array, or an Arrow array that may hold nulls; a column given as None is all NULL), or all
    NULL where the engine gave no logits (``columns`` None)."""
    import pyarrow as pa

    for c in DISTRIBUTION:
        values = None if columns is None else columns[c]
        if values is None:
            col = pa.nulls(table.num_rows, pa.float64())
        else:
            if len(values) != table.num_rows:
                raise ValueError(f"{len(values)} values of {c} for {table.num_rows} positions")
            col = values if isinstance(values, pa.Array) else pa.array(values, type=pa.float64())
            if not col.type.equals(pa.float64()):
                raise ValueError(f"{c} is {col.type}, not float64")
        table = table.append_column(c, col)
    return table


def k3_from_logprobs(ref_logprobs: Any, arm_logprobs: Any) -> dict[str, np.ndarray]:
    """``ref_token_prob_ref``, ``ref_token_prob_arm`` and ``k3_ref_arm`` from the reference token's
    float64 log-probability under each arm, with the operations :func:`distribution_arrays` applies
    to its gathered log-probabilities (``exp``; ``log r = lp_arm - lp_ref``, ``k3 = expm1(log r) -
    log r``): the same log-probabilities give the same bits (tests/test_vllm_probs.py)."""
    import numpy as np
    import torch

    from tasks.numerics import rl_metrics

    at_ref = torch.from_numpy(np.ascontiguousarray(ref_logprobs, dtype=np.float64))
    at_arm = torch.from_numpy(np.ascontiguousarray(arm_logprobs, dtype=np.float64))
    if at_ref.shape != at_arm.shape or at_ref.ndim != 1:
        raise ValueError(f"log-probabilities of shapes {tuple(at_ref.shape)} and {tuple(at_arm.shape)}: both must be [positions]")
    return {"ref_token_prob_ref": at_ref.exp().numpy(), "ref_token_prob_arm": at_arm.exp().numpy(),
            "k3_ref_arm": rl_metrics.k3(at_arm, at_ref).numpy()}


def vllm_distribution(ref_logprobs: Sequence[float | None], arm_logprobs: Any) -> dict[str, Any]:
    """The :data:`DISTRIBUTION` columns of a vLLM unit's rows: :func:`k3_from_logprobs` where the
    reference side was recorded (``ref_logprobs[i]`` not None, nor NaN), NULL in all four columns where
    it was not; ``kl_ref_arm`` NULL everywhere (the exact KL needs both full distributions in one
    process: module docstring)."""
    import numpy as np
    import pyarrow as pa

    n = len(ref_logprobs)
    ref = np.array([np.nan if v is None else v for v in ref_logprobs], dtype=np.float64)
    arm = np.asarray(arm_logprobs, dtype=np.float64)
    if arm.shape != (n,):
        raise ValueError(f"{arm.shape} arm log-probabilities for {n} positions")
    missing = np.isnan(ref)
    got = k3_from_logprobs(np.where(missing, 0.0, ref), arm)
    out: dict[str, Any] = {c: pa.array(v, type=pa.float64(), mask=missing) for c, v in got.items()}
    out["kl_ref_arm"] = None
    return out


def vllm_table(ref_arm: str, arm: str, generated: Sequence[Sequence[int]], decoded: Decoding, scores: ScoreResult,
               arm_logprobs: Sequence[Any], firsts: Sequence[int]) -> pa.Table:
    """A vLLM teacher_forced unit's rows: :func:`position_table` of the reference arm's decoding
    (``decoded``: its token and margin per (prompt, position), :func:`reference_decoding`) against the
    arm's teacher-forced ``scores``, with :func:`vllm_distribution` of the reference arm's recorded
    log-probability and the arm's (``arm_logprobs[i]``: per score position of sequence ``i``, the
    log-probability of the token that follows; ``firsts[i]``: the score position that predicts
    generated token 0)."""
    ref_side = [[decoded[(i, p)] for p in range(len(g))] for i, g in enumerate(generated)]
    for i, (g, r) in enumerate(zip(generated, ref_side, strict=True)):
        if [t for t, _m, _lp in r] != [int(t) for t in g]:
            raise RuntimeError(f"prompt {i}: the reference arm's generations rows hold other tokens than its sequence")
    table = position_table(ref_arm, arm, generated, [[t for t, _m, _lp in r] for r in ref_side],
                           [[m for _t, m, _lp in r] for r in ref_side], _aligned(scores.argmax, firsts, generated),
                           _aligned(scores.margins, firsts, generated), firsts=None)
    ref_lp = [lp for r in ref_side for _t, _m, lp in r]
    arm_lp = _concat("arm log-probabilities", _aligned(arm_logprobs, firsts, generated), float, len(ref_lp))
    return with_distribution(table, vllm_distribution(ref_lp, arm_lp))


def _aligned(per_sequence: Sequence[Any], firsts: Sequence[int], generated: Sequence[Sequence[int]]) -> list[Any]:
    """Score positions ``first .. first + len(generated)`` of each sequence (the generated positions)."""
    return [per_sequence[i][f: f + len(g)] for i, (f, g) in enumerate(zip(firsts, generated, strict=True))]


def _run_vllm(params: dict[str, Any], ctx: UnitContext, generated: dict[int, list[int]]) -> pa.Table:
    import logging

    from tasks.models.arms import build_vllm_engine, vllm_prompts
    from tasks.models.vllm_rows import TEACHER_FORCED_LOGPROB as REF_LOGPROB

    ref = params["reference"]
    prompts = vllm_prompts(params)
    decoded, present = reference_decoding(ctx, ref["unit_id"])
    sequences = [prompts[i] + generated[i] for i in range(len(prompts))]
    engine = build_vllm_engine(params)
    firsts = [len(p) - 1 for p in prompts]  # the score position that predicts generated token 0
    scores, arm_logprobs = engine.score_logprobs(sequences, top_k=2, starts=firsts)
    engine.require_evidence()
    gen = [generated[i] for i in range(len(prompts))]
    # The reference side is its own greedy decoding (aligned to the generated positions already).
    table = vllm_table(ref["name"], params["arm"]["name"], gen, decoded, scores, arm_logprobs, firsts)
    nulls = table.column("ref_token_prob_ref").null_count
    if nulls:
        why = (f"its generations file has no {REF_LOGPROB} column (written before it existed)" if not present
               else f"{nulls} of its generated positions have {REF_LOGPROB} NULL")
        logging.getLogger(__name__).warning(
            "teacher_forced %s on %s: ref_token_prob_ref, ref_token_prob_arm and k3_ref_arm are NULL at %d of %d "
            "positions: the reference arm's generate unit %s recorded no teacher-forced log-probability there (%s)",
            params["arm"]["name"], ref["name"], nulls, table.num_rows, ref["unit_id"], why)
    return table


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
    arm_model = build_arm_model(params)
    ref_scores = ref_model.score(sequences, top_k=2)
    arm_scores = arm_model.score(sequences, top_k=2)
    lengths = [len(generated[i]) for i in range(len(prompts))]
    firsts = [len(p) - 1 for p in prompts]  # the score position that predicts generated token 0
    table = scores_table(ref["name"], params["arm"]["name"], ref_scores, arm_scores, firsts, lengths)
    dist = distribution_columns(ref_model, arm_model, sequences, firsts, lengths, ref_scores, arm_scores)
    return {"teacher_forced": with_distribution(table, dist)}


KIND = Kind(name="teacher_forced", version=VERSION, spec=None, tables=("teacher_forced",), describe=describe,
            run=run, doc=__doc__ or "")
