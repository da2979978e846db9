"""The registry of activation quantizers: one call ``quantizer(x) -> (q, scale)``.

A :class:`swapcheck_common.registry.Registry` (the shape of every registry of swapcheck): built-in entries are lazy ``"module:attr"``
targets with preset parameters, imported on first use; :func:`register_quantizer` adds one (a
duplicate name is refused); an unknown name is answered with "did you mean ..." and the valid names;
:func:`list_quantizers` builds each entry with its defaults, and an entry that cannot be built (a
static quantizer without its scale) is a row with its reason, never a gap.

A quantizer takes a 2-D float tensor ``x`` ``[tokens, hidden]`` (fp32, bf16 or fp16; converted to
fp32 exactly) and returns ``q`` ``[tokens, hidden]`` (int8 or float8_e4m3fn) and ``scale``
``[tokens, 1]`` (fp32, or fp16 for an fp16-scale variant) with ``x ~= q * scale``.  Its
:attr:`Quantizer.identity` (name, version, parameters) goes into unit ids.
"""

from __future__ import annotations

import abc
import importlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from swapcheck_common.errors import InputError
from swapcheck_common.registry import Registry

if TYPE_CHECKING:
    import torch

__all__ = [
    "Quantizer",
    "QuantizerError",
    "get_quantizer",
    "list_quantizers",
    "quantizer_names",
    "register_quantizer",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
INPUT_DTYPES = ("float32", "bfloat16", "float16")


class QuantizerError(InputError):
    """An unknown quantizer, a bad parameter, or input a quantizer cannot take; the message says
    what is allowed (exit code 2)."""


class Quantizer(abc.ABC):
    """Base class of every activation quantizer (module docstring for the call).

    Attributes:
        name: the registry name it was built under.
        out_dtype: ``"int8"`` or ``"fp8_e4m3"`` (the dtype of ``q``).
        version: bump when the numerics change; it goes into unit ids.
        params: the parameters this instance was built with (defaults filled in).
    """

    out_dtype: ClassVar[str] = ""
    version: ClassVar[str] = "1"
    param_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, name: str = "", **params: Any) -> None:
        self.name = name or type(self).__name__
        unknown = sorted(set(params) - set(self.param_defaults))
        if unknown:
            allowed = ", ".join(f"{k}={v!r}" for k, v in self.param_defaults.items()) or "none"
            raise QuantizerError(f"quantizer {self.name!r} got unknown parameter(s) {', '.join(unknown)}; "
                                 f"allowed parameters (with defaults): {allowed}")
        self.params: dict[str, Any] = self.check_params({**self.param_defaults, **params})

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Validate (and normalise) the merged parameters; raise :class:`QuantizerError`."""
        return params

    @abc.abstractmethod
    def formula(self) -> str:
        """The exact formula this instance computes, in one line (docs/quantizers.md notation)."""

    @abc.abstractmethod
    def compute(self, xf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, scale)`` of a validated, finite, contiguous fp32 ``[M, K]`` tensor."""

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise QuantizerError(f"quantizer {self.name!r} takes a 2-D [tokens, hidden] tensor, got {shape}")
        if str(x.dtype).removeprefix("torch.") not in INPUT_DTYPES:
            raise QuantizerError(f"quantizer {self.name!r} takes {', '.join(INPUT_DTYPES)} input, got {x.dtype}")
        xf = x.detach().to(device="cpu", dtype=torch.float32).contiguous()  # exact for all three
        if xf.numel() and not bool(torch.isfinite(xf).all()):
            raise QuantizerError(f"quantizer {self.name!r}: the input contains inf or NaN; "
                                 "per-token quantization needs finite activations")
        return self.compute(xf)

    @property
    def identity(self) -> dict[str, Any]:
        """What identifies this quantizer's numerics: name, version and parameters."""
        return {"name": self.name, "version": self.version, "params": dict(sorted(self.params.items()))}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"<Quantizer {self.name}({args}) v{self.version}>"


@dataclass
class _Entry:
    name: str
    target: Any  # a Quantizer subclass or "module:attr" naming one
    preset: dict[str, Any] = field(default_factory=dict)
    summary: str = ""


#: name -> its entry (a lazy target is imported by :func:`_resolve` on first use).
_REGISTRY: Registry[_Entry] = Registry("quantizer", error=QuantizerError)


def register_quantizer(name: str, target: Any, summary: str = "", **preset: Any) -> None:
    """Register ``target`` (a :class:`Quantizer` subclass, or ``"module:attr"`` naming one) under
    ``name`` with ``preset`` parameters (which a caller's parameters override); duplicates refused."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise QuantizerError(f"invalid quantizer name {name!r}: use letters, digits and . _ + -")
    if name in _REGISTRY:
        raise QuantizerError(f"quantizer name {name!r} is already registered; pick another name")
    if isinstance(target, str):
        if ":" not in target:
            raise QuantizerError(f"a lazy quantizer target is 'module:attr', got {target!r}")
    elif not (isinstance(target, type) and issubclass(target, Quantizer)):
        raise QuantizerError(f"cannot register {target!r} as quantizer {name!r}: expected a Quantizer subclass "
                             "or a 'module:attr' string naming one")
    from tasks.inputs import caller_module, registered_at_runtime

    _REGISTRY.register(name, _Entry(name, target, dict(preset), summary))
    registered_at_runtime(f"quantizer {name!r}", target, caller_module())


def _unregister(name: str) -> None:
    """Remove an entry (tests only)."""
    from tasks.inputs import caller_module, registered_at_runtime

    registered_at_runtime(f"quantizer {name!r}", None, caller_module())
    _REGISTRY.unregister(name)


def _resolve(entry: _Entry) -> type[Quantizer]:
    if isinstance(entry.target, str):
        module, attr = entry.target.split(":", 1)
        obj = getattr(importlib.import_module(module), attr)
        if not (isinstance(obj, type) and issubclass(obj, Quantizer)):
            raise QuantizerError(f"{entry.target} (quantizer {entry.name!r}) is not a Quantizer subclass")
        entry.target = obj
    cls: type[Quantizer] = entry.target
    return cls


def quantizer_names() -> list[str]:
    """Every registered quantizer name, sorted."""
    return _REGISTRY.names()


def get_quantizer(name: str, **params: Any) -> Quantizer:
    """Build the quantizer called ``name``: its preset parameters, overridden by ``params``."""
    if not isinstance(name, str) or not name:
        raise QuantizerError(f"quantizer name must be a non-empty string, got {name!r}")
    entry = _REGISTRY.get(name)
    return _resolve(entry)(name, **{**entry.preset, **params})


def list_quantizers() -> list[dict[str, Any]]:
    """One row per registered quantizer built with its defaults: name, out_dtype, version, params,
    formula, summary, ok, reason (an entry that cannot be built is a row with ok False)."""
    rows: list[dict[str, Any]] = []
    for name in quantizer_names():
        entry = _REGISTRY.get(name)
        row: dict[str, Any] = {"name": name, "out_dtype": None, "version": None, "params": dict(entry.preset),
                               "formula": None, "summary": entry.summary, "ok": False, "reason": None}
        try:
            q = get_quantizer(name)
            row.update(out_dtype=q.out_dtype, version=q.version, params=dict(q.params), formula=q.formula(), ok=True)
        except Exception as exc:  # a failure is a row too
            row["reason"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows
