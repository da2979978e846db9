"""The attention-swap experiment: arms with an `attention` kernel, the `attention_replay` kind, and an
attention pair's certificate.

Unit ids of arms without `attention` are pinned to the ids sweeps/demo.toml planned before arms had
the field; the replay kind's rows are recomputed here independently (torch's own SDPA calls and a
spacing distance written out in this file); the certificate is built from rows written with the
real store and read through the real catalog.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _library_facts import fact

from orchestrator.plan import make_plan
from orchestrator.spec import load_spec
from reports import certificate as cf
from storage.catalog import open_catalog
from storage.store import ResultStore
from tasks.devices import cuda_reason
from tasks.kinds import attention_replay as ar
from tasks.kinds import generate
from tasks.kinds.base import content_id
from tasks.kinds.fields import SyntheticPrompts
from tasks.models import build_model

pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed

REPO = Path(__file__).resolve().parents[1]

#: Generate units of sweeps/demo.toml's plan, computed before arms had an `attention` field (the same
#: ids are in the ledger of the demo results written before this change).
DEMO_IDS = {
    ("cutlass", 0): "36ba215e49e41db916e2",
    ("triton", 1): "b0128537e4d2651c6685",
    ("cutlass-pow2", 0): "55bf806bae3b43afa387",
    ("triton-pow2", 1): "d5b01c787ec5e47c67c8",
}
DEMO_TF = "7ffbbe560b244523d9a1"


def test_arms_without_attention_keep_their_unit_ids() -> None:
    plan = make_plan(load_spec(REPO / "sweeps" / "demo.toml"))
    gen = {(u.params["arm"]["name"], u.params["restart"]): u.id for u in plan.units if u.kind == "generate"}
    for key, uid in DEMO_IDS.items():
        assert gen[key] == uid
    tf = [u.id for u in plan.units if u.kind == "teacher_forced"]
    assert tf[0] == DEMO_TF
    assert all("attention" not in u.params["arm"] for u in plan.units if u.kind == "generate")


def _exp(**arms: dict[str, Any]) -> generate.GenerateExperiment:
    return generate.GenerateExperiment(kind="generate", arms={k: generate.Arm(**v) for k, v in arms.items()},
                                       restarts=1, prompts=SyntheticPrompts(count=2, length=6, seed=0),
                                       max_new_tokens=4)


def test_attention_joins_the_payload_and_the_id_only_when_set() -> None:
    plain = generate.arm_payload("a", generate.Arm(kernel="int8-cutlass-order"))
    math = generate.arm_payload("a", generate.Arm(kernel="int8-cutlass-order", attention="sdpa-math"))
    assert "attention" not in plain and math["attention"] == {"name": "sdpa-math", "version": "1"}
    assert {k: v for k, v in math.items() if k != "attention"} == plain
    assert content_id("generate", "1", {"arm": plain}) != content_id("generate", "1", {"arm": math})


def test_spec_problems_name_the_field() -> None:
    exp = _exp(a={"attention": "sdpa-flsh"}, b={"attention": "vllm-flash-attn"})
    problems = generate.problems("experiments.e2e", exp)
    assert any(p.startswith("experiments.e2e.arms.a.attention: unknown attention kernel 'sdpa-flsh'; did you mean")
               for p in problems)
    assert any(p.startswith("experiments.e2e.arms.b.attention: 'vllm-flash-attn' runs on cuda") for p in problems)
    vllm = generate.problems("x", _exp(a={"engine": "vllm", "kernel": "cutlass-int8", "attention": "sdpa-math"}))
    assert any(p.startswith("x.arms.a.attention: 'sdpa-math' is not a vLLM attention backend") for p in vllm)


def test_engine_runs_the_named_attention_kernel() -> None:
    from tasks.models.hf_attention import CALLS

    prompts = [[5, 6, 7, 8, 9], [3, 4, 5]]
    default = build_model().forward_tokens(prompts)
    fp64 = build_model(attention="fp64").forward_tokens(prompts)
    assert torch.equal(default, fp64)  # the registry's fp64 entry is the engine's default path
    before = CALLS["sdpa-math"]
    math = build_model(attention="sdpa-math").forward_tokens(prompts)
    assert CALLS["sdpa-math"] - before == 4  # one call per decoder layer
    assert float((math - default).abs().max()) < 1e-2


def test_generate_unit_with_an_attention_arm_records_it() -> None:
    exp = _exp(flash={"attention": "sdpa-flash-cpu"})
    (unit,) = generate.expand("e2e", exp)
    out = generate.run(unit.params)
    (row,) = out["arm_runs"]
    assert row["attention"] == "sdpa-flash-cpu" and row["evidence_ok"]
    assert len(out["generations"]) == 2 * 4
    assert "attention sdpa-flash-cpu" in unit.description


def test_a_configured_attention_that_never_ran_fails_the_unit() -> None:
    from tasks.models.hf_attention import attention_calls, require_attention_calls

    before = attention_calls()
    with pytest.raises(RuntimeError, match="attention kernel 'sdpa-math' was configured but never called"):
        require_attention_calls("sdpa-math", "math", before)
    build_model(attention="sdpa-math").forward_tokens([[5, 6, 7]])
    require_attention_calls("sdpa-math", "math", before)  # it ran since `before`: no error
    require_attention_calls("fp64", "default", attention_calls())  # the engine's own path needs no count


# -- attention_replay ---------------------------------------------------------------------------------


def _spacing(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Distance in spacings of a's format, from the ordered integer view of the bits (no NaNs here);
    -0 and +0 one step apart (the project's convention, tasks/numerics/spacing.py)."""
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    sign = {torch.int32: 0x7FFFFFFF, torch.int16: 0x7FFF}[view]

    def ordered(x: torch.Tensor) -> np.ndarray:
        i: np.ndarray = np.asarray(x.contiguous().view(view).numpy(), dtype=np.int64)
        out: np.ndarray = np.where(i < 0, -(i & sign) - 1, i)
        return out

    d: np.ndarray = np.abs(ordered(a) - ordered(b))
    return d


@pytest.fixture(scope="module")
def replayed() -> tuple[list[Any], list[dict[str, Any]]]:
    exp = ar.AttentionReplayExperiment(kind="attention_replay", pairs=[["sdpa-math", "sdpa-flash-cpu"]],
                                       dtypes=["float32", "bfloat16"], prompts=SyntheticPrompts(count=3, length=10, seed=1),
                                       algorithms={"sdpa-math": "plain", "sdpa-flash-cpu": "flash-cpu"},
                                       ulps={"sdpa-flash-cpu": 8})
    (unit,) = ar.expand("attn", exp)
    records = ar.capture(unit.params)
    p = unit.params
    return records, ar.replay_attention(records, p["pairs"], p["dtypes"], p["algorithms"], p["ulps"])


#: Whether torch's CPU kernels are inside the named algorithms that describe them (tasks/checks/
#: attention.py: `plain` for sdpa-math, `flash-cpu` with 8 ulps of logsumexp for sdpa-flash-cpu), and
#: whether the flash kernel's bf16 output is outside `plain` (it rounds the weights).  Checked on torch
#: 2.13.0+cpu (docs/numerics.md, "Which algorithms describe PyTorch's CPU kernels").
TORCH_CPU_ATTENTION = {">=2.13,<2.14": {"inside_their_algorithms": True, "flash_bf16_outside_plain": True}}


def test_replay_judges_each_kernel_with_its_algorithm(replayed: tuple[list[Any], list[dict[str, Any]]]) -> None:
    records, rows = replayed
    refs = [r for r in rows if r["comparison"] == "reference"]
    assert {(r["impl_a"], r["algorithm"]) for r in refs} == {("sdpa-math", "plain"), ("sdpa-flash-cpu", "flash-cpu")}
    assert all(isinstance(r["outside_bound"], int) and isinstance(r["lse_outside_bound"], int) for r in refs)
    assert all(r["algorithm"] is None and r["outside_bound"] is None for r in rows if r["comparison"] == "pair")


def test_replayed_torch_kernels_inside_their_algorithms(replayed: tuple[list[Any], list[dict[str, Any]]]) -> None:
    torch_fact = fact("torch", TORCH_CPU_ATTENTION, what="the CPU attention kernels against their named algorithms")
    records, rows = replayed
    refs = [r for r in rows if r["comparison"] == "reference"]
    inside = all(r["outside_bound"] == 0 and r["lse_outside_bound"] == 0 for r in refs)
    assert inside == torch_fact["inside_their_algorithms"]
    # Not vacuous: the flash kernel's bf16 output is outside the bounds of `plain` (no weight rounding).
    rec = records[0]
    ops = ar.operands(rec, torch.bfloat16)
    from tasks.attention import get_attention

    q, k, v, mask = ops
    out, lse = get_attention("sdpa-flash-cpu")(q, k, v, attn_mask=mask, scale=rec.scale, enable_gqa=True)
    outside = ar.bound_columns("plain", "bfloat16", 8, out, lse, ops, rec.scale)["outside_bound"] > 0
    assert outside == torch_fact["flash_bf16_outside_plain"]


def test_replay_spec_problems() -> None:
    exp = ar.AttentionReplayExperiment(kind="attention_replay", pairs=[["sdpa-math", "sdpa-math"], ["eager", "fp6"]],
                                       algorithms={"fp64": "plain", "eager": "fast"}, ulps={"sdpa-math": 1})
    problems = ar.problems("experiments.r", exp)
    assert "experiments.r.pairs[0]: both sides are 'sdpa-math'; name two different attention kernels" in problems
    assert any(p.startswith("experiments.r.pairs[1][1]: unknown attention kernel 'fp6'; did you mean 'fp64'")
               for p in problems)
    assert any(p.startswith("experiments.r.algorithms.fp64: not a kernel of pairs") for p in problems)
    assert any(p.startswith("experiments.r.algorithms.eager: 'fast': not a preset") for p in problems)
    assert any(p.startswith("experiments.r.ulps.sdpa-math: not a kernel with an algorithm") for p in problems)


def test_capture_holds_every_layer_after_rope(replayed: tuple[list[Any], list[dict[str, Any]]]) -> None:
    records, _ = replayed
    assert [r.layer_index for r in records] == [0, 1, 2, 3]
    r0 = records[0]
    assert tuple(r0.q.shape) == (3, 4, 10, 32) and tuple(r0.k.shape) == (3, 2, 10, 32) and r0.scale == 32**-0.5
    assert r0.mask is not None and bool((r0.mask != 0).any())  # causal: the model's own additive mask


def test_replay_rows_recomputed_independently(replayed: tuple[list[Any], list[dict[str, Any]]]) -> None:
    records, rows = replayed
    assert len(rows) == 4 * 2 * 3  # layers x dtypes x (2 reference rows + 1 pair row)
    for rec in records:
        for dt, tdt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            q, k, v = rec.q.to(tdt), rec.k.to(tdt).repeat_interleave(2, 1), rec.v.to(tdt).repeat_interleave(2, 1)
            mask = torch.where(rec.mask == 0, 0.0, torch.finfo(tdt).min).to(tdt)
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.MATH):
                math = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=rec.scale)
            flash, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False,
                                                                                    attn_mask=mask, scale=rec.scale)
            d = _spacing(math, flash)
            (row,) = [r for r in rows if r["layer_index"] == rec.layer_index and r["dtype"] == dt
                      and r["comparison"] == "pair"]
            assert (row["impl_a"], row["impl_b"]) == ("sdpa-math", "sdpa-flash-cpu")
            assert row["elements"] == math.numel() and row["differing"] == int((d != 0).sum())
            assert row["max_spacing"] == int(d.max()) and row["bitwise_equal"] == (row["differing"] == 0)
            s = q.double() @ k.double().transpose(-1, -2) * rec.scale + mask.double()
            ref_lse = torch.logsumexp(s, -1).float()
            dl = _spacing(ref_lse, lse)
            assert row["lse_elements"] == lse.numel() and row["lse_differing"] == int((dl != 0).sum())
            (ref_row,) = [r for r in rows if r["layer_index"] == rec.layer_index and r["dtype"] == dt
                          and r["impl_a"] == "sdpa-flash-cpu" and r["comparison"] == "reference"]
            ref_out = (torch.softmax(s, -1) @ v.double()).to(tdt)
            assert ref_row["differing"] == int((_spacing(flash, ref_out) != 0).sum())


# -- attention_replay with CUDA kernels: validation, resources, devices, is_causal ------------------------

#: A replay naming CUDA attention kernels (and one CPU kernel against its CUDA counterpart).
CUDA_REPLAY = """
question = "q"
name = "replay-cuda"

[experiments.r]
kind = "attention_replay"
model = "tiny-qwen3"
pairs = [["sdpa-flash-cuda", "sdpa-math-cuda"], ["sdpa-math-cuda", "sdpa-math"]]
dtypes = ["bfloat16"]
algorithms = { "sdpa-flash-cuda" = "fused-general", "sdpa-math-cuda" = "plain" }
prompts = { count = 2, length = 8, seed = 0 }
"""


def test_replay_accepts_a_cuda_kernel_that_exists_and_requests_a_gpu_for_it() -> None:
    cuda = ar.AttentionReplayExperiment(kind="attention_replay", pairs=[["sdpa-flash-cuda", "sdpa-cudnn-cuda"],
                                                                      ["sdpa-math-cuda", "sdpa-math"]],
                                        algorithms={"sdpa-flash-cuda": "fused-general", "sdpa-math-cuda": "plain"})
    assert ar.problems("x", cuda) == []
    (unit,) = ar.expand("x", cuda)
    assert unit.resources.num_gpus == 1
    cpu = ar.AttentionReplayExperiment(kind="attention_replay", pairs=[["sdpa-math", "sdpa-flash-cpu"]])
    (unit,) = ar.expand("x", cpu)
    assert unit.resources.num_gpus == 0  # and its id is the one tests/data/pinned_unit_ids.json holds
    bad = ar.AttentionReplayExperiment(kind="attention_replay", pairs=[["vllm-flash-attn", "sdpa-math"],
                                                                     ["sdpa-efficient-cpu", "sdpa-flsh-cuda"]])
    problems = ar.problems("x", bad)
    assert any(p.startswith("x.pairs[0][0]: 'vllm-flash-attn' is a vLLM engine backend (FLASH_ATTN)") for p in problems)
    assert any(p.startswith("x.pairs[1][0]: attention kernel 'sdpa-efficient-cpu' is not available here: PyTorch has "
                            "no CPU implementation") for p in problems), problems
    assert any(p.startswith("x.pairs[1][1]: unknown attention kernel 'sdpa-flsh-cuda'; did you mean") for p in problems)


@pytest.mark.skipif(cuda_reason() is None, reason="a CUDA device is visible")
def test_a_cuda_replay_plans_with_a_gpu_and_a_launch_without_one_refuses_it(tmp_path: Path) -> None:
    """As kdepth with torch-scaled-mm-cuda: planned with gpu=1; the launch refuses it (exit 2) naming what is
    missing, before writing anything."""
    import json

    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    runner = CliRunner()
    spec = tmp_path / "replay-cuda.toml"
    spec.write_text(CUDA_REPLAY)
    plan = runner.invoke(app, ["sweep", "plan", str(spec), "--format", "json"])
    assert plan.exit_code == 0, plan.output
    (row,) = json.loads(plan.stdout)
    assert row["kind"] == "attention_replay" and "gpu=1" in row["resources"]
    results = tmp_path / "results"
    res = runner.invoke(app, ["sweep", "launch", str(spec), "--results", str(results), "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "request a GPU" in res.output and "no GPU" in res.output and "sdpa-flash-cuda~sdpa-math-cuda" in res.output
    assert not results.exists()


def test_exactly_causal_is_decided_from_the_mask_values() -> None:
    lo = torch.finfo(torch.float32).min
    causal = torch.where(torch.ones(5, 5, dtype=torch.bool).tril(), 0.0, lo)[None, None].expand(3, 1, 5, 5)
    assert ar.exactly_causal(causal, 5, 5)
    assert ar.exactly_causal(causal.masked_fill(causal != 0, float("-inf")), 5, 5)  # any exclusion value
    padded = causal.clone()
    padded[1, :, :, 0] = lo  # batch element 1 has a padded first key
    assert not ar.exactly_causal(padded, 5, 5)
    assert not ar.exactly_causal(torch.zeros(3, 1, 5, 5), 5, 5)  # full attention
    assert not ar.exactly_causal(None, 5, 5)
    assert not ar.exactly_causal(causal, 5, 6)


def test_cpu_kernels_give_the_same_bits_with_is_causal_as_with_the_causal_mask(
        replayed: tuple[list[Any], list[dict[str, Any]]]) -> None:
    """Why every kernel may be called with is_causal where the captured mask is exactly causal: each CPU
    kernel's output and logsumexp are bit for bit those it gives with the mask, on every replayed layer and
    dtype (so rows written before the kind chose is_causal stay valid)."""
    records, rows = replayed
    assert all(r["is_causal"] is True for r in rows)
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    for rec in records:
        assert ar.exactly_causal(rec.mask, rec.q.shape[2], rec.k.shape[2])
        for dt in view:
            ops = ar.operands(rec, dt)
            for name in ("sdpa-math", "sdpa-flash-cpu", "eager", "fp64"):
                out_c, lse_c, _ = ar._run(name, ops, rec.scale, causal=True)
                out_m, lse_m, _ = ar._run(name, ops, rec.scale, causal=False)
                assert torch.equal(out_c.view(view[dt]), out_m.view(view[dt])), (name, dt, rec.layer_index)
                assert torch.equal(lse_c.view(torch.int32), lse_m.view(torch.int32)), (name, dt, rec.layer_index)


def test_each_kernel_gets_its_operands_on_its_device_and_the_causal_call(
        replayed: tuple[list[Any], list[dict[str, Any]]]) -> None:
    """The device path, on the CPU: a stand-in kernel asserts that q, k, v (and a mask) arrive on its
    device and records how it was called; its outputs come back on the CPU and are compared there. A
    causal layer calls it with is_causal=True and no mask; a padded layer with the mask."""
    from tasks.attention import AttentionKernel, get_attention, register_attention
    from tasks.attention.registry import _unregister
    from tasks.models.hf_attention import CapturedAttention

    calls: list[tuple[str, bool, bool]] = []
    math = get_attention("sdpa-math")

    def compute(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        where = torch.device(standin.device)
        assert all(t.device == where for t in (q, k, v)), [t.device for t in (q, k, v)]
        assert attn_mask is None or attn_mask.device == where
        calls.append((str(q.dtype), is_causal, attn_mask is not None))
        assert math.compute is not None
        return math.compute(q, k, v, attn_mask, is_causal, scale)

    standin = AttentionKernel(name="replay-device-standin", device="cpu", description="a test's stand-in",
                              logsumexp="sdpa-math's", compute=compute, algorithm="plain")
    register_attention(standin)
    try:
        records, _ = replayed
        rec = records[0]
        padded_mask = rec.mask.clone()
        padded_mask[0, :, :, 0] = torch.finfo(padded_mask.dtype).min  # prompt 0 has a padded first position
        padded_mask[0, :, 0, 0] = 0.0  # (which its first query still sees: no row is fully excluded)
        padded = CapturedAttention(rec.layer_index, rec.q, rec.k, rec.v, padded_mask, rec.scale)
        pairs = [[{"name": "replay-device-standin", "version": "1"}, {"name": "sdpa-math", "version": "1"}]]
        rows = ar.replay_attention([rec, padded], pairs, ["float32", "bfloat16"], {"replay-device-standin": "plain"})
    finally:
        _unregister("replay-device-standin")
    assert calls == [("torch.float32", True, False), ("torch.bfloat16", True, False),
                     ("torch.float32", False, True), ("torch.bfloat16", False, True)]
    assert [r["is_causal"] for r in rows] == [True] * 6 + [False] * 6
    # Computed by sdpa-math's own code on the same call: the pair is identical, and inside plain's bounds.
    pair_rows = [r for r in rows if r["comparison"] == "pair"]
    assert all(r["bitwise_equal"] and r["lse_differing"] == 0 for r in pair_rows)
    assert all(r["outside_bound"] == 0 for r in rows if r["impl_a"] == "replay-device-standin"
               and r["comparison"] == "reference")


# -- the certificate of an attention pair ---------------------------------------------------------------


def _arm(arm: str, attention: str, restart: int) -> dict[str, Any]:
    return {"unit_id": f"run-{arm}-{restart}", "experiment": "e2e", "arm": arm, "restart": restart, "model": "m",
            "engine": "cpu", "configured_kernel": "int8-cutlass-order", "scales": "real", "env_json": "{}",
            "host": "h", "pid": 1, "observed_kernels": ["int8-cutlass-order"], "kernel_calls_json": "{}",
            "evidence_ok": True, "weights_sha256": "w" * 64, "attention": attention}


def _seq(arm: str, restart: int, prompt: int, seq: str) -> dict[str, Any]:
    return {"unit_id": f"seq-{arm}-{restart}", "experiment": "e2e", "arm": arm, "restart": restart,
            "prompt_index": prompt, "prompt_hash": f"p{prompt}", "sequence_hash": seq, "n_tokens": 3, "tokens": [1, 2]}


@pytest.fixture(scope="module")
def attention_certs(tmp_path_factory: pytest.TempPathFactory,
                    replayed: tuple[list[Any], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("attn-cert") / "results"
    store = ResultStore(root)
    _, rows = replayed
    store.write("attention_replay", "s", "replay", [{**r, "unit_id": "replay", "experiment": "attn", "model": "m"}
                                                    for r in rows])
    store.write("arm_runs", "s", "runs", [_arm(a, att, r) for a, att in (("math", "sdpa-math"),
                                                                         ("flash", "sdpa-flash-cpu")) for r in (0, 1)])
    seqs = [_seq(a, r, p, f"s{p}" if (a, p) != ("flash", 2) else "other") for a in ("math", "flash")
            for r in (0, 1) for p in range(4)]
    store.write("sequences", "s", "seqs", seqs)
    tf = [{"unit_id": "tf", "experiment": "e2e", "ref_arm": "math", "ref_restart": 0, "arm": "flash",
           "prompt_index": i % 4, "position": i, "ref_token": 1, "ref_argmax": 1, "ref_margin": 0.01 * i,
           "arm_argmax": 2 if i < 2 else 1, "arm_margin": 0.1, "flip": i < 2} for i in range(40)]
    store.write("teacher_forced", "s", "tf", tf)
    with open_catalog(root) as cat:
        return cf.certificates(cat, "s")


def test_an_attention_pair_gets_its_own_certificate(attention_certs: list[dict[str, Any]],
                                                    replayed: tuple[list[Any], list[dict[str, Any]]]) -> None:
    _, rows = replayed
    (cert,) = [c for c in attention_certs if c.get("swap") == "attention"]
    assert (cert["kernel_a"], cert["kernel_b"]) == ("sdpa-math", "sdpa-flash-cpu")
    assert not [c for c in attention_certs if c.get("swap") != "attention"]  # same GEMM kernel: no GEMM pair
    (sec,) = cert["scale_modes"]
    assert sec["scale_mode"] == "real" and sec["kdepth"]["status"] == "not run"
    pair32 = [r for r in rows if r["comparison"] == "pair" and r["dtype"] == "float32"]
    rp = sec["replay"]
    assert rp["layers"] == 4 and rp["identical_layers"] == sum(r["bitwise_equal"] for r in pair32)
    assert rp["differing"] == sum(r["differing"] for r in pair32) and rp["max_spacing"] == max(
        r["max_spacing"] for r in pair32)
    (pair,) = sec["end_to_end"]["arm_pairs"]
    assert (pair["identical"], pair["total"]) == (3, 4)
    assert pair["flips"][0]["flips"] == 2 and pair["flips"][0]["positions"] == 40
    assert [d["dtype"] for d in cert["attention_replay"]] == ["bfloat16", "float32"]
    assert cert["provenance"]["gemm_kernels"] == ["int8-cutlass-order"]
    assert cert["checks_a"] == cert["checks_b"] == {"bounds": "WITHIN_ALGORITHM_BOUND"}
    assert cert["algorithms"] == {"sdpa-math": "plain", "sdpa-flash-cpu": "flash-cpu"}
    # Not identical, beyond one spacing, both kernels within their algorithms' bounds:
    assert rp["max_spacing"] > 1 and cert["verdict"] == "WITHIN_ALGORITHM_BOUND"
    assert "sdpa-flash-cpu" in cert["answer"] and f"max {rp['max_spacing_significant']} sp in the normal range" in cert["answer"]
    assert "the verdict's reason: sdpa-flash-cpu within the bounds of flash-cpu" in cert["answer"]
    assert cf.evidence_rows(cert)[0]["sequences identical"] == "flash~math 3/4"
