"""An INT8 kernel that accumulates the way oneDNN does on a CPU without VNNI (issue #35), on every CPU.

``"_planted_saturation:Int16PairSaturation"``: activations shifted to u8 by +128, adjacent u8 x s8
products added in int16 with saturation (``vpmaddubsw``), the pairs summed in int32, the shift's
compensation subtracted, then ``fl(fl(acc * sa) * sb)``.  What ``int8-onednn`` computes on AVX2
(measured: tasks/kernels/onednn.py), so its diagnosis can be tested where oneDNN has VNNI.
"""

from __future__ import annotations

import torch

from tasks.kernels import Kernel
from tasks.kernels.onednn import saturated_pair_sums


class Int16PairSaturation(Kernel):
    operand_dtype = "int8"
    device = "cpu"
    description = "planted: u8 x s8 products added in saturating int16 pairs (oneDNN without VNNI)"

    def compute(self, ops):
        u = ops.a.numpy().astype("int64") + 128
        w = ops.b.numpy().astype("int64")
        acc = torch.from_numpy(saturated_pair_sums(u, w) - 128 * w.sum(0)).to(torch.float32)
        return (acc * ops.scale_a * ops.scale_b).to(ops.out_dtype)
