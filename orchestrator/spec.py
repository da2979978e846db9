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
import os
import re
import unicodedata
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.errors import SpecError
from swapcheck_common.echo import echo
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


#: Keys whose string values name things a user sees or that become paths: kernels' and quantizers'
#: ``label``, and any ``name``. Dict keys (arm names, parameter names) are names too.
_NAME_KEYS = frozenset({"label", "name"})
#: Longest label (as ``NAME``): it becomes a column value and a table cell.
MAX_LABEL = 128


def _bad_name_character(text: str) -> str | None:
    """Why ``text`` cannot be a label or name shown on a terminal: a control character (newline, escape,
    NUL, DEL, ...), a line or paragraph separator, or a bidirectional override that reorders what is
    shown (unicode categories Cc, Zl, Zp and the Cf formatting controls); None when it has none."""
    for c in text:
        if unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cf"):
            return f"U+{ord(c):04X}"
    return None


def _label_problems(where: tuple[Any, ...], body: Any) -> list[str]:
    """Labels and names anywhere inside an experiment (every kind's ``label``, arm names, keys) that
    hold a control character or are longer than :data:`MAX_LABEL`: each names its field path."""
    problems: list[str] = []
    stack: list[tuple[tuple[Any, ...], Any]] = [(where, body)]
    while stack:
        at, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                bad = _bad_name_character(str(key))
                if bad:
                    problems.append(f"{_path(at)}: the key {echo(key)} contains a control character ({bad}); use "
                                    "letters, digits, '.', '_' or '-'")
                    continue
                if key in _NAME_KEYS and isinstance(item, str):
                    bad = _bad_name_character(item)
                    if bad:
                        problems.append(f"{_path((*at, key))}: a {key} must not contain newlines or other control "
                                        f"characters (found {bad}); it is shown in tables and on terminals")
                    elif key == "label" and len(item) > MAX_LABEL:
                        problems.append(f"{_path((*at, key))}: a label is at most {MAX_LABEL} characters "
                                        f"(got {len(item)})")
                stack.append(((*at, key), item))
        elif isinstance(value, list):
            stack.extend(((*at, i), item) for i, item in enumerate(value))
    return sorted(problems)


def _path(where: tuple[Any, ...]) -> str:
    """``experiments.int8.implementations[1].label``: a field path with list positions in brackets."""
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_ENV_NAME = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)|\$([A-Za-z_][A-Za-z0-9_]*)")
_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")
#: Shortest value of a referenced variable hidden where it appears unquoted (shorter ones only in quotes).
MIN_HIDDEN = 6


def hide_environment(problems: list[str], text: str) -> list[str]:
    """Problem lines with the values of the environment variables that ``text`` references removed.

    Paths are expanded (``${CKPT}/model``) before they are checked, so a "not found" message would
    show the expanded path: whatever the variable holds (a secret, a home directory). A quoted value
    that contains one is replaced whole, as an environment reference is (``swapcheck_common.echo``);
    an unquoted occurrence of a longer value too.
    """
    from swapcheck_common.echo import HIDDEN_ENV

    values = {v for m in _ENV_NAME.finditer(text) if (v := os.environ.get(m.group(1) or m.group(2), ""))}
    if not values:
        return problems

    def quoted(m: re.Match[str]) -> str:
        return HIDDEN_ENV if any(v in m.group(0) for v in values) else m.group(0)

    out = []
    for line in problems:
        line = _QUOTED.sub(quoted, line)
        for v in sorted(values, key=len, reverse=True):
            if len(v) >= MIN_HIDDEN:
                line = line.replace(v, HIDDEN_ENV)
        out.append(line)
    return out


def _experiments(sweep: SweepSpec, resolve: Any) -> tuple[dict[str, Any], list[str]]:
    """Each experiment validated by its kind's model, paths resolved; and the problems found."""
    from tasks.kinds import KindError, experiment_kinds, get_kind

    problems: list[str] = []
    experiments: dict[str, Any] = {}
    for name, body in sweep.experiments.items():
        where = ("experiments", name)
        bad = _bad_name_character(name)  # the rule of every other key: controls, separators, bidi overrides
        if bad:
            problems.append(f"experiments: the experiment name {echo(name)} contains a control character ({bad}); "
                            "use letters, digits, '.', '_' or '-'")
            continue
        if not isinstance(body, dict):
            problems.append(f"{_loc(where)}: must be a table")
            continue
        labels = _label_problems(where, body)
        if labels:
            problems.extend(labels)
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


def _shared_arm_names(experiments: dict[str, Any]) -> list[str]:
    """An arm name given to arms of two ``generate`` experiments of one sweep. The generation tables
    (``sequences``, ``generated``, ``teacher_forced``) and every report over them key a run by sweep
    and arm, so such arms' rows would be pooled as one arm's: refused, naming both."""
    first: dict[str, str] = {}
    problems = []
    for name, exp in experiments.items():
        if getattr(exp, "kind", None) != "generate":
            continue
        for arm in getattr(exp, "arms", None) or {}:
            if arm in first:
                problems.append(
                    f"{_loc(('experiments', name, 'arms', arm))}: the arm name {arm!r} is also an arm of "
                    f"{_loc(('experiments', first[arm]))}; runs are keyed by sweep and arm, so the two experiments' "
                    "rows would be pooled as one arm's: give every generate arm a name unique in the sweep "
                    f"(e.g. {arm + '-' + name!r})")
            else:
                first[arm] = name
    return problems


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
        problems.extend(_shared_arm_names(experiments))
    if problems:
        raise SpecError(path, hide_environment(problems, text))
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
