"""Scaled FP8 kernels with planted defects for the three-way arbiter (tests/test_arbiter.py), named the
way a user names their own kernel: ``"_arbiter_kernels:Attr"``.

Each declares the accumulation it claims (``Kernel.bounds_algorithm``) and computes something else:

========================  ==========================================================================
attr                      what it computes (and declares)
========================  ==========================================================================
``Bf16Accumulator``       e4m3 products summed in blocks of 32 in fp32, the running sum rounded to bf16
                          after every block (declares ``blocked-32`` in fp32): a narrower accumulator
``DroppedTerm``           the last K term never added (declares ``any`` in fp32)
``Undeclared``            fp32 sequential sum, correct, but declares nothing
========================  ==========================================================================
"""

from __future__ import annotations

import torch

from tasks.kernels import Kernel

BLOCK = 32


def _fp32(ops):
    return ops.a.to(torch.float32), ops.b.to(torch.float32)


def _epilogue(acc, ops):
    return (acc * ops.scale_a * ops.scale_b).to(ops.out_dtype)


class Bf16Accumulator(Kernel):
    """Declares blocked-32 fp32; keeps its running sum in bf16."""

    operand_dtype = "fp8_e4m3"
    device = "cpu"
    description = "planted defect: the running sum rounded to bf16 after every block of 32 products"

    def bounds_algorithm(self, operand_dtype, m, n, capability=None):
        return (f"blocked-{BLOCK}", "fp32")

    def compute(self, ops):
        a, b = _fp32(ops)
        acc = torch.zeros(ops.m, ops.n, dtype=torch.bfloat16)
        for k0 in range(0, a.shape[1], BLOCK):
            acc = (acc.float() + a[:, k0:k0 + BLOCK] @ b[k0:k0 + BLOCK]).to(torch.bfloat16)
        return _epilogue(acc.float(), ops)


class DroppedTerm(Kernel):
    """Declares any order in fp32; never adds the last product."""

    operand_dtype = "fp8_e4m3"
    device = "cpu"
    description = "planted defect: the last K term dropped"

    def bounds_algorithm(self, operand_dtype, m, n, capability=None):
        return ("any", "fp32")

    def compute(self, ops):
        a, b = _fp32(ops)
        return _epilogue(a[:, :-1] @ b[:-1], ops)


class Undeclared(Kernel):
    """A correct fp32 GEMM that declares no accumulation algorithm."""

    operand_dtype = "fp8_e4m3"
    device = "cpu"
    description = "fp32 GEMM of the e4m3 values, no declared algorithm"

    def compute(self, ops):
        a, b = _fp32(ops)
        return _epilogue(a @ b, ops)
