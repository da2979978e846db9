"""The three-way arbiter (issue #41): each side of a kernel pair against its declared bound, on real sweeps.

One sweep, launched in this process through the worker's own code path (``launch_in_process``): an FP8
K-depth experiment with two correct emulations (``fp8-sequential``, ``fp8-pairwise``: different fp32
orders), the planted kernels of ``tests/_arbiter_kernels.py`` (a bf16 running sum declared as
blocked-32 fp32; a dropped last term declared as any order in fp32; a correct kernel that declares
nothing), and the INT8 CUTLASS-order vs Triton-order pair of the demo under real and power-of-two scales.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from reports import arbiter, certificate, conformance
from swapcheck_common import verdicts as vocab
from tests.conftest import launch_in_process

SPEC = '''
question = "Which side of an FP8 swap leaves its declared bound?"
name = "arb"

[experiments.fp8]
kind = "kdepth"
dtype = "fp8_e4m3"
implementations = ["fp8-sequential", "fp8-pairwise", "_arbiter_kernels:Bf16Accumulator",
                   "_arbiter_kernels:DroppedTerm", "_arbiter_kernels:Undeclared"]
scale_modes = ["real"]
m = 64
n = 64
k = [1024, 4096]
seeds = 1

[experiments.int8]
kind = "kdepth"
dtype = "int8"
implementations = ["int8-cutlass-order", "int8-triton-order"]
scale_modes = ["real", "pow2"]
m = 512
n = 512
k = [256]
seeds = 4
'''
BF16 = "_arbiter_kernels:Bf16Accumulator"
DROPPED = "_arbiter_kernels:DroppedTerm"
UNDECLARED = "_arbiter_kernels:Undeclared"


@pytest.fixture(scope="module")
def cat(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from storage.catalog import Catalog

    results = tmp_path_factory.mktemp("arbiter")
    summary = launch_in_process(results, SPEC)
    assert summary.n_ok == summary.n_units, summary.failures
    return Catalog(str(results))


@pytest.fixture(scope="module")
def certs(cat: Any) -> list[dict[str, Any]]:
    return certificate.certificates(cat, "arb")


def _cert(certs: list[dict[str, Any]], a: str, b: str) -> dict[str, Any]:
    (c,) = certificate.select_pair(certs, a, b)
    return c


def _arb(certs: list[dict[str, Any]], a: str, b: str, mode: str = "real") -> tuple[dict[str, Any], str, str]:
    c = _cert(certs, a, b)
    arb = c["arbiter"][mode]
    assert next(s for s in c["scale_modes"] if s["scale_mode"] == mode)["arbiter"] is arb
    return arb, c["kernel_a"], c["kernel_b"]


def _side(arb: dict[str, Any], kernel_a: str, name: str) -> dict[str, Any]:
    return arb["a"] if kernel_a == name else arb["b"]


def test_a_planted_out_of_bound_kernel_against_a_correct_one_reads_its_side(certs: list[dict[str, Any]]) -> None:
    for planted in (BF16, DROPPED):
        arb, ka, kb = _arb(certs, "fp8-sequential", planted)
        c = _cert(certs, "fp8-sequential", planted)
        assert c["scale_modes"][0]["kdepth"]["differing"] > 0  # the two sides differ
        assert arb["status"] == "run"
        assert arb["verdict"] == ("a_outside_bound" if ka == planted else "b_outside_bound")
        bad, good = _side(arb, ka, planted), _side(arb, ka, "fp8-sequential")
        assert bad["status"] == "outside" and bad["outside_bound"] > 0 and bad["max_bound_ratio"] > 1
        assert good["status"] == "inside" and good["outside_bound"] == 0 and good["max_bound_ratio"] <= 1
        assert good["algorithm"] == "sequential (fp32)"
        assert bad["algorithm"] == ("blocked-32 (fp32)" if planted == BF16 else "any (fp32)")
        assert set(bad["worst"]) == {"k", "seed", "row", "col"} and 0 <= bad["worst"]["row"] < 64
        # the answer names the side that left its bound
        assert f"{planted} outside its {bad['algorithm']} bound" in c["answer"]
        assert arb["verdict"] in c["answer"]


def test_two_planted_defects_read_both_outside(certs: list[dict[str, Any]]) -> None:
    arb, _, _ = _arb(certs, BF16, DROPPED)
    assert arb["verdict"] == "both_outside"
    assert arb["a"]["outside_bound"] > 0 and arb["b"]["outside_bound"] > 0


def test_an_fp8_order_only_difference_reads_both_inside(certs: list[dict[str, Any]]) -> None:
    c = _cert(certs, "fp8-sequential", "fp8-pairwise")
    kd = c["scale_modes"][0]["kdepth"]
    assert kd["differing"] > 0  # sequential and pairwise fp32 orders differ at K = 4096
    arb = c["arbiter"]["real"]
    assert arb["verdict"] == "both_inside"
    for s in (arb["a"], arb["b"]):
        assert s["outside_bound"] == 0 and 0 <= s["max_bound_ratio"] <= 1
        assert s["units"] == s["units_judged"] == 2


def test_the_int8_epilogue_orders_are_order_only_under_both_scale_modes(certs: list[dict[str, Any]]) -> None:
    c = _cert(certs, "int8-cutlass-order", "int8-triton-order")
    real = next(s for s in c["scale_modes"] if s["scale_mode"] == "real")
    assert real["kdepth"]["differing"] > 0  # a few ppm one spacing apart under real scales
    for mode in ("real", "pow2"):
        arb = c["arbiter"][mode]
        assert arb["verdict"] == "both_inside"
        assert arb["a"]["algorithm"] == arb["b"]["algorithm"] == "exact (fp32)"


def test_a_side_without_a_declared_bound_is_not_guessed(certs: list[dict[str, Any]]) -> None:
    for other in ("fp8-sequential", BF16):
        arb, ka, _ = _arb(certs, other, UNDECLARED)
        assert arb["status"] == vocab.ARBITER_UNDECIDED and arb["verdict"] is None
        assert f"no bound declared for {UNDECLARED}" in arb["reason"]
        assert _side(arb, ka, UNDECLARED)["status"] == "unknown"
        budget = arb["error_budget"]["a" if ka == UNDECLARED else "b"]
        assert budget["defect"].startswith("not measured: no bound declared")
    # the side that is known is still shown: the planted kernel is outside, the verdict stays open
    arb, ka, _ = _arb(certs, BF16, UNDECLARED)
    assert _side(arb, ka, BF16)["status"] == "outside"


def test_every_verdict_is_of_the_vocabulary_and_the_json_round_trips(certs: list[dict[str, Any]]) -> None:
    seen = set()
    for c in certs:
        for arb in c["arbiter"].values():
            assert arb["status"] in ("run", vocab.ARBITER_UNDECIDED, arbiter.NOT_RUN)
            assert (arb["verdict"] in vocab.ARBITER_ORDER) == (arb["status"] == "run")
            seen.add(arb["verdict"])
    assert set(vocab.ARBITER_ORDER) - {"a_outside_bound", "b_outside_bound"} <= seen
    assert {"a_outside_bound", "b_outside_bound"} & seen
    assert json.loads(json.dumps(certs)) == certs


def test_error_budget_says_what_is_not_measured(certs: list[dict[str, Any]]) -> None:
    arb, ka, _ = _arb(certs, "fp8-sequential", BF16)
    eb = arb["error_budget"]
    for side in ("a", "b"):
        assert eb[side]["quantization"].startswith("not measured")
        assert eb[side]["reference_rounding"].startswith("at most 1/2 spacing")  # the reference is `exact`
        assert eb[side]["unit"] == "bf16 spacings"
    good = eb["a" if ka == "fp8-sequential" else "b"]
    assert good["defect"].startswith("none: 0 of")
    bad = eb["b" if ka == "fp8-sequential" else "a"]
    assert "outside the blocked-32 (fp32) bound" in bad["defect"]


def test_conformance_and_the_certificate_view_show_the_arbiter(certs: list[dict[str, Any]]) -> None:
    rows = certificate.matrix_rows(certs)
    row = next(r for r in rows if {r["kernel_a"], r["kernel_b"]} == {"fp8-sequential", BF16})
    assert row["arbiter"] in ("a_outside_bound", "b_outside_bound")
    planted = "a" if row["kernel_a"] == BF16 else "b"
    assert row[f"arbiter_{planted}_outside_bound"] > 0 and row[f"arbiter_{planted}_max_bound_ratio"] > 1
    line = next(t for t, r in zip(conformance.table_rows(rows), rows, strict=True) if r is row)
    assert line["arbiter (worst, in units of each side's bound)"].startswith(row["arbiter"])
    ev = certificate.evidence_rows(_cert(certs, "fp8-sequential", BF16))[0]
    assert ev["arbiter (each side vs its declared bound)"].startswith(row["arbiter"] + ": ")
    assert "quantization not measured" in ev["error budget"]
    undecided = next(r for r in rows if {r["kernel_a"], r["kernel_b"]} == {"fp8-sequential", UNDECLARED})
    assert undecided["arbiter"] == "undecided" and "no bound declared" in undecided["arbiter_reason"]
    summary = {r["pair"]: r["arbiter"] for r in certificate.summary_rows(certs)}
    assert summary["int8-cutlass-order vs int8-triton-order"] == "pow2: both_inside; real: both_inside"


def test_the_nightly_tracks_each_verdict_and_the_documents_show_it(cat: Any, certs: list[dict[str, Any]]) -> None:
    from reports import metrics, render

    m = metrics.sweep_metrics(cat, "arb")
    arb, ka, kb = _arb(certs, "fp8-sequential", BF16)
    (key,) = [k for k in m if k.startswith("arbiter/") and "fp8-sequential" in k and BF16 in k]
    # the key names the pair as a~b and the verdict's a/b follow the key (the certificate's order may differ)
    swapped = {"a_outside_bound": "b_outside_bound", "b_outside_bound": "a_outside_bound"}
    expected = arb["verdict"] if key.startswith(f"arbiter/{ka}~") else swapped[arb["verdict"]]
    assert m[key] == {"value": expected, "rule": "exact"} and key.endswith("/real/verdict")
    assert m[next(k for k in m if k.startswith("arbiter/") and UNDECLARED in k)]["value"] == "undecided"
    rows = conformance.conformance(cat, "arb")
    view = render.evidence_view(rows)
    cells = {v["pair"]: v[arbiter.COLUMN] for v in view if v["scales"] == "real"}
    assert cells[f"{ka} vs {kb}"].startswith(arb["verdict"] + " (")
