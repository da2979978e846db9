"""What a third-party library does, recorded per version (issue #22).

The rule: a test asserts what swapcheck does unconditionally; what a library does (a bug, a quirk, a
cast's rounding, saturation, an error message, an implementation detail) is a fact about the
versions it was checked on.  Such a test records the fact next to it, one value per version range,
and asks for it with :func:`fact`::

    #: checked on ml_dtypes 0.4.1, 0.5.4, 0.6.0 and 0.7.0
    F64_TO_BF16 = {">=0.4,<0.7": "via fp32", ">=0.7,<0.8": "once"}

    how = fact("ml_dtypes", F64_TO_BF16, what="its float64 -> bfloat16 cast")

On a version no range covers the test is skipped, saying what to check and where to record it:
neither failed by a library's change nor passed on a guess.  Ranges are PEP 440 specifier sets
(pre-releases and local versions such as ``2.13.0+cpu`` included); they must not overlap.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.metadata import version
from typing import TypeVar

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

__all__ = ["fact", "installed", "isa_fact"]

T = TypeVar("T")


def installed(package: str) -> Version:
    """The installed version of distribution ``package``."""
    return Version(version(package))


def fact(package: str, record: Mapping[str, T], *, what: str, where: str | None = None) -> T:
    """The value ``record`` holds for the installed version of ``package``; skip the test if none.

    ``what`` names the behaviour ("its float64 -> bfloat16 cast"); ``where`` names the record
    (default: the running test).
    """
    v = installed(package)
    hits = [spec for spec in record if SpecifierSet(spec).contains(v, prereleases=True)]
    if len(hits) > 1:
        raise ValueError(f"{package} {v}: overlapping ranges {hits} in the record of {what}")
    if not hits:
        where = where or os.environ.get("PYTEST_CURRENT_TEST", "the test").rsplit(" (", 1)[0]
        pytest.skip(
            f"{package} {v}: behaviour of {what} not recorded for this version (recorded: "
            f"{'; '.join(record) or 'none'}); check it and add it to the record in {where}"
        )
    return record[hits[0]]


def isa_fact(record: Mapping[str, T], *, what: str, where: str | None = None, level: str | None = None) -> T:
    """The value ``record`` holds for this CPU's ISA level (:func:`tasks.devices.isa_level`: AVX2,
    AVX512, AVX512-VNNI, AMX, ...); skip the test where none is recorded.

    What a third-party kernel computes can depend on the instructions it runs on as much as on its
    version (issue #35: oneDNN's int8 GEMM is exact with VNNI and saturates int16 pairs without it;
    MKL's fp32 GEMM sums in another order on AVX2).  Such a fact is recorded per level, beside the
    test, and a level nobody checked skips with the reason instead of failing or passing on a guess.
    ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` runs the AVX2 entries on an AVX512 machine.
    ``level`` names another key (e.g. :func:`tasks.devices.mkl_isa` for what MKL computes).
    """
    import torch

    from tasks.devices import isa_level

    if level is None:
        level = isa_level(torch_capability=torch.backends.cpu.get_cpu_capability())
    if level not in record:
        where = where or os.environ.get("PYTEST_CURRENT_TEST", "the test").rsplit(" (", 1)[0]
        pytest.skip(f"ISA level {level}: {what} not recorded for it (recorded: {', '.join(record) or 'none'}); "
                    f"check it and add it to the record in {where}")
    return record[level]
