"""A kernel that differs from ``int8-cutlass-order`` on ONE linear of ``tiny-qwen3`` only, named as a
user names a kernel: ``"_localize_planted:OneLinearOff"``.

It recognises the linear by its operands alone (its per-channel weight scales equal that linear's in
the seeded model), adds ``offset`` to every output element there, and elsewhere returns exactly what
``int8-cutlass-order`` returns. So a localize run of cutlass-order vs this kernel can only part
because of that one linear: the culprit set must be exactly ``[linear]``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tasks.kernels import Kernel, get_kernel

_TARGETS: dict[tuple[str, int], torch.Tensor] = {}


def _target_scale(linear: str, seed: int) -> torch.Tensor:
    key = (linear, seed)
    if key not in _TARGETS:
        from tasks.models import build_model

        _TARGETS[key] = build_model("tiny-qwen3", seed=seed).linears()[linear].weight_scale.clone()
    return _TARGETS[key]


class OneLinearOff(Kernel):
    name = "planted-one-linear-off"
    operand_dtype = "int8"
    device = "cpu"
    description = "int8-cutlass-order, plus `offset` on every output of one tiny-qwen3 linear (planted)"
    param_defaults: ClassVar[dict[str, Any]] = {"linear": "layers.1.mlp.down_proj", "seed": 0, "offset": 0.5}

    def compute(self, ops: Any) -> torch.Tensor:
        base = get_kernel("int8-cutlass-order")
        out: torch.Tensor = base(ops.a, ops.b, ops.scale_a, ops.scale_b.reshape(-1), ops.out_dtype, ops.bias)
        target = _target_scale(self.params["linear"], int(self.params["seed"]))
        sb = ops.scale_b.reshape(-1)
        if sb.shape == target.shape and torch.equal(sb, target):
            out = (out.float() + float(self.params["offset"])).to(ops.out_dtype)
        return out
