"""Kernel correctness checks that cannot be fooled (issue 4; docs/checks.md).

* :func:`run_exact_match` (:mod:`.exact_match`): binary operands sparse enough that every reference
  sum is exact in the output format; exact equality required wherever it is.
* :func:`run_bounds` (:mod:`.bounds`): randn and adversarial operands; every output within a named
  accumulation algorithm's error bound, then one rounding to the output format.
* :func:`run_precision` (:mod:`.precision`): exact-integer operands whose sums are exact in fp32
  but not in tf32, fp16 or bf16; a kernel computing in a narrower format than it claims reads
  PRECISION_DOWNGRADE.
* :func:`tasks.checks.fuzz.fuzz` (:mod:`.fuzz`): a seeded hunt over edge shapes, value recipes and
  scales, each trial judged by both checks; failures shrunk and saved as artifacts that
  :func:`tasks.checks.artifact.replay` (:mod:`.artifact`) reproduces byte for byte.

Both take a :class:`Subject` (:func:`load_subject`: a registry name, an entry point or
``package.module:attr``, including a plain matmul ``f(A, B) -> C``) and end in a verdict of
:mod:`tasks.verdicts` with its evidence (:class:`CheckResult`).  Example::

    from tasks.checks import load_subject, run_exact_match, run_bounds
    s = load_subject("mypkg.kernels:torch_matmul")   # torch_matmul = kernel_function(torch.matmul)
    print(run_exact_match(s, [(64, 1000, 48)], trials=20).text())
    print(run_bounds(s, [(64, 1000, 48)], "any").verdict)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .defaults import DEFAULT_SHAPES, DEFAULT_TRIALS

if TYPE_CHECKING:
    from .bounds import ALGORITHMS, algorithm, run_bounds
    from .exact_match import MIN_CHECKED_FRACTION, run_exact_match
    from .operands import INPUT_KINDS, SCALE_MODES
    from .precision import run_precision
    from .result import CheckResult, Element, TrialResult, combined
    from .sparsity import exact_limit, min_zero_probability, overflow_probability, zero_probability
    from .subject import CheckInputError, Subject, load_subject

# Names are imported from their submodule on first use (PEP 562), so the light defaults above can be
# read (by the CLI's option declarations) without importing torch.
_WHERE = {
    "ALGORITHMS": "bounds", "algorithm": "bounds", "run_bounds": "bounds",
    "MIN_CHECKED_FRACTION": "exact_match", "run_exact_match": "exact_match", "run_precision": "precision",
    "INPUT_KINDS": "operands", "SCALE_MODES": "operands",
    "CheckResult": "result", "Element": "result", "TrialResult": "result", "combined": "result",
    "exact_limit": "sparsity", "min_zero_probability": "sparsity", "overflow_probability": "sparsity",
    "zero_probability": "sparsity",
    "CheckInputError": "subject", "Subject": "subject", "load_subject": "subject",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ALGORITHMS",
    "DEFAULT_SHAPES",
    "DEFAULT_TRIALS",
    "INPUT_KINDS",
    "SCALE_MODES",
    "MIN_CHECKED_FRACTION",
    "CheckInputError",
    "CheckResult",
    "Element",
    "Subject",
    "TrialResult",
    "algorithm",
    "combined",
    "exact_limit",
    "load_subject",
    "min_zero_probability",
    "overflow_probability",
    "run_bounds",
    "run_exact_match",
    "run_precision",
    "zero_probability",
]
