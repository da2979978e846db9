"""``Registry[T]``: the one shape of every name -> thing table of swapcheck.

Experiment kinds, GEMM kernels, attention kernels, quantizers and reports are each one
``Registry``: ``register`` (a duplicate name is refused), ``get`` (an unknown name raises the
registry's error with a did-you-mean and the allowed names), ``names``, iteration in name order,
and lazy entries (``"module:attr"``, imported on first ``get``) so that listing names imports no
heavy module. Contract tests iterate the registries rather than listing names by hand.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from swapcheck_common.errors import InputError

__all__ = ["Registry", "RegistryError", "did_you_mean"]

T = TypeVar("T")


class RegistryError(InputError):
    """An unknown or duplicate name in a registry (exit code 2)."""


def did_you_mean(name: object, choices: list[str]) -> str:
    """``"did you mean 'x'? "`` for the close matches of ``name`` among ``choices`` (or ``""``)."""
    close = difflib.get_close_matches(str(name), choices, n=3, cutoff=0.5)
    return f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""


class Registry(Generic[T]):
    """Names -> entries of one kind of thing (``what``, as messages name it).

    ``error`` is the exception class raised for an unknown or duplicate name, or a lazy entry that
    cannot be loaded: :class:`RegistryError` or a layer's own input error (a subclass of
    :class:`~swapcheck_common.errors.InputError`, so that every registry maps to exit code 2 through one base).
    ``validate(name, entry)`` runs when a lazy entry is loaded and may raise ``error``.  An entry
    is never a ``str`` itself: a string is the ``"module:attr"`` of a lazy entry.
    """

    def __init__(self, what: str, *, error: type[InputError] = RegistryError,
                 validate: Callable[[str, T], None] | None = None) -> None:
        self.what = what
        self.error = error
        self._validate = validate
        self._entries: dict[str, T | str] = {}

    # -- writing ------------------------------------------------------------------------------
    def register(self, name: str, entry: T | str, *, replace: bool = False) -> T | str:
        """Add ``entry`` (or ``"module:attr"`` naming it) as ``name``; a taken name is refused."""
        if not isinstance(name, str) or not name:
            raise self.error(f"a {self.what} needs a non-empty name, not {name!r}")
        if name in self._entries and not replace:
            raise self.error(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (no error if it is absent)."""
        self._entries.pop(name, None)

    # -- reading ------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every registered name, sorted (lazy entries included, nothing imported)."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def is_loaded(self, name: str) -> bool:
        """Whether ``name``'s entry is already an object (not a ``"module:attr"`` still to import)."""
        return name in self._entries and not isinstance(self._entries[name], str)

    def ref(self, name: str) -> str | None:
        """The ``"module:attr"`` of a lazy entry (None for an entry registered as an object)."""
        entry = self._entries.get(name)
        return entry if isinstance(entry, str) else None

    def unknown(self, name: object, *, allowed: list[str] | None = None, note: str = "") -> InputError:
        """The error for an unknown ``name``: did-you-mean and the allowed names.

        ``allowed`` narrows the names listed (default: every name); ``note`` is appended (say what
        else a name may be, such as ``'package.module:attr'``).
        """
        shown = ", ".join(self.names() if allowed is None else allowed) or "none registered"
        return self.error(f"unknown {self.what} {name!r}; {did_you_mean(name, self.names())}allowed: {shown}{note}")

    def get(self, name: str) -> T:
        """The entry called ``name`` (imported if lazy); an unknown name raises :meth:`unknown`, a
        lazy entry whose module or attribute cannot be loaded raises ``error`` naming it."""
        entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is None:
            raise self.unknown(name)
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            try:
                loaded: T = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise self.error(f"{self.what} {name!r}: cannot load {entry}: {exc}") from exc
            if self._validate is not None:
                self._validate(name, loaded)
            self._entries[name] = entry = loaded
        return entry

    def values(self) -> list[T]:
        """Every entry, loaded, in name order."""
        return [self.get(n) for n in self.names()]

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs, loaded, in name order."""
        return [(n, self.get(n)) for n in self.names()]
