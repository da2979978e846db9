"""The one TOML loader: text validated into a pydantic model, every problem named by its field path.

Sweep specs (``orchestrator.spec``) and pre-registered prediction files (``storage.prereg``) both
load through :func:`load_toml_model`; it lives here, below every layer, so that each may use it
(``swapcheck_common`` imports nothing of swapcheck). A failure is a :class:`TomlModelError` naming the file
and each problem (``experiments.int8.k.stop: ...``); callers turn it into their own error
(``orchestrator.spec`` into ``SpecError``) or let it through (exit 2, an ``InputError``).
"""

from __future__ import annotations

import re
import tomllib
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from swapcheck_common.echo import echo, scrub
from swapcheck_common.errors import InputError

__all__ = ["MAX_NESTING", "TomlModelError", "format_errors", "load_toml_model", "loc"]

M = TypeVar("M", bound=BaseModel)

#: Deepest nesting of tables and arrays a file may use (a spec needs about 5).
MAX_NESTING = 32

# Pydantic names union members in an error's location (`int`, `list[int]`, ...): not field names.
_UNION_MEMBER = re.compile(r"^(int|str|list\[.*\]|bool|float|dict\[.*\]|GeometricRange|ArithmeticRange|"
                           r"Implementation|SyntheticPrompts|FilePrompts|literal\[.*\])$")


class TomlModelError(InputError):
    """A TOML file is not valid TOML or not a valid instance of its model; ``problems`` says why."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = [scrub(p) for p in problems]
        super().__init__(f"{path}: " + "; ".join(self.problems))


def loc(where: tuple[Any, ...]) -> str:
    """A field path as users write it: ``experiments.int8.k.stop``."""
    return ".".join(str(p) for p in where if not str(p).startswith("function-"))


def format_errors(err: ValidationError, prefix: tuple[Any, ...] = ()) -> list[str]:
    """One ``field.path: message (got ...)`` line per problem, each once; the value shown is a bounded
    excerpt, and never one that looks like a secret (``swapcheck_common.echo``)."""
    problems = []
    for e in err.errors(include_url=False):
        where = tuple(p for p in prefix + tuple(e["loc"]) if not _UNION_MEMBER.match(str(p)))
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        problems.append(f"{loc(where)}: required field is missing" if e["type"] == "missing"
                        else f"{loc(where) or '<top level>'}: {msg} (got {echo(e.get('input'), where)})")
    return list(dict.fromkeys(problems))


def _too_deep(raw: Any) -> str | None:
    """The path of a value nested deeper than :data:`MAX_NESTING`, or None (no recursion)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(raw, ())]
    while stack:
        value, where = stack.pop()
        if len(where) > MAX_NESTING:
            return loc(where[:MAX_NESTING]) + "..."
        if isinstance(value, dict):
            stack.extend((v, (*where, k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*where, f"[{i}]")) for i, v in enumerate(value))
    return None


def load_toml_model(text: str, path: str, model: type[M]) -> M:
    """TOML text validated into ``model``; TomlModelError naming the file and every field path otherwise.

    Any failure of the parser (invalid TOML, nesting so deep that it recurses out, ...) is a
    TomlModelError too: a file never crashes the loader."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlModelError(path, [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise TomlModelError(path, [f"not usable: tables or arrays nested too deeply (at most {MAX_NESTING} levels)"]) from None
    except Exception as exc:  # a parser crash on hostile input is still bad input
        raise TomlModelError(path, [f"not valid TOML: {type(exc).__name__}: {exc}"]) from None
    deep = _too_deep(raw)
    if deep is not None:
        raise TomlModelError(path, [f"{deep}: tables or arrays nested deeper than {MAX_NESTING} levels"])
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise TomlModelError(path, format_errors(exc)) from None
    except RecursionError:
        raise TomlModelError(path, [f"tables or arrays nested too deeply (at most {MAX_NESTING} levels)"]) from None
