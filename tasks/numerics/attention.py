"""Attention algorithms: the bounds of fused attention kernels (a later issue; nothing here yet).

Fused attention kernels round in places the definition of ``scaled_dot_product_attention`` does not.
This module will describe those places by method, the way :mod:`.products` describes the orders of a
matmul, following the seed ``seeds/001_f76128d442045203.txt``:

    AttentionAlgorithm(*, online_softmax=False, block_size=None, exp2=False, weights=None,
                       accumulate=None, bias=None, reciprocal=False)

=====================  ==========================================================================
method                 what the kernel does
=====================  ==========================================================================
online_softmax=True    processes the keys in blocks with a running maximum and sum, rescaling
                       earlier partial sums
block_size=n           with online_softmax: at most ceil(S / n) blocks of at most n keys, in any
                       order (without it, any blocking)
exp2=True              computes the weights as exp2 of logits in base-2 units
weights="bfloat16"     rounds the weights to this format before the product with V (in the
                       backward, also P and dS)
accumulate="bfloat16"  does every accumulation in this format instead of the compute format
bias="bfloat16"        rounds float-mask values to this format before adding them (ALiBi biases
                       computed in lower precision)
reciprocal=True        normalizes by a rounded reciprocal of the row sum instead of dividing
=====================  ==========================================================================

The methods combine; with none, the bounds are the definition's.  An algorithm will have
``tolerance()``, ``finite_range()``, ``may_be()`` and ``covers()`` taking the arguments of
``scaled_dot_product_attention``, and ``backward_`` forms of each for the gradients (given the
forward's ``out`` and ``logsumexp``, as a fused backward recomputes P from logsumexp; without them,
for a backward that recomputes the softmax).  It will have no ``run()``, because kernels differ in
details these methods leave open, and no error model, because attention's error grows with the size
of the logits, which no formula in shapes and formats alone can bound.

The building blocks already exist: accumulation orders and their counts (:mod:`.accumulation`),
error models and elementwise bounds (:mod:`.errormodel`), exact sums (:mod:`.exactsum`) and matmul
algorithms for ``Q K^T`` and ``P V`` (:mod:`.products`).
"""

from __future__ import annotations

__all__: list[str] = []
