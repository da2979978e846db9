"""The ``batch_invariance`` kind: does a kernel (or the model) compute a row the same way in every batch?

A kernel swap can only be blamed for differences above the noise the same kernel makes on its own.
This kind measures that noise at two levels (``level`` in the spec; docs/noise-floor.md):

**Kernel level** (``level = "kernel"``; table ``batch_invariance``). One probe row of activations is
multiplied by one fixed weight matrix ``[K, N]`` alone (M = 1: the reference), and again placed at
positions ``first`` (row 0), ``middle`` (row ``M // 2``), ``last`` (row ``M - 1``) and ``random`` (a
row drawn from the unit's seed and M) of batches of M rows for every M of the spec's axis, its
neighbours random rows drawn with the unit's seed. Operands are drawn and quantized as
:func:`tasks.models.operands.draw_operands` draws them (per-token scales: the probe's int8/e4m3
values and scale do not depend on its neighbours). One unit per kernel, seed and output dtype
(``out_dtype``: one or several, default bf16 and fp32). Each (M, position) row compares the probe's
output row in the batch with the M = 1 output (:func:`tasks.comparison.compare`: bitwise and in
output spacings) and judges both computations against the accumulation algorithm the experiment
declares (``algorithm``/``accumulate``, default ``any`` in fp32; :mod:`.bound`: elements outside the
bound, and the largest ``|batch - alone|`` over the bound's width). With ``threads`` every probe runs
at each torch thread count, and each cell is also compared with the same cell at the first count.
The M = 1 cell runs the kernel a second time on the same single row: run-to-run determinism. A
kernel's verdict (``reports.noise_floor``): ``bit-invariant`` when every cell is bit-identical,
``varies within bound (alg, fmt)`` when cells differ and no element of either computation lies
outside the bound, else ``varies beyond bound (alg, fmt)``; rows written before the bound keep the
spacings verdicts (``batch-invariant``, ``varies within / beyond k spacings``, k =
``tolerance_spacings``). Kernels that compute each output element from its own row and column only
(the CPU INT8 kernels: an exact int32 accumulator and an elementwise epilogue; the FP8 emulations:
one fixed summation order per element) must come out bit-invariant — measured, not assumed.

**Attention kernels** (``attention_kernels`` beside or instead of ``kernels``; table
``batch_invariance_attention``). The probe is one batch element: q, k, v of ``[1, heads, seq_len,
head_dim]`` (standard normal in float64, rounded once to ``attention_dtype``), its causal attention
computed alone (B = 1) and first / middle / last / random among B elements (B the ``m`` axis), the others
random elements; each cell compares the probe's output (spacings of the dtype) and logsumexp (fp32
spacings) with the reference, and is bit-identical when both are. The spacings verdicts above (no bound). These
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

from typing import Any

from tasks.kinds.base import Kind, Rows, Unit, UnitContext
from tasks.kinds.batch_invariance import attention, kernel, model
from tasks.kinds.batch_invariance.attention import run_attention
from tasks.kinds.batch_invariance.kernel import kernel_dtype, run_kernel
from tasks.kinds.batch_invariance.model import (
    alone_logits,
    decode_logits,
    position_stats,
    run_model,
)
from tasks.kinds.batch_invariance.spec import (
    ATTENTION_DTYPES,
    DEFAULT_M,
    KERNEL_FIELDS,
    MAX_BATCH_ROWS,
    MAX_MODEL_BATCH,
    MODEL_FIELDS,
    POSITIONS,
    BatchInvarianceExperiment,
    Comparison,
    Position,
    Reductions,
    other_level_problems,
    probe_row,
)
from tasks.kinds.fields import MAX_UNITS, axis_values, resolve_model_and_prompts

__all__ = [
    "ATTENTION_DTYPES", "DEFAULT_M", "KERNEL_FIELDS", "KIND", "MAX_BATCH_ROWS", "MAX_MODEL_BATCH", "MODEL_FIELDS",
    "POSITIONS", "VERSION", "BatchInvarianceExperiment", "Comparison", "Position", "Reductions", "alone_logits",
    "decode_logits", "describe", "expand", "kernel_dtype", "position_stats", "probe_row", "problems", "run",
    "run_attention", "run_kernel", "run_model",
]

VERSION = "1"


def problems(base: str, exp: BatchInvarianceExperiment) -> list[str]:
    out = other_level_problems(base, exp)
    if exp.level == "model":
        return out + model.problems(base, exp)
    if not exp.kernels and not exp.attention_kernels:
        out.append(f"{base}.kernels: level = 'kernel' needs at least one kernel or attention kernel (registry "
                   "names, `swapcheck kernels list`, `swapcheck kernels attention`)")
    units = (len(exp.kernels) + len(exp.attention_kernels)) * len(exp.seed_values())
    if units > MAX_UNITS:
        out.append(f"{base}: (kernels + attention_kernels) x seeds is {units} units; at most {MAX_UNITS} per experiment")
    ms = axis_values(exp.m)
    out += attention.problems(base, exp, max(ms))
    out += kernel.problems(base, exp, ms)
    return out


def expand(experiment: str, exp: BatchInvarianceExperiment) -> list[Unit]:
    if exp.level == "model":
        units = model.expand(exp)
    else:
        # GEMM kernels first, then attention kernels (with their own parameters: the GEMM units keep theirs).
        units = kernel.expand(exp) + attention.expand(exp)
    return [KIND.unit(experiment, params, resources) for params, resources in units]


def describe(p: dict[str, Any]) -> str:
    if p["level"] == "model":
        return model.describe(p)
    return attention.describe(p) if "attention" in p else kernel.describe(p)


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    if params["level"] == "model":
        return run_model(params)
    return run_attention(params) if "attention" in params else run_kernel(params)


KIND = Kind(name="batch_invariance", version=VERSION, spec=BatchInvarianceExperiment,
            tables=("batch_invariance", "batch_invariance_model", "batch_invariance_attention"), describe=describe, run=run, expand=expand,
            problems=problems, resolve=resolve_model_and_prompts, doc=__doc__ or "")
