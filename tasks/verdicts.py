"""The verdict vocabulary: how every correctness check and kernel comparison ends.

One vocabulary for the ``exact_match`` and ``bounds`` checks (:mod:`tasks.checks`) and for the
kernel-pair comparisons of the K-depth sweep.  A verdict always travels with its evidence (counts,
the worst element, its indices, the exact and observed values); see docs/checks.md.

=========================  =======  ===========================================================
verdict                    passes?  meaning
=========================  =======  ===========================================================
``IDENTICAL``              yes      bitwise equal to the reference at every compared position
                                    (exact match: every checked position; bounds: every output
                                    equals the exact result rounded once to the output format)
``EPILOGUE_ROUNDING``      yes      not identical, but every difference is at most one output
                                    spacing and differences are rare (at most
                                    :data:`RARE_FRACTION` of the outputs), everything covered by
                                    the bound; over a K sweep the rate is also flat in K
                                    (:func:`flat_in_k`)
``WITHIN_ALGORITHM_BOUND`` yes      differences larger or more frequent than that, but every
                                    output lies within the named accumulation algorithm's error
                                    bound
``DIFFERENT``              no       (kernel pairs only) the outputs differ beyond epilogue
                                    rounding and no bound was checked: not interchangeable bit
                                    for bit, which is not by itself a claim that either is wrong
``INCORRECT``              no       some output violates the check: a mismatch where the exact
                                    result is representable (exact match), or an output outside
                                    the algorithm's bound (bounds), or an output of the wrong
                                    shape
``PRECISION_DOWNGRADE``    no       (``precision`` check) exact integers came back wrong, and
                                    each wrong one is what a narrower format than the claimed one
                                    gives (inputs rounded to tf32/fp16/bf16, a bf16/fp16/tf32
                                    accumulator); the evidence names the format.
                                    Above INCORRECT: the more specific diagnosis wins ``check all``
``INCONCLUSIVE``           no       the check ran but saw too little to judge (fewer than half of
                                    the positions had a reference within the exact range)
``ERROR``                  no       the kernel raised instead of returning an output
=========================  =======  ===========================================================

Severity grows down the table; a run of many trials or shapes ends in the most severe verdict of
its parts (:func:`worst`).  The CLI exits 0 when the verdict passes, 1 when it does not (bad input,
which never produces a verdict, exits 2).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum

import numpy as np

# The names, the order, what passes and "rare": one vocabulary with the reports (swapcheck_common.verdicts).
from swapcheck_common import verdicts as _names
from swapcheck_common.verdicts import RARE_FRACTION

__all__ = [
    "Verdict",
    "PASSING",
    "RARE_FRACTION",
    "worst",
    "passed",
    "classify_differences",
    "flat_in_k",
]



class Verdict(str, Enum):
    """How a check ended (see the module docstring's table)."""

    IDENTICAL = "IDENTICAL"
    EPILOGUE_ROUNDING = "EPILOGUE_ROUNDING"
    WITHIN_ALGORITHM_BOUND = "WITHIN_ALGORITHM_BOUND"
    DIFFERENT = "DIFFERENT"
    INCORRECT = "INCORRECT"
    PRECISION_DOWNGRADE = "PRECISION_DOWNGRADE"
    INCONCLUSIVE = "INCONCLUSIVE"
    ERROR = "ERROR"

    @property
    def passed(self) -> bool:
        """True for IDENTICAL, EPILOGUE_ROUNDING and WITHIN_ALGORITHM_BOUND."""
        return self in PASSING

    @property
    def severity(self) -> int:
        """Position in the table: a larger number is a worse outcome."""
        return _ORDER.index(self)

    def __str__(self) -> str:
        return self.value


_ORDER = list(Verdict)
if tuple(v.value for v in _ORDER) != _names.VERDICT_ORDER:  # the enum is the shared vocabulary, in order
    raise ImportError("tasks.verdicts.Verdict differs from swapcheck_common.verdicts.VERDICT_ORDER")
PASSING = frozenset(Verdict(v) for v in _names.PASSING)


def worst(verdicts: Iterable[Verdict | str]) -> Verdict:
    """The most severe verdict of several (IDENTICAL for none)."""
    out = Verdict.IDENTICAL
    for v in verdicts:
        v = Verdict(v)
        if v.severity > out.severity:
            out = v
    return out


def passed(verdict: Verdict | str) -> bool:
    """Does this verdict pass?"""
    return Verdict(verdict) in PASSING


def classify_differences(
    distance: np.ndarray,
    covered: np.ndarray | None = None,
    rare: float = RARE_FRACTION,
) -> Verdict:
    """The verdict of one comparison from its elementwise distances in output spacings.

    Args:
        distance: int array, the distance of each output from the reference in spacings of the
            output format (:func:`tasks.numerics.distance`; -1 where a NaN is involved and the bits
            differ).
        covered: optional bool array, whether each output is within the algorithm's bound.  When
            given, any uncovered output makes the verdict INCORRECT and differences beyond
            EPILOGUE_ROUNDING end in WITHIN_ALGORITHM_BOUND.  When absent (a kernel pair compared
            with no bound) they end in DIFFERENT.
        rare: the largest fraction of differing outputs that still counts as rare.

    Returns:
        IDENTICAL, EPILOGUE_ROUNDING, WITHIN_ALGORITHM_BOUND, DIFFERENT or INCORRECT.
    """
    d = np.asarray(distance).reshape(-1)
    if covered is not None and not bool(np.all(covered)):
        return Verdict.INCORRECT
    if d.size == 0 or not bool(np.any(d != 0)):
        return Verdict.IDENTICAL
    differing = np.count_nonzero(d != 0)
    if bool(np.all((d >= 0) & (d <= 1))) and differing <= rare * d.size:
        return Verdict.EPILOGUE_ROUNDING
    if covered is not None:
        return Verdict.WITHIN_ALGORITHM_BOUND
    return Verdict.DIFFERENT


def flat_in_k(differing_by_k: Mapping[int, tuple[int, int]], factor: float = 4.0) -> bool:
    """Is a rate of differing outputs flat in K (the EPILOGUE_ROUNDING signature of a sweep)?

    ``differing_by_k`` maps K to ``(differing, elements)``.  The rate is flat when the rate at the
    largest K is at most ``factor`` times the rate at the smallest K, after adding one differing
    element to both (so that a handful of events at small counts is not read as growth).  An
    accumulation-order difference grows with K (FP8: docs/reference/numerics.md §5.1); an epilogue
    difference does not (INT8: §4).
    """
    if len(differing_by_k) < 2:
        return True
    ks = sorted(differing_by_k)
    d0, n0 = differing_by_k[ks[0]]
    d1, n1 = differing_by_k[ks[-1]]
    if n0 <= 0 or n1 <= 0:
        return True
    return (d1 + 1) / n1 <= factor * (d0 + 1) / n0
