"""The one registry of experiment kinds: the only list of kind names in the code.

Each built-in kind is a lazy ``"module:attr"`` entry, imported on first use (so ``swapcheck --help``
and spec parsing import nothing heavy); :func:`register_kind` adds another (a plugin, or a kind a
test defines); a duplicate name is refused; an unknown name is answered with "did you mean ..." and
the valid names — the shape of :mod:`tasks.kernels.registry`.

Adding a kind is one new module under ``tasks/kinds/`` that builds a :class:`Kind`, its entry
below, its tables in ``storage/schemas.py``, and its tests (docs/architecture.md).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import Any

from tasks.kinds.base import Kind, Rows, Unit, UnitContext, canonical_json, content_id

__all__ = [
    "Kind",
    "KindError",
    "Rows",
    "Unit",
    "UnitContext",
    "canonical_json",
    "experiment_kinds",
    "get_kind",
    "kind_names",
    "kind_ref",
    "register_kind",
    "unit_id",
    "unregister_kind",
]

#: name -> a Kind, or "module:attr" naming one (imported on first use).
_REGISTRY: dict[str, Kind | str] = {
    "kdepth": "tasks.kinds.kdepth:KIND",
    "replay": "tasks.kinds.replay:KIND",
    "generate": "tasks.kinds.generate:KIND",
    "teacher_forced": "tasks.kinds.teacher_forced:KIND",
    "exact_match": "tasks.kinds.exact_match:KIND",
    "bounds": "tasks.kinds.bounds:KIND",
    "attention_replay": "tasks.kinds.attention_replay:KIND",
    "quantize": "tasks.kinds.quantize:KIND",
    "batch_invariance": "tasks.kinds.batch_invariance:KIND",
    "fuzz": "tasks.kinds.fuzz:KIND",
}


class KindError(ValueError):
    """An unknown or duplicate experiment kind; the message lists the valid names."""


def register_kind(kind: Kind | str, name: str | None = None) -> Kind | str:
    """Register ``kind`` (a :class:`Kind`, or ``"module:attr"`` with ``name``); duplicates are refused."""
    key = kind.name if isinstance(kind, Kind) else name
    if not key:
        raise KindError("a lazy kind entry needs a name")
    if key in _REGISTRY:
        raise KindError(f"experiment kind {key!r} is already registered")
    _REGISTRY[key] = kind
    return kind


def unregister_kind(name: str) -> None:
    _REGISTRY.pop(name, None)


def kind_names() -> list[str]:
    """Every registered kind, sorted (including kinds planned by another kind)."""
    return sorted(_REGISTRY)


def get_kind(name: str, ref: str | None = None) -> Kind:
    """The kind called ``name``; an unknown name raises :class:`KindError` with the valid names.

    ``ref`` (``"module:attr"``, from :func:`kind_ref` in the process that planned the unit) lets a
    worker process find a kind that was registered at run time in the driver (a plugin, a test).
    """
    if isinstance(name, str) and name not in _REGISTRY and ref:
        _REGISTRY[name] = ref
    entry = _REGISTRY.get(name) if isinstance(name, str) else None
    if entry is None:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise KindError(f"unknown experiment kind {name!r}; {hint}allowed: {', '.join(experiment_kinds())}")
    if isinstance(entry, str):
        module, attr = entry.split(":")
        loaded: Any = getattr(importlib.import_module(module), attr)
        if not isinstance(loaded, Kind) or loaded.name != name:
            raise KindError(f"{entry} is not the Kind {name!r}")
        _REGISTRY[name] = entry = loaded
    return entry


def kind_ref(name: str) -> str | None:
    """Where another process finds kind ``name``: its lazy entry, or the module attribute holding it."""
    entry = _REGISTRY.get(name)
    if entry is None or isinstance(entry, str):
        return entry
    module = sys.modules.get(getattr(entry.run, "__module__", ""))
    for attr, value in vars(module).items() if module else ():
        if value is entry:
            return f"{module.__name__}:{attr}"  # type: ignore[union-attr]
    return None


def experiment_kinds() -> list[str]:
    """Kinds a spec may name (those with a spec model of their own), sorted."""
    return [n for n in kind_names() if get_kind(n).spec is not None]


def unit_id(kind: str, params: dict[str, Any]) -> str:
    """The content-addressed id of a unit of ``kind`` with ``params`` (the kind's version included)."""
    return content_id(kind, get_kind(kind).version, params)
