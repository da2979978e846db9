"""Warm numba's on-disk cache: compile every kernel of :mod:`.compiled` once, so that later processes
(Ray workers, CLI subprocesses, test workers) load the kernels instead of each compiling them.

    python -c "from tasks.numerics.warmup import warm; warm()"

A clean checkout has no cache: the first process that needs a kernel would compile it (seconds to a
minute for all of them), and every process started before that cache is written compiles it too.
"""

from __future__ import annotations

import numpy as np

from . import compiled, products

__all__ = ["warm"]


def warm(part: str = "all") -> bool:
    """Compile every kernel once (or load it from numba's cache), so that later processes -- Ray
    workers, CLI subprocesses, test workers -- load it instead of each compiling it again.

    Runs each order on tiny operands along both kernel paths (float32 accumulators and the float64
    general path) and the exact accumulation, in fp32, bf16, fp16 and fp8 inputs: every signature
    the fast paths take.  ``part``: ``"ordered"`` (sequential, pairwise, blocked), ``"exact"`` (the
    exact accumulation) or ``"all"``; the two parts compile independently, so two processes can
    warm a cold cache in parallel.  False (and nothing compiled) where the compiled paths are off."""
    if part not in ("all", "ordered", "exact"):
        raise ValueError(f"part must be 'all', 'ordered' or 'exact', got {part!r}")
    if not compiled.available():
        return False
    import ml_dtypes

    rng = np.random.default_rng(0)
    for dt in (np.float32, ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn):
        a = rng.standard_normal((3, 5)).astype(np.float32).astype(dt)
        b = rng.standard_normal((5, 2)).astype(np.float32).astype(dt)
        for acc in ("float32", "bfloat16", "float16", "float8_e4m3fn"):
            if part in ("all", "ordered"):
                for fma in (False, True):
                    products.matmul_sequential(acc, fma=fma).run(a, b)
                    products.matmul_pairwise(acc, fma=fma).run(a, b)
                    products.matmul_blocked(acc, 2, fma=fma).run(a, b)
            if part in ("all", "exact"):
                products.matmul_exact_accumulation(acc).run(a, b)
    return True
