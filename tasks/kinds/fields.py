"""Building blocks of experiment spec models, shared by the kinds (and by the sweep envelope).

Strict models (unknown keys, wrong types are errors), the range forms of an integer axis
(``{start, stop, factor}``, ``{start, stop, step}``), one kernel in an experiment
(:class:`Implementation`), the Ray resources of a unit, prompt sets, and the helpers that turn them
into canonical unit parameters (kernel versions, model fingerprints, prompt payloads).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.inputs import expansion_input

#: Names that become partitions, arms or labels: letters, digits, '.', '_' or '-'.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")  # \Z: "$" would let a trailing newline through

# -- limits on what a spec may ask for (docs/specs.md, "Limits") -----------------------------------
#: Largest M, N or K of one GEMM.
MAX_DIM = 2**20
#: Most values one integer axis (m, n, k, seeds) may take.
MAX_AXIS_VALUES = 10_000
#: Most units one experiment may expand to.
MAX_UNITS = 100_000
#: Largest seed (seeds feed 64-bit generators).
MAX_SEED = 2**63 - 1
#: Largest num_cpus / num_gpus one unit may request.
MAX_UNIT_CPUS = 1024
MAX_UNIT_GPUS = 1024
#: Largest memory_gb one unit may request.
MAX_UNIT_MEMORY_GB = 65536
#: The memory one unit may use (by the estimate from its shape) when its experiment sets no
#: ``resources.memory_gb``; with ``memory_gb`` set, the estimate must fit in that instead.
DEFAULT_UNIT_MEMORY_GB = 16
GIB = 2**30

ScaleMode = Literal["real", "pow2"]


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
        if self.count() > MAX_AXIS_VALUES:
            raise ValueError(f"the range has {self.count()} values; at most {MAX_AXIS_VALUES} are allowed")
        return self

    def count(self) -> int:
        return (self.stop - self.start) // self.step + 1

    def values(self) -> list[int]:
        return list(range(self.start, self.stop + 1, self.step))


IntAxis = int | list[int] | GeometricRange | ArithmeticRange


def check_arm_names(arms: dict[str, Any]) -> dict[str, Any]:
    """``arms`` (a spec's ``arms`` table), once every key is a :data:`NAME`; ValueError naming the others."""
    bad = [a for a in arms if not NAME.match(a)]
    if bad:
        raise ValueError(f"arm names {bad}: use letters, digits, '.', '_' or '-'")
    return arms


def axis_values(axis: IntAxis) -> list[int]:
    if isinstance(axis, int):
        return [axis]
    if isinstance(axis, list):
        return list(axis)
    return axis.values()


def check_axis(v: Any, minimum: int, maximum: int | None = None) -> Any:
    """A validator body: the axis is non-empty, distinct, every value >= ``minimum`` (and <=
    ``maximum``), at most :data:`MAX_AXIS_VALUES` values."""
    values = axis_values(v)
    if not values:
        raise ValueError("the axis is empty")
    if len(values) > MAX_AXIS_VALUES:
        raise ValueError(f"the axis has {len(values)} values; at most {MAX_AXIS_VALUES} are allowed")
    bad = [x for x in values if x < minimum]
    if bad:
        raise ValueError(f"values must be >= {minimum}, got {bad[:5]}")
    if maximum is not None:
        big = [x for x in values if x > maximum]
        if big:
            raise ValueError(f"values must be <= {maximum}, got {big[:5]}")
    if len(set(values)) != len(values):
        raise ValueError("values must be distinct")
    return v


class Implementation(Strict):
    """One kernel in an experiment: a registry name (or ``module:attr``), optional label and params."""

    kernel: str = Field(min_length=1, max_length=300)
    label: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_params_data(v)

    @property
    def name(self) -> str:
        return self.label or self.kernel


def check_seed_axis(v: Any) -> Any:
    """``seeds = 4`` means four seeds 0..3 (a count, 1..MAX_AXIS_VALUES); a list or a range names them."""
    if isinstance(v, int) and not isinstance(v, bool):
        if not 1 <= v <= MAX_AXIS_VALUES:
            raise ValueError(f"a seed count must be between 1 and {MAX_AXIS_VALUES}")
        return v
    return check_axis(v, 0, MAX_SEED)


def seed_values(seeds: IntAxis) -> list[int]:
    """The seeds an experiment's ``seeds`` field names (see :func:`check_seed_axis`)."""
    return list(range(seeds)) if isinstance(seeds, int) else axis_values(seeds)


def check_distinct(v: list[Any], what: str = "values") -> list[Any]:
    if len(set(v)) != len(v):
        raise ValueError(f"{what} must be distinct")
    return v


def check_params_data(v: dict[str, Any]) -> dict[str, Any]:
    """Kernel parameters are plain data: strings, booleans, integers, finite floats, lists and
    tables of them (no dates: they go into unit ids as JSON)."""
    stack: list[tuple[str, Any]] = [(k, x) for k, x in v.items()]
    while stack:
        where, x = stack.pop()
        if isinstance(x, dict):
            stack.extend((f"{where}.{k}", y) for k, y in x.items())
        elif isinstance(x, list):
            stack.extend((f"{where}[{i}]", y) for i, y in enumerate(x))
        elif isinstance(x, float) and not math.isfinite(x):
            raise ValueError(f"{where}: {x} is not a finite number")
        elif not isinstance(x, str | bool | int | float):
            raise ValueError(f"{where}: a {type(x).__name__} is not allowed; use a string, number or boolean")
    return v


def as_impl(x: str | Implementation) -> Implementation:
    return x if isinstance(x, Implementation) else Implementation(kernel=x)


class Resources(Strict):
    """Ray resources one unit requests (finite; whether a node of the cluster has them is checked
    at launch).  ``memory_gb`` also bounds the memory estimated from a unit's shape."""

    num_cpus: float = Field(default=1, ge=0, le=MAX_UNIT_CPUS, allow_inf_nan=False)
    num_gpus: float = Field(default=0, ge=0, le=MAX_UNIT_GPUS, allow_inf_nan=False)
    memory_gb: float | None = Field(default=None, gt=0, le=MAX_UNIT_MEMORY_GB, allow_inf_nan=False)

    def with_gpu(self, needed: bool) -> Resources:
        """One GPU when the unit needs a device and the spec did not ask for any."""
        return self.model_copy(update={"num_gpus": 1}) if needed and self.num_gpus == 0 else self


class SyntheticPrompts(Strict):
    """``count`` prompts of ``length`` token ids drawn uniformly from the model's vocabulary."""

    count: int = Field(default=4, ge=1, le=4096)
    length: int = Field(default=16, ge=1, le=32768)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)


class FilePrompts(Strict):
    """A JSONL file, one prompt per line: a JSON list of token ids, or ``{"tokens": [...]}`` with
    optionally ``"answer": [...]`` (the expected continuation; the generate kind checks it)."""

    file: str = Field(min_length=1)


Prompts = SyntheticPrompts | FilePrompts


# -- kernels --------------------------------------------------------------------------------------

def kernel_problem(field: str, impl: Implementation, dtype: str | None = None) -> str | None:
    """The problem with one kernel entry (unknown name, bad params, wrong operand dtype), or None."""
    from tasks.kernels import KernelError, get_kernel

    try:
        kernel = get_kernel(impl.kernel, **impl.params)
    except KernelError as exc:
        return f"{field}: {exc}"
    except TypeError as exc:
        return f"{field}.params: {exc}"
    if dtype is not None and kernel.operand_dtype not in (dtype, "any"):
        return f"{field}: kernel {impl.kernel!r} takes {kernel.operand_dtype} operands, but this experiment's dtype is {dtype}"
    return None


def gemm_unit_memory_bytes(m: int, n: int, k: int, implementations: int) -> int:
    """An upper estimate of the memory of a unit that draws GEMM operands
    (:func:`tasks.models.operands.draw_operands`) and runs ``implementations`` kernels (the exact
    reference among them) on them, from what ``kdepth``'s ``run`` allocates.

    Per operand element (``m*k + k*n``) 32 bytes: the fp32 draws, the quantizer's fp32 temporaries,
    the int8/e4m3 operands and the exact reference's float64 (or int64 chunk) copies.  Per output
    element (``m*n``) 128 bytes for the reference (its int64/float64 accumulator and the float64
    temporaries of its correctly rounded epilogue) and 16 per implementation (an int32/fp32
    accumulator, the output, the comparison's copies).
    """
    return 32 * (m * k + k * n) + m * n * (128 + 16 * implementations)


def memory_problem(field: str, what: str, estimate: int, resources: Resources) -> str | None:
    """Why a unit whose estimated memory is ``estimate`` bytes cannot run, or None.

    The limit is ``resources.memory_gb`` when the experiment sets it, else
    :data:`DEFAULT_UNIT_MEMORY_GB`."""
    limit_gb = resources.memory_gb if resources.memory_gb is not None else DEFAULT_UNIT_MEMORY_GB
    if estimate <= limit_gb * GIB:
        return None
    source = "resources.memory_gb" if resources.memory_gb is not None else (
        "the default per-unit limit; set resources.memory_gb to raise it")
    return (f"{field}: {what} needs about {estimate / GIB:,.1f} GiB of memory per unit, more than "
            f"{limit_gb:g} GiB ({source})")


def impl_payload(impl: Implementation) -> dict[str, Any]:
    """An implementation as unit parameters: its kernel's version is part of the unit id, and for a
    user's kernel the fingerprint of its code (``code``, tasks/fingerprint.py: an edit reruns
    its units; built-ins have none, so their ids are unchanged)."""
    from tasks.kernels import get_kernel
    from tasks.kernels.registry import kernel_code

    kernel = get_kernel(impl.kernel, **impl.params)
    out = {"name": impl.name, "kernel": impl.kernel, "params": dict(sorted(impl.params.items())), "version": kernel.version}
    code = kernel_code(impl.kernel)
    if code is not None:
        out["code"] = code
    return out


def needs_gpu(impls: list[Implementation]) -> bool:
    from tasks.kernels import get_kernel

    return any(get_kernel(i.kernel, **i.params).device == "cuda" for i in impls)


# -- models and prompts ---------------------------------------------------------------------------

#: Models named in a spec besides "tiny-qwen3" and a checkpoint path: the checkpoints shipped in the
#: repository's models/ (tasks.models.checkpoint.SHIPPED_MODELS; kept here so that validating a spec
#: imports no torch), loaded with their MANIFEST.json sha256 checked.
SHIPPED_MODELS = ("answer-qwen3",)

@expansion_input
def model_fingerprint(model: str) -> str:
    """Identity of a model for unit ids: the name, or a hash of a checkpoint's config and file list."""
    if model == "tiny-qwen3":
        return model
    if model in SHIPPED_MODELS:
        # The weights' sha256 from the shipped MANIFEST.json: retrained weights are another model.
        import json

        from tasks.models.checkpoint import shipped_model_dir

        manifest = json.loads((shipped_model_dir(model) / "MANIFEST.json").read_text())
        return f"{model}@{str(manifest['model_safetensors_sha256'])[:16]}"
    d = Path(model)
    if not (d / "config.json").is_file():
        # A checkpoint only the cluster's GPU nodes hold (or a hub name vLLM resolves there).
        return f"{model}@unverified"
    h = hashlib.sha256((d / "config.json").read_bytes())
    for f in sorted(d.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return f"{d.name}@{h.hexdigest()[:16]}"


def prompt_payload(prompts: Prompts) -> dict[str, Any]:
    from tasks.prompts import read_prompt_records

    if isinstance(prompts, FilePrompts):
        tokens, answers = read_prompt_records(prompts.file)
        if any(a is not None for a in answers):  # only then: files without answers keep their unit ids
            return {"tokens": tokens, "answers": answers}
        return {"tokens": tokens}
    return {"synthetic": prompts.model_dump()}


def model_and_prompt_problems(base: str, model: str, prompts: Prompts) -> list[str]:
    from tasks.prompts import read_prompt_file

    problems = []
    if model in SHIPPED_MODELS or (Path(model) / "MANIFEST.json").is_file():
        from tasks.models.checkpoint import check_manifest, shipped_model_dir

        try:
            check_manifest(shipped_model_dir(model) if model in SHIPPED_MODELS else Path(model))
        except ValueError as exc:
            problems.append(f"{base}.model: {exc}")
    elif model != "tiny-qwen3" and not (Path(model) / "config.json").is_file():
        problems.append(f"{base}.model: {model!r} is neither 'tiny-qwen3' nor a directory with a config.json "
                        f"nor a shipped model ({', '.join(SHIPPED_MODELS)})")
    if isinstance(prompts, FilePrompts):
        try:
            read_prompt_file(prompts.file)
        except FileNotFoundError:
            problems.append(f"{base}.prompts.file: {prompts.file!r} not found")
        except (ValueError, OSError) as exc:
            problems.append(f"{base}.prompts.file: {exc}")
    return problems


def resolve_model_and_prompts(exp: Any, resolve_path: Callable[[str], Path]) -> Any:
    """A model directory and a prompt file given relative to the spec become absolute paths."""
    update: dict[str, Any] = {}
    if exp.model != "tiny-qwen3" and exp.model not in SHIPPED_MODELS:
        # A local directory relative to the spec, else kept as given (a path on the cluster's
        # GPU nodes, or a name vLLM resolves there).
        cand = resolve_path(exp.model)
        update["model"] = str(cand) if cand.exists() else expand_env(exp.model)
    if isinstance(exp.prompts, FilePrompts):
        update["prompts"] = FilePrompts(file=str(resolve_path(exp.prompts.file)))
    return exp.model_copy(update=update) if update else exp


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: str) -> str:
    """``${VAR}`` / ``${VAR:-default}`` in model paths: checkpoints live at cluster-specific paths."""
    import os

    return _ENV_REF.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), value)


# -- an activation quantizer named in a spec (the quantize kind, generate's arms) ---------------


class QuantizerRef(Strict):
    """One quantizer: a registry name (``swapcheck`` lists them in docs/quantizers.md), optional
    label and parameters (which override the entry's presets)."""

    quantizer: str = Field(min_length=1, max_length=200)
    label: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_params_data(v)

    @property
    def name(self) -> str:
        return self.label or self.quantizer


def quantizer_problem(where: str, ref: QuantizerRef) -> str | None:
    """The problem with one quantizer entry (unknown name, bad parameters), or None."""
    from tasks.quantizers import QuantizerError, get_quantizer

    try:
        get_quantizer(ref.quantizer, **ref.params)
    except QuantizerError as exc:
        return f"{where}: {exc}"
    return None


def quantizer_payload(ref: QuantizerRef) -> dict[str, Any]:
    """A quantizer as unit parameters: its version is part of the unit id."""
    version, code = quantizer_identity(ref.quantizer, ref.params)
    payload = {"name": ref.name, "quantizer": ref.quantizer, "params": dict(sorted(ref.params.items())),
               "version": version}
    if code is not None:  # a user's quantizer: its code enters the unit id (issue #36); built-ins: pinned
        payload.update(kernel=ref.quantizer, code=code)
    return payload


@expansion_input
def quantizer_identity(quantizer: str, params: dict[str, Any]) -> tuple[str, str | None]:
    """A quantizer's version and, for a user's one, the fingerprint of its code (an expansion input)."""
    from tasks.fingerprint import code_fingerprint
    from tasks.quantizers import get_quantizer

    q = get_quantizer(quantizer, **params)
    return q.version, code_fingerprint(q, quantizer.partition(":")[0] if ":" in quantizer else None)
