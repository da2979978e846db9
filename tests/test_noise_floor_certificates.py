"""The noise floor beside attention and quantizer swaps, and the certificate cells around it.

* the ``batch_invariance`` kind's model level takes ``attention`` (an attention registry name): the
  engine runs it (attention-call evidence), the rows name it, and unit ids of experiments without
  it do not change;
* its kernel level takes ``attention_kernels``: a probe batch element's causal attention alone and
  among B elements; the CPU kernels come out batch-invariant, a kernel planted here that changes its
  computation above B = 16 is caught;
* an attention pair's certificate quotes the noise floor measured with its attention kernels, a
  quantizer pair's the floor of its fixed GEMM kernel, each named for what it is;
* an attention pair whose arms also differ in their quantizer gets no end-to-end figures;
* an FP8 quantizer pair's answer says there is no downstream GEMM;
* self-reproducibility of arms run once per prompt reads "not measured";
* the fuzz check's worst verdict is a check cell of each GEMM kernel and fails the verdict as an
  exact_match INCORRECT does.

Rows are written with ResultStore.write (the catalog and the named queries run for real) or come
from units run in this process through the worker's own code path.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.errors import SpecError
from orchestrator.plan import make_plan
from orchestrator.spec import parse_spec
from reports import agreement, quantizer_swap
from reports import certificate as cf
from storage.catalog import open_catalog
from storage.store import ResultStore
from tasks.attention import AttentionKernel, get_attention, register_attention
from tasks.attention.registry import _unregister
from tasks.kinds import get_kind
from tests.conftest import launch_in_process

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed
KIND = get_kind("batch_invariance")
GEMM = "int8-cutlass-order"
PLANTED = "h6-planted-bf16-above-b16"


def _run_all(root: Path, text: str) -> str:
    """Launch ``text`` in this process (the runner's in-process launch: the worker's code path)."""
    summary = launch_in_process(root, text)
    assert summary.n_ok == summary.n_units, summary.failures
    return summary.sweep


def _parquet(root: Path, table: str) -> list[dict[str, Any]]:
    return [r for f in sorted((root / f"table={table}").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]


# -- a planted attention kernel: exact for B <= 16, its probabilities rounded to bf16 above -------------

def _planted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    from tasks.attention.cpu import additive_mask, logsumexp_alongside

    scores = torch.matmul(q.double(), k.double().transpose(-2, -1)) * scale
    mask = additive_mask(q, k.shape[-2], attn_mask, is_causal, torch.float64)
    probs = torch.softmax(scores if mask is None else scores + mask, dim=-1)
    if q.shape[0] > 16:  # a configuration chosen by the batch: bf16 probabilities
        probs = probs.to(torch.bfloat16).double()
    return (probs @ v.double()).to(q.dtype), logsumexp_alongside(q, k, attn_mask, is_causal, scale)


@pytest.fixture(scope="module")
def planted() -> Any:
    register_attention(AttentionKernel(name=PLANTED, device="cpu", description="planted: bf16 probabilities above B = 16",
                                       logsumexp="computed alongside", compute=_planted))
    yield PLANTED
    _unregister(PLANTED)


KERNEL_SPEC = textwrap.dedent("""
    question = "Is each attention kernel batch-invariant?"
    name = "bia"

    [experiments.attention-kernels]
    kind = "batch_invariance"
    level = "kernel"
    attention_kernels = ["sdpa-math", "sdpa-flash-cpu", "eager", "PLANTED"]
    m = [1, 2, 5, 16, 17, 33]
    heads = 2
    seq_len = 8
    head_dim = 16
    """).replace("PLANTED", PLANTED)


@pytest.fixture(scope="module")
def attention_kernel_results(tmp_path_factory: pytest.TempPathFactory, planted: str) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("bia") / "results"
    return root, _run_all(root, KERNEL_SPEC)


def test_attention_kernels_batch_invariance_and_a_planted_kernel_is_caught(
        attention_kernel_results: tuple[Path, str]) -> None:
    from reports import noise_floor as nf

    root, sweep = attention_kernel_results
    with open_catalog(root) as cat:
        rep = nf.noise_floor(cat, sweep)
    verdicts = {r["kernel"]: r for r in rep["attention_kernels"]}
    for name in ("sdpa-math", "sdpa-flash-cpu", "eager"):
        assert verdicts[name]["verdict"] == "batch-invariant", verdicts[name]
        assert verdicts[name]["cells_bitwise_equal"] == verdicts[name]["cells"] == 6 * 3
    bad = verdicts[PLANTED]
    assert bad["verdict"] == "varies beyond 1 spacings" and bad["first_varying_batch"] == 17
    # recomputed from the Parquet rows: the cells that differ are exactly those with B > 16
    rows = [r for r in _parquet(root, "batch_invariance_attention") if r["kernel"] == PLANTED]
    assert {r["batch"] for r in rows if not r["bitwise_equal"]} == {17, 33}
    assert bad["differing"] == sum(r["differing"] for r in rows) > 0
    assert bad["lse_differing"] == 0  # the logsumexp is computed alongside: it does not move
    # the probe element alone is the reference: at B = 1 every kernel repeats itself bit for bit
    assert all(r["bitwise_equal"] for r in _parquet(root, "batch_invariance_attention") if r["batch"] == 1)


def test_the_attention_probe_is_the_same_element_in_every_batch(attention_kernel_results: tuple[Path, str]) -> None:
    """Recompute one cell independently: the planted kernel's probe output at the last of 33 elements."""
    from tasks.kinds.batch_invariance import run

    (unit,) = [u for u in KIND.expand("a", parse_spec(KERNEL_SPEC).experiments["attention-kernels"])
               if u.params["attention"]["name"] == "sdpa-math"]
    rows = run({**unit.params, "m": [1, 33], "positions": ["last"]})["batch_invariance_attention"]
    assert [(r["batch"], r["row_index"], r["bitwise_equal"]) for r in rows] == [(1, 0, True), (33, 32, True)]
    kernel = get_attention("sdpa-math")
    assert kernel.name == rows[0]["kernel"] and rows[0]["elements"] == 2 * 8 * 16


def test_report_noise_floor_shows_attention_kernels(attention_kernel_results: tuple[Path, str]) -> None:
    root, _ = attention_kernel_results
    res = runner.invoke(app, ["report", "noise-floor", "--results", str(root), "--table", "attention"])
    assert res.exit_code == 0, res.output
    assert "batch invariance per attention kernel" in res.stdout and PLANTED in res.stdout
    res = runner.invoke(app, ["report", "noise-floor", "--results", str(root), "--table", "attention",
                              "--format", "json"])
    assert {r["kernel"] for r in json.loads(res.stdout)} == {"sdpa-math", "sdpa-flash-cpu", "eager", PLANTED}


def test_attention_kernel_spec_problems_name_the_field() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(KERNEL_SPEC.replace(PLANTED, "no-such-attention"))
    assert any(p.startswith("experiments.attention-kernels.attention_kernels[3]: ") and "no-such-attention" in p
               for p in err.value.problems), err.value.problems
    with pytest.raises(SpecError) as err:
        parse_spec(KERNEL_SPEC.replace("level = \"kernel\"", "level = \"model\"").replace("m = [1, 2, 5, 16, 17, 33]\n", ""))
    assert "experiments.attention-kernels.attention_kernels: applies to level = 'kernel' only; this experiment " \
           "is level = 'model'" in err.value.problems


# -- the model level with a named attention kernel -----------------------------------------------------

MODEL_SPEC = textwrap.dedent("""
    question = "What is the tiny model's noise floor with sdpa-math attention?"
    name = "bim-att"

    [experiments.model]
    kind = "batch_invariance"
    level = "model"
    reductions = ["fp64"]
    batch_sizes = [1, 3]
    prompts = { count = 3, length = 6, seed = 1 }
    new_tokens = 3
    """)


def test_model_level_attention_joins_the_id_only_when_set_and_runs(tmp_path: Path) -> None:
    plain = KIND.expand("model", parse_spec(MODEL_SPEC).experiments["model"])
    assert all("attention" not in u.params for u in plain)
    # Specs without `attention` (or `attention_kernels`) keep their unit ids: these are the ids of
    # sweeps/noise-floor-demo.toml's units as recorded by a launch made before either field existed.
    from orchestrator.spec import load_spec

    demo = make_plan(load_spec(str(Path(__file__).parents[1] / "sweeps" / "noise-floor-demo.toml")))
    assert [u.id for u in demo.units if u.experiment == "model"] == [
        "91a7cbcdc601b18026c1", "737422d26ee0a036c6e3", "b0dab6586a053d01c74e", "db2a83db335eb81b064b",
        "d12821622af0c585720d", "2ec92a4184bf1589f405"]
    # Its GEMM units are new work since issue #26 (a deliberate change: parameters `algorithm` and
    # `accumulate`, and one unit per output dtype, bf16 and fp32 by default; docs/noise-floor.md): 7
    # kernels x 2 output dtypes, then its two attention units, whose ids did not change.
    assert [u.id for u in demo.units if u.experiment == "kernels"][:14] == [
        "1ffc1aef93f0d5162392", "773eaa38ec22bf296aa2", "8df1d60f04799e2837e9", "5e6977dcce56eabd0096",
        "9ad06bf82996c762280b", "e2f0f4270475b7454645", "74d738adf86c3c62148d", "5de3c39520baa4c8cd59",
        "c03a78633946e85bb072", "a731aba4c6f079ed1d2d", "a781cab8497e17b6a2ca", "91c3b510c823f48fdd47",
        "4521eb6d0649b6c944af", "11cfb587353b1a477cc3"]
    named = KIND.expand("model", parse_spec(MODEL_SPEC + 'attention = "sdpa-math"\n').experiments["model"])
    assert [u.params["attention"] for u in named] == [get_attention("sdpa-math").identity] * 2
    assert {u.id for u in named}.isdisjoint({u.id for u in plain})
    assert "attention sdpa-math" in named[0].describe()

    from tasks.models.hf_attention import CALLS

    before = CALLS["sdpa-math"]
    root = tmp_path / "results"
    _run_all(root, MODEL_SPEC + 'attention = "sdpa-math"\n')
    assert CALLS["sdpa-math"] > before  # the evidence that the engine ran it
    rows = _parquet(root, "batch_invariance_model")
    assert rows and {r["attention"] for r in rows} == {"sdpa-math"}
    with open_catalog(root) as cat:
        (floor,) = [r for r in cat.named("batch_invariance_model_prompts", sweep=None) if r["comparison"] == "decode"]
    assert floor["attention"] == "sdpa-math" and floor["prompts"] == 3


def test_model_level_attention_problems() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(MODEL_SPEC + 'attention = "sdpa-mth"\n')
    assert err.value.problems[0].startswith("experiments.model.attention: ") and "sdpa-math" in err.value.problems[0]
    with pytest.raises(SpecError) as err:
        parse_spec(MODEL_SPEC + 'attention_kernels = ["sdpa-math"]\n')
    assert err.value.problems == ["experiments.model.attention_kernels: applies to level = 'kernel' only; "
                                  "this experiment is level = 'model'"]


# -- certificates, from rows written here ----------------------------------------------------------------

def _arm(arm: str, *, kernel: str = GEMM, attention: str = "sdpa-math", quantizer: dict[str, Any] | None = None,
         restart: int = 0) -> dict[str, Any]:
    evidence: dict[str, Any] = {"ok": True, **({"quantizer": quantizer} if quantizer else {})}
    return {"unit_id": f"run-{arm}-{restart}", "experiment": "e2e", "arm": arm, "restart": restart, "model": "m",
            "engine": "cpu", "configured_kernel": kernel, "scales": "real", "env_json": "{}", "host": "h",
            "pid": 10 + restart, "observed_kernels": [kernel], "kernel_calls_json": json.dumps({"evidence": evidence}),
            "evidence_ok": True, "weights_sha256": "w" * 64, "attention": attention}


def _seqs(arm: str, differ: set[int], restarts: int = 1) -> list[dict[str, Any]]:
    return [{"unit_id": f"seq-{arm}-{r}", "experiment": "e2e", "arm": arm, "restart": r, "prompt_index": p,
             "prompt_hash": f"p{p}", "sequence_hash": f"s{p}" + ("x" if p in differ else ""), "n_tokens": 2,
             "tokens": [1, 2]} for r in range(restarts) for p in range(4)]


def _floor_rows(kernel: str, attention: str | None, flips: set[int]) -> list[dict[str, Any]]:
    return [{"unit_id": f"bim-{kernel}-{attention}", "experiment": "model", "model": "tiny-qwen3", "kernel": kernel,
             "attention": attention, "scales": "real", "reductions": "fp64", "comparison": "decode", "batch": b,
             "prompt_index": p, "position": 0, "argmax_equal": p not in flips, "logits_equal": p not in flips,
             "max_spacing": 0, "argmax_spacing": 0, "ref_margin": 0.5, "nonfinite_mismatch": 0}
            for b in (1, 4) for p in range(4)]


def _write(root: Path, arms: list[dict[str, Any]], seqs: list[dict[str, Any]], floors: list[dict[str, Any]]) -> None:
    store = ResultStore(root)
    store.write("arm_runs", "s", "runs", arms)
    store.write("sequences", "s", "seqs", seqs)
    if floors:
        store.write("batch_invariance_model", "s", "bim", floors)


def _certs(root: Path) -> list[dict[str, Any]]:
    with open_catalog(root) as cat:
        return cf.certificates(cat, "s")


def test_the_attention_certificate_puts_the_floor_of_its_attention_kernels_beside_the_swap(
        tmp_path: Path, attention_kernel_results: tuple[Path, str]) -> None:
    root = tmp_path / "results"
    _write(root, [_arm("math"), _arm("flash", attention="sdpa-flash-cpu")],
           _seqs("math", set()) + _seqs("flash", {2}),
           # the floor with sdpa-math attention (1/4 sequences flip), and one of the engine's own
           # attention with the same GEMM kernel, which is not this swap's floor
           _floor_rows(GEMM, "sdpa-math", {3}) + _floor_rows(GEMM, None, {0, 1}))
    # the attention kernels' own batch invariance, from the kernel-level run above
    ResultStore(root).write("batch_invariance_attention", "s", "bia",
                            [{**r, "unit_id": "bia"} for r in _parquet(attention_kernel_results[0], "batch_invariance_attention")
                             if r["kernel"] in ("sdpa-math", "sdpa-flash-cpu")])
    (cert,) = _certs(root)
    assert cert["swap"] == "attention"
    (row,) = cf.evidence_rows(cert)
    a, b = cert["kernel_a"], cert["kernel_b"]
    assert row["kernel swap vs noise floor"] == (
        f"kernel swap flash~math ({a} vs {b}): 1/4 sequences differ; noise floor of the same kernel across batch "
        f"shapes: {GEMM}, attention sdpa-math, fp64 reductions, KV-cache decode in a batch vs prefill alone "
        "(batches 1, 4): 1/4 sequences")
    assert row["model noise floor (sequences with an argmax difference across batch shapes)"].startswith(
        f"{GEMM}, attention sdpa-math, fp64 reductions")
    cell = row["batch invariance (probe row in batches of M vs alone)"]
    assert "sdpa-flash-cpu: batch-invariant (18/18 cells bit-identical, B 1..33" in cell
    assert "sdpa-math: batch-invariant (18/18 cells bit-identical, B 1..33" in cell


def test_an_attention_pair_whose_arms_also_change_the_quantizer_has_no_end_to_end_figures(tmp_path: Path) -> None:
    root = tmp_path / "results"
    static = {"quantizer": "int8-static", "params": {"static_scale": 0.03125}, "version": "1"}
    _write(root, [_arm("math"), _arm("flash-q", attention="sdpa-flash-cpu", quantizer=static)],
           _seqs("math", set()) + _seqs("flash-q", {1}), [])
    certs = _certs(root)
    attention = [c for c in certs if c.get("swap") == "attention"]
    assert attention == []  # the only arm pair changes two things: no attention certificate
    # (the quantizer certificate refuses it too: the arms' attention differs)
    assert not [p for c in certs for s in c["scale_modes"] for p in s["end_to_end"].get("arm_pairs", [])]


def test_the_quantizer_certificate_quotes_the_floor_of_the_fixed_gemm_kernel(tmp_path: Path) -> None:
    root = tmp_path / "results"
    static = {"quantizer": "int8-static", "params": {"static_scale": 0.03125}, "version": "1"}
    _write(root, [_arm("base", attention="fp64"), _arm("q", attention="fp64", quantizer=static)],
           _seqs("base", set()) + _seqs("q", {0, 3}), _floor_rows(GEMM, None, set()))
    (cert,) = [c for c in _certs(root) if c.get("swap") == "quantizer"]
    (row,) = cf.evidence_rows(cert)
    assert row["kernel swap vs noise floor"] == (
        "quantizer swap base~q (vllm-int8 vs int8-static(static_scale=0.03125), GEMM kernel int8-cutlass-order "
        "fixed): 2/4 sequences differ; noise floor of the fixed GEMM kernel int8-cutlass-order across batch shapes: "
        "int8-cutlass-order, fp64 reductions, KV-cache decode in a batch vs prefill alone (batches 1, 4): 0/4 sequences")


def test_an_fp8_quantizer_pair_answer_says_there_is_no_downstream_gemm() -> None:
    fp8: list[dict[str, Any]] = [{"experiment": "q", "activation_dtype": "fp32", "q_dtype": "fp8_e4m3", "reference": "vllm-fp8",
            "candidate": "fp8-mul-inv", "layers": 28, "elements": 1000, "q_differing": 7, "q_max_abs_diff": 1.0,
            "tokens": 10, "scales_differing": 0, "scale_max_spacing": 0, "scale_format": "fp32",
            "out_elements": None, "out_differing": None, "out_max_spacing": None,
            "out_max_spacing_significant": None, "identical_out_layers": None}]
    cert: dict[str, Any] = {"kernel_a": "vllm-fp8", "kernel_b": "fp8-mul-inv", "gemm_kernel": GEMM, "verdict": "not run",
            "quantize": fp8, "scale_modes": [{"scale_mode": "real", "replay": {"status": "not run"},
                                              "end_to_end": {"status": "not run"}}]}
    text = quantizer_swap.answer(cert)
    assert GEMM not in text and "fixed" not in text
    assert text.startswith("can fp8-mul-inv replace vllm-fp8? no downstream GEMM for this pair (fp8_e4m3 values")
    assert "7/1,000 quantized values (fp8_e4m3)" in text
    assert quantizer_swap.fixed_phrase(GEMM, fp8).startswith("quantizer swap: no downstream GEMM for this pair")
    cert.update({"swap": "quantizer", "fixed": quantizer_swap.fixed_phrase(GEMM, fp8), "checks_a": {}, "checks_b": {},
                 "gemm_checks": {"exact_match": "IDENTICAL"}, "provenance": {
                     "kernel_versions_a": [], "kernel_versions_b": [], "spec_sha256": [], "launches": [],
                     "weights_sha256": []}})
    assert cf.detail_lines(cert)[0] == cert["fixed"]  # no "checks of <GEMM kernel>": no GEMM takes these values
    int8 = [{**fp8[0], "q_dtype": "int8", "out_elements": 10, "out_differing": 0, "out_max_spacing": 0,
             "out_max_spacing_significant": 0, "identical_out_layers": 28}]
    assert quantizer_swap.fixed_phrase(GEMM, int8) == f"quantizer swap: GEMM kernel {GEMM} fixed, only the activation quantizer changes"


def test_self_reproducibility_of_one_run_per_prompt_reads_not_measured(tmp_path: Path) -> None:
    root = tmp_path / "results"
    _write(root, [_arm("a", kernel="ka"), _arm("b", kernel="kb")], _seqs("a", set()) + _seqs("b", {1}), [])
    with open_catalog(root) as cat:
        tables = dict(agreement.summary_tables(cat, "s"))
        self_rows = agreement.self_table(cat.named("self_reproducibility", sweep="s"))
    assert [r["identical"] for r in tables["Self-reproducibility across cold restarts"]] == [
        "not measured (one run per prompt)"] * 2
    assert [r["identical"] for r in self_rows] == ["not measured (one run per prompt)"] * 2
    (cert,) = _certs(root)
    (row,) = cf.evidence_rows(cert)
    assert row["self-reproducible"] == "a not measured (one run per prompt); b not measured (one run per prompt)"
    assert "None" not in json.dumps(tables)


def _fuzz(kernel: str, verdicts: list[str]) -> list[dict[str, Any]]:
    return [{"unit_id": f"fz-{kernel}", "experiment": "fuzz", "kernel": kernel, "kind": "int8", "operands": "int8",
             "dtype": "bf16", "seed": 0, "trial": i, "m": 4, "k": 4, "n": 4, "verdict": v}
            for i, v in enumerate(verdicts)]


def test_the_fuzz_check_is_a_check_cell_and_its_incorrect_fails_the_verdict(tmp_path: Path) -> None:
    root = tmp_path / "results"
    _write(root, [_arm("a", kernel="ka"), _arm("b", kernel="kb")], _seqs("a", set()) + _seqs("b", set()), [])
    store = ResultStore(root)
    store.write("fuzz", "s", "fz", _fuzz("ka", ["IDENTICAL", "INCORRECT", "EPILOGUE_ROUNDING"]))
    (cert,) = _certs(root)
    assert cert["checks_a"] == {"exact_match": "not run", "bounds": "not run", "fuzz": "INCORRECT", "precision": "not run"}
    assert cert["checks_b"] == {"exact_match": "not run", "bounds": "not run", "fuzz": "not run", "precision": "not run"}
    # every sequence identical, yet the fuzz check found ka incorrect: as an exact_match INCORRECT would
    assert cert["verdict"] == "INCORRECT"
    assert "checks of ka: exact_match not run, bounds not run, fuzz INCORRECT, precision not run" in cf.detail_lines(cert)


def test_a_precision_downgrade_is_a_check_cell_and_fails_the_verdict(tmp_path: Path) -> None:
    """The precision-downgrade probe (``precision`` table) counts like the other checks: a kernel that
    computes in a narrower format than it claims fails the certificate, whatever the sequences say."""
    root = tmp_path / "results"
    _write(root, [_arm("a", kernel="ka"), _arm("b", kernel="kb")], _seqs("a", set()) + _seqs("b", set()), [])
    rows = [{**r, "unit_id": "pr-kb", "experiment": "precision", "check": "precision"}
            for r in _fuzz("kb", ["IDENTICAL", "PRECISION_DOWNGRADE"])]
    ResultStore(root).write("precision", "s", "pr", rows)
    (cert,) = _certs(root)
    assert cert["checks_b"]["precision"] == "PRECISION_DOWNGRADE" and cert["checks_a"]["precision"] == "not run"
    assert cert["verdict"] == "PRECISION_DOWNGRADE"
    assert cf.answer(cert).startswith("not interchangeable: a kernel computes in a narrower format")
    sec = cert["scale_modes"][0]
    assert cf.section_verdict(sec, {"ka": {"fuzz": "INCORRECT"}}) == cf.section_verdict(
        sec, {"kb": {"exact_match": "INCORRECT"}}) == "INCORRECT"
    assert cf.section_verdict(sec, {"ka": {"fuzz": "ERROR"}}) == "ERROR"
    assert cf.section_verdict(sec, {"ka": {"fuzz": "IDENTICAL"}}) == "IDENTICAL"
