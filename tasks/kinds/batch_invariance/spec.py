"""The ``batch_invariance`` spec model and what its levels share: the experiment table of a spec, its
constants, where the probe sits in a batch (the package docstring says what each level measures).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from tasks.kinds.fields import (
    MAX_DIM,
    MAX_SEED,
    Implementation,
    IntAxis,
    Prompts,
    Resources,
    ScaleMode,
    Strict,
    SyntheticPrompts,
    as_impl,
    check_axis,
    check_distinct,
    check_seed_axis,
    seed_values,
)

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


def other_level_problems(base: str, exp: BatchInvarianceExperiment) -> list[str]:
    """A field of the level this experiment is not, set to something other than its default."""
    default = BatchInvarianceExperiment(kind="batch_invariance")
    fields, theirs = (MODEL_FIELDS, "model") if exp.level == "kernel" else (KERNEL_FIELDS, "kernel")
    return [f"{base}.{f}: applies to level = {theirs!r} only; this experiment is level = {exp.level!r}"
            for f in fields if getattr(exp, f) != getattr(default, f)]


def probe_row(m: int, position: str) -> int:
    """Where the probe sits in a batch of ``m`` rows."""
    return {"first": 0, "middle": m // 2, "last": m - 1}[position]
