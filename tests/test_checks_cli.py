"""``swapcheck check``: exit codes, one JSON object, a report a person can read."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app

runner = CliRunner()
SMALL = ["--shape", "32x300x24", "--shape", "17x1000x9", "--trials", "4"]


def _run(*args: str):
    return runner.invoke(app, ["check", *args])


def test_exact_match_pass_table():
    res = _run("exact-match", "--kernel", "_planted_kernels:torch_matmul", *SMALL)
    assert res.exit_code == 0, res.output
    out = res.output
    assert "exact-match check of _planted_kernels:torch_matmul" in out and "output bf16" in out
    assert "32x300x24" in out and "17x1000x9" in out and "positions" in out
    assert "verdict: IDENTICAL (pass)" in out


def test_exact_match_fail_names_first_mismatch_json_and_table():
    res = _run("exact-match", "--kernel", "_planted_kernels:dropped_k_block", *SMALL)
    assert res.exit_code == 1
    assert "first mismatch (shape 32x300x24, trial 0): C[" in res.output
    assert "exact " in res.output and "observed " in res.output
    assert "verdict: INCORRECT (FAIL)" in res.output
    res = _run("exact-match", "--kernel", "_planted_kernels:dropped_k_block", *SMALL, "--format", "json")
    assert res.exit_code == 1
    obj = json.loads(res.stdout)  # one JSON object
    assert {"verdict", "trials", "checked", "mismatches"} <= set(obj)
    assert obj["verdict"] == "INCORRECT" and obj["trials"] == 4 and obj["mismatches"] > 0
    fm = obj["first_mismatch"]
    assert fm["exact"] != fm["observed"] and fm["shape"] == "32x300x24"


def test_bounds_catches_bf16_accumulator_json():
    args = ["bounds", "--kernel", "_planted_kernels:bf16_accumulator", "--algorithm", "any", *SMALL]
    res = _run(*args, "--format", "json")
    assert res.exit_code == 1
    obj = json.loads(res.stdout)
    assert obj["verdict"] == "INCORRECT" and obj["checked"] == obj["positions"] == 4 * (32 * 24 + 17 * 9)
    assert obj["first_mismatch"]["low"] is not None
    res = _run(*args)
    assert "first element outside the bound" in res.output and "allowed [" in res.output


def test_bounds_pass_scaled_kernel_and_params():
    res = _run("bounds", "--kernel", "fp8-blocked", "--param", "block_size=32", *SMALL, "--dtype", "float16")
    assert res.exit_code == 0, res.output
    assert "fp8_e4m3 operands" in res.output and "output fp16" in res.output


def test_all_combines_both_checks():
    res = _run("all", "--kernel", "_planted_kernels:rtz_epilogue", *SMALL, "--format", "json")
    assert res.exit_code == 1
    obj = json.loads(res.stdout)
    assert obj["verdict"] == "INCORRECT" and [c["check"] for c in obj["checks"]] == ["exact_match", "bounds", "precision"]
    assert [c["verdict"] for c in obj["checks"]] == ["IDENTICAL", "INCORRECT", "IDENTICAL"]
    assert {"trials", "checked", "mismatches"} <= set(obj)
    res = _run("all", "--kernel", "int8-triton-order", *SMALL)
    assert res.exit_code == 0 and "overall: IDENTICAL (pass)" in res.output


def test_an_identical_verdict_says_what_it_cannot_see():
    """Issue #36: a kernel whose epilogue differs from CUTLASS's reads IDENTICAL under power-of-two
    scales, where every epilogue is exact; the output says so beside the verdict, with what to run."""
    res = _run("all", "--kernel", "int8-triton-order", *SMALL)
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and "cannot see: with pow2 scales every multiplication by a scale is exact" in text
    assert 'scale_modes = ["real"]' in text
    obj = json.loads(_run("all", "--kernel", "int8-triton-order", *SMALL, "--format", "json").stdout)
    (blind,) = obj["cannot_see"]
    assert blind.startswith("cannot see: with pow2 scales") and "K-depth sweep" in blind
    plain = json.loads(_run("all", "--kernel", "_planted_kernels:correct", *SMALL, "--format", "json").stdout)
    assert plain["cannot_see"] == []  # a plain matmul has no scales to hide anything


@pytest.mark.parametrize(
    "args,message",
    [
        (["exact-match", "--kernel", "no_such_mod_q:f"], "cannot import module"),
        (["exact-match", "--kernel", "int8-cutlas-order"], "did you mean"),
        (["exact-match", "--kernel", "_planted_kernels:three_args"], "required positional"),
        (["exact-match", "--kernel", "_planted_kernels:torch_matmul", "--shape", "3x4"], "MxKxN"),
        (["exact-match", "--kernel", "_planted_kernels:torch_matmul", "--dtype", "int4"], "allowed bfloat16"),
        (["exact-match", "--kernel", "_planted_kernels:torch_matmul", "--trials", "0"], "trials"),
        (["bounds", "--kernel", "_planted_kernels:torch_matmul", "--algorithm", "zigzag"], "unknown algorithm"),
        (["bounds", "--kernel", "_planted_kernels:torch_matmul", "--inputs", "gauss"], "input kind"),
        (["bounds", "--kernel", "exact", "--operands", "int4"], "operands"),
        (["bounds", "--kernel", "_planted_kernels:torch_matmul", "--param", "oops"], "KEY=VALUE"),
    ],
)
def test_bad_input_exits_2(args, message):
    res = _run(*args)
    assert res.exit_code == 2, res.output
    assert message in res.stderr


def test_error_and_inconclusive_exit_1():
    res = _run("exact-match", "--kernel", "_planted_kernels:raises", "--shape", "4x10x4", "--format", "json")
    assert res.exit_code == 1 and json.loads(res.stdout)["verdict"] == "ERROR"
    res = _run("exact-match", "--kernel", "_planted_kernels:torch_matmul", "--shape", "8x2000x8", "--p", "0", "--trials", "1")
    assert res.exit_code == 1 and "INCONCLUSIVE" in res.output
