"""The per-token figures reinforcement-learning teams read off two log-probabilities, defined once.

RL trainers compare the log-probability a *trainer* assigns to a token with the one the *rollout
engine* assigned when it sampled it (docs/rl-metrics.md). Three things make those numbers mean
something other than what they say: the two sides are different distributions (one engine returns
*processed* log-probabilities -- after temperature, top-k and top-p renormalisation -- the other *raw*
ones), the per-token values are aggregated differently (a sum over the sequence vs a mean), and the
KL is taken in the other direction. Every formula here names its direction and its aggregation.

Notation. ``q`` is the distribution the tokens were drawn from (the *sampler*: the rollout engine in
RL, the reference arm in ``report divergence``), ``p`` the other one (the trainer; the other arm);
``x ~ q`` a token, ``log r = log p(x) - log q(x)``, ``r = p(x) / q(x)``.

====================  ==================================  ===============================================
figure                formula                             estimates / means
====================  ==================================  ===============================================
importance ratio      ``r = exp(log p(x) - log q(x))``    in RL ``p_train / p_engine``: the per-token
                                                          off-policy correction (:func:`importance_ratio`)
k1                    ``-log r``                          KL(q || p), unbiased, can be negative
k2                    ``(log r)**2 / 2``                  KL(q || p), biased, non-negative, low variance
k3                    ``(r - 1) - log r``                 KL(q || p), unbiased, non-negative
exact KL              ``sum_v q(v) (log q(v) - log p(v))``  KL(q || p) over the whole vocabulary
====================  ==================================  ===============================================

k1, k2 and k3 are the estimators of J. Schulman, "Approximating KL Divergence" (2020): for ``x ~ q``,
their means estimate KL(q || p) -- *the sampler first*. With the engine as the sampler, k3 estimates
KL(p_engine || p_train), not KL(p_train || p_engine); the two differ (:func:`kl_exact` both ways on a
planted pair: tests/test_rl_metrics.py). ``report divergence``'s k3 (``teacher_forced.k3_ref_arm``)
has q = the reference arm, p = the arm: KL(ref || arm), the direction of its exact ``kl_ref_arm``.

**Null controls.** Identical log-probabilities give ``log r = 0`` exactly -- also where both are
``-inf`` (a token a processed distribution masked out, where ``-inf - (-inf)`` would be NaN) -- so the
ratio is ``exp(0) = 1`` and k1, k2, k3 are 0, bit for bit, in every float dtype (:func:`null_controls`).

**Exactness.** k3 is computed as ``expm1(log r) - log r`` (no cancellation near r = 1). Everything
runs in the dtype of the inputs (float64 in the reports); :func:`log_ratio` of two finite values is
the plain difference, so these are the operations ``teacher_forced.distribution_arrays`` always
applied, and its columns are unchanged bit for bit (tests/test_divergence_kind.py).

**Aggregation** (:func:`aggregate`): ``token-mean`` (every token of every sequence weighs the same:
sum / total tokens -- ``report divergence``'s "mean per position"), ``sequence-mean`` (each
sequence's mean, then their mean), ``sequence-sum`` (each sequence's sum, then their mean --
``report divergence``'s "mismatch KL per sequence"). For the ratio, :func:`sequence_ratios` gives the
token-level ratios' mean, the sequence-level ratio ``exp(sum log r)`` and its geometric mean per token
``exp(mean log r)``: on bit-identical per-token values they differ by orders of magnitude on long
sequences (huggingface/trl #5814: a ratio's mean moved from 0.569 to 0.993 by the aggregation alone).

**Raw vs processed** (:func:`raw_logprobs`, :func:`processed_logprobs`): raw = ``log_softmax(logits)``;
processed = the log-probabilities of the distribution the sampler draws from: logits / temperature,
then top-k (keep every logit >= the k-th largest), then top-p (keep the smallest set of the largest
probabilities whose mass reaches p, at least one token), renormalised; masked tokens get ``-inf``.
This is the order vLLM's sampler applies (temperature, then top-k/top-p; docs/rl-metrics.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["AGGREGATIONS", "Sampling", "aggregate", "importance_ratio", "k1", "k2", "k3", "kl_exact", "log_ratio",
           "null_controls", "processed_logprobs", "raw_logprobs", "sequence_ratios", "token_logprobs"]

#: How per-token values become one figure (:func:`aggregate`).
AGGREGATIONS = ("token-mean", "sequence-mean", "sequence-sum")


def _t(x: Any) -> torch.Tensor:
    import torch

    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def log_ratio(logp_p: Any, logp_q: Any) -> torch.Tensor:
    """``log r = log p(x) - log q(x)``, 0 where the two are equal (both ``-inf`` included).

    For finite inputs this is the plain difference (a - a = +0 exactly); only ``-inf - (-inf)``,
    which would be NaN, becomes 0: the same token masked out by both sides is no mismatch. A NaN
    input stays NaN.
    """
    import torch

    a, b = _t(logp_p), _t(logp_q)
    return torch.where(a == b, torch.zeros((), dtype=a.dtype), a - b)


def importance_ratio(logp_p: Any, logp_q: Any) -> torch.Tensor:
    """Per-token ``r = exp(log p(x) - log q(x))``; in RL ``logp_p`` is the trainer's, ``logp_q`` the
    engine's (the sampler's): ``r = p_train / p_engine``. Exactly 1 where the two are identical."""
    return log_ratio(logp_p, logp_q).exp()


def k1(logp_p: Any, logp_q: Any) -> torch.Tensor:
    """Schulman's k1 = ``-log r``: unbiased for KL(q || p) under ``x ~ q``, per token may be negative.
    Computed as ``0 - log r`` so that identical inputs give ``+0`` (negation would give ``-0``)."""
    lr = log_ratio(logp_p, logp_q)
    return lr.new_zeros(()) - lr


def k2(logp_p: Any, logp_q: Any) -> torch.Tensor:
    """Schulman's k2 = ``(log r)**2 / 2``: non-negative, biased estimate of KL(q || p) under ``x ~ q``."""
    lr = log_ratio(logp_p, logp_q)
    return lr * lr / 2


def k3(logp_p: Any, logp_q: Any) -> torch.Tensor:
    """Schulman's k3 = ``(r - 1) - log r`` computed as ``expm1(log r) - log r``: unbiased and
    non-negative for KL(q || p) under ``x ~ q`` (q: the sampler, the second argument)."""
    import torch

    lr = log_ratio(logp_p, logp_q)
    return torch.expm1(lr) - lr


def kl_exact(logp_q: Any, logp_p: Any, dim: int = -1) -> torch.Tensor:
    """``KL(q || p) = sum_v q(v) (log q(v) - log p(v))`` over ``dim`` (the vocabulary), from full
    log-probability rows; terms with ``q(v) = 0`` are 0. Note the order: the *first* argument is the
    distribution the expectation is under."""
    import torch

    lq, lp = _t(logp_q), _t(logp_p)
    q = lq.exp()
    terms = torch.where(q > 0, q * (lq - lp), torch.zeros_like(q))
    return terms.sum(dim=dim)


def raw_logprobs(logits: Any) -> torch.Tensor:
    """``log_softmax(logits)`` in float64 over the last axis: what the model's distribution is."""
    import torch

    return torch.log_softmax(_t(logits).to(torch.float64), dim=-1)


def token_logprobs(logprobs: Any, tokens: Any) -> torch.Tensor:
    """Each row's entry at its token: ``[P, V]`` log-probabilities and ``[P]`` token ids -> ``[P]``."""
    import numpy as np
    import torch

    lp = _t(logprobs)
    tok = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    if lp.ndim != 2 or tok.shape != (lp.shape[0],):
        raise ValueError(f"{tuple(tok.shape)} tokens for log-probabilities of shape {tuple(lp.shape)}: "
                         "need [positions, vocab] and [positions]")
    return lp.gather(1, tok.unsqueeze(1)).squeeze(1)


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters as vLLM's ``SamplingParams`` reads them: ``top_k`` 0 or -1 and ``top_p``
    1 mean off; ``temperature`` 0 is greedy (no distribution to renormalise: :func:`processed_logprobs`
    refuses it)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature {self.temperature}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p}: must be in (0, 1]")
        if self.top_k < -1:
            raise ValueError(f"top_k {self.top_k}: must be -1, 0 (off) or a count")

    @property
    def neutral(self) -> bool:
        """True when processed and raw log-probabilities are the same distribution."""
        return self.temperature == 1 and self.top_p == 1 and self.top_k <= 0

    def label(self) -> str:
        """``temperature 0.7, top-p 0.9, top-k 20`` (only the parameters that are on)."""
        parts = [f"temperature {self.temperature:g}"]
        if self.top_p < 1:
            parts.append(f"top-p {self.top_p:g}")
        if self.top_k > 0:
            parts.append(f"top-k {self.top_k}")
        return ", ".join(parts)


def processed_logprobs(logits: Any, sampling: Sampling) -> torch.Tensor:
    """The log-probabilities (float64, ``[..., V]``) of the distribution a sampler with ``sampling``
    draws from: ``logits / T``, top-k, top-p, renormalised; masked tokens ``-inf`` (module docstring).

    Top-k keeps every logit >= the k-th largest (ties at the k-th kept). Top-p sorts the (top-k)
    probabilities in descending order and keeps a token while the mass *before* it is < p, so the
    largest is always kept and the kept mass reaches p.
    """
    import torch

    if sampling.temperature == 0:
        raise ValueError("temperature 0 is greedy: there is no sampling distribution to renormalise")
    z = _t(logits).to(torch.float64) / sampling.temperature
    v = z.shape[-1]
    if 0 < sampling.top_k < v:
        kth = torch.topk(z, sampling.top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if sampling.top_p < 1:
        probs = torch.softmax(z, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = before >= sampling.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return torch.log_softmax(z, dim=-1)


def _segments(values: Any, lengths: Sequence[int]) -> list[torch.Tensor]:
    v = _t(values)
    if v.ndim != 1 or sum(lengths) != v.shape[0] or any(n < 0 for n in lengths):
        raise ValueError(f"{v.shape[0] if v.ndim == 1 else tuple(v.shape)} values for sequences of lengths "
                         f"summing to {sum(lengths)}")
    return list(v.split(list(lengths)))


def aggregate(values: Any, lengths: Sequence[int], how: str) -> float:
    """One figure from per-token ``values`` of consecutive sequences of ``lengths`` tokens:
    ``token-mean`` = sum / total tokens; ``sequence-mean`` = mean over sequences of each one's mean
    (empty sequences left out); ``sequence-sum`` = mean over sequences of each one's sum."""
    import torch

    segs = _segments(values, lengths)
    if how == "token-mean":
        n = sum(lengths)
        return float(torch.cat(segs).sum() / n) if n else float("nan")
    if how == "sequence-mean":
        means = [s.mean() for s in segs if s.numel()]
        return float(torch.stack(means).mean()) if means else float("nan")
    if how == "sequence-sum":
        return float(torch.stack([s.sum() for s in segs]).mean()) if segs else float("nan")
    raise ValueError(f"aggregation {how!r}: one of {', '.join(AGGREGATIONS)}")


def sequence_ratios(logp_p: Any, logp_q: Any, lengths: Sequence[int]) -> dict[str, float]:
    """The importance ratio three ways over consecutive sequences of ``lengths`` tokens:
    ``token_mean`` (mean of the per-token ratios over all tokens), ``sequence`` (mean over sequences of
    ``exp(sum log r)``, the ratio of the sequences' probabilities) and ``sequence_geometric`` (mean over
    sequences of ``exp(mean log r)``, the per-token geometric mean)."""
    import torch

    lr = log_ratio(logp_p, logp_q)
    segs = [s for s in _segments(lr, lengths) if s.numel()]
    if not segs:
        return {"token_mean": float("nan"), "sequence": float("nan"), "sequence_geometric": float("nan")}
    return {"token_mean": float(torch.cat(segs).exp().mean()),
            "sequence": float(torch.stack([s.sum().exp() for s in segs]).mean()),
            "sequence_geometric": float(torch.stack([s.mean().exp() for s in segs]).mean())}


#: The dtypes the null controls run in (every float dtype torch computes these in on a CPU).
NULL_DTYPES = ("float64", "float32", "bfloat16", "float16")


def null_controls(logprobs: Any, dtypes: Sequence[str] = NULL_DTYPES) -> list[dict[str, Any]]:
    """Identical log-probabilities on both sides, in each dtype: the importance ratio must be exactly
    1 and k1, k2, k3 and the exact KL exactly 0 (``+0``: bits compared, so ``-0`` fails too).

    ``logprobs``: ``[P, V]`` rows (``-inf`` allowed: masked tokens), or ``[P]`` token values (then no
    exact KL). One row per (dtype, figure): ``{"dtype", "figure", "expected", "values", "bad",
    "worst"}``; ``bad`` counts the values whose bits differ from the expected value's.
    """
    import torch

    out = []
    base = _t(logprobs)
    for name in dtypes:
        dt = getattr(torch, name)
        a = base.to(dt)
        b = a.clone()  # another tensor of the same bits: nothing may short-cut on identity
        figures: dict[str, tuple[torch.Tensor, float]] = {
            "importance_ratio": (importance_ratio(a, b), 1.0), "k1": (k1(a, b), 0.0), "k2": (k2(a, b), 0.0),
            "k3": (k3(a, b), 0.0)}
        if a.ndim == 2:
            figures["kl_exact"] = (kl_exact(a, b), 0.0)
        for fig, (got, want) in figures.items():
            expected = torch.full_like(got, want)
            same = _bits(got) == _bits(expected)
            bad = int((~same).sum())
            worst = None if bad == 0 else float(got.reshape(-1)[(~same).reshape(-1).nonzero()[0, 0]])
            out.append({"dtype": name, "figure": fig, "expected": want, "values": int(got.numel()), "bad": bad,
                        "worst": worst})
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    import torch

    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}
    return t.contiguous().view(ints[t.element_size()])
