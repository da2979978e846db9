"""A user's own kernels, for the registry tests (imported lazily by 'module:attr' names)."""

from __future__ import annotations

import torch

from tasks.kernels import Kernel

IMPORTED = True


class FloatReference(Kernel):
    """Dequantize to float64, matmul, scale, add bias, round once (a plausible user kernel)."""

    operand_dtype = "any"
    device = "cpu"
    description = "user kernel: rn(fl64(a) @ fl64(b) * sa * sb + bias)"
    param_defaults = {"offset": 0.0}

    def compute(self, ops):
        acc = ops.a.to(torch.float64) @ ops.b.to(torch.float64)
        out = acc * ops.scale_a.double() * ops.scale_b.double() + self.params["offset"]
        if ops.bias is not None:
            out = out + ops.bias.double()
        return out.to(ops.out_dtype)


def make_float_reference(**params) -> Kernel:
    """A factory, the other registrable form."""
    return FloatReference(**params)


NOT_A_KERNEL = 42
