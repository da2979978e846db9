"""The registry of attention kernels: one call, lazy entries, did-you-mean, a failure listed as a row.

A :class:`swapcheck_common.registry.Registry` (the shape of every registry of swapcheck).  Every attention
kernel shares one call, the arguments of ``torch.nn.functional.scaled_dot_product_attention``::

    out, logsumexp = attn(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False)

``q`` ``[B, H, L, D]``, ``k`` ``[B, KV, S, D]``, ``v`` ``[B, KV, S, Dv]`` of one floating dtype;
``KV`` = ``H``, or divides ``H`` with ``enable_gqa=True`` (query head ``h`` reads key head
``h // (H / KV)``, as SDPA and transformers' ``repeat_kv`` do).  ``attn_mask`` is boolean (True =
attend) or additive in the query's dtype, broadcastable to ``[B, H, L, S]``; it and ``is_causal``
exclude each other (as in SDPA).  ``scale`` defaults to ``1 / sqrt(D)``.

It returns ``out`` ``[B, H, L, Dv]`` in the query's dtype and ``logsumexp`` ``[B, H, L]`` in
float32: the natural-log ``log(sum_j exp(s_ij))`` of the scaled, masked scores.  A kernel whose
backend returns its logsumexp (PyTorch's CPU flash kernel) returns that one; the others compute it
*alongside* (``info["logsumexp"]`` says how), in float64 rounded once to float32, so two kernels
whose logsumexp is computed alongside agree on it bit for bit and only a kernel's own logsumexp can
differ.

:func:`register_attention` adds an :class:`AttentionKernel` (or a lazy ``"module:attr"``), duplicate
names are refused, :func:`get_attention` answers an unknown name with "did you mean" and the valid
names, and :func:`list_attention` lists every entry with its availability -- an entry that cannot
even be loaded is a row with the error as its reason.  The built-in entries are in :mod:`.cpu`,
:mod:`.sdpa` (PyTorch's SDPA backends, each forced) and :mod:`.vllm` (docs/attention.md).
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from swapcheck_common.errors import InputError
from swapcheck_common.registry import Registry

if TYPE_CHECKING:
    import torch

__all__ = [
    "AttentionError",
    "AttentionKernel",
    "attention_names",
    "get_attention",
    "list_attention",
    "register_attention",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
DEVICES = ("cpu", "cuda")

#: The signature every kernel's ``compute`` has: validated operands (keys repeated to the query's
#: heads unless the kernel declares ``gqa=True``) -> (out, logsumexp float32).
Compute = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]


class AttentionError(InputError):
    """An unknown or duplicate attention kernel, bad operands, or a kernel unavailable here (exit 2)."""


@dataclass(eq=False)
class AttentionKernel:
    """One attention implementation behind the shared call (module docstring).

    Attributes:
        name: the registry name.
        device: "cpu" or "cuda" (where the operands must live).
        description: one line naming what it calls.
        logsumexp: how its logsumexp comes about ("returned by the backend" or "computed alongside ...").
        compute: ``compute(q, k, v, attn_mask, is_causal, scale) -> (out, logsumexp)`` on validated
            operands; None for a backend reachable only inside an engine (``engine_backend``).
        version: bump when the numerics change; it goes into unit ids.
        gqa: whether ``compute`` takes fewer key heads than query heads itself (else the call
            repeats them first, which only copies values).
        reason: ``reason() -> str | None``: why it cannot run here (None: it can).
        engine_backend: for a vLLM backend, the name vLLM selects it by (``FLASH_ATTN``, ...).
        algorithm: the preset of ``swapcheck check attention --algorithm`` whose bounds describe
            what it computes (``plain``, ``flash-cpu``, ...; :mod:`tasks.checks.attention`): the
            contract test holds every callable kernel to it.  None for an engine backend.
    """

    name: str
    device: str
    description: str
    logsumexp: str
    compute: Compute | None
    version: str = "1"
    gqa: bool = False
    reason: Callable[[], str | None] = field(default=lambda: None)
    engine_backend: str | None = None
    algorithm: str | None = None

    def available(self) -> tuple[bool, str | None]:
        """(True, None) if the kernel can run in this process, else (False, why)."""
        why = self.reason()
        if why is None and self.compute is None:
            why = (f"a vLLM engine backend ({self.engine_backend}): selected per arm on engine = 'vllm', "
                   "not called on its own")
        return (why is None), why

    @property
    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "device": self.device, "description": self.description,
                "logsumexp": self.logsumexp, "version": self.version, "engine_backend": self.engine_backend,
                "algorithm": self.algorithm}

    def __repr__(self) -> str:
        return f"<AttentionKernel {self.name} v{self.version} ({self.device})>"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                 is_causal: bool = False, scale: float | None = None,
                 enable_gqa: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v, attn_mask, scale = check_operands(self.name, q, k, v, attn_mask, is_causal, scale, enable_gqa)
        ok, why = self.available()
        if not ok or self.compute is None:
            raise AttentionError(f"attention kernel {self.name!r} is not available here: {why}")
        if q.device.type != self.device:
            raise AttentionError(f"attention kernel {self.name!r} takes {self.device} tensors, got {q.device.type}")
        if k.shape[1] != q.shape[1] and not self.gqa:
            k, v = repeat_kv(k, q.shape[1] // k.shape[1]), repeat_kv(v, q.shape[1] // v.shape[1])
        out, lse = self.compute(q, k, v, attn_mask, is_causal, scale)
        b, h, length = q.shape[:3]
        if tuple(out.shape) != (b, h, length, v.shape[-1]) or out.dtype != q.dtype:
            raise AttentionError(f"attention kernel {self.name!r} returned {out.dtype} {tuple(out.shape)}; "
                                 f"expected {q.dtype} {(b, h, length, v.shape[-1])}")
        if tuple(lse.shape) != (b, h, length):
            raise AttentionError(f"attention kernel {self.name!r} returned logsumexp of shape {tuple(lse.shape)}; "
                                 f"expected {(b, h, length)}")
        import torch

        return out, lse.to(torch.float32)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[B, KV, S, D]`` -> ``[B, KV * n_rep, S, D]``: head ``h`` is key head ``h // n_rep`` (a copy)."""
    if n_rep == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def check_operands(name: str, q: Any, k: Any, v: Any, attn_mask: Any, is_causal: bool, scale: float | None,
                   enable_gqa: bool) -> tuple[Any, Any, Any, Any, float]:
    """Validate the shared call's arguments (module docstring); return them with ``scale`` filled in."""
    import torch

    where = f"attention kernel {name!r}"
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = f"{t.dim()}-D tensor" if isinstance(t, torch.Tensor) else type(t).__name__
            raise AttentionError(f"{where}: {label} must be a 4-D tensor [B, heads, length, dim], got a {got}")
        if not t.is_floating_point() or t.dtype != q.dtype:
            raise AttentionError(f"{where}: q, k and v must share one floating dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise AttentionError(f"{where}: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit "
                             "(q [B, H, L, D], k [B, KV, S, D], v [B, KV, S, Dv])")
    if k.shape[1] != q.shape[1]:
        if not enable_gqa:
            raise AttentionError(f"{where}: q has {q.shape[1]} heads and k {k.shape[1]}; pass enable_gqa=True "
                                 "for grouped-query attention")
        if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
            raise AttentionError(f"{where}: {q.shape[1]} query heads are not a multiple of {k.shape[1]} key heads")
    if attn_mask is not None:
        if is_causal:
            raise AttentionError(f"{where}: give attn_mask or is_causal=True, not both (as scaled_dot_product_attention)")
        if not isinstance(attn_mask, torch.Tensor) or (attn_mask.dtype != torch.bool and attn_mask.dtype != q.dtype):
            got = str(attn_mask.dtype) if isinstance(attn_mask, torch.Tensor) else type(attn_mask).__name__
            raise AttentionError(f"{where}: attn_mask must be boolean or of the query's dtype {q.dtype}, got {got}")
        try:
            torch.broadcast_shapes(tuple(attn_mask.shape), (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
        except RuntimeError as exc:
            raise AttentionError(f"{where}: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                                 f"[B, H, L, S] = {(q.shape[0], q.shape[1], q.shape[2], k.shape[2])}") from exc
        attn_mask = attn_mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if not isinstance(scale, int | float) or not math.isfinite(scale):
        raise AttentionError(f"{where}: scale must be a finite number, got {scale!r}")
    return q, k, v, attn_mask, float(scale)


# -- the registry --------------------------------------------------------------------------------

def _check_kernel(name: str, loaded: Any) -> None:
    if not isinstance(loaded, AttentionKernel) or loaded.name != name:
        raise AttentionError(f"attention kernel {name!r}: {_REGISTRY.ref(name)} is not an AttentionKernel "
                             f"named {name!r}")


#: name -> a kernel, or "module:attr" naming one (imported on first use).
_REGISTRY: Registry[AttentionKernel] = Registry("attention kernel", error=AttentionError, validate=_check_kernel)
#: Modules whose import registers the built-in entries.
_BUILTINS = ("tasks.attention.cpu", "tasks.attention.sdpa", "tasks.attention.vllm")
_LOADED = False


def _load_builtins() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for module in _BUILTINS:
            importlib.import_module(module)


def register_attention(kernel: AttentionKernel | str, name: str | None = None) -> AttentionKernel | str:
    """Register ``kernel`` (or a lazy ``"module:attr"`` under ``name``); a duplicate name is refused."""
    key = kernel.name if isinstance(kernel, AttentionKernel) else name
    if not isinstance(key, str) or not _NAME_RE.match(key):
        raise AttentionError(f"invalid attention kernel name {key!r}: use letters, digits and . _ + -")
    if isinstance(kernel, str) and ":" not in kernel:
        raise AttentionError(f"a lazy attention kernel is 'module:attr', got {kernel!r}")
    if not isinstance(kernel, AttentionKernel | str):
        raise AttentionError(f"cannot register {kernel!r}: expected an AttentionKernel or 'module:attr'")
    from tasks.inputs import caller_module, registered_at_runtime

    out = _REGISTRY.register(key, kernel)
    registered_at_runtime(f"attention kernel {key!r}", kernel, caller_module())
    return out


def _unregister(name: str) -> None:
    """Remove an entry (tests only)."""
    from tasks.inputs import caller_module, registered_at_runtime

    registered_at_runtime(f"attention kernel {name!r}", None, caller_module())
    _REGISTRY.unregister(name)


def attention_names() -> list[str]:
    """Every registered attention kernel name, sorted."""
    _load_builtins()
    return _REGISTRY.names()


def get_attention(name: str) -> AttentionKernel:
    """The attention kernel called ``name``; an unknown name raises :class:`AttentionError` naming
    the closest matches and every valid name."""
    _load_builtins()
    return _REGISTRY.get(name)


def list_attention() -> list[dict[str, Any]]:
    """One row per entry: name, device, available, reason, logsumexp, engine_backend, algorithm,
    description, version.  An entry that cannot be loaded is a row with available False and the error as reason."""
    rows = []
    for name in attention_names():
        row: dict[str, Any] = {"name": name, "device": None, "available": False, "reason": None, "logsumexp": None,
                               "engine_backend": None, "algorithm": None, "description": "", "version": None}
        try:
            kernel = get_attention(name)
            ok, why = kernel.available()
            row.update({**kernel.info(), "available": ok, "reason": why})
        except Exception as exc:  # a failure is a row too
            row["reason"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows
