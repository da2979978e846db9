"""The exact_match and bounds checks: p derivation, verdicts, evidence, and no false alarm.

Planted defects are in test_checks_planted.py; the CLI in test_checks_cli.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _library_facts import fact

from tasks.checks import (
    CheckInputError,
    exact_limit,
    load_subject,
    min_zero_probability,
    overflow_probability,
    run_bounds,
    run_exact_match,
    zero_probability,
)
from tasks.checks import operands as ops_mod
from tasks.kernels import list_kernels
from tasks.verdicts import PASSING, Verdict, classify_differences, flat_in_k, worst

SHAPES = [(64, 100, 48), (64, 1000, 48)]  # K not a multiple of 64 or 128
TRIALS = 20


# -- p from K and the output format (docs/reference/numerics.md §6.1) ----------------------------------


def test_exact_limits():
    assert exact_limit("fp16") == 2048
    assert exact_limit(torch.bfloat16) == 256
    assert exact_limit("float32") == 2**24


@pytest.mark.parametrize(
    "k,limit,overflow,table",
    [
        (4096, 2048, 0.01, 0.3058),
        (4096, 256, 0.01, 0.7671),
        (16384, 2048, 0.01, 0.6549),
        (16384, 256, 0.01, 0.8837),
        (4096, 2048, 1 - 0.99 ** (1 / 1024**2), 0.3245),
        (4096, 256, 1 - 0.99 ** (1 / 1024**2), 0.7912),
        (4096, 2048, 1 - 0.99 ** (1 / 4096**2), 0.3272),
        (4096, 256, 1 - 0.99 ** (1 / 4096**2), 0.7945),
        (16384, 2048, 1 - 0.99 ** (1 / 1024**2), 0.6668),
        (16384, 256, 1 - 0.99 ** (1 / 1024**2), 0.8960),
        (16384, 2048, 1 - 0.99 ** (1 / 4096**2), 0.6685),
        (16384, 256, 1 - 0.99 ** (1 / 4096**2), 0.8977),
    ],
)
def test_p_matches_numerics_table(k, limit, overflow, table):
    p = min_zero_probability(k, limit, overflow)
    assert table - 1e-4 <= p <= table + 1e-4  # the table rounds its lower bounds up to 4 digits
    assert overflow_probability(k, p, limit) <= overflow < overflow_probability(k, p - 1e-6, limit)


def test_p_mean_column_and_floor():
    # "mean = L": K (1 - p)**2 = L
    for k, limit in ((4096, 2048), (4096, 256), (16384, 256)):
        p_mean = 1 - (limit / k) ** 0.5
        assert overflow_probability(k, p_mean, limit) == pytest.approx(0.5, abs=0.03)
    assert min_zero_probability(1000, 2**24) == 0.0
    assert zero_probability(1000, 2**24) == 0.5  # never denser than q = 1/4
    assert zero_probability(16384, 256) == pytest.approx(0.8837, abs=1e-4)


def test_p_simulated_overflow_fraction():
    """§6.1's simulation check: K = 4096, p = 0.7671, 256 x 256 outputs: about 1 % exceed 256."""
    a, b = ops_mod.binary(256, 4096, 256, 0.7671, ops_mod.generator("sim", 0))
    frac = float(((a @ b) > 256).float().mean())
    assert 0.006 < frac < 0.016


# -- verdicts ------------------------------------------------------------------------------------


def test_verdict_vocabulary():
    assert [v.value for v in Verdict] == [
        "IDENTICAL", "EPILOGUE_ROUNDING", "WITHIN_ALGORITHM_BOUND", "DIFFERENT", "INCORRECT",
        "PRECISION_DOWNGRADE", "INCONCLUSIVE", "ERROR",
    ]  # fmt: skip
    assert PASSING == {Verdict.IDENTICAL, Verdict.EPILOGUE_ROUNDING, Verdict.WITHIN_ALGORITHM_BOUND}
    assert worst([Verdict.IDENTICAL, "INCORRECT", Verdict.EPILOGUE_ROUNDING]) is Verdict.INCORRECT
    assert worst([]) is Verdict.IDENTICAL
    import tasks.verdicts

    for v in Verdict:
        assert f"``{v.value}``" in (tasks.verdicts.__doc__ or "")


def test_classify_differences():
    zero = np.zeros(10_000, dtype=np.int64)
    assert classify_differences(zero) is Verdict.IDENTICAL
    one = zero.copy()
    one[:3] = 1
    assert classify_differences(one) is Verdict.EPILOGUE_ROUNDING
    many = zero.copy()
    many[:500] = 1
    assert classify_differences(many) is Verdict.DIFFERENT
    assert classify_differences(many, np.ones(10_000, bool)) is Verdict.WITHIN_ALGORITHM_BOUND
    two = zero.copy()
    two[0] = 2
    assert classify_differences(two, np.ones(10_000, bool)) is Verdict.WITHIN_ALGORITHM_BOUND
    cov = np.ones(10_000, bool)
    cov[5] = False
    assert classify_differences(zero, cov) is Verdict.INCORRECT
    nan = zero.copy()
    nan[0] = -1
    assert classify_differences(nan) is Verdict.DIFFERENT


def test_flat_in_k():
    assert flat_in_k({256: (3, 10**6), 16384: (4, 10**6)})
    assert not flat_in_k({256: (3, 10**6), 16384: (300, 10**6)})
    assert flat_in_k({1024: (0, 10)})


# -- no false alarm: every correct kernel passes both checks -------------------------------------


def _builtin_cpu_kernels() -> list[dict]:
    """The registry's rows of built-in CPU kernels: every one is checked, no list of names here."""
    return [r for r in list_kernels() if r["source"] == "builtin" and r["device"] == "cpu"]


def _correct_kernels():
    """Every built-in CPU kernel, once per operand format it takes, and a plain matmul per dtype."""
    cases = []
    for row in _builtin_cpu_kernels():
        formats = ["int8", "fp8_e4m3"] if row["operand_dtype"] == "any" else [None]
        cases += [(row["name"], torch.bfloat16, operands) for operands in formats]
    cases += [("_planted_kernels:torch_matmul", d, None) for d in (torch.float32, torch.bfloat16, torch.float16)]
    return cases


CORRECT = _correct_kernels()


def test_every_builtin_is_covered():
    rows = _builtin_cpu_kernels()
    assert rows
    assert all(row["available"] for row in rows), [(r["name"], r["reason"]) for r in rows if not r["available"]]
    assert {name for name, _, _ in CORRECT} >= {row["name"] for row in rows}


@pytest.mark.parametrize("ref,dtype,operands", CORRECT, ids=[f"{r}-{d}-{o}" for r, d, o in CORRECT])
def test_correct_kernel_passes_both_checks(ref, dtype, operands):
    s = load_subject(ref, operands=operands)
    em = run_exact_match(s, SHAPES, dtype, trials=TRIALS)
    assert em.verdict is Verdict.IDENTICAL, em.text()
    assert em.mismatches == 0 and len(em.results) == TRIALS * len(SHAPES)
    assert em.min_checked_fraction >= 0.5
    bd = run_bounds(s, SHAPES, "any", dtype, trials=TRIALS)
    assert bd.passed, bd.text()
    assert bd.mismatches == 0 and len(bd.results) == TRIALS * len(SHAPES)
    if not s.plain and ref.startswith("int8") or ref == "exact":
        assert bd.verdict is Verdict.IDENTICAL  # exact accumulator, exact pow2 epilogue


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("ref", sorted(row["name"] for row in _builtin_cpu_kernels()))
def test_correct_builtin_other_output_dtypes_and_bigger_shapes(ref, dtype):
    s = load_subject(ref)
    shapes = [(127, 4096, 65), (1, 2049, 33)]
    assert run_exact_match(s, shapes, dtype, trials=TRIALS).verdict is Verdict.IDENTICAL
    assert run_bounds(s, shapes, "any", dtype, trials=TRIALS).passed


# -- behaviour ------------------------------------------------------------------------------------


def test_exact_match_evidence_and_rerun_determinism():
    s = load_subject("_planted_kernels:tile_scaled")
    r1 = run_exact_match(s, [(40, 300, 40)], torch.bfloat16, trials=3, seed=7)
    r2 = run_exact_match(s, [(40, 300, 40)], torch.bfloat16, trials=3, seed=7)
    rows1 = [{k: v for k, v in r.to_row().items() if k != "seconds"} for r in r1.results]
    rows2 = [{k: v for k, v in r.to_row().items() if k != "seconds"} for r in r2.results]
    assert rows1 == rows2
    assert r1.verdict is Verdict.INCORRECT
    first = r1.first_failure().first
    assert first is not None and first.row < 16 and first.col < 16  # inside the scaled tile
    assert first.exact == first.expected and first.observed != first.exact
    assert float(first.exact).is_integer() and first.spacings >= 1
    d = r1.to_dict()
    assert d["first_mismatch"]["row"] == first.row and d["first_mismatch"]["trial"] == 0
    assert len(d["trial_rows"]) == 3 and d["trial_rows"][0]["first_observed"] == first.observed


def test_scaled_kernel_gets_pow2_scales_and_richest_layout():
    s = load_subject("int8-cutlass-order")
    r = run_exact_match(s, [(8, 50, 6)], torch.float16, trials=2)
    info = r.results[0].info
    assert info["scale_a_numel"] == 8 and info["scale_b_numel"] == 6 and info["scales"] == "pow2"
    onednn = load_subject("int8-onednn")  # one activation scale per call by default
    assert onednn.scale_numel(8, 6, 50) == (1, 6)


def test_inconclusive_when_p_too_small():
    s = load_subject("_planted_kernels:torch_matmul")
    r = run_exact_match(s, [(16, 2000, 16)], torch.bfloat16, trials=2, p=0.0)
    assert r.verdict is Verdict.INCONCLUSIVE and r.checked == 0
    assert "too small" in r.text()


def test_kernel_that_raises_is_error_and_wrong_shape_incorrect():
    r = run_exact_match(load_subject("_planted_kernels:raises"), [(4, 10, 4)], trials=3)
    assert r.verdict is Verdict.ERROR and len(r.results) == 1
    assert "planted failure" in r.text()
    r = run_bounds(load_subject("_planted_kernels:wrong_shape"), [(4, 10, 4)], trials=2)
    assert r.verdict is Verdict.INCORRECT and "expected [4, 4]" in r.text()


def test_bad_input():
    s = load_subject("_planted_kernels:torch_matmul")
    with pytest.raises(CheckInputError, match="unknown algorithm"):
        run_bounds(s, SHAPES, "zigzag")
    with pytest.raises(CheckInputError, match="input kind"):
        run_bounds(s, SHAPES, inputs=("gaussian",))
    with pytest.raises(CheckInputError, match="trials"):
        run_exact_match(s, SHAPES, trials=0)
    with pytest.raises(CheckInputError, match="shape"):
        run_exact_match(s, [(0, 10, 3)])
    with pytest.raises(CheckInputError, match="cannot import"):
        load_subject("no_such_pkg_zz:f")
    with pytest.raises(CheckInputError, match="required positional"):
        load_subject("_planted_kernels:three_args")
    with pytest.raises(CheckInputError, match="takes fp8_e4m3 operands"):
        load_subject("fp8-sequential", operands="int8")


#: Whether torch's fp32 CPU matmul (its BLAS) is the exact sum rounded once on the positive 32x1000x24
#: operands below (no: its fp32 partial sums round).  Checked on torch 2.13.0+cpu.
TORCH_FP32_MATMUL_ROUNDS_ONCE = {">=2.13,<2.14": False}


def test_bounds_algorithms_nest():
    """A tighter named algorithm flags what a looser one allows: torch's fp32 CPU matmul is within
    the any-order bound (as any fp32 accumulation is), and on the torch versions recorded it is not
    the exact sum rounded once.  (On positive inputs the sum of magnitudes is the result itself, so
    the one-rounding bound is about one spacing wide.)"""
    s = load_subject("_planted_kernels:torch_matmul")
    pos = ("uniform-positive",)
    loose = run_bounds(s, [(32, 1000, 24)], "any", torch.float32, trials=3, inputs=pos)
    assert loose.passed
    bf16 = run_bounds(s, [(32, 1000, 24)], "sequential", torch.bfloat16, trials=3, accumulate="bf16")
    assert bf16.passed  # a bf16-accumulation bound is loose enough for an fp32 accumulator
    once = fact("torch", TORCH_FP32_MATMUL_ROUNDS_ONCE, what="its fp32 CPU matmul of positive operands")
    tight = run_bounds(s, [(32, 1000, 24)], "exact", torch.float32, trials=3, inputs=pos)
    assert (tight.verdict is Verdict.INCORRECT) == (not once)
    if not once:
        assert loose.verdict is Verdict.WITHIN_ALGORITHM_BOUND


def test_task_kinds_rows():
    """tasks.kinds.exact_match / tasks.kinds.bounds: the sweep task functions (fn(params, context) -> rows)."""
    import tasks.kinds.bounds
    import tasks.kinds.exact_match
    from tasks.checks.result import ROW_COLUMNS

    unit = {"kernel": "_planted_kernels:rtz_epilogue", "dtype": "bf16", "m": 20, "k": 300, "n": 12, "trials": 3}
    em = tasks.kinds.exact_match.run(unit, None)["exact_match"]
    bd = tasks.kinds.bounds.run({**unit, "algorithm": "any"}, None)["bounds"]
    assert [r["verdict"] for r in em] == ["IDENTICAL"] * 3
    assert {r["verdict"] for r in bd} == {"INCORRECT"}
    for rows in (em, bd):
        assert list(rows[0])[-len(ROW_COLUMNS):] == list(ROW_COLUMNS)
        assert rows[0]["kernel"] == unit["kernel"] and rows[0]["kind"] == "matmul"
