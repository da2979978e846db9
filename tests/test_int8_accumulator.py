"""The exact INT8 accumulator on every path (tasks/kernels/accumulator.py, issue #35).

Every path is checked bit for bit against an integer oracle (numpy int64, no BLAS) with hypothesis,
and against ``torch._int_mm``'s reference loop (oneDNN off: the loop PyTorch runs on a CPU without
VNNI, exact on every machine), on whatever CPU runs the suite.  The probe refuses a path that is not
exact (an int16-saturating one is built here from the measured model of oneDNN's AVX2 path).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.kernels import accumulator as acc_mod
from tasks.kernels import get_kernel
from tasks.kernels.accumulator import (
    ACCUMULATOR_ENV,
    INT32_EXACT_K,
    PATHS,
    accumulator_path,
    check_path,
    compute_exact,
    exact_int8_accumulator,
    int32_accumulator,
    shared_accumulators,
    wrap_int32,
)
from tasks.kernels.onednn import saturated_pair_sums


@pytest.fixture
def forced(monkeypatch):
    """Force a path for this test (the probed one comes back afterwards)."""

    def force(path: str) -> None:
        monkeypatch.setenv(ACCUMULATOR_ENV, path)
        acc_mod.reset_accumulator_path()

    yield force
    monkeypatch.delenv(ACCUMULATOR_ENV, raising=False)
    acc_mod.reset_accumulator_path()


def oracle(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return a.numpy().astype(np.int64) @ b.numpy().astype(np.int64)


def reference_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm`` on PyTorch's own loop (oneDNN off), exact on any CPU."""
    with torch.backends.mkldnn.flags(enabled=False):
        return torch._int_mm(a, b)


extreme = st.sampled_from([-128, -127, -1, 0, 1, 126, 127])
values = st.one_of(st.integers(-128, 127), extreme)


@st.composite
def operands(draw, max_k: int = 2300):
    m, n = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    k = draw(st.one_of(st.integers(1, 70), st.integers(1000, max_k)))
    fill = draw(st.sampled_from(["random", "extreme-rows", "constant"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if fill == "constant":  # every partial sum as large as it gets: K * 2**14 past 2**24 for K > 1024
        a = torch.full((m, k), draw(extreme), dtype=torch.int8)
        b = torch.full((k, n), draw(extreme), dtype=torch.int8)
    else:
        a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
        b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=gen)
        if fill == "extreme-rows":
            a[0] = draw(extreme)
            b[:, 0] = draw(extreme)
    if draw(st.booleans()):  # a column-major B, as weights [N, K] transposed arrive
        b = b.t().contiguous().t()
    return a, b


@pytest.mark.parametrize("path", PATHS)
def test_every_path_passes_its_check_or_says_why(path):
    why = check_path(path)
    if path != "int_mm":
        assert why is None  # float GEMMs of small integers are exact on any IEEE-754 machine
    else:
        assert why is None or "wrong" in why or "Error" in why


@pytest.mark.parametrize("path", [p for p in PATHS if p != "int_mm"] + ["int_mm"])
@settings(max_examples=60, deadline=None)
@given(problem=operands())
def test_path_is_exact_against_the_integer_oracle_and_the_int_mm_loop(path, problem):
    a, b = problem
    if path == "int_mm" and check_path("int_mm") is not None:
        pytest.skip(f"torch._int_mm is not exact on this CPU: {check_path('int_mm')}")
    got = compute_exact(path, a, b)
    want = oracle(a, b)
    assert got.dtype == torch.float64
    assert np.array_equal(got.numpy(), want.astype(np.float64))
    assert torch.equal(wrap_int32(got), reference_int_mm(a, b))


@pytest.mark.parametrize("path", PATHS)
def test_int32_accumulator_wraps_past_the_bound_on_every_path(path, forced):
    if path == "int_mm" and check_path("int_mm") is not None:
        pytest.skip(f"torch._int_mm is not exact on this CPU: {check_path('int_mm')}")
    forced(path)
    for k, av, bv, exact in [(INT32_EXACT_K, -128, -128, True), (132104, -128, 127, True),
                             (132105, -128, -127, False), (INT32_EXACT_K + 1, -128, -128, False)]:
        a = torch.full((2, k), av, dtype=torch.int8)
        b = torch.full((k, 3), bv, dtype=torch.int8)
        true = av * bv * k
        got = int32_accumulator(a, b)
        assert got.dtype == torch.int32
        assert bool((got == ((true + 2**31) % 2**32) - 2**31).all())  # wrapping int32, order-free
        assert (int(got[0, 0]) == true) == exact
        # and the exact accumulator stays exact past the int32 bound on every path
        assert bool((exact_int8_accumulator(a, b) == float(true)).all())


def test_forcing_a_path_and_refusing_a_bad_name(forced):
    forced("float64")
    p = accumulator_path()
    assert p.name == "float64" and ACCUMULATOR_ENV in p.how
    assert "float64" in get_kernel("int8-cutlass-order").code_path
    forced("simd")
    with pytest.raises(ValueError, match="allowed: auto, int_mm, float64, float32-chunked"):
        accumulator_path()


def test_probe_picks_an_exact_path_and_names_the_others():
    p = acc_mod.probe()
    assert p.name in PATHS and p.name not in p.inexact
    assert set(p.seconds) | set(p.inexact) == set(PATHS)
    text = p.describe()
    assert text.startswith(f"int8 accumulator {p.name} (probed")
    assert not re.search(r"\d ms", text)  # no timings in the identity: they change from run to run
    assert re.search(r"\d ms", p.describe(timings=True))


def test_a_saturating_path_is_refused_with_what_it_got_wrong(monkeypatch):
    """oneDNN's s8 GEMM on an ISA without VNNI (measured: ONEDNN_MAX_CPU_ISA=AVX2) sums adjacent
    u8 x s8 products in saturating int16 pairs; the probe's operands catch that model."""

    def saturating(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        u = a.numpy().astype(np.int64) + 128
        bb = b.numpy().astype(np.int64)
        return torch.from_numpy((saturated_pair_sums(u, bb) - 128 * bb.sum(0)).astype(np.float64))

    monkeypatch.setitem(acc_mod._EXACT, "saturating", saturating)
    why = check_path("saturating")
    assert why is not None and "sums wrong" in why and "exact" in why
    p = acc_mod.probe(("saturating", "float64"))
    assert p.name == "float64" and "saturating" in p.inexact
    assert "saturating not exact here" in p.describe()


def test_shared_within_a_scope_only_and_never_stale():
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-128, 128, (4, 3000), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (3000, 5), dtype=torch.int8, generator=g)
    assert exact_int8_accumulator(a, b) is not exact_int8_accumulator(a, b)  # no scope: no sharing
    with shared_accumulators():
        first = exact_int8_accumulator(a, b)
        assert exact_int8_accumulator(a, b) is first
        i32 = int32_accumulator(a, b)
        assert int32_accumulator(a, b) is i32 and torch.equal(i32, wrap_int32(first))
        a[0, 0] = 7 if int(a[0, 0]) != 7 else 8  # edited in place: a new version, new integers
        again = exact_int8_accumulator(a, b)
        assert again is not first and np.array_equal(again.numpy(), oracle(a, b).astype(np.float64))
        view = a[:2]  # another tensor over the same memory is another operand
        assert exact_int8_accumulator(view, b).shape == (2, 5)


def test_kdepth_rows_are_the_same_on_every_path(forced):
    from tasks.kinds import kdepth

    params = {"dtype": "int8", "m": 16, "n": 24, "k": 2100, "seed": 3, "scale_mode": "real", "out_dtype": "bf16",
              "bias": True, "reference": {"name": "exact", "kernel": "exact", "params": {}},
              "implementations": [{"name": n, "kernel": n, "params": {}}
                                  for n in ("int8-cutlass-order", "int8-triton-order", "int8-torch-channelwise")]}
    runs = {}
    for path in PATHS:
        if path == "int_mm" and check_path("int_mm") is not None:
            continue
        forced(path)
        runs[path] = [{k: v for k, v in r.items() if not k.startswith("seconds")}
                      for r in kdepth.run(params)["kdepth"]]
    first = next(iter(runs.values()))
    assert len(runs) >= 2 and all(rows == first for rows in runs.values())


def test_the_certificate_names_a_kernel_that_was_not_exact_on_its_cpu():
    from reports.certificate import identity_line, not_exact_lines

    path = ("oneDNN gemm:jit; NOT EXACT here (18 of 24 probe sums wrong): int16 saturation of adjacent u8 x s8 "
            "product pairs (vpmaddubsw without VNNI): every probe output equals that model bit for bit")
    ident = {"cpu": {"model": "AMD EPYC", "isa_level": "AVX2", "torch_capability": "AVX2", "isa_flags": ["avx2"]},
             "libraries": {}, "layout_path": {"int8-onednn": path, "int8-cutlass-order": "int8 accumulator float64"}}
    prov = {"identity_sha256": ["abc"], "launches": [
        {"launch_id": "L1", "identity_sha256": "abc", "identity": ident, "cpu": "AMD EPYC"}]}
    lines = not_exact_lines(prov, ("int8-cutlass-order", "int8-onednn"))
    assert lines == [f"WARNING: int8-onednn was not exact on the CPU of launch L1 (AMD EPYC): {path}"]
    assert not_exact_lines(prov, ("int8-cutlass-order",)) == []
    text = identity_line(prov, ("int8-cutlass-order", "int8-onednn"))
    assert "CPU AMD EPYC" in text and "ISA level AVX2" in text and "int8 accumulator float64" in text


def test_int_mm_on_its_reference_loop_is_named_and_never_chosen():
    """What a CPU without VNNI does (PyTorch then runs its own loop, 40-90x slower), here with oneDNN
    turned off in the process: the probe says so, picks a float path, and the kernels list note names it."""
    with torch.backends.mkldnn.flags(enabled=False):
        p = acc_mod.probe()
    assert p.int_mm_via == acc_mod.REFERENCE_LOOP and p.name != "int_mm"
    assert "torch._int_mm on PyTorch's reference loop" in p.describe()
    note = p.native_note()
    assert note is not None and "reference loop" in note and f"the accumulator uses {p.name}" in note


def test_int_mm_on_onednn_is_chosen_where_it_is_exact():
    p = acc_mod.probe()
    if p.int_mm_via in (None, acc_mod.REFERENCE_LOOP) or "int_mm" in p.inexact:
        pytest.skip(f"torch._int_mm here: {p.int_mm_via}; {p.inexact.get('int_mm', 'exact')}")
    assert p.name == "int_mm" and p.int_mm_via.startswith("oneDNN ") and p.native_note() is None
