"""What a spec's expansion reads besides the spec and swapcheck's own code: its *inputs* (issue #39).

A unit id is the hash of the unit's parameters, and some parameters come from outside the spec: a
model's fingerprint (its config and file list), a prompt file's tokens, the code fingerprint of a
user's kernel, kind, quantizer or attention kernel (issue #36). Each function that reads such an input
is an *expansion input*, marked with :func:`expansion_input`. While :func:`recording` is active,
every call of one is noted with its arguments and its result; :func:`replay` later calls the same
functions with the same arguments and says whether every result is still the same.

That is what lets a relaunch reuse a plan without walking a million-unit grid
(``orchestrator.plan_cache``): the expansion is a deterministic function of the resolved spec,
swapcheck's code and these results, so equal results give an equal plan. Two things keep the
argument sound:

* no expansion reads a file outside an expansion input: ``tests/test_plan_cache.py`` expands every
  kind's example and every shipped spec under an audit hook and fails on a read of anything but code;
* a registry entry that a process registered as an object from code other than swapcheck's own (a
  test's planted kernel, a notebook's kind) has attributes no fingerprint describes:
  :func:`registered_at_runtime` notes it, and :func:`not_hermetic` then gives the reason the
  process must expand every time. Entries registered as ``"module:attr"`` are fine: their code is
  fingerprinted by an expansion input when it is used.

Lookups take JSON arguments (strings, numbers, lists, dicts) and return JSON results; they run as
usual (no note) when nothing records.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = ["Recording", "caller_module", "expansion_input", "not_hermetic", "recording", "registered_at_runtime", "replay"]

F = TypeVar("F", bound=Callable[..., Any])

#: swapcheck's own top-level packages (tasks.fingerprint.OWN and the public ``swapcheck``).
OWN = frozenset({"tasks", "orchestrator", "storage", "reports", "swapcheck_common", "swapcheck"})
_MARK = "__swapcheck_expansion_input__"


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


class Recording:
    """The inputs one expansion read: ``reads`` maps (lookup, arguments) to the result, each as
    canonical JSON. ``conflict`` names a lookup that gave two results within the expansion (a file
    changed while it was read): such a recording describes no single state and must not be kept."""

    def __init__(self) -> None:
        self.reads: dict[tuple[str, str], str] = {}
        self.conflict: str | None = None
        self._depth = 0

    def note(self, lookup: str, args: tuple[Any, ...], result: Any) -> None:
        key = (lookup, _json(list(args)))
        value = _json(result)
        if self.reads.setdefault(key, value) != value and self.conflict is None:
            self.conflict = f"{lookup}{key[1]} gave two results while the spec was expanded"

    def entries(self) -> list[list[str]]:
        """``[[lookup, arguments, result], ...]`` (JSON texts), sorted: what :func:`replay` checks."""
        return [[k[0], k[1], v] for k, v in sorted(self.reads.items())]


_ACTIVE: ContextVar[Recording | None] = ContextVar("swapcheck_expansion_inputs", default=None)


def expansion_input(fn: F) -> F:
    """Mark ``fn`` (a module-level function of JSON arguments and a JSON result) as an input of the
    expansion: while :func:`recording`, its outermost calls are noted (calls it makes of other
    inputs are its own business: replaying it replays them)."""
    ref = f"{fn.__module__}:{fn.__qualname__}"

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        rec = _ACTIVE.get()
        if rec is None:
            return fn(*args)
        rec._depth += 1
        try:
            result = fn(*args)
        finally:
            rec._depth -= 1
        if rec._depth == 0:
            rec.note(ref, args, result)
        return result

    setattr(wrapper, _MARK, ref)
    return wrapper  # type: ignore[return-value]


def note(lookup: str, args: tuple[Any, ...], result: Any) -> None:
    """Note a read made through a cache (``lookup``: the expansion input that would make it again)."""
    rec = _ACTIVE.get()
    if rec is not None and rec._depth == 0:
        rec.note(lookup, args, result)


@contextmanager
def recording() -> Iterator[Recording]:
    """Note every expansion input read in this context."""
    rec = Recording()
    token = _ACTIVE.set(rec)
    try:
        yield rec
    finally:
        _ACTIVE.reset(token)


def replay(entries: list[list[str]]) -> str | None:
    """Call each recorded lookup again: None when every result is the same, else what differs."""
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(e, str) for e in entry)):
            return f"a malformed entry {entry!r}"
        ref, args, result = entry
        module, _, attr = ref.partition(":")
        try:
            fn: Any = importlib.import_module(module)
            for part in attr.split("."):
                fn = getattr(fn, part)
        except (ImportError, AttributeError):
            return f"{ref} no longer exists"
        if getattr(fn, _MARK, None) != ref:
            return f"{ref} is not an expansion input"
        try:
            now = _json(fn(*json.loads(args)))
        except Exception as exc:  # noqa: BLE001 - an input that cannot be read now is a changed input
            return f"{ref}{args} now fails ({type(exc).__name__}: {exc})"
        if now != result:
            return f"{ref}{args} changed"
    return None


#: Why this process cannot reuse a plan: registry entries registered as objects by code other than
#: swapcheck's own (their attributes are not fingerprinted).
_RUNTIME: list[str] = []


def caller_module(depth: int = 2) -> str:
    """The module of the function ``depth`` frames up from the caller of this function (1: the caller)."""
    return str(sys._getframe(depth).f_globals.get("__name__", ""))


def registered_at_runtime(what: str, entry: Any, caller: str) -> None:
    """Called by each registry's public ``register``/``unregister`` with the module that called it:
    ``entry`` (None for an unregistration). A ``"module:attr"`` string is reproducible from its name;
    an object registered by swapcheck's own modules is covered by the code digest
    (orchestrator.plan_cache); anything else makes this process :func:`not_hermetic`."""
    if isinstance(entry, str):
        return
    if caller.split(".")[0] not in OWN:
        _RUNTIME.append(f"{what} {'unregistered' if entry is None else 'registered as an object'} by {caller or '?'}")


def not_hermetic() -> str | None:
    """Why this process's expansions may depend on more than the spec, the code and the inputs (None:
    they do not)."""
    if not _RUNTIME:
        return None
    more = f" (and {len(_RUNTIME) - 1} more)" if len(_RUNTIME) > 1 else ""
    return _RUNTIME[0] + more
