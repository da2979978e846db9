"""The ``batch_invariance`` kind, its named queries, the noise-floor report and the certificate cells.

Kernel level: the CPU kernels come out bit-invariant (measured on every cell, judged against the
default ``any`` fp32 bound), and two kernels planted here, whose computation depends on M, are told
apart: one that splits K into bf16 partial sums above M = 64 (beyond the bound) and one whose epilogue
truncates instead of rounding above M = 64 (one spacing: within the bound). The bound itself, the
random probe row, several output dtypes and thread counts: tests/test_batch_invariance_bound.py. Model level: the tiny W8A8 model with fp64 reductions computes a prompt's
logits bit for bit alike alone, in padded batches and decoded with the KV cache; with fp32 reductions
it does not (torch's matmuls: a fact recorded per torch version). The SQL and report figures are recomputed here from the Parquet rows themselves.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from _library_facts import fact
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.errors import SpecError
from orchestrator.spec import parse_spec
from reports import certificate as cf
from reports import noise_floor as nf
from storage.catalog import open_catalog
from storage.store import ResultStore
from tasks.kernels import Kernel
from tasks.kinds import get_kind
from tasks.kinds.batch_invariance import probe_row
from tests.conftest import launch_in_process

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed
KIND = get_kind("batch_invariance")
CPU_KERNELS = ["int8-cutlass-order", "int8-triton-order", "int8-torch-channelwise", "fp8-sequential",
               "fp8-pairwise", "fp8-blocked-128"]
SMALL_M = [1, 2, 3, 5, 17, 64, 65, 129]


# -- kernels planted here: right for M <= 64, another computation above --------------------------

class SplitKBf16AboveM64(Kernel):
    """fp8: the exact dot product rounded once to fp32 for M <= 64; above, K split in four partial sums,
    each rounded to bf16, then added in fp32 (a split-K configuration chosen by M)."""

    operand_dtype = "fp8_e4m3"
    description = "planted: split-K with bf16 partials when M > 64"

    def compute(self, ops: Any) -> torch.Tensor:
        a, b = ops.a.to(torch.float64), ops.b.to(torch.float64)  # e4m3 products and their sums: exact here
        if ops.m <= 64:
            acc = (a @ b).to(torch.float32)
        else:
            bounds = torch.linspace(0, ops.k, 5).round().long().tolist()
            acc = torch.zeros(ops.m, ops.n)
            for k0, k1 in zip(bounds[:-1], bounds[1:], strict=True):
                acc += (a[:, k0:k1] @ b[k0:k1]).to(torch.bfloat16).to(torch.float32)
        out: torch.Tensor = (acc * ops.scale_a * ops.scale_b).to(ops.out_dtype)
        return out


class TruncatingEpilogueAboveM64(Kernel):
    """int8: the exact accumulator times both scales in float64, rounded to nearest in the output
    dtype; above M = 64 truncated (rounded toward zero) instead: within one spacing."""

    operand_dtype = "int8"
    description = "planted: round-toward-zero epilogue when M > 64"

    def compute(self, ops: Any) -> torch.Tensor:
        acc = ops.a.to(torch.float64) @ ops.b.to(torch.float64)  # exact
        c = ops.scale_a.to(torch.float64) * (ops.scale_b.to(torch.float64) * acc)
        r: torch.Tensor = c.to(ops.out_dtype)
        if ops.m <= 64:
            return r
        away = r.to(torch.float64).abs() > c.abs()  # rounded away from zero: one spacing back
        out: torch.Tensor = torch.where(away, torch.nextafter(r, torch.zeros_like(r)), r)
        return out


SPLIT = "test_batch_invariance:SplitKBf16AboveM64"
TRUNC = "test_batch_invariance:TruncatingEpilogueAboveM64"


def _kernel_spec(kernels: list[str], *, name: str = "bi", m: list[int] = SMALL_M, k: int = 64, n: int = 48,
                 extra: str = "") -> str:
    return textwrap.dedent(f"""
        question = "Is each kernel batch-invariant?"
        name = "{name}"

        [experiments.kernels]
        kind = "batch_invariance"
        level = "kernel"
        kernels = {json.dumps(kernels)}
        m = {m}
        k = {k}
        n = {n}
        out_dtype = "fp32"
        """) + textwrap.dedent(extra)


MODEL_SPEC = textwrap.dedent("""
    question = "What is the tiny model's noise floor?"
    name = "bim"

    [experiments.model]
    kind = "batch_invariance"
    level = "model"
    reductions = ["fp32", "fp64"]
    batch_sizes = [1, 3]
    prompts = { count = 6, length = 8, seed = 3 }
    new_tokens = 6
    """)


def _run_all(root: Path, text: str) -> str:
    """Launch ``text`` in this process (the runner's in-process launch: the worker's own code path)."""
    summary = launch_in_process(root, text)
    assert summary.n_ok == summary.n_units, summary.failures
    return summary.sweep


def _parquet(root: Path, table: str) -> list[dict[str, Any]]:
    files = sorted((root / f"table={table}").rglob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


@pytest.fixture(scope="module")
def kernel_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bi") / "results"
    _run_all(root, _kernel_spec([*CPU_KERNELS, SPLIT, TRUNC]))
    return root


@pytest.fixture(scope="module")
def model_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bim") / "results"
    _run_all(root, MODEL_SPEC)
    return root


# -- kernel level ---------------------------------------------------------------------------------

def test_probe_positions() -> None:
    assert [probe_row(1, p) for p in ("first", "middle", "last")] == [0, 0, 0]
    assert [probe_row(2, p) for p in ("first", "middle", "last")] == [0, 1, 1]
    assert [probe_row(257, p) for p in ("first", "middle", "last")] == [0, 128, 256]
    # random: drawn from the seed and M, the same every time, inside the batch, and not one fixed row
    rows = [probe_row(m, "random", seed) for m in (1, 2, 17, 257) for seed in (0, 1, 2)]
    assert rows == [probe_row(m, "random", seed) for m in (1, 2, 17, 257) for seed in (0, 1, 2)]
    assert rows[:3] == [0, 0, 0] and all(0 <= r < 257 for r in rows[9:])
    assert len({probe_row(257, "random", seed) for seed in range(8)}) > 1


def test_the_probe_row_is_the_same_input_in_every_batch() -> None:
    """What the kind feeds a kernel: the probe's operands at its row, whatever M and the position."""
    captured: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Recorder(Kernel):
        operand_dtype = "int8"

        def compute(self, ops: Any) -> torch.Tensor:
            captured.append((ops.a.clone(), ops.scale_a.clone()))
            return torch.zeros(ops.m, ops.n, dtype=ops.out_dtype)

    import tasks.kinds.batch_invariance as bi

    params: dict[str, Any] = {"level": "kernel", "kernel": {"name": "rec", "kernel": "rec", "params": {}, "version": "1"},
              "dtype": "int8", "m": [1, 4, 9], "positions": ["first", "middle", "last"], "k": 16, "n": 8,
              "seed": 0, "scale_mode": "real", "out_dtype": "bf16", "tolerance_spacings": 1}
    from tasks.kernels import registry

    registry.register_kernel("rec-test-only", Recorder)
    try:
        bi.run_kernel({**params, "kernel": {**params["kernel"], "kernel": "rec-test-only"}})
    finally:
        registry._unregister("rec-test-only")
    probe_a, probe_s = captured[0]
    assert probe_a.shape[0] == 1
    cells = [(m, p) for m in (1, 4, 9) for p in ("first", "middle", "last")]
    for (m, p), (a, s) in zip(cells, captured[1:], strict=True):
        r = probe_row(m, p)
        assert a.shape[0] == m and torch.equal(a[r], probe_a[0]) and torch.equal(s[r], probe_s[0])
        others = [i for i in range(m) if i != r]
        assert all(not torch.equal(a[i], probe_a[0]) for i in others)  # neighbours are other rows


def test_cpu_kernels_are_batch_invariant_and_planted_ones_are_caught(kernel_results: Path) -> None:
    with open_catalog(kernel_results) as cat:
        rep = nf.noise_floor(cat, None)
    verdicts = {r["kernel"]: r for r in rep["kernels"]}
    for name in CPU_KERNELS:
        r = verdicts[name]
        assert r["verdict"] == nf.BIT_INVARIANT, r
        assert r["cells"] == r["cells_bitwise_equal"] == r["cells_judged"] == len(SMALL_M) * 4 and r["differing"] == 0
        assert r["cells_beyond_bound"] == 0 and r["max_reference_outside_bound"] == 0 and r["max_bound_ratio"] == 0
    split = verdicts[SPLIT]  # a kernel named by module:attr is reported by that name
    assert split["verdict"] == "varies beyond bound (any, fp32)"
    assert split["first_varying_m"] == 65 and split["varying_ms"] == [65, 129] and split["cells_beyond_bound"] > 0
    trunc = verdicts[TRUNC]  # one spacing toward zero: well inside the fp32 algorithm's bound
    assert trunc["verdict"] == "varies within bound (any, fp32)"
    assert trunc["first_varying_m"] == 65 and trunc["max_spacing"] == 1 and trunc["cells_beyond_tolerance"] == 0
    assert trunc["cells_beyond_bound"] == 0 and 0 < trunc["max_bound_ratio"] < 1


def test_kernel_figures_recomputed_from_the_parquet_rows(kernel_results: Path) -> None:
    rows = _parquet(kernel_results, "batch_invariance")
    assert len(rows) == (len(CPU_KERNELS) + 2) * len(SMALL_M) * 4
    with open_catalog(kernel_results) as cat:
        summary = {r["kernel"]: r for r in cat.named("batch_invariance_kernels", sweep=None)}
        by_m = {(r["kernel"], r["m"]): r for r in cat.named("batch_invariance_by_m", sweep=None)}
    for kernel, s in summary.items():
        mine = [r for r in rows if r["kernel"] == kernel]
        assert s["cells"] == len(mine)
        assert s["cells_bitwise_equal"] == sum(r["differing"] == 0 for r in mine)
        assert s["differing"] == sum(r["differing"] for r in mine)
        assert s["elements"] == sum(r["elements"] for r in mine) == len(mine) * 48
        assert s["max_spacing"] == max(r["max_spacing"] for r in mine)
        varying = sorted({r["m"] for r in mine if r["differing"]})
        assert s["varying_ms"] == varying and s["first_varying_m"] == (varying[0] if varying else None)
        assert s["cells_beyond_bound"] == sum(r["outside_bound"] > 0 or r["reference_outside_bound"] > 0
                                              or r["nonfinite_mismatch"] > 0 for r in mine)
        assert s["outside_bound"] == sum(r["outside_bound"] for r in mine)
        assert s["max_bound_ratio"] == max(r["max_bound_ratio"] for r in mine)
        for m in SMALL_M:
            cell = [r for r in mine if r["m"] == m]
            assert by_m[(kernel, m)]["differing"] == sum(r["differing"] for r in cell)
            assert by_m[(kernel, m)]["cells_bitwise_equal"] == sum(r["bitwise_equal"] for r in cell)


def test_a_tolerance_of_zero_spacings_turns_within_into_beyond() -> None:
    row = {"tolerance_spacings": 0, "cells": 3, "cells_bitwise_equal": 2, "cells_beyond_tolerance": 1}
    assert nf.kernel_verdict(row) == "varies beyond 0 spacings"
    assert nf.kernel_verdict({**row, "tolerance_spacings": 1, "cells_beyond_tolerance": 0}) == "varies within 1 spacings"
    assert nf.kernel_verdict({**row, "cells_bitwise_equal": 3}) == nf.BATCH_INVARIANT


def test_report_noise_floor_cli(kernel_results: Path) -> None:
    res = runner.invoke(app, ["report", "noise-floor", "--results", str(kernel_results)], env={"COLUMNS": "420"})
    assert res.exit_code == 0, res.output
    assert "bit-invariant" in res.output and "varies beyond bound (any, fp32)" in res.output
    js = runner.invoke(app, ["report", "noise-floor", "--results", str(kernel_results), "--format", "json"])
    data = json.loads(js.stdout)
    assert {r["kernel"] for r in data["kernels"]} == {*CPU_KERNELS, SPLIT, TRUNC}
    csv = runner.invoke(app, ["report", "noise-floor", "--results", str(kernel_results), "--format", "csv"])
    assert csv.exit_code == 2 and "--table" in csv.output
    m = runner.invoke(app, ["report", "noise-floor", "--results", str(kernel_results), "--format", "csv", "--table", "m"])
    assert m.exit_code == 0 and m.stdout.count("\n") == 1 + (len(CPU_KERNELS) + 2) * len(SMALL_M)


# -- model level ----------------------------------------------------------------------------------

#: Whether, with fp32 reductions (transformers' eager attention and torch's fp32 lm_head), the decoded
#: positions' logits differ from the prefill's at most of them: torch's fp32 CPU matmuls compute one
#: query row (decode, lm_head on one position) in another order than the whole sequence (prefill).
#: Checked on torch 2.13.0+cpu with transformers 5.19.0.  (Padded prefill in fp32 came out
#: bit-identical there: docs/noise-floor.md, measured.)
TORCH_FP32_DECODE_DIFFERS = {">=2.13,<2.14": True}


def test_model_fp64_reductions_are_batch_invariant(model_results: Path) -> None:
    rows = _parquet(model_results, "batch_invariance_model")
    # 6 prompts: 8 prompt positions (padded prefill) and 6 generated positions (decode) per batch size.
    assert len(rows) == 2 * 2 * 6 * (8 + 6)
    fp64 = [r for r in rows if r["reductions"] == "fp64"]
    assert all(r["logits_equal"] and r["argmax_equal"] and r["max_spacing"] == 0 for r in fp64)
    padded = [r for r in rows if r["comparison"] == "padded_prefill" and r["batch"] == 3]
    assert {r["slot"] for r in padded} == {0, 1, 2} and any(r["padding"] > 0 for r in padded)


def test_model_fp32_reductions_are_not(model_results: Path) -> None:
    differs = fact("torch", TORCH_FP32_DECODE_DIFFERS, what="fp32 CPU matmuls of one row against the whole sequence")
    rows = _parquet(model_results, "batch_invariance_model")
    decode = [r for r in rows if r["reductions"] == "fp32" and r["comparison"] == "decode"]
    assert decode and (sum(not r["logits_equal"] for r in decode) > len(decode) // 2) == differs


def test_model_figures_recomputed_from_the_parquet_rows(model_results: Path) -> None:
    rows = _parquet(model_results, "batch_invariance_model")
    with open_catalog(model_results) as cat:
        rep = nf.noise_floor(cat, None)
    for r in rep["model"]:
        mine = [x for x in rows if (x["reductions"], x["comparison"], x["batch"]) == (r["reductions"], r["comparison"], r["batch"])]
        flipped = {x["prompt_index"] for x in mine if not x["argmax_equal"]}
        assert r["prompts"] == len({x["prompt_index"] for x in mine}) == 6
        assert r["prompts_argmax_differ"] == len(flipped) == r["sequences"]["k"]
        assert r["positions"] == len(mine) and r["positions_argmax_differ"] == sum(not x["argmax_equal"] for x in mine)
        assert r["positions_logits_differ"] == sum(not x["logits_equal"] for x in mine)
        assert r["max_spacing"] == max(x["max_spacing"] for x in mine)
        assert r["max_spacing_significant"] == max(x["max_spacing_significant"] for x in mine) <= r["max_spacing"]
        from scipy.stats import binomtest

        ci = binomtest(r["positions_argmax_differ"], r["positions"]).proportion_ci(method="exact")
        assert r["positions_rate"]["interval"] == [pytest.approx(ci.low), pytest.approx(ci.high)]
    for r in rep["model_overall"]:
        mine = [x for x in rows if (x["reductions"], x["comparison"]) == (r["reductions"], r["comparison"])]
        assert r["batch_sizes"] == [1, 3]
        assert r["prompts_argmax_differ"] == len({x["prompt_index"] for x in mine if not x["argmax_equal"]})
        assert r["prompts_logits_differ"] == len({x["prompt_index"] for x in mine if not x["logits_equal"]})


def _ordered(x: float) -> int:
    """The slow oracle of the ordered fp32 line: the bit pattern as an integer, negatives mirrored."""
    import struct

    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    return int(bits) if bits < 2**31 else -(int(bits) - 2**31) - 1


def _check_stats(ref: torch.Tensor, other: torch.Tensor) -> dict[str, Any]:
    """position_stats of two [P, V] fp32 logit arrays, each figure checked against a slow oracle."""
    from tasks.kinds.batch_invariance import position_stats

    stats = position_stats(ref, other)
    for p in range(ref.shape[0]):
        r, o = ref[p].tolist(), other[p].tolist()
        d = [abs(_ordered(a) - _ordered(b)) for a, b in zip(o, r, strict=True)]
        big = [abs(x) >= 0.05 * max(abs(y) for y in r) for x in r]
        am_r = min(i for i, x in enumerate(r) if x == max(r))
        am_o = min(i for i, x in enumerate(o) if x == max(o))
        two = sorted(r, reverse=True)
        assert stats["differing"][p] == sum(x != 0 for x in d)
        assert stats["max_spacing"][p] == max(d)
        assert stats["max_spacing_significant"][p] == max((x for x, b in zip(d, big, strict=True) if b), default=0)
        assert stats["ref_argmax"][p] == am_r and stats["argmax"][p] == am_o
        assert stats["argmax_spacing"][p] == d[am_r]
        assert stats["ref_margin"][p] == two[0] - two[1]
    return stats


_FP32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4).flatmap(lambda p: st.integers(2, 9).flatmap(lambda v: st.tuples(
    st.lists(st.lists(_FP32, min_size=v, max_size=v), min_size=p, max_size=p),
    st.lists(st.lists(_FP32, min_size=v, max_size=v), min_size=p, max_size=p)))))
def test_position_stats_property(pair: tuple[list[list[float]], list[list[float]]]) -> None:
    """Any finite fp32 logits (zeros of both signs, subnormals, the largest values included)."""
    ref, other = (torch.tensor(x, dtype=torch.float32) for x in pair)
    _check_stats(ref, other)
    _check_stats(ref, ref.clone())


def test_position_stats_against_a_slow_oracle() -> None:
    g = torch.Generator().manual_seed(5)
    ref = torch.randn(7, 50, generator=g)
    ref[5, 7] = 1e-30
    other = ref.clone()
    other[1, 3] = torch.nextafter(ref[1, 3], torch.tensor(float("inf")))  # one spacing
    other[2] = ref[2] * (1 + 2**-10)                                         # every logit moves
    other[3, 0] = -ref[3, 0]                                                  # across zero
    other[4, ref[4].argmax()] -= 10.0                                        # the argmax changes
    other[5, 7] = -1e-30                                                      # a tiny logit: big count, not significant
    stats = _check_stats(ref, other)
    assert stats["max_spacing"][1] == 1 and stats["ref_argmax"][4] != stats["argmax"][4]
    assert stats["max_spacing"][5] > 2**20 and stats["max_spacing_significant"][5] == 0
    assert stats["max_spacing"][6] == 0 and stats["differing"][6] == 0


def test_decode_rows_score_what_was_decoded(model_results: Path) -> None:
    """Each decode row's reference is the prefill of the tokens the decoding chose (teacher forcing)."""
    rows = [r for r in _parquet(model_results, "batch_invariance_model")
            if r["comparison"] == "decode" and r["reductions"] == "fp64"]
    # With fp64 reductions decoding and scoring agree, so the decoded token is the scored argmax.
    assert all(r["argmax"] == r["ref_argmax"] for r in rows)
    assert {r["position"] for r in rows} == set(range(6))


# -- distinct completions -------------------------------------------------------------------------

def test_distinct_completions_count_distinct_sequences_per_prompt(tmp_path: Path) -> None:
    root = tmp_path / "results"
    outcomes = {0: ["a", "a", "a"], 1: ["a", "b", "a"], 2: ["a", "b", "c"], 3: ["x", "x"]}  # prompt 3: one run missing
    rows = [{"unit_id": f"u{r}", "experiment": "e2e", "arm": "cut", "restart": r, "prompt_index": p,
             "prompt_hash": f"p{p}", "sequence_hash": h, "n_tokens": 1, "tokens": [1]}
            for p, hs in outcomes.items() for r, h in enumerate(hs)]
    ResultStore(root).write("sequences", "s", "seqs", rows)
    with open_catalog(root) as cat:
        (r,) = cat.named("distinct_completions", sweep=None)
    counts = [len(set(hs)) for hs in outcomes.values()]
    assert r["restarts"] == 3 and r["prompts"] == 4
    assert r["max_distinct"] == max(counts) == 3 and r["mean_distinct"] == pytest.approx(sum(counts) / 4)
    assert r["prompts_several"] == sum(c > 1 for c in counts) == 2 and r["prompts_incomplete"] == 1
    assert r["distribution"] == [{"distinct": 1, "prompts": 2}, {"distinct": 2, "prompts": 1}, {"distinct": 3, "prompts": 1}]
    res = runner.invoke(app, ["report", "agreement", "--results", str(root), "--table", "distinct"],
                        env={"COLUMNS": "250"})
    assert res.exit_code == 0 and "3 / 1.75" in res.stdout and "1: 2, 2: 1, 3: 1" in res.stdout


# -- the certificate ------------------------------------------------------------------------------

def test_the_certificate_puts_the_noise_floor_beside_the_swap(tmp_path: Path) -> None:
    root = tmp_path / "results"
    store = ResultStore(root)
    store.write("arm_runs", "s", "runs", [
        {"unit_id": f"run-{arm}", "experiment": "e2e", "arm": arm, "restart": 0, "model": "tiny-qwen3",
         "engine": "cpu", "configured_kernel": kernel, "scales": "real", "evidence_ok": True, "pid": 1, "host": "h",
         "observed_kernels": [kernel], "weights_sha256": "w"} for arm, kernel in (("cut", "ka"), ("tri", "kb"))])
    store.write("sequences", "s", "seqs", [
        {"unit_id": f"seq-{arm}", "experiment": "e2e", "arm": arm, "restart": 0, "prompt_index": p,
         "prompt_hash": f"p{p}", "sequence_hash": f"{p}" if arm == "cut" or p >= 3 else f"{p}x", "n_tokens": 1,
         "tokens": [1]} for arm in ("cut", "tri") for p in range(8)])
    # The same kernel across batch shapes: prompt 1 flips in batch 4 (decode, fp64), prompt 2 in batch 8.
    model_rows = [{"unit_id": "bim", "experiment": "model", "model": "tiny-qwen3", "kernel": "ka", "scales": "real",
                   "reductions": "fp64", "comparison": "decode", "batch": b, "prompt_index": p, "position": 0,
                   "argmax_equal": (p, b) not in ((1, 4), (2, 8)), "logits_equal": (p, b) not in ((1, 4), (2, 8)),
                   "max_spacing": 0, "argmax_spacing": 0, "ref_margin": 0.5, "nonfinite_mismatch": 0}
                  for b in (1, 4, 8) for p in range(8)]
    store.write("batch_invariance_model", "s", "bim", model_rows)
    store.write("batch_invariance", "s", "bik", [
        {"unit_id": "bik", "experiment": "kernels", "kernel": "ka", "dtype": "int8", "out_dtype": "bf16",
         "scale_mode": "real", "k": 8, "n": 8, "seed": 0, "tolerance_spacings": 1, "m": m, "position": "first",
         "elements": 8, "differing": 0, "max_spacing": 0, "nonfinite_mismatch": 0, "bitwise_equal": True}
        for m in (1, 2, 3)])
    with open_catalog(root) as cat:
        (cert,) = cf.certificates(cat, "s")
    (row,) = cf.evidence_rows(cert)
    assert row["kernel swap vs noise floor"] == (
        "kernel swap cut~tri (ka vs kb): 3/8 sequences differ; noise floor of the same kernel across batch shapes: "
        "ka, fp64 reductions, KV-cache decode in a batch vs prefill alone (batches 1, 4, 8): 2/8 sequences")
    # rows written before the bound (no algorithm): the spacings verdict, the kernel's line names its output
    assert row["batch invariance (probe row in batches of M vs alone)"].startswith(
        "ka: batch-invariant (bf16 out; 3/3 cells bit-identical, M 1..3, max 0 sp)")
    assert cert["noise_floor"]["model"][0]["sequences"]["k"] == 2
    res = runner.invoke(app, ["report", "certificate", "--results", str(root), "--format", "markdown"])
    assert res.exit_code == 0 and "3/8 sequences differ; noise floor" in res.stdout


# -- the spec -------------------------------------------------------------------------------------

def test_spec_errors_name_the_field() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(_kernel_spec(["int8-cutlass-order", "no-such-kernel"], extra="batch_sizes = [2]\n"))
    problems = err.value.problems
    assert any(p.startswith("experiments.kernels.kernels[1]: unknown kernel 'no-such-kernel'") for p in problems), problems
    assert "experiments.kernels.batch_sizes: applies to level = 'model' only; this experiment is level = 'kernel'" in problems
    with pytest.raises(SpecError) as err:
        parse_spec(_kernel_spec([]))
    assert err.value.problems[0].startswith("experiments.kernels.kernels: level = 'kernel' needs at least one kernel")
    with pytest.raises(SpecError) as err:
        parse_spec(_kernel_spec(["int8-cutlass-order"], m=[0, 4]))
    assert err.value.problems[0].startswith("experiments.kernels.m")
    with pytest.raises(SpecError) as err:
        parse_spec(MODEL_SPEC + 'kernels = ["int8-cutlass-order"]\nreductions_typo = 1\n')
    assert any(p.startswith("experiments.model.reductions_typo") for p in err.value.problems), err.value.problems
    with pytest.raises(SpecError) as err:
        parse_spec(MODEL_SPEC.replace('["fp32", "fp64"]', '["fp32", "fp16"]'))
    assert err.value.problems[0].startswith("experiments.model.reductions.1: Input should be 'fp32' or 'fp64'")
    with pytest.raises(SpecError) as err:
        parse_spec(MODEL_SPEC + 'kernels = ["int8-cutlass-order"]\n')
    assert err.value.problems == ["experiments.model.kernels: applies to level = 'kernel' only; this experiment is level = 'model'"]


def test_sweep_validate_exits_2_naming_the_file_and_field(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(_kernel_spec(["int8-cutlass-order"], extra="new_tokens = 4\n"))
    res = runner.invoke(app, ["sweep", "validate", str(spec)])
    assert res.exit_code == 2
    assert "bad.toml" in res.output and "experiments.kernels.new_tokens" in res.output


def test_units_and_resources() -> None:
    exp = parse_spec(_kernel_spec(["int8-cutlass-order", "fp8-sequential"], extra="seeds = 2\n")).experiments["kernels"]
    units = KIND.expand("kernels", exp)
    assert [(u.params["kernel"]["name"], u.params["seed"], u.params["dtype"]) for u in units] == [
        ("int8-cutlass-order", 0, "int8"), ("int8-cutlass-order", 1, "int8"),
        ("fp8-sequential", 0, "fp8_e4m3"), ("fp8-sequential", 1, "fp8_e4m3")]
    assert all(u.params["algorithm"] == "any" and u.params["accumulate"] == "fp32" and "threads" not in u.params
               for u in units)
    assert all(u.resources.num_gpus == 0 for u in units)
    model = KIND.expand("model", parse_spec(MODEL_SPEC).experiments["model"])
    assert [(u.params["reductions"], u.params["batch"]) for u in model] == [("fp32", 1), ("fp32", 3), ("fp64", 1), ("fp64", 3)]
