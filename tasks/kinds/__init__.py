"""The one registry of experiment kinds: the only list of kind names in the code.

A :class:`swapcheck_common.registry.Registry` of :class:`Kind`: each built-in kind is a lazy ``"module:attr"``
entry, imported on first use (so ``swapcheck --help`` and spec parsing import nothing heavy);
:func:`register_kind` adds another (a plugin, or a kind a test defines); a duplicate name is
refused; an unknown name is answered with "did you mean ..." and the valid names (:class:`KindError`,
a :class:`~swapcheck_common.registry.RegistryError`: exit code 2).

Adding a kind is one new module under ``tasks/kinds/`` that builds a :class:`Kind`, its entry
below, its tables in ``storage/schemas.py``, and its tests (docs/architecture.md).
"""

from __future__ import annotations

import sys
from typing import Any

from swapcheck_common.registry import Registry, RegistryError
from tasks.inputs import expansion_input
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


class KindError(RegistryError):
    """An unknown or duplicate experiment kind; the message lists the valid names."""


def _check_kind(name: str, loaded: Any) -> None:
    if not isinstance(loaded, Kind) or loaded.name != name:
        raise KindError(f"{_REGISTRY.ref(name)} is not the Kind {name!r}")


#: name -> a Kind, or "module:attr" naming one (imported on first use).
_REGISTRY: Registry[Kind] = Registry("experiment kind", error=KindError, validate=_check_kind)
for _name in ("kdepth", "replay", "generate", "teacher_forced", "exact_match", "bounds", "attention_replay",
              "quantize", "batch_invariance", "fuzz", "precision"):
    _REGISTRY.register(_name, f"tasks.kinds.{_name}:KIND")
_REGISTRY.register("localize", "tasks.kinds.localize:KIND")  # issue 27: where two kernels make a generation part


def register_kind(kind: Kind | str, name: str | None = None) -> Kind | str:
    """Register ``kind`` (a :class:`Kind`, or ``"module:attr"`` with ``name``); duplicates are refused."""
    from tasks.inputs import caller_module, registered_at_runtime

    key = kind.name if isinstance(kind, Kind) else name
    if not key:
        raise KindError("a lazy kind entry needs a name")
    out = _REGISTRY.register(key, kind)
    registered_at_runtime(f"kind {key!r}", kind, caller_module())
    return out


def unregister_kind(name: str) -> None:
    from tasks.inputs import caller_module, registered_at_runtime

    registered_at_runtime(f"kind {name!r}", None, caller_module())
    _REGISTRY.unregister(name)


def kind_names() -> list[str]:
    """Every registered kind, sorted (including kinds planned by another kind)."""
    return _REGISTRY.names()


def get_kind(name: str, ref: str | None = None) -> Kind:
    """The kind called ``name``; an unknown name raises :class:`KindError` with the valid names.

    ``ref`` (``"module:attr"``, from :func:`kind_ref` in the process that planned the unit) lets a
    worker process find a kind that was registered at run time in the driver (a plugin, a test).
    """
    if isinstance(name, str) and name and name not in _REGISTRY and ref:
        _REGISTRY.register(name, ref)
    if not isinstance(name, str) or name not in _REGISTRY:
        raise _REGISTRY.unknown(name, allowed=experiment_kinds())
    return _REGISTRY.get(name)


def kind_ref(name: str) -> str | None:
    """Where another process finds kind ``name``: its lazy entry, or the module attribute holding it."""
    if name not in _REGISTRY:
        return None
    if not _REGISTRY.is_loaded(name):
        return _REGISTRY.ref(name)
    entry = _REGISTRY.get(name)
    module = sys.modules.get(getattr(entry.run, "__module__", ""))
    for attr, value in vars(module).items() if module else ():
        if value is entry:
            return f"{module.__name__}:{attr}"  # type: ignore[union-attr]
    return None


def experiment_kinds() -> list[str]:
    """Kinds a spec may name (those with a spec model of their own), sorted."""
    return [n for n in kind_names() if get_kind(n).spec is not None]


def unit_id(kind: str, params: dict[str, Any]) -> str:
    """The content-addressed id of a unit of ``kind`` with ``params`` (the kind's version included, and
    for a kind from a user's package or a plugin the fingerprint of its code: :func:`kind_version`)."""
    return content_id(kind, kind_version(kind), params)


def kind_version(name: str) -> str:
    """What enters a unit id as kind ``name``'s version (:meth:`Kind.id_version`)."""
    return get_kind(name).id_version()


@expansion_input
def kind_code(name: str) -> str | None:
    """The code fingerprint of a user's or a plugin's kind; None for swapcheck's own (:meth:`Kind.code`)."""
    return get_kind(name).code()
