"""The defaults of a check, written once: the sweep kinds, the harness and the CLI read them here."""

from __future__ import annotations

#: Fresh draws of operands per shape.
DEFAULT_TRIALS = 20

#: Shapes (M, K, N) checked when none is named: not multiples of typical tile sizes, one decode-like row.
DEFAULT_SHAPES: tuple[tuple[int, int, int], ...] = ((64, 1000, 48), (127, 2049, 65), (1, 4096, 33))
