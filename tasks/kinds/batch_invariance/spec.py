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
    axis_values,
    check_axis,
    check_distinct,
    check_seed_axis,
    seed_values,
)

#: The batch sizes of vLLM's own batch-invariance test (1 to 257, around every power of two).
DEFAULT_M = [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257]
#: Where the probe row sits in a batch of M rows (``random``: a row drawn with the unit's seed per M).
POSITIONS = ("first", "middle", "last", "random")
Position = Literal["first", "middle", "last", "random"]
OutDtype = Literal["bf16", "fp16", "fp32"]
Comparison = Literal["padded_prefill", "decode"]
Reductions = Literal["fp32", "fp64"]
#: Largest M of the kernel level (the probe's neighbours are drawn as one [M, K] matrix).
MAX_BATCH_ROWS = 65536
#: Largest batch of the model level.
MAX_MODEL_BATCH = 1024

#: Fields of each level, with the spec's other level named in the message when they are set.
KERNEL_FIELDS = ("kernels", "attention_kernels", "m", "positions", "k", "n", "seeds", "dtype", "scale_mode",
                 "out_dtype", "tolerance_spacings", "algorithm", "accumulate", "threads", "heads", "seq_len",
                 "head_dim", "attention_dtype")
#: Largest torch thread count of the ``threads`` axis.
MAX_THREADS = 1024
MODEL_FIELDS = ("model", "model_seed", "kernel", "attention", "scales", "reductions", "batch_sizes", "comparisons",
                "prompts", "new_tokens")
#: The attention dtypes of the kernel level (the names of the attention registry and replay).
ATTENTION_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}


class BatchInvarianceExperiment(Strict):
    """A kernel's or the model's noise floor across batch shapes (docs/noise-floor.md).

    ``level = "kernel"`` uses the kernel fields (``kernels`` and/or ``attention_kernels``, ``m``,
    ``positions``, ``seeds``, ``tolerance_spacings``; GEMM kernels ``k``, ``n``, ``dtype``,
    ``scale_mode``, ``out_dtype`` (one or several: one unit each), ``algorithm`` and ``accumulate``
    (the accumulation algorithm the kernels declare, judged as the ``bounds`` check judges it),
    ``threads`` (torch thread counts to run each probe at); attention kernels ``heads``, ``seq_len``, ``head_dim``,
    ``attention_dtype``); ``level = "model"`` the model fields (``model``, ``model_seed``, ``kernel``,
    ``attention``, ``scales``, ``reductions``, ``batch_sizes``, ``comparisons``, ``prompts``,
    ``new_tokens``). A field of the other level set to anything but its default is an error.
    """

    kind: Literal["batch_invariance"]
    level: Literal["kernel", "model"] = "kernel"
    # -- kernel level
    kernels: list[str | Implementation] = Field(default_factory=list)
    m: IntAxis = Field(default_factory=lambda: list(DEFAULT_M))
    #: Where the probe sits; unset: first, middle, last and random for GEMM kernels, first, middle and
    #: last for attention kernels (their units keep the ids they had before ``random`` existed).
    positions: list[Position] | None = Field(default=None, min_length=1)
    k: int = Field(default=256, ge=1, le=MAX_DIM)
    n: int = Field(default=256, ge=1, le=MAX_DIM)
    seeds: IntAxis = 1
    #: Operand dtype for kernels that take either (``any``); other kernels use their own.
    dtype: Literal["int8", "fp8_e4m3"] = "int8"
    scale_mode: ScaleMode = "real"
    #: Output dtype(s) of the GEMM kernels: one unit per kernel, seed and output dtype.
    out_dtype: OutDtype | list[OutDtype] = Field(default_factory=lambda: list[OutDtype](["bf16", "fp32"]))
    tolerance_spacings: int = Field(default=1, ge=0, le=2**31 - 1)
    #: The accumulation algorithm every GEMM kernel of the experiment declares (``swapcheck check
    #: bounds --algorithm`` names: any, sequential, pairwise, blocked-<b>, exact, slots16) and its
    #: format: each computation of the probe row is judged against its bound.
    algorithm: str = "any"
    accumulate: Literal["fp32", "bf16", "fp16"] = "fp32"
    #: torch thread counts (``torch.set_num_threads``) to run every probe at, the CPU analogue of a
    #: tensor-parallel size; unset: the worker's own setting, recorded.
    threads: IntAxis | None = None
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

    @field_validator("threads")
    @classmethod
    def _threads_axis(cls, v: Any) -> Any:
        return None if v is None else check_axis(v, 1, MAX_THREADS)

    @field_validator("out_dtype")
    @classmethod
    def _out_dtypes(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("give at least one output dtype (bf16, fp16, fp32)")
            return check_distinct(v)
        return v

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
    def _distinct(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else check_distinct(v)

    def seed_values(self) -> list[int]:
        return seed_values(self.seeds)

    def gemm_positions(self) -> list[str]:
        """The probe positions of the GEMM kernels (the default: all four)."""
        return list(self.positions) if self.positions is not None else list(POSITIONS)

    def attention_positions(self) -> list[str]:
        """The probe positions of the attention kernels (the default: first, middle, last)."""
        return list(self.positions) if self.positions is not None else list(POSITIONS[:3])

    def out_dtypes(self) -> list[str]:
        """The output dtypes of the GEMM kernels, as a list."""
        return list(self.out_dtype) if isinstance(self.out_dtype, list) else [self.out_dtype]

    def thread_counts(self) -> list[int] | None:
        return None if self.threads is None else axis_values(self.threads)

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


def probe_row(m: int, position: str, seed: int = 0) -> int:
    """Where the probe sits in a batch of ``m`` rows (``random``: a row drawn from ``seed`` and ``m``,
    the same in every process)."""
    if position == "random":
        from tasks.seeds import stable_seed

        return stable_seed("batch_invariance_random_row", seed, m) % m
    return {"first": 0, "middle": m // 2, "last": m - 1}[position]
