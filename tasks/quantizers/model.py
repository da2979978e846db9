"""Quantizers in the CPU W8A8 engine: install one in every layer, and record each layer's float input.

* :func:`install_quantizer` sets :attr:`tasks.models.W8A8Linear.quantizer` on every decoder linear;
  with None every layer goes back to the engine's own quantizer (``vllm-int8``, bit for bit).
* :func:`capture_inputs` records, while open, the activations each W8A8 layer is about to quantize:
  the ``[M, K]`` fp32 input (the engine runs fp32 between linears; a bf16/fp16 activation is up-cast
  exactly) with the layer it feeds.  The ``quantize`` kind runs every quantizer on exactly these.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["LayerInput", "capture_inputs", "install_quantizer"]


@dataclass
class LayerInput:
    """One W8A8 layer call's input ``x`` ``[M, K]`` fp32, and the layer (weights, kernel, out dtype)."""

    name: str
    index: int
    layer_type: str
    call: int
    x: torch.Tensor
    layer: Any

    @property
    def key(self) -> str:
        return self.name if self.call == 0 else f"{self.name}@{self.call}"


def install_quantizer(model: Any, quantizer: Any) -> None:
    """Make every W8A8 layer of ``model`` quantize its input with ``quantizer`` (an int8 registry
    quantizer, or None for the engine's own)."""
    if quantizer is not None and quantizer.out_dtype != "int8":
        raise ValueError(f"quantizer {quantizer.name!r} produces {quantizer.out_dtype}; the W8A8 engine's "
                         "kernels take int8 activations")
    for layer in model.linears().values():
        layer.quantizer = quantizer


@contextmanager
def capture_inputs(model: Any) -> Iterator[list[LayerInput]]:
    """Record each W8A8 layer call's input (module docstring) in call order while the block is open."""
    import torch

    records: list[LayerInput] = []
    calls: dict[str, int] = {}
    handles = []

    def hook(layer: Any, args: tuple[Any, ...]) -> None:
        x = args[0]
        call = calls.get(layer.name, 0)
        calls[layer.name] = call + 1
        x2 = x.detach().reshape(-1, layer.in_features).to(torch.float32).clone()
        records.append(LayerInput(layer.name, layer.index, layer.layer_type, call, x2, layer))

    for layer in model.linears().values():
        handles.append(layer.register_forward_pre_hook(hook))
    try:
        yield records
    finally:
        for h in handles:
            h.remove()
