"""Where two GEMM kernels make a greedy generation part: first divergence, layer-boundary hashes and
delta debugging over the set of W8A8 linears whose kernel is swapped.

Everything here drives one :class:`~tasks.models.W8A8Model` from outside (``set_kernel`` and torch
forward hooks); the engine is not changed.  Kernel A is the reference, kernel B the candidate:

* :func:`first_divergence` -- the first generated position where two token lists differ (None when
  they agree over the shorter one).
* :func:`boundary_hashes` -- one teacher-forced forward pass over a token sequence with a forward
  hook on every W8A8 linear and every decoder layer, recording, in forward order, the sha256 of
  each module's output bytes; :func:`first_differing` compares two such records.
* :func:`ddmin` -- Zeller's delta debugging (ddmin) of a set of items against a monotone-or-not
  predicate, returning a 1-minimal subset (removing any one element no longer satisfies it) and the
  number of distinct predicate evaluations it paid for.
* :class:`Swapper` -- generation of one prompt with a chosen set of linears on kernel B and every
  other linear on kernel A; the predicate the bisection evaluates ("diverges from all-A at or before
  the position where all-B diverged").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

    from .engine import W8A8Model

__all__ = ["BisectionBudgetError", "Boundary", "Swapper", "boundary_hashes", "ddmin", "first_differing",
           "first_divergence", "tensor_sha256"]

T = TypeVar("T")


class BisectionBudgetError(RuntimeError):
    """The search needed more generations than its budget allows (the message says how many)."""


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (row-major, any dtype)."""
    import torch

    flat = t.detach().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"").hexdigest()


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ, or None if they agree over the shorter one."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if int(x) != int(y):
            return i
    return None


@dataclass(frozen=True)
class Boundary:
    """One module output in a forward pass: ``kind`` "linear" (a W8A8 linear, ``name`` as the engine
    names it) or "layer" (decoder layer ``index``'s output, ``name`` ``layers.<i>``), and its sha256."""

    kind: str
    name: str
    index: int
    sha256: str


def boundary_hashes(model: W8A8Model, tokens: list[int]) -> tuple[list[Boundary], torch.Tensor]:
    """One forward pass over ``tokens`` (unpadded, no cache) with forward hooks on every W8A8 linear
    and decoder layer: their outputs' sha256 in the order they ran, and the fp32 logits ``[T, V]``."""
    from .engine import _decoder_layers

    record: list[Boundary] = []
    handles = []

    def hook(kind: str, name: str, index: int) -> Callable[..., None]:
        def run(module: Any, inputs: Any, output: Any) -> None:
            out = output[0] if isinstance(output, tuple) else output
            record.append(Boundary(kind, name, index, tensor_sha256(out)))
        return run

    try:
        for name, lin in model.linears().items():
            handles.append(lin.register_forward_hook(hook("linear", name, lin.index)))
        for i, layer in enumerate(_decoder_layers(model.hf)):
            handles.append(layer.register_forward_hook(hook("layer", f"layers.{i}", i)))
        logits = model.forward_tokens([tokens])[0]
    finally:
        for h in handles:
            h.remove()
    return record, logits


def first_differing(a: list[Boundary], b: list[Boundary], kind: str) -> Boundary | None:
    """The first boundary of ``kind`` (in forward order) whose hash differs between two records of
    the same forward pass; None when every one agrees.  The records must name the same modules."""
    xa = [r for r in a if r.kind == kind]
    xb = [r for r in b if r.kind == kind]
    if [r.name for r in xa] != [r.name for r in xb]:
        raise ValueError("the two forward passes ran different modules; they cannot be compared")
    return next((ra for ra, rb in zip(xa, xb, strict=True) if ra.sha256 != rb.sha256), None)


def ddmin(items: Sequence[T], test: Callable[[tuple[T, ...]], bool]) -> tuple[list[T], int]:
    """Delta debugging (Zeller and Hildebrandt 2002, ddmin): a 1-minimal subset of ``items`` for which
    ``test`` holds, given that it holds for all of ``items``.

    Subsets are tested in the order of ``items``; each distinct subset is tested once (results are
    cached), and the number of distinct tests is returned with the subset.  The loop ends only
    after every single-element complement of the result was tested and failed, so the result is
    1-minimal with respect to ``test`` (the empty set is not tested here; the caller verifies it).
    """
    cache: dict[tuple[T, ...], bool] = {}

    def t(subset: Iterable[T]) -> bool:
        key = tuple(subset)
        if key not in cache:
            cache[key] = bool(test(key))
        return cache[key]

    current = list(items)
    n = 2
    while len(current) >= 2:
        size = len(current)
        bounds = [(i * size) // n for i in range(n + 1)]
        chunks = [current[bounds[i]:bounds[i + 1]] for i in range(n) if bounds[i] < bounds[i + 1]]
        for chunk in chunks:
            if t(chunk):
                current, n = chunk, 2
                break
        else:
            for chunk in chunks:
                rest = [x for x in current if x not in chunk]
                if t(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= size:
                    break
                n = min(size, 2 * n)
    return current, len(cache)


class Swapper:
    """Greedy generation of one prompt with a set of linears on kernel ``b`` and the rest on ``a``.

    ``reference`` is the all-A generation of the prompt, ``horizon`` how many tokens each trial
    generates; :meth:`diverges` is the bisection's predicate and counts every generation it runs
    (``generations``), and ``budget`` caps that count (:class:`BisectionBudgetError`).
    """

    def __init__(self, model: W8A8Model, prompt: list[int], kernel_a: Any, kernel_b: Any,
                 reference: list[int], horizon: int, budget: int) -> None:
        from .linear import resolve_kernel

        self.model = model
        self.prompt = prompt
        self.a = resolve_kernel(kernel_a)
        self.b = resolve_kernel(kernel_b)
        self.reference = list(reference)
        self.horizon = horizon
        self.budget = budget
        self.generations = 0
        #: The last generation's full result (tokens, top-k, margins).
        self.last: Any = None

    def generate(self, swapped: Iterable[str], max_new_tokens: int | None = None) -> list[int]:
        """Tokens of one generation with ``swapped`` on kernel B and every other linear on kernel A."""
        if self.generations >= self.budget:
            raise BisectionBudgetError(f"the search needed more than {self.budget} generations (max_generations)")
        self.generations += 1
        names = list(swapped)
        self.model.set_kernel(self.a)
        if names:
            self.model.set_kernel(self.b, names)
        self.model.reset_kernel_calls()
        try:
            out = self.model.generate([self.prompt], max_new_tokens or self.horizon, top_k=2)
            self._check_calls(set(names))
            self.last = out
        finally:
            self.model.set_kernel(self.a)
        return [int(x) for x in out.tokens[0]]

    def _check_calls(self, swapped: set[str]) -> None:
        """Kernel evidence: every linear ran, and only through the kernel it was set to (counted at
        call time by the engine); a generation that did not test what it claims must not count."""
        for name, calls in self.model.kernel_calls().items():
            want = self.b.name if name in swapped else self.a.name
            if set(calls) != {want}:
                raise RuntimeError(f"kernel evidence: {name} ran {dict(calls)}, expected only {want!r}")

    def divergence(self, swapped: Iterable[str], max_new_tokens: int | None = None) -> int | None:
        """Where a generation with ``swapped`` on B first differs from the all-A reference (or None)."""
        toks = self.generate(swapped, max_new_tokens)
        return first_divergence(self.reference[: len(toks)], toks)

    def diverges(self, swapped: Iterable[str]) -> bool:
        """The predicate: it differs from all-A within ``horizon`` tokens."""
        return self.divergence(swapped) is not None
