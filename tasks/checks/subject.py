"""The kernel under test: a registry kernel (scaled) or a user's plain matmul ``f(A, B) -> C``.

:func:`load_subject` resolves a kernel reference (a registry name, an entry-point name, or
``package.module:attr``) through :func:`tasks.kernels.get_kernel`, with its rules: a ``module:attr``
must name a Kernel subclass or instance or a callable marked ``@kernel_function`` /
``@kernel_factory``, else it is refused before anything is called; user kernels may be turned off
(:func:`tasks.kernels.set_user_kernels`).  A :class:`~tasks.kernels.MatmulKernel`
(a marked plain callable) is checked on floating-point operands of the check's dtype, with no scales; any
other kernel follows the shared scaled-GEMM call on int8 or fp8 e4m3 operands with power-of-two (or
unit) scales.

Bad input (an unknown or unimportable kernel, a wrong signature, a kernel that is not available
here, a problem it does not support) is a :class:`CheckInputError`; an exception raised by the kernel
while computing is not bad input but a result: the trial's verdict is ``ERROR``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from swapcheck_common.errors import InputError
from tasks.kernels import Kernel, KernelError, MatmulKernel, get_kernel
from tasks.numerics.formats import FORMATS, torch_dtype

__all__ = [
    "CheckInputError",
    "Subject",
    "load_subject",
    "output_problem",
    "shape_problem",
    "OPERAND_DTYPES",
    "FLOAT_DTYPES",
    "FORMAT_DTYPES",
]

OPERAND_DTYPES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
#: Output dtypes of the checks by short name (tasks.numerics.formats.torch_dtype takes any name).
FLOAT_DTYPES = {name: torch_dtype(name) for name in ("bf16", "fp16", "fp32")}
#: Output dtypes a check can judge (those tasks.numerics has a format for).
FORMAT_DTYPES = tuple(fmt.torch_dtype for fmt in FORMATS.values())


class CheckInputError(InputError):
    """Bad input to a check (exit code 2): the message says what is allowed."""


@dataclass
class Subject:
    """A kernel ready to be checked.

    Attributes:
        ref: how the user named it.
        kernel: the built kernel.
        device: where operands are placed ("cpu" or "cuda"); outputs come back to the CPU.
        operands: for a scaled kernel, "int8" or "fp8_e4m3"; None for a plain matmul.
    """

    ref: str
    kernel: Kernel
    device: str = "cpu"
    operands: str | None = None

    @property
    def plain(self) -> bool:
        """True for a plain matmul callable f(A, B) -> C (unscaled)."""
        return isinstance(self.kernel, MatmulKernel)

    @property
    def kind(self) -> str:
        """"matmul" (plain callable) or "scaled" (the registry's scaled-GEMM call)."""
        return "matmul" if self.plain else "scaled"

    def operand_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The operand dtype of a check whose output dtype is ``dtype``."""
        if self.plain:
            return dtype
        assert self.operands is not None
        return OPERAND_DTYPES[self.operands]

    def scale_numel(self, m: int, n: int, k: int) -> tuple[int, int]:
        """The richest scale layout the kernel supports: per-token and per-channel if it can."""
        if self.plain:
            return 1, 1
        reasons = []
        for na, nb in ((m, n), (1, n), (m, 1), (1, 1)):
            ok, reason = self.kernel.supports(m, n, k, na, nb, False)
            if ok:
                return na, nb
            reasons.append(reason)
        raise CheckInputError(
            f"kernel {self.ref!r} supports no scale layout for M={m}, K={k}, N={n}: {reasons[-1]}"
        )

    def describe(self) -> str:
        """One line: what was checked and how it was called."""
        if self.plain:
            return f"{self.ref} (plain matmul f(A, B) -> C, unscaled)"
        return f"{self.ref} (scaled kernel, {self.operands} operands)"

    def preflight(self, m: int, n: int, k: int) -> None:
        """Raise CheckInputError if the kernel cannot run this problem here."""
        if self.plain:
            return
        ok, reason = self.kernel.available()
        if not ok:
            raise CheckInputError(f"kernel {self.ref!r} is not available here: {reason}")
        self.scale_numel(m, n, k)

    def run(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        out_dtype: torch.dtype,
        scale_a: torch.Tensor | None = None,
        scale_b: torch.Tensor | None = None,
    ) -> Any:
        """The kernel's output for these operands (on the CPU when it is a tensor).

        Exceptions from the kernel propagate: the caller turns them into an ERROR verdict.
        """
        from tasks.devices import on_device

        if self.plain:
            assert isinstance(self.kernel, MatmulKernel)
            out, _ = on_device(self.device, self.kernel.matmul, a, b)
        else:
            assert scale_a is not None and scale_b is not None
            out, _ = on_device(self.device, self.kernel, a, b, scale_a, scale_b, out_dtype)
        return out.detach() if isinstance(out, torch.Tensor) else out


def load_subject(
    ref: str,
    params: dict[str, Any] | None = None,
    *,
    device: str | None = None,
    operands: str | None = None,
    field: str | None = None,
) -> Subject:
    """Build the kernel named ``ref`` (with ``params``) for checking.

    Args:
        ref: a registry name, an entry-point name or ``package.module:attr``.
        params: the kernel's parameters (for a plain callable: keyword arguments of f).
        device: "cpu" or "cuda"; default the kernel's own device (plain callables: "cpu").
        operands: for a scaled kernel, "int8" or "fp8_e4m3"; default the kernel's operand dtype
            ("int8" when it takes either).
        field: how the caller names the reference (e.g. "--kernel"); prefixes the message of a
            kernel that cannot be resolved.

    Raises:
        CheckInputError: unknown kernel, import failure, wrong signature, bad parameters, or an
            operand dtype / device the kernel does not take.
    """
    try:
        kernel = get_kernel(ref, **(params or {}))
    except KernelError as exc:
        raise CheckInputError(f"{field}: {exc}" if field else str(exc)) from exc
    if device is not None and device not in ("cpu", "cuda"):
        raise CheckInputError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if isinstance(kernel, MatmulKernel):
        if operands is not None:
            raise CheckInputError(
                f"kernel {ref!r} is a plain matmul f(A, B) -> C: its operands are in the check's "
                "dtype (--dtype); --operands applies to scaled kernels only"
            )
        dev = device or "cpu"
        if dev == "cuda" and not torch.cuda.is_available():
            raise CheckInputError("device 'cuda' asked for, but torch sees no CUDA device")
        return Subject(ref, kernel, dev, None)
    if device is not None and device != kernel.device:
        raise CheckInputError(f"kernel {ref!r} runs on {kernel.device!r}, not {device!r}")
    allowed = ["int8", "fp8_e4m3"] if kernel.operand_dtype == "any" else [kernel.operand_dtype]
    chosen = operands or allowed[0]
    if chosen not in allowed:
        raise CheckInputError(
            f"kernel {ref!r} takes {' or '.join(allowed)} operands, not {chosen!r}"
        )
    return Subject(ref, kernel, kernel.device, chosen)


def shape_problem(shape: tuple[int, int, int]) -> str | None:
    """Why ``(M, K, N)`` is not a valid problem, or None."""
    if len(shape) != 3 or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in shape):
        return f"shape must be three positive integers M x K x N, got {shape!r}"
    return None


def output_problem(out: object, m: int, n: int) -> str | None:
    """Why a kernel's output cannot be judged as the [M, N] result, or None."""
    if not isinstance(out, torch.Tensor):
        return f"the kernel returned {type(out).__name__}, not a tensor"
    if tuple(out.shape) != (m, n):
        return f"the kernel returned shape {list(out.shape)}, expected [{m}, {n}]"
    if out.dtype not in FORMAT_DTYPES:
        return f"the kernel returned dtype {out.dtype}, not a floating-point format (fp32, bf16, fp16, fp8)"
    return None


@dataclass(frozen=True)
class Ran:
    """One timed call of a check's kernel: its output, and why it cannot be judged (``error``: the
    kernel raised, a result of verdict ERROR; ``problem``: its output is not an [M, N] float tensor,
    a result of verdict INCORRECT), or neither."""

    out: Any
    seconds: float
    error: str | None = None
    problem: str | None = None


def run_once(subject: Subject, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, sa: torch.Tensor | None,
             sb: torch.Tensor | None, m: int, n: int) -> Ran:
    """Call the kernel once, timed, as every check does: bad input (:class:`CheckInputError`) raises;
    any other exception of the kernel is the trial's ``error``; an output that cannot be judged its
    ``problem`` (:func:`output_problem`)."""
    t0 = time.perf_counter()
    try:
        out = subject.run(a, b, dtype, sa, sb)
    except CheckInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the kernel failed: a result, not bad input
        return Ran(None, 0.0, error=f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - t0
    return Ran(out, seconds, problem=output_problem(out, m, n))
