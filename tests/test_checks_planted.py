"""Planted defects, named the way a user names a kernel (``_planted_kernels:attr``): each is reported
INCORRECT by the checks listed in ``_planted_kernels.CAUGHT_BY`` and passed by the others; and which
of them ``torch.allclose`` with the usual bf16 tolerances would pass (docs/reference/numerics.md §6.3).
"""

from __future__ import annotations

import pytest
import torch
from _planted_kernels import CAUGHT_BY

from tasks.checks import load_subject, run_bounds, run_exact_match
from tasks.verdicts import Verdict

SHAPES = [(64, 100, 48), (64, 1000, 48)]
TRIALS = 6  # per shape: 2 draws of each input kind for bounds

#: Which defects torch.allclose(rtol=1.6e-2, atol=1e-5) against torch's bf16 matmul lets through:
#: the small multiplicative error and the truncating epilogue.  Everything else it catches on randn.
ALLCLOSE_PASSES = {"tile_scaled", "rtz_epilogue"}


def _checks(attr: str) -> dict[str, Verdict]:
    s = load_subject(f"_planted_kernels:{attr}")
    em = run_exact_match(s, SHAPES, torch.bfloat16, trials=TRIALS)
    bd = run_bounds(s, SHAPES, "any", torch.bfloat16, trials=TRIALS)
    for r in (em, bd):
        if r.verdict is Verdict.INCORRECT:
            fail = r.first_failure()
            assert fail is not None and fail.first is not None
            assert fail.first.observed != fail.first.expected  # evidence names a real mismatch
            assert "observed" in r.text() and "exact" in r.text()
    return {"exact_match": em.verdict, "bounds": bd.verdict}


@pytest.mark.parametrize("attr", sorted(CAUGHT_BY))
def test_planted_defect_caught_by_named_checks(attr: str) -> None:
    verdicts = _checks(attr)
    caught = {check for check, v in verdicts.items() if v is Verdict.INCORRECT}
    assert caught == CAUGHT_BY[attr], verdicts
    for check, v in verdicts.items():
        if check not in CAUGHT_BY[attr]:
            assert v.passed  # the check that cannot see this defect passes it (documented blind spot)


def test_precision_defects_pass_exact_match_but_not_bounds() -> None:
    """numerics.md §6.3: binary exact match cannot see precision bugs; the bounds check can."""
    blind = {attr for attr, caught in CAUGHT_BY.items() if "exact_match" not in caught}
    assert blind == {"bf16_accumulator", "split_k_bf16_partials", "rtz_epilogue"}


def _allclose_passes(attr: str) -> bool:
    import _planted_kernels as planted

    from tasks.kernels import get_kernel
    from tasks.models.operands import draw_operands

    ok = True
    for i, (m, k, n) in enumerate(SHAPES):
        if attr == "WrongChannelScale":  # a scaled kernel: realistic W8A8 operands and real scales
            o = draw_operands("int8", m, n, k, i, "real", "bf16")
            args = (o["a"], o["b"], o["scale_a"], o["scale_b"], torch.bfloat16)
            out = get_kernel(f"_planted_kernels:{attr}")(*args)
            ref = get_kernel("int8-cutlass-order")(*args)
        else:
            g = torch.Generator().manual_seed(i)
            a = torch.randn(m, k, generator=g).bfloat16()
            b = torch.randn(k, n, generator=g).bfloat16()
            out, ref = getattr(planted, attr)(a, b), torch.matmul(a, b)
        ok &= torch.allclose(out.float(), ref.float(), rtol=1.6e-2, atol=1e-5)
    return bool(ok)


def test_which_defects_allclose_would_pass() -> None:
    passes = {attr for attr in CAUGHT_BY if _allclose_passes(attr)}
    assert passes == ALLCLOSE_PASSES
    # ...and those are exactly caught by a check: tile_scaled by both, rtz_epilogue by bounds only
    assert CAUGHT_BY["tile_scaled"] == {"exact_match", "bounds"}
    assert CAUGHT_BY["rtz_epilogue"] == {"bounds"}
    assert _allclose_passes("correct")
