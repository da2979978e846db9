"""Sweep specs: strict pydantic models and the one loader that validates them.

A spec is a TOML file that opens with the question it answers and declares named experiments::

    question = "Do CUTLASS-order and Triton-order INT8 epilogues agree as K grows?"
    name = "kdepth-demo"

    [experiments.int8]
    kind = "kdepth"
    dtype = "int8"
    implementations = ["int8-cutlass-order", "int8-triton-order"]
    k = { start = 256, stop = 16384, factor = 2 }

Unknown keys, wrong types, unknown kernels and impossible parameters are errors that name the file
and the field path (``experiments.int8.k.stop``); nothing is written when a spec is invalid.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.errors import SpecError

#: K above which an int32 accumulator of int8 products can overflow: weights in [-127, 127] and
#: activations in [-128, 127] give |product| <= 16256, and floor((2**31 - 1) / 16256) = 132104
#: (reference/numerics.md §3).
INT8_MAX_K = 132104

#: Exact fp8 e4m3 accumulation in the reference stays exact in int64 always; the float64 fast path
#: of the `exact` kernel needs K * 448**2 * 2**18 < 2**53 (about 171000), beyond which it falls back.
SWEEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

OUT_DTYPES = ("bf16", "fp16", "fp32")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class GeometricRange(Strict):
    """``{start, stop, factor}``: start, start*factor, ... up to stop (inclusive)."""

    start: int = Field(gt=0)
    stop: int = Field(gt=0)
    factor: int = Field(ge=2)

    @model_validator(mode="after")
    def _order(self) -> GeometricRange:
        if self.stop < self.start:
            raise ValueError(f"stop ({self.stop}) must be >= start ({self.start})")
        return self

    def values(self) -> list[int]:
        out, v = [], self.start
        while v <= self.stop:
            out.append(v)
            v *= self.factor
        return out


class ArithmeticRange(Strict):
    """``{start, stop, step}``: start, start+step, ... up to stop (inclusive); step defaults to 1."""

    start: int = Field(ge=0)
    stop: int = Field(ge=0)
    step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _order(self) -> ArithmeticRange:
        if self.stop < self.start:
            raise ValueError(f"stop ({self.stop}) must be >= start ({self.start})")
        return self

    def values(self) -> list[int]:
        return list(range(self.start, self.stop + 1, self.step))


IntAxis = int | list[int] | GeometricRange | ArithmeticRange


def axis_values(axis: IntAxis) -> list[int]:
    if isinstance(axis, int):
        return [axis]
    if isinstance(axis, list):
        return list(axis)
    return axis.values()


def _check_axis(v: Any, minimum: int) -> Any:
    values = axis_values(v)
    if not values:
        raise ValueError("the axis is empty")
    bad = [x for x in values if x < minimum]
    if bad:
        raise ValueError(f"values must be >= {minimum}, got {bad[:5]}")
    if len(set(values)) != len(values):
        raise ValueError("values must be distinct")
    return v


class Implementation(Strict):
    """One kernel in an experiment: a registry name (or ``module:attr``), optional label and params."""

    kernel: str
    label: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.label or self.kernel


class Resources(Strict):
    """Ray resources one unit requests."""

    num_cpus: float = Field(default=1, ge=0)
    num_gpus: float = Field(default=0, ge=0)
    memory_gb: float | None = Field(default=None, gt=0)


ScaleMode = Literal["real", "pow2"]


class KdepthExperiment(Strict):
    """K on an axis: every implementation and the exact reference on identical operands."""

    kind: Literal["kdepth"]
    dtype: Literal["int8", "fp8_e4m3"]
    implementations: list[str | Implementation] = Field(min_length=1)
    reference: str | Implementation = "exact"
    scale_modes: list[ScaleMode] = Field(default_factory=lambda: list[ScaleMode](["real"]), min_length=1)
    m: IntAxis = 256
    n: IntAxis = 256
    k: IntAxis
    seeds: IntAxis = 4
    out_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    bias: bool = False
    resources: Resources = Field(default_factory=Resources)

    @field_validator("m", "n", "k")
    @classmethod
    def _positive_axis(cls, v: Any) -> Any:
        return _check_axis(v, 1)

    @field_validator("seeds")
    @classmethod
    def _seed_axis(cls, v: Any) -> Any:
        # `seeds = 4` means four seeds 0..3; a list or a range names them.
        if isinstance(v, int):
            if v < 1:
                raise ValueError("a seed count must be >= 1")
            return v
        return _check_axis(v, 0)

    @field_validator("scale_modes")
    @classmethod
    def _distinct_modes(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("scale modes must be distinct")
        return v

    def seed_values(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else axis_values(self.seeds)

    def impls(self) -> list[Implementation]:
        return [i if isinstance(i, Implementation) else Implementation(kernel=i) for i in self.implementations]

    def ref(self) -> Implementation:
        r = self.reference
        return r if isinstance(r, Implementation) else Implementation(kernel=r)


class SyntheticPrompts(Strict):
    """``count`` prompts of ``length`` token ids drawn uniformly from the model's vocabulary."""

    count: int = Field(default=4, ge=1, le=4096)
    length: int = Field(default=16, ge=1, le=32768)
    seed: int = Field(default=0, ge=0)


class FilePrompts(Strict):
    """A JSONL file, one prompt per line: a JSON list of token ids, or ``{"tokens": [...]}``."""

    file: str


class ReplayExperiment(Strict):
    """Capture every W8A8 layer's operands in a forward pass, then replay them through kernel pairs."""

    kind: Literal["replay"]
    model: str = "tiny-qwen3"
    model_seed: int = Field(default=0, ge=0)
    #: "cpu": the CPU W8A8 engine captures with a registry kernel; "vllm": vLLM captures with a
    #: kernel family (cutlass-int8 / triton-int8) on a GPU, and pairs name GPU registry kernels.
    engine: Literal["cpu", "vllm"] = "cpu"
    capture_kernel: str = "int8-cutlass-order"
    pairs: list[list[str | Implementation]] = Field(min_length=1)
    scale_modes: list[ScaleMode] = Field(default_factory=lambda: list[ScaleMode](["real", "pow2"]), min_length=1)
    prompts: SyntheticPrompts | FilePrompts = Field(default_factory=SyntheticPrompts)
    out_dtype: Literal["bf16", "fp16"] = "bf16"
    resources: Resources = Field(default_factory=Resources)

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v: list[list[Any]]) -> list[list[Any]]:
        for i, pair in enumerate(v):
            if len(pair) != 2:
                raise ValueError(f"pair {i} must name exactly two kernels, got {len(pair)}")
        return v

    def impl_pairs(self) -> list[tuple[Implementation, Implementation]]:
        def as_impl(x: str | Implementation) -> Implementation:
            return x if isinstance(x, Implementation) else Implementation(kernel=x)

        return [(as_impl(a), as_impl(b)) for a, b in self.pairs]


class Arm(Strict):
    """One way of running the model: a kernel, a scale mode and the environment that selects kernels.

    ``engine = "cpu"``: ``kernel`` is a registry kernel run by the CPU W8A8 engine. ``engine =
    "vllm"``: ``kernel`` is a vLLM kernel family (``cutlass-int8``, ``triton-int8``, ``cutlass-fp8``,
    ``torch-fp8``) forced per installed vLLM version (docs/gpu.md); such units request a GPU.
    """

    kernel: str = "int8-cutlass-order"
    params: dict[str, Any] = Field(default_factory=dict)
    scales: ScaleMode = "real"
    engine: Literal["cpu", "vllm"] = "cpu"
    env: dict[str, str] = Field(default_factory=dict)


class TeacherForcing(Strict):
    """Score the ``reference`` arm's restart-0 sequences with each of ``arms`` (teacher forcing)."""

    reference: str
    arms: list[str] = Field(min_length=1)


class GenerateExperiment(Strict):
    """Cold-restart greedy generation per arm, and teacher-forced replay across arms."""

    kind: Literal["generate"]
    model: str = "tiny-qwen3"
    model_seed: int = Field(default=0, ge=0)
    arms: dict[str, Arm] = Field(min_length=1)
    restarts: int = Field(default=2, ge=1, le=64)
    prompts: SyntheticPrompts | FilePrompts = Field(default_factory=SyntheticPrompts)
    max_new_tokens: int = Field(default=32, ge=1, le=8192)
    top_k: int = Field(default=5, ge=2, le=64)
    teacher_forced: list[TeacherForcing] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, v: dict[str, Arm]) -> dict[str, Arm]:
        bad = [a for a in v if not SWEEP_NAME.match(a)]
        if bad:
            raise ValueError(f"arm names {bad}: use letters, digits, '.', '_' or '-'")
        return v

    @model_validator(mode="after")
    def _tf_arms(self) -> GenerateExperiment:
        for i, tf in enumerate(self.teacher_forced):
            for name in [tf.reference, *tf.arms]:
                if name not in self.arms:
                    raise ValueError(f"teacher_forced[{i}]: unknown arm {name!r}; arms: {', '.join(self.arms)}")
            if tf.reference in tf.arms:
                raise ValueError(f"teacher_forced[{i}]: the reference arm {tf.reference!r} is also listed in arms")
        return self


class CheckExperiment(Strict):
    """Kernel correctness checks (docs/checks.md): one unit per kernel and shape."""

    kind: Literal["exact_match", "bounds"]
    kernels: list[str | Implementation] = Field(min_length=1)
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    shapes: list[list[int]] = Field(default_factory=lambda: [[64, 1000, 48], [127, 2049, 65], [1, 4096, 33]], min_length=1)
    trials: int = Field(default=20, ge=1, le=10000)
    seed: int = Field(default=0, ge=0)
    scales: Literal["pow2", "unit"] = "pow2"
    algorithm: str = "any"
    accumulate: str = "fp32"
    resources: Resources = Field(default_factory=Resources)

    @field_validator("shapes")
    @classmethod
    def _shapes(cls, v: list[list[int]]) -> list[list[int]]:
        for i, s in enumerate(v):
            if len(s) != 3 or any(x < 1 for x in s):
                raise ValueError(f"shape {i} must be [m, k, n] with positive sizes, got {s}")
        return v

    def impls(self) -> list[Implementation]:
        return [i if isinstance(i, Implementation) else Implementation(kernel=i) for i in self.kernels]


#: Experiment kinds and their models; later task kinds register here.
EXPERIMENT_MODELS: dict[str, type[Strict]] = {
    "kdepth": KdepthExperiment,
    "replay": ReplayExperiment,
    "generate": GenerateExperiment,
    "exact_match": CheckExperiment,
    "bounds": CheckExperiment,
}


class SweepSpec(Strict):
    """The top level of a sweep spec."""

    question: str = Field(min_length=1)
    name: str
    description: str | None = None
    max_retries: int = Field(default=2, ge=0, le=10)
    #: Pre-registered prediction files (paths relative to the spec), hashed at launch before any unit
    #: runs; amendments are new files appended here that name the hash they amend.
    preregistration: list[str] = Field(default_factory=list)
    experiments: dict[str, Any] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not SWEEP_NAME.match(v):
            raise ValueError("use letters, digits, '.', '_' or '-' (it names a results partition)")
        return v


class LoadedSpec(BaseModel):
    """A validated spec, its source text and its hash."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    path: str
    text: str
    sha256: str
    sweep: SweepSpec
    experiments: dict[str, Any]
    prereg_paths: list[str] = []


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: str) -> str:
    """``${VAR}`` / ``${VAR:-default}`` in model paths: checkpoints live at cluster-specific paths."""
    import os

    return _ENV_REF.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), value)


def _resolve(p: str, base_dir: Path) -> Path:
    q = Path(expand_env(p)).expanduser()
    return q if q.is_absolute() else (base_dir / q).resolve()


def _resolve_paths(exp: Any, base_dir: Path) -> Any:
    """Paths in a spec are relative to the spec's directory."""
    if isinstance(exp, ReplayExperiment | GenerateExperiment):
        update: dict[str, Any] = {}
        if exp.model != "tiny-qwen3":
            # A local directory relative to the spec, else kept as given (a path on the cluster's
            # GPU nodes, or a name vLLM resolves there).
            m = expand_env(exp.model)
            cand = _resolve(m, base_dir)
            update["model"] = str(cand) if cand.exists() else m
        if isinstance(exp.prompts, FilePrompts):
            update["prompts"] = FilePrompts(file=str(_resolve(exp.prompts.file, base_dir)))
        return exp.model_copy(update=update) if update else exp
    return exp


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if not str(p).startswith("function-"))


def _format_errors(err: ValidationError, prefix: tuple[Any, ...] = ()) -> list[str]:
    problems = []
    for e in err.errors(include_url=False):
        loc = prefix + tuple(e["loc"])
        # Pydantic names union members in the location (`int`, `list[int]`, ...): drop them.
        loc = tuple(p for p in loc if not re.match(r"^(int|str|list\[.*\]|bool|float|dict\[.*\]|GeometricRange|ArithmeticRange|Implementation|literal\[.*\])$", str(p)))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        problems.append(f"{_loc(loc) or '<top level>'}: {msg} (got {e.get('input')!r})" if e["type"] != "missing" else f"{_loc(loc)}: required field is missing")
    # Unions report one error per member; keep each message once.
    return list(dict.fromkeys(problems))


def parse_spec(text: str, path: str = "<string>") -> LoadedSpec:
    """Parse and validate spec text; raise SpecError naming every problem found."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(path, [f"not valid TOML: {exc}"]) from None
    try:
        sweep = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(path, _format_errors(exc)) from None
    problems: list[str] = []
    experiments: dict[str, Any] = {}
    for name, body in sweep.experiments.items():
        where = ("experiments", name)
        if not isinstance(body, dict):
            problems.append(f"{_loc(where)}: must be a table")
            continue
        kind = body.get("kind")
        if kind not in EXPERIMENT_MODELS:
            problems.append(f"{_loc(where)}.kind: unknown experiment kind {kind!r}; allowed: {', '.join(sorted(EXPERIMENT_MODELS))}")
            continue
        try:
            experiments[name] = EXPERIMENT_MODELS[kind].model_validate(body)
        except ValidationError as exc:
            problems.extend(_format_errors(exc, where))
    base_dir = Path(path).parent if path != "<string>" else Path.cwd()
    experiments = {name: _resolve_paths(exp, base_dir) for name, exp in experiments.items()}
    prereg = [str(_resolve(p, base_dir)) for p in sweep.preregistration]
    for i, p in enumerate(prereg):
        if not Path(p).is_file():
            problems.append(f"preregistration[{i}]: {sweep.preregistration[i]!r} not found (relative to the spec's directory)")
    if not problems:
        for name, exp in experiments.items():
            problems.extend(semantic_problems(("experiments", name), exp))
    if problems:
        raise SpecError(path, problems)
    return LoadedSpec(
        path=path,
        text=text,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        sweep=sweep,
        experiments=experiments,
        prereg_paths=prereg,
    )


def load_spec(path: str | Path) -> LoadedSpec:
    """Read and validate a spec file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(str(path), ["file not found" if not p.exists() else "not a regular file"])
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(path), [f"cannot read: {exc}"]) from None
    return parse_spec(text, str(path))


def semantic_problems(where: tuple[Any, ...], exp: Any) -> list[str]:
    """Cross-field rules that need the kernel registry (imported lazily: it imports torch)."""
    if isinstance(exp, KdepthExperiment):
        return _kdepth_problems(where, exp)
    if isinstance(exp, ReplayExperiment):
        return _replay_problems(where, exp)
    if isinstance(exp, GenerateExperiment):
        return _generate_problems(where, exp)
    if isinstance(exp, CheckExperiment):
        return _check_problems(where, exp)
    return []


def _check_problems(where: tuple[Any, ...], exp: CheckExperiment) -> list[str]:
    from tasks.kernels import KernelError, get_kernel

    base = _loc(where)
    problems = []
    for i, impl in enumerate(exp.impls()):
        try:
            get_kernel(impl.kernel, **impl.params)
        except (KernelError, TypeError) as exc:
            problems.append(f"{base}.kernels[{i}]: {exc}")
    if exp.kind == "bounds":
        from tasks.checks import ALGORITHMS

        if exp.algorithm not in ALGORITHMS:
            problems.append(f"{base}.algorithm: unknown algorithm {exp.algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
    return problems


def _generate_problems(where: tuple[Any, ...], exp: GenerateExperiment) -> list[str]:
    base = _loc(where)
    problems = []
    vllm = [name for name, arm in exp.arms.items() if arm.engine == "vllm"]
    for name, arm in exp.arms.items():
        if arm.engine == "vllm":
            from tasks.models.vllm_selection import FAMILIES

            if arm.kernel not in FAMILIES and arm.kernel not in ("cutlass", "triton", "torch"):
                problems.append(f"{base}.arms.{name}.kernel: {arm.kernel!r} is not a vLLM kernel family; allowed: {', '.join(FAMILIES)}")
            if arm.scales != "real":
                problems.append(f"{base}.arms.{name}.scales: the vLLM engine runs a checkpoint's own scales; make a power-of-two probe checkpoint for pow2")
            continue
        p = _kernel_problem(f"{base}.arms.{name}.kernel", Implementation(kernel=arm.kernel, params=arm.params), "int8")
        if p:
            problems.append(p)
    if vllm and len(vllm) != len(exp.arms):
        problems.append(f"{base}.arms: mix of vllm arms {vllm} and cpu arms; put them in separate experiments")
    if not vllm:
        problems.extend(_model_and_prompt_problems(base, exp.model, exp.prompts))
    elif isinstance(exp.prompts, FilePrompts):
        problems.extend(_model_and_prompt_problems(base, "tiny-qwen3", exp.prompts))
    return problems


def _model_and_prompt_problems(base: str, model: str, prompts: Any) -> list[str]:
    problems = []
    if model != "tiny-qwen3" and not (Path(model) / "config.json").is_file():
        problems.append(f"{base}.model: {model!r} is neither 'tiny-qwen3' nor a directory with a config.json")
    if isinstance(prompts, FilePrompts):
        from orchestrator.plan import read_prompt_file

        try:
            read_prompt_file(prompts.file)
        except FileNotFoundError:
            problems.append(f"{base}.prompts.file: {prompts.file!r} not found")
        except (ValueError, OSError) as exc:
            problems.append(f"{base}.prompts.file: {exc}")
    return problems


def _kernel_problem(field: str, impl: Implementation, dtype: str) -> str | None:
    from tasks.kernels import KernelError, get_kernel

    try:
        kernel = get_kernel(impl.kernel, **impl.params)
    except KernelError as exc:
        return f"{field}: {exc}"
    except TypeError as exc:
        return f"{field}.params: {exc}"
    if kernel.operand_dtype not in (dtype, "any"):
        return f"{field}: kernel {impl.kernel!r} takes {kernel.operand_dtype} operands, but this experiment's dtype is {dtype}"
    return None


def _replay_problems(where: tuple[Any, ...], exp: ReplayExperiment) -> list[str]:
    base = _loc(where)
    problems = []
    if exp.engine == "vllm":
        from tasks.models.vllm_selection import FAMILIES

        if exp.capture_kernel not in FAMILIES and exp.capture_kernel not in ("cutlass", "triton"):
            problems.append(f"{base}.capture_kernel: {exp.capture_kernel!r} is not a vLLM kernel family; allowed: {', '.join(FAMILIES)}")
    else:
        p = _kernel_problem(f"{base}.capture_kernel", Implementation(kernel=exp.capture_kernel), "int8")
        if p:
            problems.append(p)
    for i, (a, b) in enumerate(exp.impl_pairs()):
        for j, impl in enumerate((a, b)):
            p = _kernel_problem(f"{base}.pairs[{i}][{j}]", impl, "int8")
            if p:
                problems.append(p)
        if a.name == b.name:
            problems.append(f"{base}.pairs[{i}]: both sides are {a.name!r}; give one a distinct `label`")
    if exp.engine == "cpu":
        problems.extend(_model_and_prompt_problems(base, exp.model, exp.prompts))
    return problems


def _kdepth_problems(where: tuple[Any, ...], exp: KdepthExperiment) -> list[str]:
    from tasks.kernels import KernelError, get_kernel

    problems: list[str] = []
    base = _loc(where)
    ks = axis_values(exp.k)
    if exp.dtype == "int8" and max(ks) > INT8_MAX_K:
        problems.append(
            f"{base}.k: K={max(ks)} exceeds the int32 no-overflow bound for int8 products "
            f"(K <= {INT8_MAX_K} with weights in [-127, 127]); an int32 accumulator could wrap"
        )
    labels: list[str] = []
    entries = [(f"{base}.implementations[{i}]", impl) for i, impl in enumerate(exp.impls())]
    entries.append((f"{base}.reference", exp.ref()))
    ms, ns = axis_values(exp.m), axis_values(exp.n)
    for field, impl in entries:
        labels.append(impl.name)
        try:
            kernel = get_kernel(impl.kernel, **impl.params)
        except KernelError as exc:
            problems.append(f"{field}: {exc}")
            continue
        except TypeError as exc:
            problems.append(f"{field}.params: {exc}")
            continue
        if kernel.operand_dtype not in (exp.dtype, "any"):
            problems.append(
                f"{field}: kernel {impl.kernel!r} takes {kernel.operand_dtype} operands, "
                f"but this experiment's dtype is {exp.dtype}"
            )
            continue
        for m in ms:
            for n in ns:
                ok, why = kernel.supports(m, n, max(ks), m, n, exp.bias)
                if not ok:
                    problems.append(f"{field}: kernel {impl.kernel!r} cannot run M={m} N={n} with per-token/per-channel scales: {why}")
                    break
            else:
                continue
            break
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        problems.append(f"{base}.implementations: duplicate implementation names {dupes}; give each a distinct `label`")
    return problems
