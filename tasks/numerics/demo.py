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

__all__ = ["demo_lines", "demo_notes", "seed_attention_inputs", "SEED_ATTENTION_ALGORITHMS"]

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


#: What the seed prints for its attention example (docs/numerics.md, "The seed's example", says why ours differ).
SEED_ATTENTION_DIGITS = {"plain": 1.31e-05, "flash": 0.00545}


def demo_notes(lines: list[tuple[str, str, Any]], k: int = 64) -> dict[str, str]:
    """Per json key of :func:`demo_lines`: what the value is and what to compare it with (its
    yardstick), the words ``swapcheck numerics demo`` prints after each value."""
    v = {key: value for key, _, value in lines}
    ref = float(np.asarray(v["reference"]).reshape(-1)[0])

    def against(key: str) -> str:
        got = float(np.asarray(v[key]).reshape(-1)[0])
        return "equal to the reference" if got == ref else f"{ref - got:g} below the reference" if got < ref \
            else f"{got - ref:g} above the reference"

    plain, flash = v["attention_plain"], v["attention_flash"]
    return {
        "reference": "300 bfloat16 ones summed exactly, rounded once to bfloat16",
        "sequential": f"added one at a time in bfloat16: {against('sequential')}; from 256 on, bfloat16 values are "
                      "2 apart and adding 1 rounds back down",
        "pairwise": f"added as a balanced tree in bfloat16: {against('pairwise')}; every partial sum is exact",
        "error_model": f"error bound of a pairwise fp32 sum of K = {k} rounded products, per output: "
                       "gamma_n * sum |A B| + N * eta, docs/numerics.md",
        "attention_plain": "largest output tolerance of attention as defined, fp32 compute, on the seed's q, k, v "
                           f"of shape (1, 2, 64, 16), float32; the seed prints {SEED_ATTENTION_DIGITS['plain']:.3g}",
        "attention_flash": f"the same for flash attention, online softmax in blocks of 16 keys with bfloat16 weights: "
                           f"{flash / plain:.0f} x plain; the seed prints {SEED_ATTENTION_DIGITS['flash']:.3g}",
    }

