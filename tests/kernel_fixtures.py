"""User kernels named by ``module:attr`` in test specs: one that raises, one that crashes once."""

from __future__ import annotations

import os
from pathlib import Path


def failing_kernel(a, b, scale_a, scale_b, out_dtype, bias=None):
    raise RuntimeError("planted failure: this kernel always raises")


def crash_once_kernel(a, b, scale_a, scale_b, out_dtype, bias=None):
    """Kill the worker process the first time each (shape) is seen; behave like exact afterwards."""
    marker = Path(os.environ["SWAPCHECK_TEST_CRASH_DIR"]) / f"{a.shape[1]}-{scale_a.flatten()[0].item()!r}"
    if not marker.exists():
        marker.write_text("crashed")
        os._exit(17)
    from tasks.kernels import get_kernel

    return get_kernel("exact")(a, b, scale_a, scale_b, out_dtype, bias)
