"""Exact numerics for kernel-interchangeability checks.

Formats (:mod:`.formats`), correct rounding and error-free transformations (:mod:`.rounding`), and
bit-pattern distances in output spacings (:mod:`.spacing`).  Import the torch-based modules by name:
named accumulation orders over lists of terms (:mod:`.accumulation`), matmul algorithms and the
matmul reference (:mod:`.products`), error models and bounds (:mod:`.errormodel`), exact sums
(:mod:`.exactsum`), the emulation engines (:mod:`.orders`) and exact emulations of attention kernels
(:mod:`.attention_emulate`).  Attention algorithms (:mod:`.attention`: forward and backward bounds of
fused attention) need only numpy and are exported here.  See docs/numerics.md.
"""

from .attention import AttentionAlgorithm, AttentionResult, GradResult
from .formats import FORMATS, INT8_MAX_K, FloatFormat, get_format
from .rounding import (
    NEAREST_AWAY,
    NEAREST_EVEN,
    as_float64,
    check_rounding,
    is_representable,
    round_dyadic,
    round_fraction,
    round_to_format,
    to_tensor,
    two_prod,
    two_sum,
)
from .spacing import NOT_COMPARABLE, bits, distance, is_nan_bits, ordered, spacing

__all__ = [
    "AttentionAlgorithm",
    "AttentionResult",
    "GradResult",
    "FORMATS",
    "FloatFormat",
    "INT8_MAX_K",
    "get_format",
    "round_to_format",
    "round_fraction",
    "round_dyadic",
    "NEAREST_EVEN",
    "NEAREST_AWAY",
    "check_rounding",
    "two_sum",
    "two_prod",
    "to_tensor",
    "as_float64",
    "is_representable",
    "bits",
    "ordered",
    "distance",
    "spacing",
    "is_nan_bits",
    "NOT_COMPARABLE",
]
