"""Exact numerics for kernel-interchangeability checks.

Formats (:mod:`.formats`), correct rounding and error-free transformations (:mod:`.rounding`), and
bit-pattern distances in output spacings (:mod:`.spacing`).  See docs/numerics.md.
"""

from .formats import FORMATS, FloatFormat, get_format
from .rounding import (
    as_float64,
    is_representable,
    round_fraction,
    round_to_format,
    to_tensor,
    two_prod,
    two_sum,
)
from .spacing import NOT_COMPARABLE, bits, distance, is_nan_bits, ordered, spacing

__all__ = [
    "FORMATS",
    "FloatFormat",
    "get_format",
    "round_to_format",
    "round_fraction",
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
