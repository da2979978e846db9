"""Settings read from the environment: one reading and one refusal for every ``SWAPCHECK_*_S`` bound."""

from __future__ import annotations

import math
import os

from swapcheck_common.errors import InputError


def seconds_from_env(name: str, default: float, low: float, high: float,
                     error: type[Exception] = InputError, unit: str = "seconds") -> float:
    """``$name`` as seconds in ``[low, high]``; ``default`` when unset or empty. Anything else (not a
    number, NaN, out of range) raises ``error`` (an exit-2 class) naming the variable, its value and what is
    allowed: a bound that silently fell back to its default would hide the mistake."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # NaN fails both comparisons
        raise error(f"{name}={raw!r}: give {unit} between {low:g} and {high:g} (default {default:g})")
    return value


def count_from_env(name: str, default: int, low: int, high: int, error: type[Exception] = InputError,
                   unit: str = "a whole number") -> int:
    """``$name`` as a whole number in ``[low, high]``; ``default`` when unset or empty; anything else
    raises ``error`` naming the variable, its value and what is allowed (as :func:`seconds_from_env`)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise error(f"{name}={raw!r}: give {unit} between {low} and {high} (default {default})")
    return value
