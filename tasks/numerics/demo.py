"""The seed's examples, computed: what ``swapcheck numerics demo`` prints.

Four matmul lines (300 bfloat16 ones added three ways, a pairwise fp32 error model) and the seed's
attention example: seeded q, k, v of shape (1, 2, 64, 16) and each algorithm's largest output
tolerance (docs/numerics.md, "Attention", says how ours compares with the seed's digits).
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

__all__ = ["demo_lines", "seed_attention_inputs", "SEED_ATTENTION_ALGORITHMS"]

#: The seed's two attention algorithms, as keyword arguments of AttentionAlgorithm.
SEED_ATTENTION_ALGORITHMS: dict[str, dict[str, Any]] = {
    "plain": {},
    "flash": {"online_softmax": True, "block_size": 16, "weights": "bfloat16"},
}


def seed_attention_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v exactly as the seed builds them: ``random.Random(0)``, ``gauss(0, 1)`` per element,
    as float32 (what ``torch.tensor`` of Python floats gives), in the order q, k, v."""
    rng = random.Random(0)

    def randn(*shape: int) -> np.ndarray:
        values = [rng.gauss(0, 1) for _ in range(math.prod(shape))]
        return np.asarray(values, dtype=np.float32).reshape(shape)

    q = randn(1, 2, 64, 16)
    k = randn(1, 2, 64, 16)
    v = randn(1, 2, 64, 16)
    return q, k, v


def demo_lines(k: int = 64) -> list[tuple[str, str, Any]]:
    """``(json key, printed label, value)`` for each line of the demo, in order.

    ``k`` is the number of products of the printed error model.  The attention values are each
    algorithm's largest output tolerance (float).
    """
    import ml_dtypes

    from . import products
    from .attention import AttentionAlgorithm

    ones = np.ones((1, 300), dtype=ml_dtypes.bfloat16)
    column = ones.reshape(300, 1)
    lines: list[tuple[str, str, Any]] = [
        ("reference", "reference", products.matmul(ones, column).rounded.tolist()),
        ("sequential", "sequential", products.matmul_sequential("bfloat16", fma=False).run(ones, column).tolist()),
        ("pairwise", "pairwise", products.matmul_pairwise("bfloat16", fma=False).run(ones, column).tolist()),
        ("error_model", "pairwise", str(products.matmul_pairwise("float32", fma=False).error_model(k))),
    ]
    q, kk, v = seed_attention_inputs()
    for name, kwargs in SEED_ATTENTION_ALGORITHMS.items():
        tol = AttentionAlgorithm(**kwargs).tolerance(q, kk, v)
        lines.append((f"attention_{name}", name, float(np.max(tol.out))))
    return lines
