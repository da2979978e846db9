"""The ``batch_invariance`` kind: does a kernel (or the model) compute a row the same way in every batch?

A kernel swap can only be blamed for differences above the noise the same kernel makes on its own.
This kind measures that noise at two levels (``level`` in the spec; docs/noise-floor.md):

**Kernel level** (``level = "kernel"``; table ``batch_invariance``). One probe row of activations is
multiplied by one fixed weight matrix ``[K, N]`` alone (M = 1: the reference), and again placed at
positions ``first`` (row 0), ``middle`` (row ``M // 2``) and ``last`` (row ``M - 1``) of batches of M
rows for every M of the spec's axis, its neighbours random rows drawn with the unit's seed. Operands
are drawn and quantized as :func:`tasks.models.operands.draw_operands` draws them (per-token scales:
the probe's int8/e4m3 values and scale do not depend on its neighbours). Each (M, position) row
compares the probe's output row in the batch with the M = 1 output (:func:`tasks.comparison.compare`:
bitwise and in output spacings). The M = 1 cell runs the kernel a second time on the same single
row: run-to-run determinism. A kernel's verdict (``reports.noise_floor``): ``batch-invariant`` when
every cell is bit-identical, ``varies within k spacings`` when no cell is more than
``tolerance_spacings`` output spacings away (and no NaN/Inf differs), else ``varies beyond k
spacings``. Kernels that compute each output element from its own row and column only (the CPU
INT8 kernels: an exact int32 accumulator and an elementwise epilogue; the FP8 emulations: one fixed
summation order per element) must come out batch-invariant — measured, not assumed.

**Attention kernels** (``attention_kernels`` beside or instead of ``kernels``; table
``batch_invariance_attention``). The probe is one batch element: q, k, v of ``[1, heads, seq_len,
head_dim]`` (standard normal in float64, rounded once to ``attention_dtype``), its causal attention
computed alone (B = 1) and first / middle / last among B elements (B the ``m`` axis), the others
random elements; each cell compares the probe's output (spacings of the dtype) and logsumexp (fp32
spacings) with the reference, and is bit-identical when both are. Same verdicts as above. These
units carry their own parameters (``attention``, ``heads``, ...): GEMM units keep theirs, and ids.

**Model level** (``level = "model"``; table ``batch_invariance_model``). The CPU W8A8 engine
(:func:`tasks.models.build_model`) with one kernel and scale mode, once per ``reductions`` (``fp32``:
transformers' eager fp32 attention and ``lm_head``; ``fp64``: the engine's default, see
:mod:`tasks.models.invariance`) and batch size B. The reference of every prompt is its
teacher-forced score *alone*: one unpadded forward pass of batch one, exactly as the
``teacher_forced`` kind scores a sequence. Two comparisons, one row per position:

* ``padded_prefill``: the prompt placed in a left-padded batch of B sequences (the others random
  token sequences of random length up to twice the prompt's, so the prompt is padded whenever a
  neighbour is longer; its slot is ``prompt_index % B``), one forward pass; every prompt position.
* ``decode``: the prompts greedily decoded ``new_tokens`` steps with the KV cache in batches of B
  (consecutive prompts, as a ``generate`` unit batches them; a short last batch is filled with random
  prompts of the same length), against the prefill score alone of prompt + generated tokens; every
  generated position. B = 1 is prefill vs decode alone.

Per position: both argmax (ties to the lower token id, as everywhere), whether they agree, whether
all logits are bit-identical, how many of the vocabulary's logits differ, the largest distance over
the vocabulary in fp32 spacings (and over the logits of at least 5% of the largest |logit|: counts
near zero run through every tiny binade), the distance at the reference argmax, and both
top-1/top-2 margins. ``attention`` (optional, an attention registry name) runs every attention
layer through that kernel (``reductions`` then picks the ``lm_head`` only); it joins the unit
parameters only when set, so experiments without it keep their unit ids.
A prompt whose argmax differs at some position is a sequence the same kernel changes by batch
shape alone: the model's noise floor, reported beside the kernel-swap figures in the certificate.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from tasks.comparison import compare
from tasks.kinds.base import Kind, Rows, Unit, UnitContext, canonical_json
from tasks.kinds.fields import (
    MAX_DIM,
    MAX_SEED,
    MAX_UNITS,
    Implementation,
    IntAxis,
    Prompts,
    Resources,
    ScaleMode,
    Strict,
    SyntheticPrompts,
    as_impl,
    axis_values,
    check_axis,
    check_distinct,
    check_seed_axis,
    impl_payload,
    kernel_problem,
    memory_problem,
    model_and_prompt_problems,
    model_fingerprint,
    prompt_payload,
    resolve_model_and_prompts,
    seed_values,
)

if TYPE_CHECKING:
    import numpy as np
    import torch

VERSION = "1"

#: The batch sizes of vLLM's own batch-invariance test (1 to 257, around every power of two).
DEFAULT_M = [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257]
#: Where the probe row sits in a batch of M rows.
POSITIONS = ("first", "middle", "last")
Position = Literal["first", "middle", "last"]
Comparison = Literal["padded_prefill", "decode"]
Reductions = Literal["fp32", "fp64"]
#: Largest M of the kernel level (the probe's neighbours are drawn as one [M, K] matrix).
MAX_BATCH_ROWS = 65536
#: Largest batch of the model level.
MAX_MODEL_BATCH = 1024

#: Fields of each level, with the spec's other level named in the message when they are set.
KERNEL_FIELDS = ("kernels", "attention_kernels", "m", "positions", "k", "n", "seeds", "dtype", "scale_mode",
                 "out_dtype", "tolerance_spacings", "heads", "seq_len", "head_dim", "attention_dtype")
MODEL_FIELDS = ("model", "model_seed", "kernel", "attention", "scales", "reductions", "batch_sizes", "comparisons",
                "prompts", "new_tokens")
#: The attention dtypes of the kernel level (the names of the attention registry and replay).
ATTENTION_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}


class BatchInvarianceExperiment(Strict):
    """A kernel's or the model's noise floor across batch shapes (docs/noise-floor.md).

    ``level = "kernel"`` uses the kernel fields (``kernels`` and/or ``attention_kernels``, ``m``,
    ``positions``, ``seeds``, ``tolerance_spacings``; GEMM kernels ``k``, ``n``, ``dtype``,
    ``scale_mode``, ``out_dtype``; attention kernels ``heads``, ``seq_len``, ``head_dim``,
    ``attention_dtype``); ``level = "model"`` the model fields (``model``, ``model_seed``, ``kernel``,
    ``attention``, ``scales``, ``reductions``, ``batch_sizes``, ``comparisons``, ``prompts``,
    ``new_tokens``). A field of the other level set to anything but its default is an error.
    """

    kind: Literal["batch_invariance"]
    level: Literal["kernel", "model"] = "kernel"
    # -- kernel level
    kernels: list[str | Implementation] = Field(default_factory=list)
    m: IntAxis = Field(default_factory=lambda: list(DEFAULT_M))
    positions: list[Position] = Field(default_factory=lambda: list[Position](["first", "middle", "last"]), min_length=1)
    k: int = Field(default=256, ge=1, le=MAX_DIM)
    n: int = Field(default=256, ge=1, le=MAX_DIM)
    seeds: IntAxis = 1
    #: Operand dtype for kernels that take either (``any``); other kernels use their own.
    dtype: Literal["int8", "fp8_e4m3"] = "int8"
    scale_mode: ScaleMode = "real"
    out_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    tolerance_spacings: int = Field(default=1, ge=0, le=2**31 - 1)
    #: Attention kernels (tasks.attention registry names): a probe batch element's causal attention
    #: alone (B = 1) and at each position of B elements, B the ``m`` axis.
    attention_kernels: list[str] = Field(default_factory=list)
    heads: int = Field(default=4, ge=1, le=256)
    seq_len: int = Field(default=32, ge=1, le=8192)
    head_dim: int = Field(default=32, ge=1, le=1024)
    attention_dtype: Literal["float32", "bfloat16"] = "float32"
    # -- model level
    model: str = "tiny-qwen3"
    model_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    kernel: str | Implementation = "int8-cutlass-order"
    #: The attention kernel every attention layer runs (tasks.attention registry name); unset: the
    #: one ``reductions`` picks.
    attention: str | None = None
    scales: ScaleMode = "real"
    reductions: list[Reductions] = Field(default_factory=lambda: list[Reductions](["fp32", "fp64"]), min_length=1)
    batch_sizes: IntAxis = Field(default_factory=lambda: [1, 2, 4, 8, 16])
    comparisons: list[Comparison] = Field(default_factory=lambda: list[Comparison](["padded_prefill", "decode"]),
                                          min_length=1)
    prompts: Prompts = Field(default_factory=SyntheticPrompts)
    new_tokens: int = Field(default=16, ge=1, le=8192)
    resources: Resources = Field(default_factory=Resources)

    @field_validator("m")
    @classmethod
    def _m_axis(cls, v: Any) -> Any:
        return check_axis(v, 1, MAX_BATCH_ROWS)

    @field_validator("batch_sizes")
    @classmethod
    def _batch_axis(cls, v: Any) -> Any:
        return check_axis(v, 1, MAX_MODEL_BATCH)

    @field_validator("seeds")
    @classmethod
    def _seed_axis(cls, v: Any) -> Any:
        return check_seed_axis(v)

    @field_validator("positions", "reductions", "comparisons", "attention_kernels")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        return check_distinct(v)

    def seed_values(self) -> list[int]:
        return seed_values(self.seeds)

    def impls(self) -> list[Implementation]:
        return [as_impl(i) for i in self.kernels]

    def model_impl(self) -> Implementation:
        return as_impl(self.kernel)


def _other_level_problems(base: str, exp: BatchInvarianceExperiment) -> list[str]:
    """A field of the level this experiment is not, set to something other than its default."""
    default = BatchInvarianceExperiment(kind="batch_invariance")
    fields, theirs = (MODEL_FIELDS, "model") if exp.level == "kernel" else (KERNEL_FIELDS, "kernel")
    return [f"{base}.{f}: applies to level = {theirs!r} only; this experiment is level = {exp.level!r}"
            for f in fields if getattr(exp, f) != getattr(default, f)]


def kernel_dtype(kernel: Any, dtype: str) -> str:
    """The operand dtype a kernel runs on here: its own, or the spec's for a kernel taking either."""
    return str(kernel.operand_dtype) if kernel.operand_dtype != "any" else dtype


def problems(base: str, exp: BatchInvarianceExperiment) -> list[str]:
    out = _other_level_problems(base, exp)
    if exp.level == "model":
        p = kernel_problem(f"{base}.kernel", exp.model_impl(), "int8")
        out += [p] if p else []
        if exp.attention is not None:
            from tasks.attention.fields import attention_problem

            p = attention_problem(f"{base}.attention", exp.attention)
            out += [p] if p else []
        out += model_and_prompt_problems(base, exp.model, exp.prompts)
        return out
    from tasks.kernels import get_kernel
    from tasks.kinds.fields import gemm_unit_memory_bytes
    from tasks.numerics import INT8_MAX_K

    if not exp.kernels and not exp.attention_kernels:
        out.append(f"{base}.kernels: level = 'kernel' needs at least one kernel or attention kernel (registry "
                   "names, `swapcheck kernels list`, `swapcheck kernels attention`)")
    units = (len(exp.kernels) + len(exp.attention_kernels)) * len(exp.seed_values())
    if units > MAX_UNITS:
        out.append(f"{base}: (kernels + attention_kernels) x seeds is {units} units; at most {MAX_UNITS} per experiment")
    ms = axis_values(exp.m)
    out += _attention_problems(base, exp, max(ms))
    if exp.kernels:
        p = memory_problem(f"{base}.m/n/k", f"M={max(ms)} N={exp.n} K={exp.k}",
                           gemm_unit_memory_bytes(max(ms), exp.n, exp.k, 2), exp.resources)
        out += [p] if p else []
    names: list[str] = []
    for i, impl in enumerate(exp.impls()):
        field = f"{base}.kernels[{i}]"
        names.append(impl.name)
        p = kernel_problem(field, impl)
        if p:
            out.append(p)
            continue
        kernel = get_kernel(impl.kernel, **impl.params)
        dtype = kernel_dtype(kernel, exp.dtype)
        if dtype == "int8" and exp.k > INT8_MAX_K:
            out.append(f"{field}: K={exp.k} exceeds the int32 no-overflow bound for int8 products (K <= {INT8_MAX_K})")
        bad = [m for m in ms for ok, _ in [kernel.supports(m, exp.n, exp.k, m, exp.n, False)] if not ok]
        if bad:
            why = kernel.supports(bad[0], exp.n, exp.k, bad[0], exp.n, False)[1]
            out.append(f"{field}: kernel {impl.kernel!r} cannot run M={bad[0]} N={exp.n} K={exp.k}: {why}")
    dupes = sorted({x for x in names if names.count(x) > 1})
    if dupes:
        out.append(f"{base}.kernels: duplicate kernel names {dupes}; give each a distinct `label`")
    return out


def _attention_problems(base: str, exp: BatchInvarianceExperiment, max_batch: int) -> list[str]:
    """Each attention kernel must run here, on its own (not only inside an engine), and the largest
    batch of q, k, v (three float64 draws of ``[B, heads, seq_len, head_dim]``) must fit."""
    from tasks.attention import AttentionError, get_attention

    out = []
    for i, name in enumerate(exp.attention_kernels):
        field = f"{base}.attention_kernels[{i}]"
        try:
            kernel = get_attention(name)
        except AttentionError as exc:
            out.append(f"{field}: {exc}")
            continue
        ok, why = kernel.available()
        if not ok:
            out.append(f"{field}: attention kernel {name!r} is not available here: {why}")
    if exp.attention_kernels:
        size = 3 * 8 * max_batch * exp.heads * exp.seq_len * exp.head_dim
        p = memory_problem(f"{base}.m/heads/seq_len/head_dim",
                           f"B={max_batch} heads={exp.heads} seq_len={exp.seq_len} head_dim={exp.head_dim}",
                           2 * size, exp.resources)
        out += [p] if p else []
    return out


def expand(experiment: str, exp: BatchInvarianceExperiment) -> list[Unit]:
    if exp.level == "model":
        return _expand_model(experiment, exp)
    from tasks.attention import get_attention
    from tasks.attention.fields import attention_payload
    from tasks.kernels import get_kernel

    units = []
    for impl, seed in itertools.product(exp.impls(), exp.seed_values()):
        kernel = get_kernel(impl.kernel, **impl.params)
        params = {"level": "kernel", "kernel": impl_payload(impl), "dtype": kernel_dtype(kernel, exp.dtype),
                  "m": axis_values(exp.m), "positions": list(exp.positions), "k": exp.k, "n": exp.n, "seed": seed,
                  "scale_mode": exp.scale_mode, "out_dtype": exp.out_dtype,
                  "tolerance_spacings": exp.tolerance_spacings}
        units.append(KIND.unit(experiment, params, exp.resources.with_gpu(kernel.device == "cuda")))
    # Attention kernels: their own parameters (GEMM units above keep theirs, and so their ids).
    for name, seed in itertools.product(exp.attention_kernels, exp.seed_values()):
        params = {"level": "kernel", "attention": attention_payload(name), "dtype": exp.attention_dtype,
                  "m": axis_values(exp.m), "positions": list(exp.positions), "heads": exp.heads,
                  "seq_len": exp.seq_len, "head_dim": exp.head_dim, "seed": seed,
                  "tolerance_spacings": exp.tolerance_spacings}
        units.append(KIND.unit(experiment, params, exp.resources.with_gpu(get_attention(name).device == "cuda")))
    return units


def _expand_model(experiment: str, exp: BatchInvarianceExperiment) -> list[Unit]:
    common = {"level": "model", "model": exp.model, "model_fingerprint": model_fingerprint(exp.model),
              "model_seed": exp.model_seed, "kernel": impl_payload(exp.model_impl()), "scales": exp.scales,
              "comparisons": list(exp.comparisons), "prompts": prompt_payload(exp.prompts),
              "new_tokens": exp.new_tokens}
    if exp.attention is not None:  # only when set: experiments without it keep their unit ids
        from tasks.attention.fields import attention_payload

        common["attention"] = attention_payload(exp.attention)
    return [KIND.unit(experiment, {**common, "reductions": r, "batch": b}, exp.resources)
            for r, b in itertools.product(exp.reductions, axis_values(exp.batch_sizes))]


def describe(p: dict[str, Any]) -> str:
    if p["level"] == "model":
        att = f", attention {p['attention']['name']}" if p.get("attention") else ""
        return (f"batch invariance of {p['model']} ({p['kernel']['name']}{att}, {p['scales']} scales, "
                f"{p['reductions']} reductions) in batches of {p['batch']}: {', '.join(p['comparisons'])}")
    ms = p["m"]
    if "attention" in p:
        return (f"batch invariance of attention {p['attention']['name']} ({p['dtype']}, heads={p['heads']} "
                f"seq_len={p['seq_len']} head_dim={p['head_dim']}, causal, seed {p['seed']}): probe element at "
                f"{'/'.join(p['positions'])} of B={ms[0]}..{ms[-1]} ({len(ms)} sizes)")
    return (f"batch invariance of {p['kernel']['name']} ({p['dtype']}, K={p['k']} N={p['n']}, seed {p['seed']}): "
            f"probe at {'/'.join(p['positions'])} of M={ms[0]}..{ms[-1]} ({len(ms)} sizes)")


# -- kernel level ---------------------------------------------------------------------------------

def probe_row(m: int, position: str) -> int:
    """Where the probe sits in a batch of ``m`` rows."""
    return {"first": 0, "middle": m // 2, "last": m - 1}[position]


def _call(kernel: Any, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
          out_dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    import torch

    args = [a, b, sa, sb]
    if kernel.device == "cuda":  # GPU kernels take their operands on the device
        args = [x.cuda() for x in args]
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = kernel(*args, out_dtype)
    if kernel.device == "cuda":
        torch.cuda.synchronize()
    return out.cpu(), time.perf_counter() - t0


def run_kernel(params: dict[str, Any]) -> dict[str, Rows]:
    """One kernel and seed: the probe alone, then at each position of each batch size."""
    import torch

    from tasks.kernels import get_kernel
    from tasks.models.operands import draw_operands
    from tasks.numerics import get_format

    impl = params["kernel"]
    kernel = get_kernel(impl["kernel"], **impl["params"])
    fmt = get_format(params["out_dtype"])
    ms = list(params["m"])
    # Row 0 is the probe, rows 1.. its neighbours (per-token scales: each row quantized alone).
    ops = draw_operands(params["dtype"], max(ms), params["n"], params["k"], params["seed"], params["scale_mode"])
    a, sa, b, sb = ops["a"], ops["scale_a"], ops["b"], ops["scale_b"]
    ref, ref_seconds = _call(kernel, a[:1], sa[:1], b, sb, fmt.torch_dtype)
    base = {"kernel": impl["name"], "kernel_name": impl["kernel"], "kernel_version": impl["version"],
            "device": kernel.device, "dtype": params["dtype"], "out_dtype": params["out_dtype"],
            "scale_mode": params["scale_mode"], "k": params["k"], "n": params["n"], "seed": params["seed"],
            "tolerance_spacings": params["tolerance_spacings"], "seconds_reference": ref_seconds}
    rows = []
    for m in ms:
        for position in params["positions"]:
            r = probe_row(m, position)
            order = torch.cat([torch.arange(1, r + 1), torch.zeros(1, dtype=torch.long), torch.arange(r + 1, m)])
            out, seconds = _call(kernel, a[order].contiguous(), sa[order].contiguous(), b, sb, fmt.torch_dtype)
            stats = compare(out[r: r + 1], ref, fmt)
            rows.append({**base, "m": m, "position": position, "row_index": r, **stats,
                         "bitwise_equal": stats["differing"] == 0, "seconds": seconds})
    return {"batch_invariance": rows}


# -- model level ----------------------------------------------------------------------------------

def _random_sequences(count: int, lengths: tuple[int, int], vocab: int, *seed: object) -> list[list[int]]:
    """``count`` random token sequences, lengths uniform in ``lengths`` (inclusive), seeded by ``seed``."""
    import torch

    from tasks.seeds import stable_seed

    g = torch.Generator().manual_seed(stable_seed("batch_invariance", *seed))
    sizes = torch.randint(lengths[0], lengths[1] + 1, (count,), generator=g).tolist()
    return [torch.randint(0, vocab, (s,), generator=g).tolist() for s in sizes]


def alone_logits(model: Any, sequence: list[int]) -> torch.Tensor:
    """fp32 logits ``[T, V]`` of one sequence scored alone, the call ``W8A8Model.score`` makes."""
    import torch

    with _session(model):
        out: torch.Tensor = model.hf(input_ids=torch.tensor([sequence], dtype=torch.long),
                                     use_cache=False).logits[0].to(torch.float32).clone()
    return out


@contextmanager
def _session(model: Any) -> Iterator[None]:
    """Inference mode with the model's thread count, as the engine runs every entry point."""
    import torch

    prev = torch.get_num_threads()
    change = model.threads is not None and prev != model.threads
    if change:
        torch.set_num_threads(int(model.threads))
    try:
        with torch.inference_mode():
            yield
    finally:
        if change:
            torch.set_num_threads(prev)


def decode_logits(model: Any, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy decoding of one left-padded batch with the KV cache, as ``W8A8Model.generate`` runs
    it (prefill, then one token per sequence per step), keeping every step's full logits.

    Returns (generated tokens per prompt, fp32 logits ``[steps, V]`` per prompt).
    """
    import torch

    from tasks.models.invariance import kv_cache

    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    steps_logits: list[torch.Tensor] = []
    with _session(model):
        cache = kv_cache(model.config, capacity=width + steps)
        out = model.hf(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                       past_key_values=cache, logits_to_keep=1)
        for step in range(steps):
            logits = out.logits[:, -1, :].to(torch.float32).clone()
            steps_logits.append(logits)
            if step == steps - 1:
                break
            nxt = _argmax(logits)
            mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            out = model.hf(input_ids=nxt.unsqueeze(1), attention_mask=mask, position_ids=positions,
                           past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
    stacked = torch.stack(steps_logits, dim=1)  # [B, steps, V]
    tokens = [_argmax(stacked[i]).tolist() for i in range(len(prompts))]
    return tokens, [stacked[i] for i in range(len(prompts))]


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Greedy tokens of ``[P, V]`` logits with ties to the lower id (the engine's ``predict``)."""
    import torch

    from tasks.models.predictions import predict_arrays

    return torch.from_numpy(predict_arrays(logits, 2)[0])


def position_stats(ref: torch.Tensor, other: torch.Tensor) -> dict[str, np.ndarray]:
    """Per position of two ``[P, V]`` fp32 logit arrays: argmax, margins and distances in fp32 spacings."""
    import numpy as np

    from tasks.comparison import SIGNIFICANT
    from tasks.models.predictions import predict_arrays
    from tasks.numerics import distance

    d = np.asarray(distance(other.contiguous(), ref.contiguous(), "fp32")).reshape(ref.shape)
    # Spacing counts of logits near zero run through every tiny binade: also report the largest
    # distance over the logits of at least SIGNIFICANT x the position's largest |logit|, as compare() does.
    mag = np.abs(ref.double().numpy())
    big = mag >= SIGNIFICANT * np.where(np.isfinite(mag), mag, 0.0).max(axis=1, keepdims=True, initial=0.0)
    ref_am, _, _, ref_margin = predict_arrays(ref, 2)
    am, _, _, margin = predict_arrays(other, 2)
    rows = np.arange(ref.shape[0])
    return {"ref_argmax": ref_am, "argmax": am, "ref_margin": ref_margin, "margin": margin,
            "differing": (d != 0).sum(axis=1), "nonfinite_mismatch": (d < 0).sum(axis=1),
            "max_spacing": d.max(axis=1, initial=0), "max_spacing_significant": np.where(big, d, 0).max(axis=1, initial=0),
            "argmax_spacing": d[rows, ref_am]}


def _position_rows(base: dict[str, Any], stats: dict[str, np.ndarray], vocab: int) -> Rows:
    rows = []
    for p in range(len(stats["argmax"])):
        differing = int(stats["differing"][p])
        rows.append({**base, "position": p, "ref_argmax": int(stats["ref_argmax"][p]), "argmax": int(stats["argmax"][p]),
                     "argmax_equal": bool(stats["ref_argmax"][p] == stats["argmax"][p]),
                     "logits_equal": differing == 0, "vocab": vocab, "differing": differing,
                     "nonfinite_mismatch": int(stats["nonfinite_mismatch"][p]),
                     "max_spacing": int(stats["max_spacing"][p]),
                     "max_spacing_significant": int(stats["max_spacing_significant"][p]),
                     "argmax_spacing": int(stats["argmax_spacing"][p]),
                     "ref_margin": float(stats["ref_margin"][p]), "margin": float(stats["margin"][p])})
    return rows


def run_model(params: dict[str, Any]) -> dict[str, Rows]:
    """One model configuration and batch size: padded prefill and decode against each prompt alone."""
    from tasks.models import build_model
    from tasks.prompts import prompts_from_payload

    ki = params["kernel"]
    attention = (params.get("attention") or {}).get("name")
    model = build_model(params["model"], kernel={"kernel": ki["kernel"], "params": ki["params"]},
                        scales=params["scales"], seed=params["model_seed"], reductions=params["reductions"],
                        attention=attention)
    vocab = int(model.config.vocab_size)
    prompts = prompts_from_payload(params["prompts"], vocab)
    b = params["batch"]
    common = {"model": params["model"], "kernel": ki["name"], "attention": attention, "scales": params["scales"],
              "reductions": params["reductions"], "batch": b}
    seed_of = canonical_json(params["prompts"])  # the neighbours' seed: the prompts and the batch
    rows: Rows = []
    if "padded_prefill" in params["comparisons"]:
        for i, prompt in enumerate(prompts):
            slot = i % b
            others = _random_sequences(b - 1, (1, 2 * len(prompt)), vocab, "padded", i, b, seed_of)
            batch = [*others[:slot], prompt, *others[slot:]]
            width = max(len(s) for s in batch)
            logits = model.forward_tokens(batch)[slot, width - len(prompt):]
            stats = position_stats(alone_logits(model, prompt), logits)
            rows += _position_rows({**common, "comparison": "padded_prefill", "prompt_index": i, "slot": slot,
                                    "padding": width - len(prompt), "width": width}, stats, vocab)
    if "decode" in params["comparisons"]:
        steps = params["new_tokens"]
        for start in range(0, len(prompts), b):
            group = prompts[start: start + b]
            fill = _random_sequences(b - len(group), (len(group[-1]), len(group[-1])), vocab, "fill", start, b, seed_of)
            tokens, decoded = decode_logits(model, [*group, *fill], steps)
            width = max(len(s) for s in [*group, *fill])
            for j, prompt in enumerate(group):
                # Prefill alone of prompt + generated: position len(prompt) - 1 + t predicts token t.
                scored = alone_logits(model, prompt + tokens[j][:-1])[len(prompt) - 1:]
                stats = position_stats(scored, decoded[j])
                rows += _position_rows({**common, "comparison": "decode", "prompt_index": start + j, "slot": j,
                                        "padding": width - len(prompt), "width": width}, stats, vocab)
    if attention is not None:
        from tasks.models.hf_attention import require_attention_calls

        require_attention_calls(attention, f"batch_invariance {params['reductions']} B={b}")
    return {"batch_invariance_model": rows}


# -- attention kernels ----------------------------------------------------------------------------

def run_attention(params: dict[str, Any]) -> dict[str, Rows]:
    """One attention kernel and seed: the probe element's causal attention alone (B = 1), then at each
    position of each batch of B elements, its neighbours other random q, k, v.

    Every element's q, k, v are drawn independently (standard normal in float64, rounded once to the
    dtype), so the probe's operands are the same tensors whatever the batch; the output rows and the
    logsumexp of the probe are compared with those of the probe alone, bit for bit and in spacings
    (output: the dtype's; logsumexp: fp32)."""
    import numpy as np
    import torch

    from tasks.attention import get_attention
    from tasks.numerics import distance, get_format
    from tasks.seeds import stable_seed

    att = params["attention"]
    kernel = get_attention(att["name"])
    fmt = get_format(ATTENTION_DTYPES[params["dtype"]])
    ms = list(params["m"])
    g = torch.Generator().manual_seed(stable_seed("batch_invariance_attention", params["seed"], params["heads"],
                                                  params["seq_len"], params["head_dim"]))
    shape = (max(ms), params["heads"], params["seq_len"], params["head_dim"])
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64).to(fmt.torch_dtype) for _ in range(3))

    def call(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        args = [x[idx].contiguous() for x in (q, k, v)]
        if kernel.device == "cuda":
            args = [x.cuda() for x in args]
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out, lse = kernel(args[0], args[1], args[2], is_causal=True)
        if kernel.device == "cuda":
            torch.cuda.synchronize()
        return out.cpu(), lse.cpu(), time.perf_counter() - t0

    ref, ref_lse, ref_seconds = call(torch.zeros(1, dtype=torch.long))
    base = {"kernel": att["name"], "kernel_version": att["version"], "device": kernel.device, "dtype": params["dtype"],
            "heads": params["heads"], "seq_len": params["seq_len"], "head_dim": params["head_dim"], "causal": True,
            "seed": params["seed"], "tolerance_spacings": params["tolerance_spacings"],
            "seconds_reference": ref_seconds}
    rows = []
    for m in ms:
        for position in params["positions"]:
            r = probe_row(m, position)
            order = torch.cat([torch.arange(1, r + 1), torch.zeros(1, dtype=torch.long), torch.arange(r + 1, m)])
            out, lse, seconds = call(order)
            stats = compare(out[r: r + 1].reshape(-1, params["head_dim"]), ref.reshape(-1, params["head_dim"]), fmt)
            d = np.asarray(distance(lse[r: r + 1].contiguous(), ref_lse.contiguous(), "fp32")).reshape(-1)
            lse_differing = int((d != 0).sum())
            rows.append({**base, "batch": m, "position": position, "row_index": r, **stats,
                         "lse_differing": lse_differing, "lse_max_spacing": int(d.max(initial=0)),
                         "bitwise_equal": stats["differing"] == 0 and lse_differing == 0, "seconds": seconds})
    return {"batch_invariance_attention": rows}


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    if params["level"] == "model":
        return run_model(params)
    return run_attention(params) if "attention" in params else run_kernel(params)


KIND = Kind(name="batch_invariance", version=VERSION, spec=BatchInvarianceExperiment,
            tables=("batch_invariance", "batch_invariance_model", "batch_invariance_attention"), describe=describe, run=run, expand=expand,
            problems=problems, resolve=resolve_model_and_prompts, doc=__doc__ or "")
