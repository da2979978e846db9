"""A user's own kernels, for the registry tests (imported lazily by 'module:attr' names)."""

from __future__ import annotations

import torch

from tasks.kernels import Kernel, kernel_factory, kernel_function

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


@kernel_factory
def make_float_reference(**params) -> Kernel:
    """A factory, the other registrable form."""
    return FloatReference(**params)


NOT_A_KERNEL = 42


def unmarked_matmul(a, b):
    """A plain f(A, B) -> C without @kernel_function: refused (nothing calls it)."""
    raise AssertionError("an unmarked function must never be called")


def unmarked_factory(**params) -> Kernel:
    """A factory without @kernel_factory: refused (nothing calls it)."""
    raise AssertionError("an unmarked factory must never be called")


class NotAKernelClass:
    """A class that is not a Kernel subclass: refused, never instantiated."""

    def __init__(self, **params):
        raise AssertionError("a non-kernel class must never be instantiated")


@kernel_function
def marked_matmul(a, b):
    """fp32 accumulation, rounded once (the marked variant of unmarked_matmul)."""
    return (a.float() @ b.float()).to(a.dtype)
