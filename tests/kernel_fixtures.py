"""User kernels named by ``module:attr`` in test specs: one that raises, one that crashes once, one
that is slow on purpose."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tasks.kernels import Kernel, get_kernel


class FailingKernel(Kernel):
    """Always raises: a unit running it must become a failed ledger row, and the sweep go on."""

    operand_dtype = "any"
    description = "test fixture: raises"

    def compute(self, ops):
        raise RuntimeError("planted failure: this kernel always raises")


class CrashOnceKernel(Kernel):
    """Kills its worker process the first time it sees a problem; behaves like `exact` afterwards."""

    operand_dtype = "any"
    description = "test fixture: kills the worker process once per problem"

    def compute(self, ops):
        key = f"{ops.a.shape[1]}-{ops.scale_a.flatten()[0].item()!r}"
        marker = Path(os.environ["SWAPCHECK_TEST_CRASH_DIR"]) / key
        if not marker.exists():
            marker.write_text("crashed")
            os._exit(17)
        return get_kernel("exact")(ops.a, ops.b, ops.scale_a, ops.scale_b, ops.out_dtype, ops.bias)


class SlowKernel(Kernel):
    """``int8-cutlass-order`` after a 0.4 s sleep: a unit that lasts long enough to be interrupted
    whatever the machine's speed, without keeping a core busy meanwhile."""

    operand_dtype = "int8"
    description = "test fixture: cutlass-order, 0.4 s per call"

    def compute(self, ops):
        time.sleep(0.4)
        return get_kernel("int8-cutlass-order")(ops.a, ops.b, ops.scale_a, ops.scale_b, ops.out_dtype, ops.bias)


class EpilogueVariant(Kernel):
    """CUTLASS-order epilogue, or (``variant="truncate"``) the same with a round-toward-zero bf16
    conversion: the deliberately changed kernel of the nightly regression test."""

    operand_dtype = "int8"
    description = "test fixture: cutlass-order epilogue, optionally truncating"
    param_defaults = {"variant": "cutlass"}

    def compute(self, ops):
        import torch

        out = get_kernel("int8-cutlass-order")(ops.a, ops.b, ops.scale_a, ops.scale_b, torch.float32, None)
        if self.params["variant"] == "truncate" and ops.out_dtype == torch.bfloat16:
            bits = out.contiguous().view(torch.int32) & ~0xFFFF  # drop the low 16 bits: toward zero
            return bits.view(torch.float32).to(torch.bfloat16)
        return out.to(ops.out_dtype)
