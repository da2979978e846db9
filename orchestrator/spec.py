"""Sweep specs: the envelope, and the one loader that validates a TOML file into pydantic models.

A spec is a TOML file that opens with the question it answers and declares named experiments::

    question = "Do CUTLASS-order and Triton-order INT8 epilogues agree as K grows?"
    name = "kdepth-demo"

    [experiments.int8]
    kind = "kdepth"
    dtype = "int8"
    implementations = ["int8-cutlass-order", "int8-triton-order"]
    k = { start = 256, stop = 16384, factor = 2 }

The envelope (question, name, retries, pre-registrations) is defined here; each experiment's model,
its cross-field rules and its path resolution come from its kind (:mod:`tasks.kinds`). Unknown keys,
wrong types, unknown kernels and impossible parameters are errors that name the file and the field
path (``experiments.int8.k.stop``); nothing is written when a spec is invalid. Pre-registration files
are read with the same loader (``swapcheck_common.toml_model.load_toml_model``, through ``storage.prereg.parse``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.errors import SpecError
from swapcheck_common.toml_model import TomlModelError, format_errors
from swapcheck_common.toml_model import load_toml_model as _load
from swapcheck_common.toml_model import loc as _loc
from tasks.kinds.fields import NAME, Strict, expand_env

__all__ = ["LoadedSpec", "SweepSpec", "load_spec", "load_toml_model", "parse_spec"]

M = TypeVar("M", bound=BaseModel)


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
        if any(c < " " or c == "\x7f" for c in v):
            raise ValueError("a name must not contain newlines or other control characters; use letters, "
                             "digits, '.', '_' or '-' (it names a results partition)")
        if not NAME.match(v):
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


#: Largest spec or pre-registration file read.
MAX_SPEC_BYTES = 4 * 2**20


def load_toml_model(text: str, path: str, model: type[M]) -> M:
    """TOML text validated into ``model`` by the one loader (``swapcheck_common.toml_model``); SpecError naming
    the file and every field path otherwise."""
    try:
        return _load(text, path, model)
    except TomlModelError as exc:
        raise SpecError(exc.path, exc.problems) from None


def _resolver(base_dir: Path) -> Any:
    """Paths in a spec are relative to the spec's directory (``${VAR}`` expanded first)."""

    def resolve(p: str) -> Path:
        q = Path(expand_env(p)).expanduser()
        return q if q.is_absolute() else (base_dir / q).resolve()

    return resolve


def _experiments(sweep: SweepSpec, resolve: Any) -> tuple[dict[str, Any], list[str]]:
    """Each experiment validated by its kind's model, paths resolved; and the problems found."""
    from tasks.kinds import KindError, experiment_kinds, get_kind

    problems: list[str] = []
    experiments: dict[str, Any] = {}
    for name, body in sweep.experiments.items():
        where = ("experiments", name)
        if any(c < " " or c == "\x7f" for c in name):
            problems.append(f"experiments: the experiment name {name!r} contains a newline or another control "
                            "character; use letters, digits, '.', '_' or '-'")
            continue
        if not isinstance(body, dict):
            problems.append(f"{_loc(where)}: must be a table")
            continue
        try:
            kind = get_kind(body.get("kind"))  # type: ignore[arg-type]
            if kind.spec is None:
                raise KindError(f"unknown experiment kind {body.get('kind')!r}; allowed: {', '.join(experiment_kinds())}")
        except KindError as exc:
            problems.append(f"{_loc(where)}.kind: {exc}")
            continue
        try:
            experiments[name] = kind.resolve(kind.spec.model_validate(body), resolve)
        except ValidationError as exc:
            problems.extend(format_errors(exc, where))
    return experiments, problems


def parse_spec(text: str, path: str = "<string>") -> LoadedSpec:
    """Parse and validate spec text; raise SpecError naming every problem found."""
    from tasks.kinds import get_kind

    sweep = load_toml_model(text, path, SweepSpec)
    base_dir = Path(path).parent if path != "<string>" else Path.cwd()
    resolve = _resolver(base_dir)
    experiments, problems = _experiments(sweep, resolve)
    prereg = [str(resolve(p)) for p in sweep.preregistration]
    for i, p in enumerate(prereg):
        if not Path(p).is_file():
            problems.append(f"preregistration[{i}]: {sweep.preregistration[i]!r} not found (relative to the spec's directory)")
    if not problems:
        for name, exp in experiments.items():
            try:
                problems.extend(get_kind(exp.kind).problems(_loc(("experiments", name)), exp))
            except ValidationError as exc:  # a kind's check building a model (a 1 MB kernel name): still bad input
                problems.extend(format_errors(exc, ("experiments", name)))
    if problems:
        raise SpecError(path, problems)
    return LoadedSpec(path=path, text=text, sha256=hashlib.sha256(text.encode()).hexdigest(), sweep=sweep,
                      experiments=experiments, prereg_paths=prereg)


def load_spec(path: str | Path) -> LoadedSpec:
    """Read and validate a spec file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(str(path), ["file not found" if not p.exists() else "not a regular file"])
    try:
        if p.stat().st_size > MAX_SPEC_BYTES:
            raise SpecError(str(path), [f"the file is larger than {MAX_SPEC_BYTES // 2**20} MiB; a spec is a short TOML file"])
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(path), [f"cannot read: {exc}"]) from None
    return parse_spec(text, str(path))
