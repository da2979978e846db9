"""``check attention``: an attention kernel's output and logsumexp against an algorithm's bounds.

Each trial draws seeded ``q``, ``k``, ``v`` (float32 normals cast to the check's dtype) for one
shape ``B x H x L x S x D`` and one input kind, runs the kernel (:mod:`tasks.attention`), and judges
every element of its output and logsumexp with the named :class:`~tasks.numerics.attention.AttentionAlgorithm`:
an element the algorithm cannot produce (``may_be`` False) makes the trial INCORRECT; otherwise the
output is compared with the float64 attention rounded once to the dtype and the differences end in
IDENTICAL, EPILOGUE_ROUNDING or WITHIN_ALGORITHM_BOUND (:func:`tasks.verdicts.classify_differences`).

==================  ===========================================================================
input kind          what it draws
==================  ===========================================================================
``randn``           q, k, v ~ N(0, 1), no mask
``causal``          the same, ``is_causal=True``
``alibi``           an ALiBi-style float mask ``-slope_h * |i - j|`` (slope ``2**(-8 (h+1) / H)``)
``padded``          a boolean mask excluding the first ``S // 4`` keys of every other batch row
                    (left padding; every row keeps keys)
``large-logits``    q multiplied by 8: logits of tens, where exp and the running maximum matter
==================  ===========================================================================

The algorithm is given as keyword syntax (``online_softmax=true,block_size=16,weights=bfloat16``:
``true``/``false`` are booleans, integers are integers, anything else a format name) or a preset
(:data:`PRESETS`).

The bound methods' options (docs/numerics.md, "Attention: the options") are passed to every
``covers`` and ``finite_range`` call: ``compute`` (the kernel's compute format: fp32, bf16 or fp64;
the methods' ``dtype``, named ``compute`` here because ``dtype`` is the inputs' format), ``standard``
(``any-order`` or ``sequential``) and ``flush_to_zero``.
"""

from __future__ import annotations

import inspect
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.checks.result import CheckResult, TrialResult, element
from tasks.checks.subject import CheckInputError
from tasks.verdicts import Verdict, classify_differences

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_ATTENTION_SHAPES", "INPUT_KINDS", "PRESETS", "draw", "parse_algorithm", "parse_shape",
           "run_attention_check"]

#: Named algorithms: ``plain`` is the definition's bounds; ``flash`` the seed's example kernel;
#: ``flash-cpu`` PyTorch's CPU flash kernel (online softmax over blocks of 512 keys, its
#: ``kv_split_size`` in aten/src/ATen/native/cpu/FlashAttentionKernel.cpp, normalised by a reciprocal,
#: the weights rounded to the inputs' format before the product with V; ``weights`` is filled in per
#: dtype). Without the block size the bound allows a rescale per key: at S = 1024 it is several times
#: looser than the kernel needs and a 1/l computed in bf16 passes (tests/test_attention_preset_block.py).
#: ``fused-general`` is the most general fused kernel the methods describe, for a kernel whose exact
#: tiling is unknown (PyTorch's CUDA SDPA backends, :mod:`tasks.attention.sdpa`): a rescale allowed
#: after every key (no block size), exp2 of base-2 logits, a rounded reciprocal, the weights rounded
#: to the inputs' format; each of these only widens the bound.
PRESETS: dict[str, dict[str, Any]] = {
    "plain": {},
    "flash": {"online_softmax": True, "block_size": 16, "weights": "bfloat16"},
    "flash-cpu": {"online_softmax": True, "block_size": 512, "reciprocal": True, "weights": "<dtype>"},
    "fused-general": {"online_softmax": True, "exp2": True, "reciprocal": True, "weights": "<dtype>"},
}
INPUT_KINDS = ("randn", "causal", "alibi", "padded", "large-logits")
#: ``B x H x L x S x D``: the seed's example shape, and an unaligned one with more heads.
DEFAULT_ATTENTION_SHAPES = ("1x2x64x64x16", "2x4x33x70x32")
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def _value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return int(low)
    except ValueError:
        return text.strip()


def parse_algorithm(text: str, dtype: str = "float32") -> tuple[str, Any]:
    """``(label, AttentionAlgorithm)`` from a preset name or ``key=value,...`` (module docstring);
    ``dtype`` fills a preset's ``"<dtype>"`` (and leaves it out for float32, which rounds nothing)."""
    from tasks.numerics.attention import AttentionAlgorithm

    text = (text or "").strip()
    allowed = [p for p in inspect.signature(AttentionAlgorithm).parameters]
    if text in PRESETS:
        kwargs: dict[str, Any] = {key: dtype for key, value in PRESETS[text].items()
                                  if value == "<dtype>" and dtype != "float32"}
        kwargs.update({key: value for key, value in PRESETS[text].items() if value != "<dtype>"})
    elif "=" in text:
        kwargs = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or not key:
                raise CheckInputError(f"--algorithm {text!r}: expected KEY=VALUE[,KEY=VALUE...] or a preset "
                                      f"({', '.join(PRESETS)})")
            if key not in allowed:
                raise CheckInputError(f"--algorithm {text!r}: unknown key {key!r}; allowed: {', '.join(allowed)}")
            kwargs[key] = _value(value)
    else:
        raise CheckInputError(f"--algorithm {text!r}: not a preset ({', '.join(PRESETS)}) and not KEY=VALUE "
                              f"keyword syntax (keys: {', '.join(allowed)})")
    try:
        alg = AttentionAlgorithm(**kwargs)
    except (TypeError, ValueError) as exc:
        raise CheckInputError(f"--algorithm {text!r}: {exc}") from exc
    return text, alg


def parse_shape(text: str) -> tuple[int, int, int, int, int]:
    """``"BxHxLxSxD"`` -> (B, H, L, S, D), each >= 1."""
    parts = text.lower().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 5 or min(dims) < 1:
        raise CheckInputError(f"--shape {text!r}: expected BxHxLxSxD with positive integers, e.g. 1x2x64x64x16")
    b, h, length, s, d = dims
    return b, h, length, s, d


def draw(shape: tuple[int, int, int, int, int], kind: str, dtype: torch.dtype,
         seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
    """Seeded ``(q, k, v, attn_mask, is_causal)`` of one input kind (module docstring)."""
    import torch

    if kind not in INPUT_KINDS:
        raise CheckInputError(f"unknown input kind {kind!r}; allowed: {', '.join(INPUT_KINDS)}")
    b, h, length, s, d = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn((b, h, n, d), generator=g) for n in (length, s, s))
    if kind == "large-logits":
        q = q * 8
    mask: torch.Tensor | None = None
    if kind == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)]).reshape(1, h, 1, 1)
        dist = (torch.arange(length).reshape(-1, 1) - torch.arange(s).reshape(1, -1)).abs().float()
        mask = (-slopes * dist).expand(b, h, length, s).to(dtype)
    elif kind == "padded":
        mask = torch.ones((b, 1, length, s), dtype=torch.bool)
        mask[::2, :, :, : s // 4] = False
    return q.to(dtype), k.to(dtype), v.to(dtype), mask, kind == "causal"


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 attention of the drawn operands: ``(out, logsumexp)`` in float64 (not rounded)."""
    import torch

    from tasks.attention.cpu import additive_mask

    scores = torch.matmul(q.double(), k.double().transpose(-2, -1)) * scale
    add = additive_mask(q, k.shape[-2], mask, causal, torch.float64)
    if add is not None:
        scores = scores + add
    return torch.matmul(torch.softmax(scores, dim=-1), v.double()), torch.logsumexp(scores, dim=-1)


def _trial(kernel: Any, alg: Any, label: str, shape: tuple[int, int, int, int, int], kind: str, dtype: Any,
           trial: int, seed: int, ulps: float, opts: dict[str, Any] | None = None) -> TrialResult:

    from tasks.numerics import distance, get_format
    from tasks.seeds import stable_seed

    fmt = get_format(dtype)
    b, h, length, s, d = shape
    q, k, v, mask, causal = draw(shape, kind, fmt.torch_dtype, stable_seed("check-attention", seed, shape, kind, trial))
    scale = 1.0 / d**0.5
    info = {"inputs": kind, "algorithm": label, "output_dtype": fmt.name, "problem": f"B={b} H={h} L={length} S={s} D={d}"}
    base: dict[str, Any] = {"check": "attention", "m": length, "k": d, "n": s, "trial": trial, "seed": seed, "info": info}
    t0 = time.perf_counter()
    try:
        out, lse = kernel(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    except Exception as exc:  # the kernel raised: an ERROR trial, with the error as evidence
        return TrialResult(verdict=Verdict.ERROR, error=f"{type(exc).__name__}: {exc}", **base)
    seconds = time.perf_counter() - t0
    ref, _ = reference(q, k, v, mask, causal, scale)
    expected = ref.to(fmt.torch_dtype)
    opts = opts or {}
    cover = alg.covers(out, q, k, v, mask, causal, scale, logsumexp=lse, ulps=ulps, **opts)
    ok_out, ok_lse = np.asarray(cover.out), np.asarray(cover.logsumexp)
    dist = np.asarray(distance(out.reshape(-1, v.shape[-1]), expected.reshape(-1, v.shape[-1]), fmt))
    covered = ok_out.reshape(dist.shape)
    lse_bad = int((~ok_lse).sum())
    verdict = classify_differences(dist, covered)
    if lse_bad:
        verdict = Verdict.INCORRECT
        info["problem"] += f"; {lse_bad} logsumexp element(s) outside the bound"
    differs = dist != 0
    flat_obs = out.double().reshape(-1, v.shape[-1]).numpy()
    flat_exp = expected.double().reshape(-1, v.shape[-1]).numpy()
    flat_ref = ref.reshape(-1, v.shape[-1]).numpy()
    bad = ~covered
    evidence: tuple[Any, ...] = ()
    if differs.any() or bad.any():  # the allowed range of each element, for the evidence
        low, high = alg.finite_range(q, k, v, mask, causal, scale, ulps=ulps, **opts).out
        evidence = (flat_ref, flat_exp, flat_obs, dist, np.asarray(low).reshape(dist.shape),
                    np.asarray(high).reshape(dist.shape))
    first = element(int(np.flatnonzero(bad)[0] if bad.any() else np.flatnonzero(differs)[0]), v.shape[-1],
                    *evidence) if evidence else None
    worst = element(int(np.argmax(np.where(dist < 0, np.iinfo(np.int64).max, dist))), v.shape[-1],
                    *evidence) if differs.any() else None
    return TrialResult(verdict=verdict, positions=int(dist.size), checked=int(dist.size),
                       mismatches=int(bad.sum()) + lse_bad, differing=int(differs.sum()),
                       max_spacing=int(dist.max(initial=0)), first=first, worst=worst, seconds=seconds, **base)


def run_attention_check(kernel_name: str, algorithm: str, dtype: str = "float32", shapes: list[str] | None = None,
                        inputs: tuple[str, ...] = INPUT_KINDS, trials: int = 2, seed: int = 0,
                        ulps: float = 0, compute: str = "fp32", standard: str = "any-order",
                        flush_to_zero: bool = False) -> CheckResult:
    """Judge attention kernel ``kernel_name`` against ``algorithm`` (module docstring); ``ulps`` widens
    the bounds of the output and the logsumexp by that many spacings (``AttentionAlgorithm.covers``);
    ``compute``, ``standard`` and ``flush_to_zero`` are the bound methods' options."""
    from tasks.attention import AttentionError, get_attention
    from tasks.numerics.attention import COMPUTE_DTYPES, STANDARDS

    try:
        kernel = get_attention(kernel_name)
    except AttentionError as exc:
        raise CheckInputError(f"--kernel: {exc}") from exc
    ok, why = kernel.available()
    if not ok:
        raise CheckInputError(f"--kernel: attention kernel {kernel_name!r} cannot be checked here: {why}")
    if dtype not in DTYPES:
        raise CheckInputError(f"--dtype {dtype!r}: allowed {', '.join(DTYPES)}")
    bad = [i for i in inputs if i not in INPUT_KINDS]
    if bad:
        raise CheckInputError(f"--inputs {', '.join(bad)}: allowed {', '.join(INPUT_KINDS)}")
    if trials < 1:
        raise CheckInputError(f"--trials {trials}: at least 1")
    if ulps < 0:
        raise CheckInputError(f"--ulps {ulps}: must be >= 0")
    if compute not in COMPUTE_DTYPES:
        raise CheckInputError(f"--compute-dtype {compute!r}: allowed {', '.join(COMPUTE_DTYPES)}")
    if standard not in STANDARDS:
        raise CheckInputError(f"--standard {standard!r}: allowed {', '.join(STANDARDS)}")
    opts = {"dtype": compute, "standard": standard, "flush_to_zero": bool(flush_to_zero)}
    label, alg = parse_algorithm(algorithm, DTYPES[dtype])
    dims = [parse_shape(s) for s in (shapes or list(DEFAULT_ATTENTION_SHAPES))]
    settings = {"algorithm": label, "algorithm_repr": repr(alg), "seed": seed, "inputs": list(inputs), "ulps": ulps,
                "compute_dtype": compute, "standard": standard, "flush_to_zero": bool(flush_to_zero),
                "about_kernel": f"kernel: {kernel.description}",
                "about_algorithm": f"algorithm: {label} = {alg!r}; bounds with compute dtype {compute}, "
                                   f"standard {standard}, flush_to_zero {bool(flush_to_zero)}",
                "about_logsumexp": f"logsumexp: {kernel.logsumexp}",
                "about_shape": "shape MxKxN below = queries L x head dim D x keys S; C[row, col] = output "
                               "row (b, h, l) flattened, column d; shapes: " + ", ".join(shapes or DEFAULT_ATTENTION_SHAPES)}
    result = CheckResult(check="attention", kernel=kernel_name, subject=f"attention kernel {kernel_name}",
                         dtype=DTYPES[dtype], trials_per_shape=trials, settings=settings)
    for shape in dims:
        for kind in inputs:
            for t in range(trials):
                result.results.append(_trial(kernel, alg, label, shape, kind, DTYPES[dtype], t, seed, ulps, opts))
    return result
