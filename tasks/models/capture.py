"""Operand capture: the exact operands and output of every W8A8 layer call, and their file format.

While ``with model.capture() as cap:`` is open, every :class:`~tasks.models.W8A8Linear` call
appends a :class:`CapturedLayer` to ``cap.layers`` (in call order): the quantized activations
``x_q`` int8 ``[M, K]`` and their scales ``x_scale`` fp32 ``[M, 1]``, the layer's ``w_q`` int8
``[N, K]``, ``w_scale`` fp32 ``[N]`` and ``bias`` (``[N]`` in the output dtype, or None), the
output the kernel returned (``[M, N]`` in the output dtype, before the engine's exact up-cast), and
the kernel that computed it (name and parameters).  So, for every captured call::

    get_kernel(c.kernel, **c.kernel_params)(c.x_q, c.w_q.t(), c.x_scale, c.w_scale,
                                            c.output.dtype, c.bias)  ==  c.output   (bit for bit)

(:meth:`CapturedLayer.replay`; tests/test_models_capture.py checks it for every layer.)

File format (:func:`save_capture` / :func:`load_capture`): ONE safetensors file per unit.

* Per call, key ``K`` = the layer name (``layers.3.self_attn.q_proj``) for its first call, and
  ``<name>@<c>`` for its c-th repeat (c >= 1; e.g. decode steps under ``generate``):
  tensors ``K/x_q`` (int8 ``[M, K]``), ``K/x_scale`` (fp32 ``[M, 1]``), ``K/output``
  (``[M, N]``, out dtype).
* Per layer name, once: ``<name>/w_q`` (int8 ``[N, K]``), ``<name>/w_scale`` (fp32 ``[N]``),
  ``<name>/bias`` (``[N]``, out dtype; absent when the layer has none).
* The safetensors metadata key ``swapcheck.capture`` holds JSON: ``{"format":
  "swapcheck-capture", "version": 1, "meta": {...model identity...}, "layers": [row, ...]}`` with
  one row per call in call order (:func:`capture_manifest`'s columns plus ``key`` and
  ``kernel_params``).

The file is written to a temporary name and renamed (atomic on one file system).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .linear import W8A8Linear

__all__ = [
    "CapturedLayer",
    "Capture",
    "save_capture",
    "load_capture",
    "read_capture_meta",
    "capture_manifest",
    "CAPTURE_FORMAT",
    "CAPTURE_VERSION",
]

CAPTURE_FORMAT = "swapcheck-capture"
CAPTURE_VERSION = 1
_META_KEY = "swapcheck.capture"
_DTYPE_NAMES = {torch.int8: "int8", torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass
class CapturedLayer:
    """One W8A8 layer call: its operands, its output and the kernel that computed it.

    ``name`` ``layers.<index>.<self_attn|mlp>.<proj>``; ``index`` the decoder layer number;
    ``layer_type`` one of q, k, v, o, gate, up, down; ``call`` how many earlier calls of the same
    layer this capture holds (0 for a single forward pass).
    """

    name: str
    index: int
    layer_type: str
    x_q: torch.Tensor
    x_scale: torch.Tensor
    w_q: torch.Tensor
    w_scale: torch.Tensor
    bias: torch.Tensor | None
    output: torch.Tensor
    kernel: str
    kernel_params: dict[str, Any] = field(default_factory=dict)
    call: int = 0

    @property
    def key(self) -> str:
        return self.name if self.call == 0 else f"{self.name}@{self.call}"

    @property
    def m(self) -> int:
        return int(self.x_q.shape[0])

    @property
    def k(self) -> int:
        return int(self.x_q.shape[1])

    @property
    def n(self) -> int:
        return int(self.w_q.shape[0])

    def operands(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype, torch.Tensor | None]:
        """``(a, b, scale_a, scale_b, out_dtype, bias)`` for the kernel call contract."""
        return self.x_q, self.w_q.t(), self.x_scale, self.w_scale, self.output.dtype, self.bias

    def replay(self, kernel: Any = None) -> torch.Tensor:
        """Run the captured operands through ``kernel`` (a registry name, dict or Kernel; default:
        the kernel the model ran with) and return the ``[M, N]`` output."""
        from .linear import resolve_kernel

        k = resolve_kernel({"kernel": self.kernel, "params": self.kernel_params} if kernel is None else kernel)
        return k(*self.operands())

    def manifest_row(self) -> dict[str, Any]:
        return {
            "layer": self.name,
            "layer_index": self.index,
            "layer_type": self.layer_type,
            "call": self.call,
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "x_dtype": _DTYPE_NAMES.get(self.x_q.dtype, str(self.x_q.dtype)),
            "w_dtype": _DTYPE_NAMES.get(self.w_q.dtype, str(self.w_q.dtype)),
            "x_scale_layout": "per-token" if self.x_scale.numel() == self.m else "per-tensor",
            "x_scale_shape": list(self.x_scale.shape),
            "w_scale_layout": "per-channel" if self.w_scale.numel() == self.n else "per-tensor",
            "w_scale_shape": list(self.w_scale.shape),
            "out_dtype": _DTYPE_NAMES.get(self.output.dtype, str(self.output.dtype)),
            "has_bias": self.bias is not None,
            "kernel": self.kernel,
        }


@dataclass
class Capture:
    """The calls recorded inside one ``model.capture()`` block, and the model's identity."""

    layers: list[CapturedLayer] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    _calls: dict[str, int] = field(default_factory=dict, repr=False)

    def record(self, layer: W8A8Linear, x_q: torch.Tensor, x_scale: torch.Tensor, output: torch.Tensor) -> None:
        """The recorder a :class:`~tasks.models.W8A8Linear` calls after each GEMM."""
        call = self._calls.get(layer.name, 0)
        self._calls[layer.name] = call + 1
        self.layers.append(CapturedLayer(
            name=layer.name,
            index=layer.index,
            layer_type=layer.layer_type,
            x_q=x_q,
            x_scale=x_scale,
            w_q=layer.weight,
            w_scale=layer.weight_scale,
            bias=layer.bias,
            output=output,
            kernel=layer.kernel.name,
            kernel_params=dict(layer.kernel.params),
            call=call,
        ))

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[CapturedLayer]:
        return iter(self.layers)


def _layers_of(cap: Capture | Iterable[CapturedLayer]) -> list[CapturedLayer]:
    return list(cap.layers if isinstance(cap, Capture) else cap)


def capture_manifest(cap: Capture | Iterable[CapturedLayer]) -> list[dict[str, Any]]:
    """One row per captured call: layer, layer_index, layer_type, call, m, n, k, x_dtype, w_dtype,
    x_scale_layout/shape, w_scale_layout/shape, out_dtype, has_bias, kernel."""
    return [c.manifest_row() for c in _layers_of(cap)]


def save_capture(cap: Capture | Iterable[CapturedLayer], path: str | Path, meta: dict[str, Any] | None = None) -> Path:
    """Write ``cap`` to one safetensors file at ``path`` (module docstring); returns the path.

    ``meta`` (JSON-serialisable) is merged over ``cap.meta`` into the file's metadata.
    """
    from safetensors.torch import save_file

    layers = _layers_of(cap)
    if not layers:
        raise ValueError("save_capture: the capture is empty (no W8A8 layer ran inside model.capture())")
    tensors: dict[str, torch.Tensor] = {}
    rows = []
    weights_seen: dict[str, CapturedLayer] = {}
    for c in layers:
        if f"{c.key}/x_q" in tensors:
            raise ValueError(f"save_capture: two captured calls share the key {c.key!r}")
        first = weights_seen.get(c.name)
        if first is None:
            weights_seen[c.name] = c
            tensors[f"{c.name}/w_q"] = c.w_q.contiguous().clone()
            tensors[f"{c.name}/w_scale"] = c.w_scale.contiguous().clone()
            if c.bias is not None:
                tensors[f"{c.name}/bias"] = c.bias.contiguous().clone()
        elif not (
            torch.equal(first.w_q, c.w_q)
            and torch.equal(first.w_scale, c.w_scale)
            and (first.bias is None) == (c.bias is None)
            and (c.bias is None or torch.equal(first.bias, c.bias))  # type: ignore[arg-type]
        ):
            raise ValueError(f"save_capture: layer {c.name!r} was captured with two different weights")
        tensors[f"{c.key}/x_q"] = c.x_q.contiguous().clone()
        tensors[f"{c.key}/x_scale"] = c.x_scale.contiguous().clone()
        tensors[f"{c.key}/output"] = c.output.contiguous().clone()
        rows.append({**c.manifest_row(), "key": c.key, "kernel_params": c.kernel_params})
    all_meta = {**(cap.meta if isinstance(cap, Capture) else {}), **(meta or {})}
    header = {"format": CAPTURE_FORMAT, "version": CAPTURE_VERSION, "meta": all_meta, "layers": rows}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata={_META_KEY: json.dumps(header, sort_keys=True, default=str)})
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def _read_header(path: str | Path) -> dict[str, Any]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get(_META_KEY)
    if raw is None:
        raise ValueError(f"{path}: not a swapcheck capture file (no {_META_KEY!r} metadata)")
    header: dict[str, Any] = json.loads(raw)
    if header.get("format") != CAPTURE_FORMAT or header.get("version") != CAPTURE_VERSION:
        raise ValueError(
            f"{path}: capture format {header.get('format')!r} version {header.get('version')!r}; "
            f"this swapcheck reads {CAPTURE_FORMAT!r} version {CAPTURE_VERSION}"
        )
    return header


def read_capture_meta(path: str | Path) -> dict[str, Any]:
    """The file's metadata header: ``{"format", "version", "meta", "layers": [rows]}``."""
    return _read_header(path)


def load_capture(path: str | Path) -> list[CapturedLayer]:
    """Read a capture file back into :class:`CapturedLayer` objects, in call order.

    Calls of the same layer share one ``w_q``/``w_scale``/``bias`` tensor.
    """
    from safetensors.torch import load_file

    header = _read_header(path)
    tensors = load_file(str(path))
    out = []
    for row in header["layers"]:
        name, key = row["layer"], row["key"]
        out.append(CapturedLayer(
            name=name,
            index=int(row["layer_index"]),
            layer_type=row["layer_type"],
            x_q=tensors[f"{key}/x_q"],
            x_scale=tensors[f"{key}/x_scale"],
            w_q=tensors[f"{name}/w_q"],
            w_scale=tensors[f"{name}/w_scale"],
            bias=tensors.get(f"{name}/bias"),
            output=tensors[f"{key}/output"],
            kernel=row["kernel"],
            kernel_params=dict(row.get("kernel_params") or {}),
            call=int(row["call"]),
        ))
    return out
