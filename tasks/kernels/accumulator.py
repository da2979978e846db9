"""The exact INT8 accumulator, on the fastest exact path of the CPU it runs on (issue #35).

Every built-in INT8 kernel starts from one integer matrix, ``acc = a @ b`` of int8 operands, and
differs only in its epilogue (:mod:`.int8`); the ``exact`` reference starts from the same integers.
Three ways compute it exactly on a CPU:

=================== ================================================== =================================
path                why it is exact                                    where it is fast
=================== ================================================== =================================
``int_mm``          ``torch._int_mm``: an int32 GEMM, exact while no   with oneDNN on AVX512-VNNI or AMX;
                    sum leaves int32 (K <= 131071), wrapping modulo    elsewhere PyTorch runs a
                    2**32 past it                                      reference loop (~1-3 GOP/s)
``float64``         one float64 GEMM of the integers: every partial    any CPU with a BLAS
                    sum, in any order or blocking, is an integer of
                    magnitude <= K * 2**14 <= 2**53 for K <= 2**39
``float32-chunked`` float32 GEMMs over K-chunks of 1024: every partial  any CPU; half the bytes of
                    sum of a chunk is an integer <= 1024 * 2**14 =     float64, twice the lanes
                    2**24, exact in fp32; the chunks are added in
                    float64 (exact below 2**53)
=================== ================================================== =================================

Which path runs is decided once per process (:func:`accumulator_path`, :func:`probe`): every
candidate is first checked bit for bit against an integer oracle on operands built to break inexact
paths (pairs of products that saturate int16, as AVX2's ``vpmaddubsw`` does without VNNI; all-extreme
rows; sums past 2**24; a ragged K), and a path that is not exact here is never used (the reason is
recorded).  ``int_mm`` wins where it is exact and oneDNN runs it (its verbose log names the
primitive); never where PyTorch runs its reference loop.  Otherwise the exact float paths are timed on
one probe shape and the fastest wins.  The
environment variable ``SWAPCHECK_INT8_ACCUMULATOR`` (``int_mm``, ``float64``, ``float32-chunked``
or ``auto``) forces a path; a forced path that fails the check is refused with the reason.

The path is part of each INT8 kernel's identity (``code_path``, recorded in every launch's
provenance and named in the certificate); it never changes a result, which is why it stays out of
unit ids.

Where several built-in kernels of one unit take the same operands, :func:`shared_accumulators`
computes the accumulator once for all of them: inside the ``with`` block the first call for a pair
of operand tensors computes it, later calls with the same (unmodified) tensors get the same integers.
Only built-in kernels call this module, so a user's kernel always runs its own code.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .errors import KernelError

__all__ = [
    "ACCUMULATOR_ENV",
    "AccumulatorPath",
    "INT32_EXACT_K",
    "PATHS",
    "accumulator_path",
    "exact_int8_accumulator",
    "int32_accumulator",
    "compute_exact",
    "shared_accumulators",
    "wrap_int32",
]

#: Forces a path: one of :data:`PATHS`, or "auto" (the default).
ACCUMULATOR_ENV = "SWAPCHECK_INT8_ACCUMULATOR"
PATHS = ("int_mm", "float64", "float32-chunked")

# Largest K for which every int8 x int8 dot product is exact in int32 whatever the operands
# (both may be -128): floor((2**31 - 1) / 16384) = 131071 (docs/reference/numerics.md §3).
INT32_EXACT_K = (2**31 - 1) // (128 * 128)
#: K-chunk of the float32 path: 1024 * 128 * 128 = 2**24, the largest run of int8 products whose
#: partial sums are all exact in fp32.
FP32_CHUNK = 2**24 // (128 * 128)
#: float64 holds every integer sum of up to 2**39 int8 products.
FLOAT64_EXACT_K = 2**53 // (128 * 128)
#: The shape the paths are timed on (M, K, N): large enough that a reference loop shows (~10^8 MACs).
PROBE_SHAPE = (128, 4096, 128)
#: What :attr:`AccumulatorPath.int_mm_via` says where no oneDNN primitive ran for ``torch._int_mm``.
REFERENCE_LOOP = "PyTorch's reference loop"
#: Paths within this factor of the fastest count as tied; the first in :data:`PATHS` order wins.
NEAR_TIE = 1.3


def wrap_int32(x: torch.Tensor) -> torch.Tensor:
    """Exact integers (int64 or integer-valued float64) reduced modulo 2**32 into int32, as an int32
    accumulator wraps (two's-complement addition is associative, so the order does not matter)."""
    xi = x.to(torch.int64)
    return (((xi + 2**31) % 2**32) - 2**31).to(torch.int32)


def _float64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape[1] > FLOAT64_EXACT_K:
        raise OverflowError(f"K={a.shape[1]} > {FLOAT64_EXACT_K}: float64 cannot hold every partial sum")
    return a.to(torch.float64) @ b.to(torch.float64)


def _float32_chunked(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k = int(a.shape[1])
    if k > FLOAT64_EXACT_K:
        raise OverflowError(f"K={k} > {FLOAT64_EXACT_K}: the float64 sum of chunks could round")
    a32, b32 = a.to(torch.float32), b.to(torch.float32)
    if k <= FP32_CHUNK:
        return (a32 @ b32).to(torch.float64)
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for k0 in range(0, k, FP32_CHUNK):
        acc += a32[:, k0 : k0 + FP32_CHUNK] @ b32[k0 : k0 + FP32_CHUNK]
    return acc


def _int_mm_exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape[1] > INT32_EXACT_K:
        raise OverflowError(f"K={a.shape[1]} > {INT32_EXACT_K}: an int32 sum can wrap")
    if a.shape[1] < 2:
        # torch 2.13's CPU _int_mm returns unset memory at K = 1 for a column-major b (the layout swapcheck
        # passes; measured on AVX512-VNNI, 80 of 80 draws wrong): the float64 path, exact there.
        return _float64(a, b)
    return torch._int_mm(a, b).to(torch.float64)


#: Each path's exact accumulator, as integer-valued float64.
_EXACT: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "int_mm": _int_mm_exact, "float64": _float64, "float32-chunked": _float32_chunked}


@dataclass(frozen=True)
class AccumulatorPath:
    """The path this process uses, and what decided it.

    Attributes:
        name: one of :data:`PATHS`.
        how: "probed" (fastest exact path) or "forced by SWAPCHECK_INT8_ACCUMULATOR=...".
        seconds: per exact candidate, its best time on :data:`PROBE_SHAPE`.
        inexact: per candidate that failed the check, what it got wrong.
        int_mm_via: what ran ``torch._int_mm`` here: ``"oneDNN <implementation>"`` (from oneDNN's
            verbose log) or :data:`REFERENCE_LOOP` (no oneDNN primitive ran); None where not probed.
    """

    name: str
    how: str
    seconds: dict[str, float] = field(default_factory=dict)
    inexact: dict[str, str] = field(default_factory=dict)
    int_mm_via: str | None = None

    def describe(self, timings: bool = False) -> str:
        """One line for the kernel's identity: the path, how it was chosen and which paths are not
        exact here; ``timings`` adds the probe's times (never in the identity: they vary by run)."""
        text = f"int8 accumulator {self.name} ({self.how}"
        if timings and self.seconds:
            timed = ", ".join(f"{p} {s * 1e3:.3g} ms" for p, s in sorted(self.seconds.items(), key=lambda x: x[1]))
            text += f"; {PROBE_SHAPE[0]}x{PROBE_SHAPE[1]}x{PROBE_SHAPE[2]}: {timed}"
        text += ")"
        for p, why in sorted(self.inexact.items()):
            text += f"; {p} not exact here: {why}"
        return text

    def native_note(self) -> str | None:
        """What is wrong with ``torch._int_mm`` (the native int32 GEMM) on this CPU, where something
        is: not exact (then never used), or exact but far slower than the chosen path -- PyTorch's
        reference loop on a CPU without AVX512-VNNI or AMX; else None.  Not a fault of these kernels'
        results (the chosen path is exact): a fact about the CPU that a user of ``_int_mm`` needs."""
        if "int_mm" in self.inexact:
            return (f"torch._int_mm gives wrong sums on this CPU ({self.inexact['int_mm']}); not used: the "
                    f"accumulator uses {self.name}")
        if self.int_mm_via != REFERENCE_LOOP:
            return None
        native, chosen = self.seconds.get("int_mm"), self.seconds.get(self.name)
        m, k, n = PROBE_SHAPE
        timed = (f" ({native * 1e3:.3g} ms at {m}x{k}x{n}, {native / chosen:.0f}x the {self.name} path's "
                 f"{chosen * 1e3:.3g} ms)") if native and chosen else ""
        return (f"torch._int_mm runs {REFERENCE_LOOP} here{timed}: PyTorch calls oneDNN's int8 GEMM only "
                f"on AVX512-VNNI or AMX; not used: the accumulator uses {self.name}")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "how": self.how, "seconds": dict(self.seconds), "inexact": dict(self.inexact),
                "int_mm_via": self.int_mm_via}


def _check_operands() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Operands that break the inexact paths we know of, each with a K that crosses a boundary.

    * all-extreme rows and columns (127, -128 against 127, -127): pairs of products saturate an int16
      intermediate (u8 x s8 pairs of AVX2's ``vpmaddubsw``: 255 * 127 * 2 > 32767 after the +128
      shift), and every partial sum is as large as it can be;
    * K = 1100 crosses a float32 chunk (sums past 2**24) and a 64-wide vector block;
    * random operands with a ragged K (odd, not a multiple of 4 or 16) and small M and N.
    """
    gen = torch.Generator().manual_seed(35)
    k = 1100
    a = torch.randint(-128, 128, (6, k), dtype=torch.int8, generator=gen)
    b = torch.randint(-128, 128, (k, 5), dtype=torch.int8, generator=gen)
    a[0], a[1], a[2] = 127, -128, torch.tensor([127, -128], dtype=torch.int8).repeat(k // 2)
    b[:, 0], b[:, 1] = 127, -127
    b[:, 2] = torch.tensor([-128, 127], dtype=torch.int8).repeat(k // 2)
    ragged_a = torch.randint(-128, 128, (17, 333), dtype=torch.int8, generator=gen)
    ragged_b = torch.randint(-128, 128, (333, 19), dtype=torch.int8, generator=gen)
    return [(a, b), (ragged_a, ragged_b), (a[:, :64].contiguous(), b[:64].contiguous())]


def _oracle(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """The exact product in numpy int64 (integer arithmetic, no BLAS)."""
    return np.asarray(a.numpy().astype(np.int64) @ b.numpy().astype(np.int64))


def check_path(name: str) -> str | None:
    """Why path ``name`` is not exact here (None when it gives the oracle's integers on every check
    operand); an exception is a reason too."""
    for a, b in _check_operands():
        want = _oracle(a, b)
        try:
            got = _EXACT[name](a, b)
        except Exception as exc:  # noqa: BLE001 - a path that cannot run is not exact here
            return f"{type(exc).__name__}: {exc}"
        gi = got.to(torch.int64).numpy()
        if not (np.array_equal(gi, want) and bool((got == got.round()).all())):
            bad = np.argwhere(gi != want)
            i, j = (int(x) for x in bad[0]) if len(bad) else (0, 0)
            return (f"{len(bad)} of {want.size} sums wrong at {a.shape[0]}x{a.shape[1]}x{b.shape[1]} "
                    f"(e.g. [{i},{j}]: exact {int(want[i, j])}, got {int(gi[i, j])})")
    return None


def _time(fn: Callable[[], object], repeat: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def int_mm_via() -> str:
    """What runs ``torch._int_mm`` in this process: ``"oneDNN <implementation>"`` when a oneDNN
    primitive ran for it (its verbose log names it), else :data:`REFERENCE_LOOP`."""
    from .onednn import onednn_call

    a = torch.ones(32, 64, dtype=torch.int8)
    _, impl = onednn_call(lambda: torch._int_mm(a, a.t().contiguous()))
    return f"oneDNN {impl}" if impl else REFERENCE_LOOP


def probe(candidates: tuple[str, ...] = PATHS) -> AccumulatorPath:
    """Check every candidate, time the exact ones on :data:`PROBE_SHAPE`, and choose.

    The choice does not rest on timings alone, which a busy machine disturbs (``torch._int_mm``'s
    threads spin when the cores are taken): ``int_mm`` wins where it is exact and runs on oneDNN
    (VNNI or AMX: several times any float path), never on PyTorch's reference loop; otherwise the
    fastest exact float path, the first in :data:`PATHS` order within :data:`NEAR_TIE` of it (two
    paths of about the same speed must not trade places from one process to the next: the path is
    part of the kernel's identity)."""
    inexact = {p: why for p in candidates if (why := check_path(p)) is not None}
    exact = [p for p in candidates if p not in inexact]
    if not exact:  # float64 is exact on any IEEE machine; reaching this is a broken BLAS
        raise RuntimeError("no exact INT8 accumulator on this CPU: " + "; ".join(f"{p}: {w}" for p, w in inexact.items()))
    via = int_mm_via() if "int_mm" in candidates else None
    m, k, n = PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=gen)
    seconds = {p: _time(lambda p=p: _EXACT[p](a, b)) for p in exact}  # type: ignore[misc]
    if "int_mm" in seconds and via is not None and via != REFERENCE_LOOP:
        return AccumulatorPath("int_mm", f"probed: exact, on {via}", seconds, inexact, via)
    floats = {p: t for p, t in seconds.items() if p != "int_mm"} or seconds
    fastest = min(floats.values())
    best = next(p for p in PATHS if p in floats and floats[p] <= NEAR_TIE * fastest)
    how = "probed: the fastest exact path" + (f"; torch._int_mm on {via}" if via == REFERENCE_LOOP else "")
    return AccumulatorPath(best, how, seconds, inexact, via)


_PATH: AccumulatorPath | None = None


def accumulator_path() -> AccumulatorPath:
    """The path of this process: probed on first use (or forced by :data:`ACCUMULATOR_ENV`)."""
    global _PATH
    if _PATH is None:
        forced = os.environ.get(ACCUMULATOR_ENV, "auto").strip() or "auto"
        if forced == "auto":
            _PATH = probe()
        elif forced not in PATHS:
            raise KernelError(f"{ACCUMULATOR_ENV}={forced!r}; allowed: auto, {', '.join(PATHS)}")
        else:
            why = check_path(forced)
            if why is not None:
                raise KernelError(f"{ACCUMULATOR_ENV}={forced}: that path is not exact on this CPU ({why}); "
                                  "unset it to take the fastest exact one")
            _PATH = AccumulatorPath(forced, f"forced by {ACCUMULATOR_ENV}={forced}")
    return _PATH


def reset_accumulator_path() -> None:
    """Forget the probed path (tests, or after changing :data:`ACCUMULATOR_ENV` in-process)."""
    global _PATH
    _PATH = None


def compute_exact(path: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of int8 operands on ``path``, exact, as integer-valued float64 (int_mm past its
    bound falls back to float64)."""
    if path == "int_mm" and a.shape[1] > INT32_EXACT_K:
        path = "float64"
    return _EXACT[path](a, b)


# -- sharing within one unit ----------------------------------------------------------------------

@dataclass
class _Shared:
    a: torch.Tensor  # held so that no other tensor can take these addresses while the scope lives
    b: torch.Tensor
    exact: torch.Tensor | None = None
    int32: torch.Tensor | None = None


_SCOPE: contextvars.ContextVar[dict[tuple[Any, ...], _Shared] | None] = contextvars.ContextVar(
    "swapcheck_shared_accumulators", default=None)


def _key(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t._version)


@contextlib.contextmanager
def shared_accumulators() -> Iterator[None]:
    """Inside the block, built-in INT8 kernels called on the same operand tensors share one
    accumulator (module docs); outside, each call computes its own.  Nested blocks share the outer one."""
    if _SCOPE.get() is not None:
        yield
        return
    token = _SCOPE.set({})
    try:
        yield
    finally:
        _SCOPE.reset(token)


def _entry(a: torch.Tensor, b: torch.Tensor) -> _Shared | None:
    scope = _SCOPE.get()
    if scope is None:
        return None
    key = (_key(a), _key(b))
    hit = scope.get(key)
    if hit is None:
        hit = scope[key] = _Shared(a, b)
    return hit


def exact_int8_accumulator(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The exact ``a @ b`` of int8 operands as integer-valued float64 (any K up to 2**39)."""
    shared = _entry(a, b)
    if shared is not None and shared.exact is not None:
        return shared.exact
    if shared is not None and shared.int32 is not None and a.shape[1] <= INT32_EXACT_K:
        out = shared.int32.to(torch.float64)  # below the bound the int32 sums are the exact ones
    else:
        out = compute_exact(accumulator_path().name, a, b)
    if shared is not None:
        shared.exact = out
    return out


def int32_accumulator(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The int32 accumulator ``a @ b`` of int8 operands, as an int32 GEMM computes it: exact below
    :data:`INT32_EXACT_K`, wrapped modulo 2**32 above (the same value in any summation order)."""
    shared = _entry(a, b)
    if shared is not None and shared.int32 is not None:
        return shared.int32
    path = accumulator_path().name
    out: torch.Tensor | None = None
    # K = 1: torch's CPU _int_mm is wrong there (_int_mm_exact): the exact integers instead.
    if path == "int_mm" and a.shape[1] >= 2 and (shared is None or shared.exact is None):
        try:
            out = torch._int_mm(a, b)
        except RuntimeError:  # a layout _int_mm refuses: the exact integers, wrapped, are the same
            out = None
    if out is None:
        out = wrap_int32(exact_int8_accumulator(a, b))
    if shared is not None:
        shared.int32 = out
    return out
