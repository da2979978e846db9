"""Operand validation shared by every kernel: the docs/reference/design.md call contract, checked once.

``kernel(a, b, scale_a, scale_b, out_dtype, bias=None)``:

* ``a`` ``[M, K]`` and ``b`` ``[K, N]``, both int8 or both ``torch.float8_e4m3fn`` (as the
  kernel's ``operand_dtype`` allows), on the kernel's device; any strides (row- or column-major).
* ``scale_a`` float32 with 1 or M elements: shape ``[M, 1]``, ``[M]``, ``[1]``, ``[1, 1]`` or 0-d.
* ``scale_b`` float32 with 1 or N elements: shape ``[N]``, ``[1, N]``, ``[N, 1]``, ``[1]``,
  ``[1, 1]`` or 0-d.
* ``out_dtype`` ``torch.bfloat16``, ``torch.float16`` or ``torch.float32``.
* ``bias`` None or ``[N]`` in ``out_dtype``.
* scales and bias finite; fp8 operands free of NaN (e4m3fn has no infinities).

Anything else is a :class:`~.registry.KernelError` naming the argument and what is allowed.
:func:`check_operands` returns :class:`Operands` with the scales normalised to float32 ``[M, 1]``
and ``[1, N]`` (a per-tensor scale is broadcast: ``expand``, no copy), so kernels never see the
many accepted spellings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .errors import KernelError

if TYPE_CHECKING:
    from .registry import Kernel

__all__ = ["Operands", "check_operands", "OUT_DTYPES", "OPERAND_TORCH_DTYPES"]

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OPERAND_TORCH_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "int8": (torch.int8,),
    "fp8_e4m3": (torch.float8_e4m3fn,),
    "any": (torch.int8, torch.float8_e4m3fn),
}


@dataclass(frozen=True)
class Operands:
    """Validated operands.

    Attributes:
        a: ``[M, K]`` int8 or float8_e4m3fn, as given.
        b: ``[K, N]``, same dtype as ``a``, as given.
        scale_a: float32 ``[M, 1]`` (an expanded view when per-tensor).
        scale_b: float32 ``[1, N]`` (an expanded view when per-tensor).
        out_dtype: bfloat16, float16 or float32.
        bias: ``[N]`` in ``out_dtype`` or None.
        scale_a_numel / scale_b_numel: 1 (per-tensor) or M / N, as given.
    """

    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    out_dtype: torch.dtype
    bias: torch.Tensor | None
    scale_a_numel: int
    scale_b_numel: int

    @property
    def m(self) -> int:
        return int(self.a.shape[0])

    @property
    def k(self) -> int:
        return int(self.a.shape[1])

    @property
    def n(self) -> int:
        return int(self.b.shape[1])

    @property
    def is_fp8(self) -> bool:
        return self.a.dtype == torch.float8_e4m3fn


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _scale(
    name: str, s: object, count: int, count_name: str, as_row: bool, who: str
) -> tuple[torch.Tensor, int]:
    if not isinstance(s, torch.Tensor):
        raise KernelError(f"{who}: {name} must be a float32 torch.Tensor, got {type(s).__name__}")
    if s.dtype != torch.float32:
        raise KernelError(f"{who}: {name} must be float32, got {s.dtype}")
    if s.numel() not in (1, count):
        raise KernelError(
            f"{who}: {name} has {s.numel()} elements (shape {_shape(s)}); allowed: 1 (per-tensor) "
            f"or {count_name}={count}"
        )
    allowed = {(), (1,), (1, 1), (count,), (count, 1)} | ({(1, count)} if as_row else set())
    if tuple(s.shape) not in allowed:
        spellings = (
            f"[{count_name}], [1, {count_name}], [{count_name}, 1]"
            if as_row
            else f"[{count_name}, 1], [{count_name}]"
        )
        raise KernelError(
            f"{who}: {name} has shape {_shape(s)}; allowed: {spellings}, [1], [1, 1] or 0-d"
        )
    if not bool(torch.isfinite(s).all()):
        raise KernelError(f"{who}: {name} must be finite (found inf or NaN)")
    numel = s.numel()
    flat = s.reshape(-1)
    if as_row:
        view = flat.reshape(1, numel).expand(1, count)
    else:
        view = flat.reshape(numel, 1).expand(count, 1)
    return view, numel


def check_operands(
    kernel: Kernel,
    a: object,
    b: object,
    scale_a: object,
    scale_b: object,
    out_dtype: object,
    bias: object = None,
) -> Operands:
    """Validate one call against the contract and ``kernel``'s dtype/device; see module docstring."""
    who = f"kernel {kernel.name!r}"
    for nm, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise KernelError(f"{who}: {nm} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise KernelError(
                f"{who}: {nm} must be 2-D ({'[M, K]' if nm == 'a' else '[K, N]'}), "
                f"got shape {_shape(t)}"
            )
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    allowed = OPERAND_TORCH_DTYPES[kernel.operand_dtype]
    allowed_txt = " or ".join(str(d) for d in allowed)
    if a.dtype not in allowed or b.dtype not in allowed:
        raise KernelError(
            f"{who} takes operands of dtype {allowed_txt} (operand_dtype={kernel.operand_dtype!r}); "
            f"got a {a.dtype}, b {b.dtype}"
        )
    if a.dtype != b.dtype:
        raise KernelError(f"{who}: a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[0]:
        raise KernelError(
            f"{who}: a is [M, K] = {_shape(a)} and b must be [K, N], got {_shape(b)} "
            "(inner dimensions differ)"
        )
    m, k, n = int(a.shape[0]), int(a.shape[1]), int(b.shape[1])
    if m == 0 or n == 0 or k == 0:
        raise KernelError(f"{who}: empty problem M={m}, N={n}, K={k}; all must be >= 1")
    for nm, t in (("a", a), ("b", b)):
        if t.device.type != kernel.device:
            raise KernelError(
                f"{who} runs on {kernel.device!r}; operand {nm} is on {t.device.type!r}"
            )
    if out_dtype not in OUT_DTYPES:
        raise KernelError(
            f"{who}: out_dtype must be torch.bfloat16, torch.float16 or torch.float32, "
            f"got {out_dtype!r}"
        )
    assert isinstance(out_dtype, torch.dtype)
    sa, sa_numel = _scale("scale_a", scale_a, m, "M", as_row=False, who=who)
    sb, sb_numel = _scale("scale_b", scale_b, n, "N", as_row=True, who=who)
    for nm, s in (("scale_a", sa), ("scale_b", sb)):
        if s.device.type != kernel.device:
            raise KernelError(f"{who} runs on {kernel.device!r}; {nm} is on {s.device.type!r}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise KernelError(
                f"{who}: bias must be None or a torch.Tensor, got {type(bias).__name__}"
            )
        if tuple(bias.shape) != (n,):
            raise KernelError(f"{who}: bias must have shape [N] = [{n}], got {_shape(bias)}")
        if bias.dtype != out_dtype:
            raise KernelError(
                f"{who}: bias must have the output dtype {out_dtype}, got {bias.dtype}"
            )
        if bias.device.type != kernel.device:
            raise KernelError(f"{who} runs on {kernel.device!r}; bias is on {bias.device.type!r}")
        if not bool(torch.isfinite(bias).all()):
            raise KernelError(f"{who}: bias must be finite (found inf or NaN)")
    if a.dtype == torch.float8_e4m3fn:
        for nm, t in (("a", a), ("b", b)):
            # e4m3fn NaN is S.1111.111: the only non-finite pattern (no infinities).
            if bool(((t.view(torch.uint8) & 0x7F) == 0x7F).any()):
                raise KernelError(f"{who}: fp8 operand {nm} contains NaN; operands must be finite")
    return Operands(a, b, sa, sb, out_dtype, bias, sa_numel, sb_numel)
