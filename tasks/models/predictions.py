"""Per-position predictions: what greedy generation and teacher-forced scoring return.

Both results hold, per sequence and position, the top-k token ids in order (largest logit first;
equal logits by lower token id first, so ``topk_ids[..][0]`` is ``argmax``, the first maximal id),
their fp32 logits, and the top-1/top-2 margin ``float64(l1) - float64(l2)`` (exact for fp32 logits of
similar magnitude; 0.0 at an exact tie).  ``rows()`` flattens them to one dict per position.

:class:`GenerationResult` holds Python lists (it is built one decoding step at a time);
:class:`ScoreResult` holds one numpy array per sequence and field (int64 ids, float64 values: the
fp32 logits widened exactly, so every value equals the Python float it used to be), so the
``teacher_forced`` rows are built column by column without a Python object per position.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["FloatArray", "GenerationResult", "IntArray", "ScoreResult", "predict", "predict_arrays", "sequence_hash",
           "target_values"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def sequence_hash(tokens: list[int]) -> str:
    """sha256 (hex) of a token list's canonical JSON: equal hashes <=> equal token sequences."""
    return hashlib.sha256(json.dumps([int(t) for t in tokens]).encode()).hexdigest()


def _top_sorted(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` columns of ``torch.sort(x, dim=-1, descending=True, stable=True)``, bit for bit.

    A full stable sort of every row costs far more than the top few: take the k largest values
    (``topk``: their multiset does not depend on how it breaks ties), keep every column at least
    as large as the k-th of them -- ties at the threshold included -- and sort only those columns,
    stably, in ascending column order, which is the order a stable sort of the whole row keeps
    them in.  More candidates than k in a row (a tie at the threshold), or a non-finite value
    anywhere, falls back to the full sort.
    """
    def full_sort() -> tuple[torch.Tensor, torch.Tensor]:
        values, ids = torch.sort(x, dim=-1, descending=True, stable=True)
        return values[:, :k], ids[:, :k]

    # a finite sum means no NaN or inf (an overflowing sum only sends a finite row to the full sort)
    if k >= int(x.shape[1]) or not math.isfinite(float(x.sum())):
        return full_sort()
    threshold = torch.topk(x, k, dim=-1, sorted=True).values[:, k - 1:k]
    keep = x >= threshold
    if not bool((keep.sum(dim=-1) == k).all()):
        return full_sort()
    cols = keep.nonzero()[:, 1].reshape(-1, k)  # row-major: ascending columns per row
    values, order = torch.sort(x.gather(1, cols), dim=-1, descending=True, stable=True)
    return values, cols.gather(1, order)


def _predict(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`predict` as tensors: argmax ``[P]`` and top-k ids ``[P, k]`` (int64), top-k logits
    ``[P, k]`` (fp32), margins ``[P]`` (fp64)."""
    if logits.dim() != 2:
        raise ValueError(f"predict takes [P, V] logits, got shape {tuple(logits.shape)}")
    vocab = int(logits.shape[1])
    if not 1 <= top_k <= vocab:
        raise ValueError(f"top_k must be between 1 and the vocabulary size {vocab}, got {top_k}")
    values, ids = _top_sorted(logits.to(torch.float32), min(max(top_k, 2), vocab))
    v64 = values[:, :2].to(torch.float64)
    margins = (v64[:, 0] - v64[:, 1]) if vocab >= 2 else torch.full_like(v64[:, 0], float("inf"))
    return ids[:, 0], ids[:, :top_k], values[:, :top_k], margins


def predict(logits: torch.Tensor, top_k: int) -> tuple[list[int], list[list[int]], list[list[float]], list[float]]:
    """``(argmax, topk_ids, topk_logits, margins)`` for logits ``[P, V]`` (one entry per row).

    Sorted with a stable descending sort, so ties keep the lower token id first (module docstring).
    """
    am, ids, values, margins = _predict(logits, top_k)
    return am.tolist(), ids.tolist(), values.tolist(), margins.tolist()


def _numpy(t: torch.Tensor, dtype: torch.dtype) -> Any:
    """``t`` as a contiguous numpy array on the host (``dtype``; shares memory with ``t`` where it can)."""
    return t.detach().to(device="cpu", dtype=dtype).contiguous().numpy()


def predict_arrays(logits: torch.Tensor, top_k: int) -> tuple[IntArray, IntArray, FloatArray, FloatArray]:
    """:func:`predict` as numpy arrays, the same values bit for bit: ``argmax [P]`` and
    ``topk_ids [P, k]`` (int64), ``topk_logits [P, k]`` (the fp32 logits as float64, exactly) and
    ``margins [P]`` (float64)."""
    am, ids, values, margins = _predict(logits, top_k)
    return (_numpy(am, torch.int64), _numpy(ids, torch.int64), _numpy(values, torch.float64),
            _numpy(margins, torch.float64))


def target_values(logits: torch.Tensor, targets: IntArray) -> FloatArray:
    """``logits[i, targets[i]]`` of ``[P, V]`` logits as float64 (the fp32 value exactly), NaN where
    ``targets[i] < 0`` (the last position of a sequence has no next token)."""
    index = torch.from_numpy(np.maximum(targets, 0)).to(device=logits.device, dtype=torch.long)
    out: FloatArray = _numpy(logits.gather(1, index.unsqueeze(1)).squeeze(1), torch.float64)
    out[targets < 0] = np.nan
    return out


@dataclass
class GenerationResult:
    """Greedy generation of one batch.

    ``tokens[b][t]`` is the token chosen at generated position ``t`` of prompt ``b`` (always
    ``max_new_tokens`` of them: end-of-sequence tokens do not stop generation, so arms stay
    comparable position by position); ``topk_ids``/``topk_logits`` ``[b][t][k]``; ``margins[b][t]``.
    """

    prompts: list[list[int]]
    tokens: list[list[int]]
    topk_ids: list[list[list[int]]]
    topk_logits: list[list[list[float]]]
    margins: list[list[float]]
    info: dict[str, Any] = field(default_factory=dict)

    def sequences(self) -> list[list[int]]:
        """Prompt + generated tokens, per prompt (what ``score`` takes for teacher forcing)."""
        return [list(p) + list(t) for p, t in zip(self.prompts, self.tokens, strict=True)]

    def sequence_hashes(self) -> list[str]:
        """:func:`sequence_hash` of each generated continuation (prompt excluded)."""
        return [sequence_hash(t) for t in self.tokens]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per (sequence, generated position)."""
        out = []
        for b, toks in enumerate(self.tokens):
            for t, tok in enumerate(toks):
                out.append({
                    "sequence": b,
                    "position": t,
                    "prompt_len": len(self.prompts[b]),
                    "token": tok,
                    "topk_ids": self.topk_ids[b][t],
                    "topk_logits": self.topk_logits[b][t],
                    "margin": self.margins[b][t],
                })
        return out


@dataclass
class ScoreResult:
    """Teacher-forced scores: one forward pass per sequence, every position scored.

    Position ``i`` of sequence ``s`` is the prediction after reading ``sequences[s][: i + 1]``:
    ``argmax[s][i]``, ``topk_ids``/``topk_logits`` ``[s][i, k]``, ``margins[s][i]``;
    ``targets[s][i]`` is the token that follows (``sequences[s][i + 1]``, -1 at the last
    position) and ``target_logits[s][i]`` its logit (NaN at the last position).

    Each field but ``sequences`` is one numpy array per sequence (:meth:`append`): int64 for ids,
    float64 for logits and margins (fp32 logits widened exactly). ``.tolist()`` of an array gives
    the Python values the lists of earlier versions held, bit for bit.
    """

    sequences: list[list[int]]
    argmax: list[IntArray] = field(default_factory=list)
    topk_ids: list[IntArray] = field(default_factory=list)
    topk_logits: list[FloatArray] = field(default_factory=list)
    margins: list[FloatArray] = field(default_factory=list)
    targets: list[IntArray] = field(default_factory=list)
    target_logits: list[FloatArray] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def append(self, argmax: Any, topk_ids: Any, topk_logits: Any, margins: Any, targets: Any,
               target_logits: Any) -> None:
        """Add the next sequence's scores (array-likes of its ``L`` positions; ``topk_*`` ``[L, k]``),
        stored as int64 / float64 arrays (no copy of arrays that already have that dtype)."""
        n = len(argmax)
        ids = np.asarray(topk_ids, dtype=np.int64)
        self.argmax.append(np.asarray(argmax, dtype=np.int64))
        self.topk_ids.append(ids.reshape(n, -1) if n else ids.reshape(0, 0))
        logits = np.asarray(topk_logits, dtype=np.float64)
        self.topk_logits.append(logits.reshape(n, -1) if n else logits.reshape(0, 0))
        self.margins.append(np.asarray(margins, dtype=np.float64))
        self.targets.append(np.asarray(targets, dtype=np.int64))
        self.target_logits.append(np.asarray(target_logits, dtype=np.float64))

    def rows(self) -> list[dict[str, Any]]:
        """One dict per (sequence, position), of Python values."""
        out = []
        for s, am in enumerate(self.argmax):
            targets, target_logits = self.targets[s].tolist(), self.target_logits[s].tolist()
            topk_ids, topk_logits = self.topk_ids[s].tolist(), self.topk_logits[s].tolist()
            margins = self.margins[s].tolist()
            for i, a in enumerate(am.tolist()):
                out.append({
                    "sequence": s,
                    "position": i,
                    "argmax": a,
                    "target": targets[i],
                    "target_logit": target_logits[i],
                    "topk_ids": topk_ids[i],
                    "topk_logits": topk_logits[i],
                    "margin": margins[i],
                })
        return out
