"""tasks.devices.on_device: the one "run a kernel on its device" of tasks/ (kinds, checks)."""

from __future__ import annotations

import pytest
import torch

from tasks.devices import cuda_reason, on_device


def test_on_device_calls_with_tensors_on_the_device_and_returns_cpu_tensors_and_seconds() -> None:
    seen: list[str] = []

    def fn(a: torch.Tensor, pair: tuple[torch.Tensor, int], scale: float, *, bias: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        seen.extend(x.device.type for x in (a, pair[0]))
        assert pair[1] == 3 and scale == 0.5 and bias is None
        return a * scale, [pair[0]]

    a = torch.arange(4.0)
    (out, rest), seconds = on_device("cpu", fn, a, (a, 3), 0.5, bias=None)
    assert seen == ["cpu", "cpu"] and torch.equal(out, a * 0.5) and rest[0] is a  # on the CPU: no copies
    assert isinstance(rest, list) and seconds >= 0.0


@pytest.mark.skipif(cuda_reason() is not None, reason="needs a CUDA device")
def test_on_device_moves_to_cuda_and_back() -> None:
    out, _ = on_device("cuda", lambda x: (x.device.type, x + 1), torch.ones(2))
    assert out[0] == "cuda" and out[1].device.type == "cpu" and torch.equal(out[1], torch.full((2,), 2.0))
