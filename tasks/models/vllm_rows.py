"""vLLM's outputs as the rows of :mod:`tasks.models.predictions`, and its layers as the CPU engine's.

Pure logic, tested without a GPU (tests/test_vllm_logic.py); :mod:`.vllm_engine` applies it.

* :func:`generation_from_outputs`, :func:`score_from_prompt_logprobs`, :func:`assemble_logits`,
  :func:`score_from_logits` -- vLLM's logprob structures (docs/reference/vllm-kernels.md §5) mapped to
  :class:`~tasks.models.GenerationResult` / :class:`~tasks.models.ScoreResult` rows: top-k ids
  sorted by value (ties: lower id first), margin top-1 minus top-2 in float64;
* :func:`token_logprobs`, :func:`target_logprobs`, :func:`generated_logprobs` -- the float64
  log-probability of given tokens from captured full-vocabulary logits (what the teacher-forced
  probability columns are built from on vLLM, tasks/kinds/teacher_forced.py, docs/divergence.md);
* :func:`vllm_layer_name`, :func:`split_fused` -- vLLM's fused ``qkv_proj``/``gate_up_proj`` calls as
  the per-projection layers of the CPU engine (column slices of one W8A8 GEMM are exactly the
  smaller GEMMs: INT8 accumulation and the epilogue are per output element, §2).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .predictions import GenerationResult, ScoreResult, predict_arrays, target_values

if TYPE_CHECKING:
    import torch

    from .capture import CapturedLayer

__all__ = [
    "FUSED",
    "TEACHER_FORCED_LOGPROB",
    "VllmEngineError",
    "assemble_logits",
    "generated_logprobs",
    "generation_from_outputs",
    "score_from_logits",
    "score_from_prompt_logprobs",
    "split_fused",
    "target_logprobs",
    "token_logprobs",
    "vllm_layer_name",
]


class VllmEngineError(RuntimeError):
    """The vLLM engine cannot run here, or vLLM returned something the rows cannot be built from."""


# ---------------------------------------------------------------------------------------------
# vLLM's logprob structures -> the rows of tasks.models.predictions (§5)


def _value(lp: Any) -> float:
    """A ``Logprob``'s value (``.logprob``: a raw logit under ``logprobs_mode="raw_logits"``)."""
    return float(getattr(lp, "logprob", lp))


def _rank(entry: Mapping[int, Any], top_k: int, where: str) -> tuple[list[int], list[float], float]:
    """Top-k ids and values of one position's dict, sorted by value (ties: lower id first), and
    the margin ``float64(v1) - float64(v2)`` (inf with a single entry, as ``predict``)."""
    items = sorted(((int(t), _value(lp)) for t, lp in entry.items()), key=lambda x: (-x[1], x[0]))
    if len(items) < top_k:
        raise VllmEngineError(
            f"{where}: vLLM returned {len(items)} logprob entries, {top_k} needed; ask for "
            "logprobs >= top_k + 1 (SamplingParams.logprobs, within LLM(max_logprobs=...))"
        )
    margin = items[0][1] - items[1][1] if len(items) >= 2 else math.inf
    return [t for t, _ in items[:top_k]], [v for _, v in items[:top_k]], float(margin)


def generation_from_outputs(
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Any],
    top_k: int,
    values: str = "raw_logits",
) -> GenerationResult:
    """A :class:`GenerationResult` from ``LLM.generate`` outputs (one ``RequestOutput`` per prompt).

    ``outputs[b].outputs[0].token_ids`` are the generated tokens and ``.logprobs`` one dict per
    generated position ``{token_id: Logprob(logprob, rank, decoded_token)}`` with the top-k plus
    the sampled token (§5).  Rows are sorted by value, ties to the lower id; ``values`` names what
    the values are (``raw_logits`` with the engine's ``logprobs_mode``).  ``info["argmax_mismatches"]``
    counts positions whose token is not the top-1 (greedy decoding makes it 0; the engine refuses
    anything else).
    """
    if len(outputs) != len(prompts):
        raise VllmEngineError(f"{len(outputs)} outputs for {len(prompts)} prompts")
    tokens: list[list[int]] = []
    topk_ids: list[list[list[int]]] = []
    topk_logits: list[list[list[float]]] = []
    margins: list[list[float]] = []
    mismatches: list[tuple[int, int]] = []
    for b, (prompt, ro) in enumerate(zip(prompts, outputs, strict=True)):
        got_prompt = getattr(ro, "prompt_token_ids", None)
        if got_prompt is not None and list(got_prompt) != list(prompt):
            raise VllmEngineError(f"output {b} is for another prompt (prompt token ids differ)")
        comp = ro.outputs[0]
        toks = [int(t) for t in comp.token_ids]
        lps = comp.logprobs
        if lps is None or len(lps) != len(toks):
            raise VllmEngineError(
                f"output {b}: {0 if lps is None else len(lps)} logprob entries for {len(toks)} tokens "
                "(SamplingParams(logprobs=k) must be set)"
            )
        ids_b, vals_b, mg_b = [], [], []
        for t, (tok, entry) in enumerate(zip(toks, lps, strict=True)):
            ids, vals, mg = _rank(entry, top_k, f"output {b} position {t}")
            if ids[0] != tok:
                mismatches.append((b, t))
            ids_b.append(ids)
            vals_b.append(vals)
            mg_b.append(mg)
        tokens.append(toks)
        topk_ids.append(ids_b)
        topk_logits.append(vals_b)
        margins.append(mg_b)
    info = {"engine": "vllm", "values": values, "argmax_mismatches": len(mismatches),
            "first_argmax_mismatch": list(mismatches[0]) if mismatches else None}
    return GenerationResult([list(p) for p in prompts], tokens, topk_ids, topk_logits, margins, info=info)


def score_from_prompt_logprobs(
    sequences: Sequence[Sequence[int]],
    outputs: Sequence[Any],
    top_k: int,
    last_values: str = "raw_logits",
    prompt_values: str = "raw_logits",
) -> ScoreResult:
    """A :class:`ScoreResult` from ``LLM.generate(..., SamplingParams(max_tokens=1,
    prompt_logprobs=k, logprobs=k))`` outputs, one per sequence (§5 teacher-forced replay).

    ``prompt_logprobs[0]`` is None; entry ``i >= 1`` scores prompt token ``i`` and holds its top-k
    plus that token, so ScoreResult position ``i`` (after reading ``seq[: i + 1]``) is entry
    ``i + 1`` and its target logit is entry ``i + 1``'s value of ``seq[i + 1]``.  The last position
    comes from the one generated step (``outputs[0].logprobs[0]``; target -1, NaN).

    What the prompt entries hold follows the engine's ``logprobs_mode`` (``prompt_values``): in every
    vLLM the extra allows (0.29-0.32), both model runners compute prompt scores "respecting
    logprobs_mode" -- raw logits under ``raw_logits``, the engine's mode (v1/worker/gpu/sample/
    prompt_logprob.py, gpu_model_runner.py; `make vllm-contract` checks it) -- so ``info["values"]``
    is ``prompt_values`` (``raw_logits``), not "logprobs" (issue #37: raw logits had been labelled
    log-probabilities). ``info["last_position_values"]`` names the last position's kind. Under a
    log-probability mode a log-softmax shifts every value by one fp32 subtraction, which can merge two
    logits a few spacings apart into a tie: where near-ties matter, :func:`score_from_logits` (the
    engine's default) is exact.
    """
    if len(outputs) != len(sequences):
        raise VllmEngineError(f"{len(outputs)} outputs for {len(sequences)} sequences")
    res = ScoreResult([list(s) for s in sequences],
                      info={"engine": "vllm", "values": prompt_values, "last_position_values": last_values})
    for s, (seq, ro) in enumerate(zip(sequences, outputs, strict=True)):
        pl = ro.prompt_logprobs
        if pl is None or len(pl) != len(seq):
            raise VllmEngineError(
                f"sequence {s}: {0 if pl is None else len(pl)} prompt logprob entries for {len(seq)} "
                "tokens (SamplingParams(prompt_logprobs=k) must be set)"
            )
        if pl[0] is not None:
            raise VllmEngineError(f"sequence {s}: prompt_logprobs[0] must be None (vLLM's convention, §5)")
        am, tk, tl, mg, tg, tv = [], [], [], [], [], []
        for i in range(len(seq) - 1):
            entry = pl[i + 1]
            ids, vals, m = _rank(entry, top_k, f"sequence {s} position {i}")
            target = int(seq[i + 1])
            if target not in entry:
                raise VllmEngineError(
                    f"sequence {s} position {i}: the prompt token {target} is missing from its "
                    "prompt logprobs (vLLM always includes it)"
                )
            am.append(ids[0])
            tk.append(ids)
            tl.append(vals)
            mg.append(m)
            tg.append(target)
            tv.append(_value(entry[target]))
        comp = ro.outputs[0]
        if not comp.logprobs:
            raise VllmEngineError(f"sequence {s}: no logprobs for the generated step (SamplingParams(logprobs=k))")
        ids, vals, m = _rank(comp.logprobs[0], top_k, f"sequence {s} position {len(seq) - 1}")
        am.append(ids[0])
        tk.append(ids)
        tl.append(vals)
        mg.append(m)
        tg.append(-1)
        tv.append(float("nan"))
        res.append(am, tk, tl, mg, tg, tv)
    return res


def assemble_logits(
    captures: Sequence[torch.Tensor],
    n_tokens: int,
    generated_token: int,
    prompt_logprobs: Sequence[Any] | None = None,
    atol: float = 1e-3,
    prompt_values: str = "raw_logits",
) -> torch.Tensor:
    """The ``[n_tokens, V]`` logits of one teacher-forced sequence from the ``compute_logits``
    outputs recorded while vLLM scored it (one request, ``max_tokens=1``, no chunked prefill).

    vLLM computes the logits of the sampled position (1 row) and, for ``prompt_logprobs``, of the
    prompt positions ``0 .. n-2`` (``n - 1`` rows), in either order; a runner that computes all
    ``n`` rows at once is accepted too.  Which capture is which is decided by row counts, and,
    when they are ambiguous (``n == 2``), by checking the candidate prompt rows against the returned
    ``prompt_logprobs`` (within ``atol``): the rows themselves when the entries are raw logits
    (``prompt_values``, the engine's ``logprobs_mode``), their ``log_softmax`` when log-probabilities.  The last row must have the
    generated token as its argmax.

    Raises:
        VllmEngineError: no consistent assignment (the message lists the captured row counts).
    """
    import torch

    rows = [int(c.shape[0]) for c in captures]
    found: torch.Tensor | None = None
    full = [c for c in captures if c.shape[0] == n_tokens]
    if n_tokens == 1:
        if full:
            found = full[-1]
    else:
        prompt_cands = [c for c in captures if c.shape[0] == n_tokens - 1]
        last_cands = [c for c in captures if c.shape[0] == 1]
        if prompt_logprobs is not None:
            prompt_cands = [c for c in prompt_cands if _matches_prompt_entries(c, prompt_logprobs, atol, prompt_values)]
        for p in prompt_cands:
            for last in last_cands:
                if last is p:
                    continue
                found = torch.cat([p.to(last.dtype), last], dim=0)
                break
            if found is not None:
                break
        if found is None and full:
            found = full[-1]
        if found is None and last_cands:
            # vLLM 0.32's V2 runner computes prompt logits in chunks of 1024 rows (v1/worker/gpu/sample/
            # prompt_logprob.py, CHUNK_SIZE): a longer prompt is several captures, in order, besides the
            # sampled position's one row (issue #37: such sequences had failed here)
            for last in reversed(last_cands):
                chunks = [c for c in captures if c is not last]
                if chunks and sum(int(c.shape[0]) for c in chunks) == n_tokens - 1:
                    joined = torch.cat([c.to(last.dtype) for c in chunks], dim=0)
                    if prompt_logprobs is None or _matches_prompt_entries(joined, prompt_logprobs, atol, prompt_values):
                        found = torch.cat([joined, last], dim=0)
                        break
    if found is None:
        raise VllmEngineError(
            f"could not find the logits of a {n_tokens}-token sequence among the compute_logits calls "
            f"(row counts {rows}); score(values='logprobs') maps vLLM's prompt_logprobs instead"
        )
    last_row = found[-1].float()
    top = int(torch.argmax(last_row).item())
    if top != int(generated_token) and not bool(last_row[int(generated_token)] == last_row[top]):
        raise VllmEngineError(
            f"the last captured logits row has argmax {top}, but vLLM generated {generated_token}"
        )
    return found


def _matches_prompt_entries(rows: torch.Tensor, prompt_logprobs: Sequence[Any], atol: float,
                            prompt_values: str = "raw_logits") -> bool:
    """``rows[i][t] ~ prompt_logprobs[i + 1][t]`` for every returned entry, ``rows`` taken as they are
    for raw or processed logits, through ``log_softmax`` for log-probabilities."""
    import torch

    logits = prompt_values in ("raw_logits", "processed_logits")
    lsm = (rows.float() if logits else torch.log_softmax(rows.float(), dim=-1)).cpu()
    for i in range(int(rows.shape[0])):
        entry = prompt_logprobs[i + 1] if i + 1 < len(prompt_logprobs) else None
        if entry is None:
            return False
        for t, lp in entry.items():
            want = _value(lp)
            if not abs(float(lsm[i, int(t)]) - want) <= atol + 1e-4 * abs(want):
                return False
    return True


def score_from_logits(
    sequences: Sequence[Sequence[int]], logits: Sequence[torch.Tensor], top_k: int
) -> ScoreResult:
    """A :class:`ScoreResult` from each sequence's ``[L, V]`` raw logits, computed exactly as the
    CPU engine does (:func:`tasks.models.predictions.predict`: fp32, stable descending sort)."""
    import torch

    if len(logits) != len(sequences):
        raise VllmEngineError(f"{len(logits)} logits tensors for {len(sequences)} sequences")
    res = ScoreResult([list(s) for s in sequences], info={"engine": "vllm", "values": "raw_logits"})
    for seq, lg in zip(sequences, logits, strict=True):
        if int(lg.shape[0]) != len(seq):
            raise VllmEngineError(f"logits have {int(lg.shape[0])} rows for a {len(seq)}-token sequence")
        lg32 = lg.to(torch.float32)
        am, tk, tl, mg = predict_arrays(lg32, top_k)
        targets = np.array([int(t) for t in seq[1:]] + [-1], dtype=np.int64)
        res.append(am, tk, tl, mg, targets, target_values(lg32, targets))
    return res


# ---------------------------------------------------------------------------------------------
# log-probabilities of given tokens from full-vocabulary logits

#: The ``generations`` column (float64, natural log) a vLLM arm's restart-0 generate unit fills with
#: each generated token's log-probability under its own teacher-forced pass (tasks/kinds/generate.py);
#: the reference side of the teacher_forced probability columns on vLLM (tasks/kinds/teacher_forced.py).
TEACHER_FORCED_LOGPROB = "teacher_forced_token_logprob"


def token_logprobs(logits: Any, tokens: Any) -> np.ndarray:
    """``log softmax(logits[i])[tokens[i]]`` of ``P`` positions in float64 (natural log), on the
    logits' device, returned as a numpy array ``[P]``.

    ``logits`` ``[P, V]`` (torch or numpy, any float dtype) is widened to float64 before the
    log-softmax, the very operations of :func:`tasks.kinds.teacher_forced.distribution_arrays`
    (``torch.log_softmax`` then ``gather``), so on the same logits and device the two give the same
    bits (tests/test_vllm_probs.py).
    """
    import torch

    lg = torch.as_tensor(logits).to(torch.float64)
    if lg.ndim != 2:
        raise ValueError(f"logits of shape {tuple(lg.shape)}: must be [positions, vocab]")
    tok = torch.as_tensor(np.asarray(tokens, dtype=np.int64)).to(lg.device)
    if tok.shape != (lg.shape[0],):
        raise ValueError(f"{tuple(tok.shape)} tokens for {lg.shape[0]} positions")
    if tok.numel() and (int(tok.min()) < 0 or int(tok.max()) >= lg.shape[1]):
        raise ValueError(f"token ids outside the vocabulary of {lg.shape[1]}")
    got: np.ndarray = torch.log_softmax(lg, dim=-1).gather(1, tok.unsqueeze(1)).squeeze(1).cpu().numpy()
    return got


def target_logprobs(logits: Any, sequence: Sequence[int], start: int = 0) -> np.ndarray:
    """Per position ``i`` of one teacher-forced sequence (``[L, V]`` logits, ``L = len(sequence)``),
    the float64 log-probability of the token that follows, ``sequence[i + 1]`` (:func:`token_logprobs`);
    NaN at the last position (no token follows), as ``ScoreResult.target_logits``, and before ``start``
    (positions not asked for: the float64 log-softmax of a row of a large vocabulary is the cost)."""
    n = len(sequence)
    if int(logits.shape[0]) != n:
        raise VllmEngineError(f"logits have {int(logits.shape[0])} rows for a {n}-token sequence")
    out = np.full(n, np.nan, dtype=np.float64)
    lo = max(0, int(start))
    if n - 1 > lo:
        out[lo:-1] = token_logprobs(logits[lo:-1], [int(t) for t in sequence[lo + 1:]])
    return out


def generated_logprobs(prompts: Sequence[Sequence[int]], generated: Sequence[Sequence[int]],
                       per_sequence: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per prompt ``i``, the log-probability of each generated token ``p`` from the teacher-forced
    :func:`target_logprobs` of the sequence ``prompts[i] + generated[i]``: score position
    ``len(prompts[i]) - 1 + p`` (the one that predicts generated token ``p``)."""
    if not len(prompts) == len(generated) == len(per_sequence):
        raise VllmEngineError(f"{len(per_sequence)} scored sequences for {len(prompts)} prompts and "
                              f"{len(generated)} generations")
    out = []
    for i, (p, g, lp) in enumerate(zip(prompts, generated, per_sequence, strict=True)):
        if len(lp) != len(p) + len(g):
            raise VllmEngineError(f"sequence {i}: {len(lp)} scored positions for {len(p)} prompt and {len(g)} "
                                  "generated tokens")
        if not p:
            raise VllmEngineError(f"sequence {i}: an empty prompt predicts no generated token")
        first = len(p) - 1
        out.append(np.asarray(lp[first: first + len(g)], dtype=np.float64))
    return out


# ---------------------------------------------------------------------------------------------
# layer names and fused layers

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
#: vLLM's fused projections and the CPU engine's projections they hold, in output order.
FUSED: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_FUSED_TYPES = {"self_attn.qkv_proj": "qkv", "mlp.gate_up_proj": "gate_up"}


def vllm_layer_name(name: str) -> tuple[str, int, str]:
    """``"model.layers.3.self_attn.qkv_proj"`` -> ``("layers.3.self_attn.qkv_proj", 3, "qkv")``.

    Layer types are the CPU engine's (q, k, v, o, gate, up, down) and ``qkv``/``gate_up`` for
    vLLM's fused projections; a module outside ``layers.<i>`` keeps its name, index -1.
    """
    from .linear import PROJECTIONS

    m = _LAYER_RE.search(name)
    if m is None:
        return name, -1, name.rsplit(".", 1)[-1].removesuffix("_proj")
    index, rest = int(m.group(1)), m.group(2)
    kind = PROJECTIONS.get(rest) or _FUSED_TYPES.get(rest) or rest.rsplit(".", 1)[-1].removesuffix("_proj")
    return f"layers.{index}.{rest}", index, kind


def split_fused(c: CapturedLayer, output_sizes: Sequence[int], calls: dict[str, int] | None = None) -> list[CapturedLayer]:
    """A captured fused-projection call as one captured call per projection (column slices).

    Output column ``j`` of a W8A8 GEMM depends only on weight row ``j``, its scale and bias ``j``
    (int32 accumulation is exact, the epilogue is elementwise; §2), so the slice of a fused call is
    bit for bit the call of the projection alone.  ``calls`` counts calls per split name (for
    ``call``); a layer that is not fused, or whose sizes do not add up to N, is returned as is.
    """
    from .capture import CapturedLayer
    from .linear import PROJECTIONS

    m = _LAYER_RE.search(c.name)
    rest = m.group(2) if m else ""
    parts = FUSED.get(rest)
    if parts is None or len(output_sizes) != len(parts) or sum(output_sizes) != c.n:
        return [c]
    counter = calls if calls is not None else {}
    out = []
    start = 0
    for part, size in zip(parts, output_sizes, strict=True):
        cols = slice(start, start + size)
        start += size
        name = f"layers.{c.index}.{part}"
        call = counter.get(name, 0)
        counter[name] = call + 1
        out.append(CapturedLayer(
            name=name,
            index=c.index,
            layer_type=PROJECTIONS[part],
            x_q=c.x_q,
            x_scale=c.x_scale,
            w_q=c.w_q[cols].contiguous(),
            w_scale=c.w_scale[cols].contiguous() if c.w_scale.numel() == c.n else c.w_scale,
            bias=None if c.bias is None else c.bias[cols].contiguous(),
            output=c.output[:, cols].contiguous(),
            kernel=c.kernel,
            kernel_params=dict(c.kernel_params),
            call=call,
        ))
    return out
