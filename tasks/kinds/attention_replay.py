"""The ``attention_replay`` kind: capture each attention layer's q, k, v in a real forward pass,
replay them through attention kernels.

One unit builds the CPU W8A8 model, runs the prompts through it once with the default float64
attention while recording every attention layer's operands (``q``, ``k`` after RoPE, ``v``, the
layer's additive mask and scaling; :func:`tasks.models.hf_attention.capturing`), and then, per layer and
per dtype of the experiment (the captured fp32 operands cast to it), feeds them to both attention
kernels of every pair:

* a ``pair`` row compares the two kernels' outputs (bitwise, and in spacings of the dtype) and
  their logsumexps (in fp32 spacings);
* a ``reference`` row compares each kernel with the float64 attention rounded once to the dtype
  (``impl_b = "fp64-reference"``): how far each kernel is from the definition, to read a pair's
  difference against.  When the experiment names the kernel's algorithm (``algorithms``), the row
  also counts the output and logsumexp elements outside that
  :class:`~tasks.numerics.attention.AttentionAlgorithm`'s bounds (``covers``, widened by ``ulps``).

The float mask is the model's (0 or the dtype's minimum); cast to another dtype it is rebuilt with
that dtype's minimum, so fp16 gets a finite mask too.  Layers see the fp64 model's activations, so
the operands of layer ``i`` do not depend on the kernels under test.

**Devices.** The capture runs on the CPU (the tiny model, transformers).  A kernel of a pair may be a
CUDA entry (``sdpa-flash-cuda``, ...): it is accepted when it exists, the unit then requests one GPU
(a launch without one refuses it before writing anything), and each kernel gets the operands moved to
its ``device`` and gives its outputs back to the CPU (:func:`tasks.devices.on_device`) before any
comparison; its seconds are the call's own.  **Causal masks.** Where a layer's mask is exactly
SDPA's causal mask (query ``i`` sees keys ``j <= i``, for every batch element; :func:`exactly_causal`),
every kernel is called with ``is_causal=True`` instead of the float mask (FlashAttention takes no
float mask); elsewhere (padding) with the mask.  The rows say which (``is_causal``).  The float64
reference and the algorithms' bounds are computed from the mask itself: it is the definition.  For
the CPU kernels the two calls give the same bits (tests/test_attention_swap.py holds them to it on
every replayed layer), so rows written before this choice stay valid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from tasks.comparison import compare
from tasks.devices import on_device
from tasks.kinds.base import Kind, Rows, Unit, UnitContext
from tasks.kinds.fields import (
    MAX_SEED,
    Prompts,
    Resources,
    Strict,
    SyntheticPrompts,
    model_and_prompt_problems,
    model_fingerprint,
    prompt_payload,
    resolve_model_and_prompts,
)

if TYPE_CHECKING:
    import torch

    from tasks.models.hf_attention import CapturedAttention

VERSION = "1"

AttentionDtype = Literal["float32", "bfloat16", "float16"]
#: ``impl_b`` of a reference row: the float64 attention rounded once to the dtype.
REFERENCE = "fp64-reference"
#: The attention kernel that computes the reference (every step in float64, rounded once).
REFERENCE_KERNEL = "fp64"
#: The bound columns of a row judged against no algorithm.
NO_BOUND: dict[str, Any] = {"algorithm": None, "outside_bound": None, "lse_outside_bound": None}


class AttentionReplayExperiment(Strict):
    """Capture each attention layer's q, k, v in a forward pass, then replay them through kernel pairs."""

    kind: Literal["attention_replay"]
    model: str = "tiny-qwen3"
    model_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    #: Pairs of attention kernels (tasks.attention registry names; CPU or CUDA entries).
    pairs: list[list[str]] = Field(min_length=1)
    #: The dtypes the captured fp32 operands are cast to before each replay.
    dtypes: list[AttentionDtype] = Field(default_factory=lambda: list[AttentionDtype](["float32"]), min_length=1)
    #: Attention kernel -> the algorithm that describes it (a preset of ``check attention`` or
    #: AttentionAlgorithm keywords): its reference rows count the elements outside the bounds.
    algorithms: dict[str, str] = Field(default_factory=dict)
    #: Attention kernel -> widen its bounds by this many spacings (``covers(..., ulps=)``; the CPU
    #: flash kernel's bf16/fp16 logsumexp needs 8).
    ulps: dict[str, float] = Field(default_factory=dict)

    @field_validator("ulps")
    @classmethod
    def _ulps(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not 0 <= x <= 1024}
        if bad:
            raise ValueError(f"ulps must be in [0, 1024], got {bad}")
        return v
    prompts: Prompts = Field(default_factory=SyntheticPrompts)
    resources: Resources = Field(default_factory=Resources)

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v: list[list[str]]) -> list[list[str]]:
        for i, pair in enumerate(v):
            if len(pair) != 2:
                raise ValueError(f"pair {i} must name exactly two attention kernels, got {len(pair)}")
        return v

    @field_validator("dtypes")
    @classmethod
    def _dtypes(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("dtypes must be distinct")
        return v


def problems(base: str, exp: AttentionReplayExperiment) -> list[str]:
    from tasks.attention.fields import callable_problem

    out = []
    for i, (a, b) in enumerate(exp.pairs):
        for j, name in enumerate((a, b)):
            p = callable_problem(f"{base}.pairs[{i}][{j}]", name)
            if p:
                out.append(p)
        if a == b:
            out.append(f"{base}.pairs[{i}]: both sides are {a!r}; name two different attention kernels")
    named = {n for pair in exp.pairs for n in pair}
    out.extend(f"{base}.ulps.{kernel}: not a kernel with an algorithm ({', '.join(sorted(exp.algorithms))})"
               for kernel in exp.ulps if kernel not in exp.algorithms)
    for kernel, alg in exp.algorithms.items():
        if kernel not in named:
            out.append(f"{base}.algorithms.{kernel}: not a kernel of pairs ({', '.join(sorted(named))})")
        try:
            from tasks.checks.attention import parse_algorithm

            parse_algorithm(alg)
        except ValueError as exc:
            out.append(f"{base}.algorithms.{kernel}: {exc}".replace("--algorithm ", ""))
    out.extend(model_and_prompt_problems(base, exp.model, exp.prompts))
    return out


def expand(experiment: str, exp: AttentionReplayExperiment) -> list[Unit]:
    from tasks.attention import get_attention
    from tasks.attention.fields import attention_payload

    params = {
        "model": exp.model,
        "model_fingerprint": model_fingerprint(exp.model),
        "model_seed": exp.model_seed,
        "pairs": [[attention_payload(a), attention_payload(b)] for a, b in exp.pairs],
        "dtypes": list(exp.dtypes),
        "algorithms": dict(sorted(exp.algorithms.items())),
        "ulps": dict(sorted(exp.ulps.items())),
        "prompts": prompt_payload(exp.prompts),
    }
    gpu = any(get_attention(name).device == "cuda" for pair in exp.pairs for name in pair)
    return [KIND.unit(experiment, params, exp.resources.with_gpu(gpu))]


def describe(p: dict[str, Any]) -> str:
    pairs = ", ".join(f"{a['name']}~{b['name']}" for a, b in p["pairs"])
    return f"attention replay {p['model']}: {pairs}; dtypes {'/'.join(p['dtypes'])}"


def operands(rec: CapturedAttention, dtype: torch.dtype) -> tuple[Any, ...]:
    """The captured ``q, k, v`` cast to ``dtype`` and the mask rebuilt in it (module docstring)."""
    import torch

    q, k, v = rec.q.to(dtype), rec.k.to(dtype), rec.v.to(dtype)
    mask = rec.mask
    if mask is not None:
        mask = torch.where(mask == 0, torch.zeros((), dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype))
    return q, k, v, mask


def exactly_causal(mask: torch.Tensor | None, q_len: int, kv_len: int) -> bool:
    """Whether the captured additive ``mask`` excludes exactly what SDPA's ``is_causal=True`` does:
    query ``i`` sees keys ``j <= i`` (top-left aligned), the same for every batch element and head.

    Decided from the values as :func:`operands` reads them (0 attends, anything else is excluded):
    a padded batch, a sliding window or no mask at all is not causal."""
    import torch

    if mask is None or tuple(mask.shape[-2:]) != (q_len, kv_len):
        return False
    causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril()
    return bool(((mask == 0) == causal).all())


def _run(name: str, ops: tuple[torch.Tensor, ...], scale: float,
         causal: bool = False) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``name`` on the CPU operands ``ops``, moved to the kernel's device (its outputs back on the
    CPU), with ``is_causal=True`` in place of the mask when ``causal``; and the call's seconds."""
    from tasks.attention import get_attention

    kernel = get_attention(name)
    q, k, v, mask = ops
    masking: dict[str, Any] = {"is_causal": True} if causal else {"attn_mask": mask}
    (out, lse), seconds = on_device(kernel.device, kernel, q, k, v, scale=scale, enable_gqa=True, **masking)
    return out, lse, seconds


def _row(out_a: torch.Tensor, out_b: torch.Tensor, lse_a: torch.Tensor, lse_b: torch.Tensor,
         fmt: Any) -> dict[str, Any]:
    from tasks.numerics import get_format

    stats = compare(out_a.reshape(-1, out_a.shape[-1]), out_b.reshape(-1, out_b.shape[-1]), fmt)
    lse = compare(lse_a.reshape(-1, lse_a.shape[-1]), lse_b.reshape(-1, lse_b.shape[-1]), get_format("float32"))
    return {**stats, "bitwise_equal": stats["differing"] == 0, "lse_elements": lse["elements"],
            "lse_differing": lse["differing"], "lse_max_spacing": lse["max_spacing"],
            "lse_max_abs_error": lse["max_abs_error"]}


def bound_columns(algorithm: str | None, dtype: str, ulps: float, out: torch.Tensor, lse: torch.Tensor,
                  ops: tuple[Any, ...], scale: float) -> dict[str, Any]:
    """``algorithm``, ``outside_bound``, ``lse_outside_bound`` of a reference row (None without one)."""
    import numpy as np

    if algorithm is None:
        return dict(NO_BOUND)
    from tasks.checks.attention import parse_algorithm

    _, alg = parse_algorithm(algorithm, dtype)
    q, k, v, mask = ops
    with np.errstate(invalid="ignore", over="ignore"):  # the mask's dtype-minimum entries meet exp() = 0
        cover = alg.covers(out, q, k, v, mask, False, scale, True, logsumexp=lse, ulps=ulps)
    return {"algorithm": algorithm, "outside_bound": int((~np.asarray(cover.out)).sum()),
            "lse_outside_bound": int((~np.asarray(cover.logsumexp)).sum())}


def replay_attention(records: list[CapturedAttention], pairs: list[list[dict[str, Any]]], dtypes: list[str],
                     algorithms: dict[str, str] | None = None,
                     ulps: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Rows of the ``attention_replay`` table for captured attention calls (docs/schema.md)."""
    from tasks.numerics import get_format

    algorithms, ulps = algorithms or {}, ulps or {}

    rows: list[dict[str, Any]] = []
    names = list(dict.fromkeys(side["name"] for pair in pairs for side in pair))
    for rec in records:
        b, h, length, d = rec.q.shape
        causal = exactly_causal(rec.mask, length, rec.k.shape[2])
        base = {"layer": f"layers.{rec.layer_index}.self_attn", "layer_index": rec.layer_index, "batch": b,
                "heads": h, "kv_heads": rec.k.shape[1], "q_len": length, "kv_len": rec.k.shape[2], "head_dim": d,
                "masked": bool(rec.mask is not None and bool((rec.mask != 0).any())),
                "is_causal": causal}
        for dt in dtypes:
            fmt = get_format(dt)
            ops = operands(rec, fmt.torch_dtype)
            runs = {n: _run(n, ops, rec.scale, causal) for n in names}
            # The definition: the float64 attention of the layer's own mask.
            ref_out, ref_lse, _ = _run(REFERENCE_KERNEL, ops, rec.scale)
            for n in names:
                out, lse, sec = runs[n]
                rows.append({**base, "dtype": dt, "comparison": "reference", "impl_a": n, "impl_b": REFERENCE,
                             **_row(out, ref_out, lse, ref_lse, fmt), "seconds_a": sec, "seconds_b": None,
                             **bound_columns(algorithms.get(n), dt, ulps.get(n, 0), out, lse, ops, rec.scale)})
            for pa, pb in pairs:
                oa, la, sa = runs[pa["name"]]
                ob, lb, sb = runs[pb["name"]]
                rows.append({**base, "dtype": dt, "comparison": "pair", "impl_a": pa["name"], "impl_b": pb["name"],
                             **_row(oa, ob, la, lb, fmt), "seconds_a": sa, "seconds_b": sb, **NO_BOUND})
    return rows


def capture(params: dict[str, Any]) -> list[CapturedAttention]:
    """Build the model of ``params`` and capture every attention call of one forward pass."""
    from tasks.models import build_model
    from tasks.models.hf_attention import capturing
    from tasks.prompts import prompts_from_payload

    model = build_model(params["model"], scales="real", seed=params["model_seed"])
    prompts = prompts_from_payload(params["prompts"], int(model.config.vocab_size))
    with capturing(model.hf) as records:
        model.forward_tokens(prompts)
    return records


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    rows = replay_attention(capture(params), params["pairs"], params["dtypes"], params["algorithms"],
                            params["ulps"])
    return {"attention_replay": [{**r, "model": params["model"]} for r in rows]}


KIND = Kind(name="attention_replay", version=VERSION, spec=AttentionReplayExperiment, tables=("attention_replay",),
            describe=describe, run=run, expand=expand, problems=problems, resolve=resolve_model_and_prompts,
            doc=__doc__ or "")
