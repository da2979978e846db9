"""Building blocks of experiment spec models, shared by the kinds (and by the sweep envelope).

Strict models (unknown keys, wrong types are errors), the range forms of an integer axis
(``{start, stop, factor}``, ``{start, stop, step}``), one kernel in an experiment
(:class:`Implementation`), the Ray resources of a unit, prompt sets, and the helpers that turn them
into canonical unit parameters (kernel versions, model fingerprints, prompt payloads).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Names that become partitions, arms or labels: letters, digits, '.', '_' or '-'.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

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


def check_axis(v: Any, minimum: int) -> Any:
    """A validator body: the axis is non-empty, distinct and every value >= ``minimum``."""
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


def as_impl(x: str | Implementation) -> Implementation:
    return x if isinstance(x, Implementation) else Implementation(kernel=x)


class Resources(Strict):
    """Ray resources one unit requests."""

    num_cpus: float = Field(default=1, ge=0)
    num_gpus: float = Field(default=0, ge=0)
    memory_gb: float | None = Field(default=None, gt=0)

    def with_gpu(self, needed: bool) -> Resources:
        """One GPU when the unit needs a device and the spec did not ask for any."""
        return self.model_copy(update={"num_gpus": 1}) if needed and self.num_gpus == 0 else self


class SyntheticPrompts(Strict):
    """``count`` prompts of ``length`` token ids drawn uniformly from the model's vocabulary."""

    count: int = Field(default=4, ge=1, le=4096)
    length: int = Field(default=16, ge=1, le=32768)
    seed: int = Field(default=0, ge=0)


class FilePrompts(Strict):
    """A JSONL file, one prompt per line: a JSON list of token ids, or ``{"tokens": [...]}``."""

    file: str


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


def impl_payload(impl: Implementation) -> dict[str, Any]:
    """An implementation as unit parameters: its kernel's version is part of the unit id."""
    from tasks.kernels import get_kernel

    kernel = get_kernel(impl.kernel, **impl.params)
    return {"name": impl.name, "kernel": impl.kernel, "params": dict(sorted(impl.params.items())), "version": kernel.version}


def needs_gpu(impls: list[Implementation]) -> bool:
    from tasks.kernels import get_kernel

    return any(get_kernel(i.kernel, **i.params).device == "cuda" for i in impls)


# -- models and prompts ---------------------------------------------------------------------------

def model_fingerprint(model: str) -> str:
    """Identity of a model for unit ids: the name, or a hash of a checkpoint's config and file list."""
    if model == "tiny-qwen3":
        return model
    d = Path(model)
    if not (d / "config.json").is_file():
        # A checkpoint only the cluster's GPU nodes hold (or a hub name vLLM resolves there).
        return f"{model}@unverified"
    h = hashlib.sha256((d / "config.json").read_bytes())
    for f in sorted(d.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return f"{d.name}@{h.hexdigest()[:16]}"


def prompt_payload(prompts: Prompts) -> dict[str, Any]:
    from tasks.prompts import read_prompt_file

    if isinstance(prompts, FilePrompts):
        return {"tokens": read_prompt_file(prompts.file)}
    return {"synthetic": prompts.model_dump()}


def model_and_prompt_problems(base: str, model: str, prompts: Prompts) -> list[str]:
    from tasks.prompts import read_prompt_file

    problems = []
    if model != "tiny-qwen3" and not (Path(model) / "config.json").is_file():
        problems.append(f"{base}.model: {model!r} is neither 'tiny-qwen3' nor a directory with a config.json")
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
    if exp.model != "tiny-qwen3":
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
