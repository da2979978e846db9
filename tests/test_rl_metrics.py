"""The RL-metric semantics probe (issue #41): null controls exact, aggregation and KL direction on
planted cases, raw vs processed log-probabilities detected on the CPU engine, the vLLM path on
RequestOutput-shaped objects, ``swapcheck check rl-metrics`` exit codes, and the report's line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tasks.models import rl_probe
from tasks.numerics import rl_metrics as m
from tasks.numerics.rl_metrics import Sampling
from tasks.verdicts import Verdict


def bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]).numpy()


# --- null controls ---------------------------------------------------------------------------------------------------

def test_null_controls_are_exact_in_every_dtype_with_masked_tokens() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(32, 101, generator=g, dtype=torch.float64) * 5
    lp = torch.log_softmax(logits, -1).masked_fill(logits < -5, float("-inf"))
    assert torch.isinf(lp).any()
    rows = m.null_controls(lp)
    assert {r["dtype"] for r in rows} == set(m.NULL_DTYPES)
    assert {r["figure"] for r in rows} == {"importance_ratio", "k1", "k2", "k3", "kl_exact"}
    assert all(r["bad"] == 0 and r["values"] > 0 for r in rows), [r for r in rows if r["bad"]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=-1e4, max_value=0, allow_nan=False), min_size=1, max_size=40),
       st.sampled_from(m.NULL_DTYPES))
def test_identical_logprobs_give_ratio_one_and_zero_kl_bit_for_bit(values: list[float], dtype: str) -> None:
    a = torch.tensor(values, dtype=torch.float64).to(getattr(torch, dtype))
    b = a.clone()
    one, zero = torch.ones_like(a), torch.zeros_like(a)
    assert np.array_equal(bits(m.importance_ratio(a, b)), bits(one))
    for f in (m.k1, m.k2, m.k3):
        assert np.array_equal(bits(f(a, b)), bits(zero)), f.__name__  # +0, not -0


def test_a_null_control_that_is_not_exact_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    # the defect RL code has: log r as a plain difference, NaN where both sides masked a token
    monkeypatch.setattr(m, "log_ratio", lambda p, q: torch.as_tensor(p) - torch.as_tensor(q))
    lp = torch.tensor([[0.0, float("-inf")], [math.log(0.5), math.log(0.5)]], dtype=torch.float64)
    bad = [r for r in m.null_controls(lp) if r["bad"]]
    assert {r["figure"] for r in bad} == {"importance_ratio", "k1", "k2", "k3"}
    assert all(r["bad"] == 1 and math.isnan(r["worst"]) for r in bad)
    res = rl_probe.ProbeResult("planted", [dict(r, source="planted") for r in m.null_controls(lp)], [], "raw",
                               Verdict.IDENTICAL)
    assert res.verdict is Verdict.INCORRECT and not res.passed
    assert "FAILED planted float64 k3: 1 of 4 values are not 0 (e.g. nan)" in res.text()


# --- the formulas, their direction and their aggregation -------------------------------------------------------------

def test_kl_direction_is_asymmetric_and_k_estimators_estimate_the_sampler_first() -> None:
    q = torch.tensor([0.9, 0.1], dtype=torch.float64)  # the sampler
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    lq, lp = q.log(), p.log()
    kl_qp = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    kl_pq = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert float(m.kl_exact(lq, lp)) == pytest.approx(kl_qp, rel=1e-15)
    assert float(m.kl_exact(lp, lq)) == pytest.approx(kl_pq, rel=1e-15)
    assert kl_pq - kl_qp > 0.14  # 0.5108 vs 0.3681 nats: the direction is no detail
    # E_{x~q}[k] over both tokens, weighted by q: k1 and k3 give KL(q || p) exactly, not KL(p || q)
    for k in (m.k1, m.k3):
        assert float((q * k(lp, lq)).sum()) == pytest.approx(kl_qp, rel=1e-12), k.__name__
    assert float((q * m.k2(lp, lq)).sum()) != pytest.approx(kl_qp, rel=1e-3)  # k2 is biased
    assert float(m.importance_ratio(lp, lq)[0]) == pytest.approx(0.5 / 0.9)


def test_sum_vs_mean_on_a_planted_case() -> None:
    # two sequences of 1 and 4 tokens; per-token k3 values chosen by hand
    v = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1], dtype=torch.float64)
    assert m.aggregate(v, [1, 4], "token-mean") == pytest.approx(0.9 / 5)
    assert m.aggregate(v, [1, 4], "sequence-mean") == pytest.approx((0.5 + 0.1) / 2)
    assert m.aggregate(v, [1, 4], "sequence-sum") == pytest.approx((0.5 + 0.4) / 2)
    with pytest.raises(ValueError, match="one of token-mean"):
        m.aggregate(v, [1, 4], "mean")
    with pytest.raises(ValueError, match="summing to 4"):
        m.aggregate(v, [1, 3], "token-mean")


def test_the_ratio_aggregated_three_ways_from_bit_identical_tokens() -> None:
    # trl #5814's shape: the same per-token log-ratios, a sequence-level ratio far from the token mean
    lengths = [20, 200]
    lr = torch.full((220,), -0.01, dtype=torch.float64)
    got = m.sequence_ratios(lr, torch.zeros_like(lr), lengths)
    assert got["token_mean"] == pytest.approx(math.exp(-0.01), rel=1e-14)
    assert got["sequence_geometric"] == pytest.approx(math.exp(-0.01), rel=1e-14)
    assert got["sequence"] == pytest.approx((math.exp(-0.2) + math.exp(-2.0)) / 2, rel=1e-12)
    assert got["sequence"] < 0.5 < 0.99 < got["token_mean"]


def _processed_oracle(logits: list[float], s: Sampling) -> list[float]:
    """Plain-Python sampler distribution: temperature, top-k (ties kept), top-p (mass before < p)."""
    z = [x / s.temperature for x in logits]
    keep = set(range(len(z)))
    if 0 < s.top_k < len(z):
        kth = sorted(z, reverse=True)[s.top_k - 1]
        keep = {i for i in keep if z[i] >= kth}
    if s.top_p < 1:
        mx = max(z[i] for i in keep)
        w = {i: math.exp(z[i] - mx) for i in keep}
        tot = sum(w.values())
        order = sorted(keep, key=lambda i: (-w[i], i))
        mass, kept = 0.0, set()
        for i in order:
            if kept and mass >= s.top_p:
                break
            kept.add(i)
            mass += w[i] / tot
        keep = kept
    mx = max(z[i] for i in keep)
    lse = mx + math.log(sum(math.exp(z[i] - mx) for i in keep))
    return [z[i] - lse if i in keep else -math.inf for i in range(len(z))]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(min_value=-8, max_value=8, allow_nan=False), min_size=2, max_size=12, unique=True),
       st.sampled_from([0.5, 0.7, 1.0, 1.3]), st.sampled_from([1.0, 0.95, 0.8, 0.5]), st.sampled_from([0, 1, 3, 5]))
def test_processed_logprobs_match_a_plain_python_sampler(logits: list[float], t: float, p: float, k: int) -> None:
    s = Sampling(t, p, k)
    got = m.processed_logprobs(torch.tensor([logits], dtype=torch.float64), s)[0].tolist()
    want = _processed_oracle(logits, s)
    # the kept set may differ only where the mass before a token ties p to rounding: skip such draws
    if [math.isinf(x) for x in got] != [math.isinf(x) for x in want]:
        return
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert math.isclose(sum(math.exp(x) for x in got), 1.0, rel_tol=1e-12)


def test_neutral_sampling_is_raw() -> None:
    x = torch.randn(4, 30, dtype=torch.float64)
    assert Sampling().neutral
    assert np.array_equal(bits(m.processed_logprobs(x, Sampling())), bits(m.raw_logprobs(x)))
    with pytest.raises(ValueError, match="greedy"):
        m.processed_logprobs(x, Sampling(temperature=0))


def test_teacher_forced_columns_are_these_formulas_bit_for_bit() -> None:
    from tasks.kinds import teacher_forced as tf

    g = torch.Generator().manual_seed(1)
    ref = torch.randn(9, 64, generator=g)
    arm = ref + 1e-4 * torch.randn(9, 64, generator=g)
    tok = np.arange(9) * 7
    got = tf.distribution_arrays(ref, arm, tok)
    lq, lp = m.raw_logprobs(ref), m.raw_logprobs(arm)
    tq, tp = m.token_logprobs(lq, tok), m.token_logprobs(lp, tok)
    assert np.array_equal(got["k3_ref_arm"].view(np.int64), bits(m.k3(tp, tq)))
    assert np.array_equal(got["kl_ref_arm"].view(np.int64), bits(m.kl_exact(lq, lp)))
    same = tf.distribution_arrays(ref, ref.clone(), tok)  # the null control through the kind's own path
    assert (same["k3_ref_arm"] == 0).all() and (same["kl_ref_arm"] == 0).all()
    assert np.array_equal(same["ref_token_prob_ref"], same["ref_token_prob_arm"])


# --- raw vs processed on the CPU engine ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine() -> Any:
    from tasks.models import build_model

    return build_model("tiny-qwen3", kernel="int8-cutlass-order", seed=0)


PROMPTS = [[5, 17, 3, 9], [40, 2, 77]]
PROBED = (Sampling(temperature=0.7), Sampling(top_p=0.9), Sampling(top_k=20), Sampling(0.7, 0.9, 20))


def test_the_cpu_engine_returns_raw_logprobs_under_every_setting(engine: Any) -> None:
    got = rl_probe.cpu_logprobs(engine, PROMPTS, 6)
    assert got["lengths"] == [6, 6] and got["logits"].shape == (12, 1024)
    rows = [rl_probe.classify(got["returned"], got["logits"], got["tokens"], s) for s in PROBED]
    assert [r["semantics"] for r in rows] == ["raw"] * 4
    assert all(r["max_gap_raw"] == 0 and r["max_gap_processed"] > 0.01 for r in rows)
    assert rl_probe.conclude(rows) == ("raw", Verdict.IDENTICAL)
    neutral = rl_probe.classify(got["returned"], got["logits"], got["tokens"], Sampling())
    assert neutral["semantics"] == "indistinguishable"
    # the report's statement about the CPU engine is what the probe measures
    from reports.divergence import LOGPROB_SEMANTICS

    assert LOGPROB_SEMANTICS["cpu"][0] == rl_probe.conclude(rows)[0]


class ProcessedEngine:
    """The CPU engine behind a sampler that returns processed logits (as vLLM's processed_logits mode
    would): every logit of the decode pass divided by T and masked by top-k/top-p."""

    def __init__(self, model: Any, sampling: Sampling) -> None:
        self.model, self.sampling = model, sampling

    def forward_tokens(self, prompts: list[list[int]]) -> torch.Tensor:
        return self.model.forward_tokens(prompts)  # type: ignore[no-any-return]

    def generate(self, prompts: list[list[int]], max_new_tokens: int, top_k: int = 5) -> Any:
        gen = self.model.generate(prompts, max_new_tokens, top_k=top_k)
        out = []
        for ids, vals in zip(gen.topk_ids, gen.topk_logits, strict=True):
            ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64))
            full = torch.empty(ids_t.shape, dtype=torch.float64).scatter(
                1, ids_t, torch.as_tensor(np.asarray(vals, dtype=np.float64)))
            proc = m.processed_logprobs(full, self.sampling)  # log-probs are logits up to a shift
            out.append(proc.gather(1, ids_t).numpy())
        return SimpleNamespace(tokens=gen.tokens, topk_ids=gen.topk_ids, topk_logits=out)


def test_a_processed_engine_is_detected_as_processed(engine: Any) -> None:
    s = Sampling(0.7, 0.9, 20)
    got = rl_probe.cpu_logprobs(ProcessedEngine(engine, s), PROMPTS, 6)
    # log_softmax of already normalised log-probabilities rounds: match within 1e-12, not bit for bit
    rows = [rl_probe.classify(got["returned"], got["logits"], got["tokens"], x, atol=1e-12)
            for x in (s, Sampling(temperature=0.7))]
    assert [r["semantics"] for r in rows] == ["processed", "neither"]
    assert rows[0]["max_gap_processed"] <= 1e-12 and rows[0]["max_gap_raw"] > 0.01
    assert rl_probe.conclude(rows[:1]) == ("processed (temperature 0.7, top-p 0.9, top-k 20)", Verdict.IDENTICAL)
    text, verdict = rl_probe.conclude(rows)
    assert verdict is Verdict.INCONCLUSIVE and text == "neither raw nor processed under temperature 0.7"


def test_conclude_refuses_mixed_or_undecided_engines() -> None:
    row = {"setting": "temperature 0.7"}
    assert rl_probe.conclude([dict(row, semantics="raw"), dict(row, semantics="processed")])[1] is Verdict.INCONCLUSIVE
    assert rl_probe.conclude([dict(row, semantics="indistinguishable")])[0].startswith("undetermined")


# --- the vLLM path, on RequestOutput-shaped objects (no vLLM needed) ----------------------------------------------

def _vllm_outputs(logits: torch.Tensor, prompt: list[int], tokens: list[int], returned: torch.Tensor) -> tuple[Any, Any]:
    lp = m.raw_logprobs(logits)
    gen = SimpleNamespace(prompt_token_ids=prompt, outputs=[SimpleNamespace(
        token_ids=tokens, logprobs=[{t: SimpleNamespace(logprob=float(returned[i]))} for i, t in enumerate(tokens)])])
    seq = [*prompt, *tokens]
    prompt_lps: list[Any] = [None] * len(seq)
    for i in range(len(tokens)):  # entry n_prompt + i scores token n_prompt + i from the rows before it
        prompt_lps[len(prompt) + i] = {v: SimpleNamespace(logprob=float(lp[i, v])) for v in range(lp.shape[1])}
    return gen, SimpleNamespace(prompt_token_ids=seq, prompt_logprobs=prompt_lps)


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_vllm_outputs_are_classified_by_their_logprobs_mode(mode: str) -> None:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(5, 40, generator=g, dtype=torch.float64) * 3
    s = Sampling(0.8, 0.9, 10)
    tokens = [int(t) for t in logits.argmax(-1)]
    src = m.raw_logprobs(logits) if mode == "raw_logprobs" else m.processed_logprobs(logits, s)
    returned = m.token_logprobs(src, tokens) + 2e-4 * torch.randn(5, generator=g, dtype=torch.float64)  # decode != prefill
    gen, sc = _vllm_outputs(logits, [1, 2, 3], tokens, returned)
    row = rl_probe.from_vllm_outputs([gen], [sc], s)
    assert row["semantics"] == mode.removesuffix("_logprobs") and row["positions"] == 5


@pytest.mark.gpu
def test_gpu_vllm_default_logprobs_mode_is_raw() -> None:  # pragma: no cover - needs CUDA and vLLM
    vllm = pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from tasks.models.arms import vllm_model

    llm = vllm.LLM(vllm_model("answer-qwen3"), max_logprobs=-1, enforce_eager=True, seed=0)
    rows = [rl_probe.vllm_logprobs(llm, [[1, 8, 7, 6, 3, 14, 13, 14, 4]], s, 4) for s in PROBED]
    assert rl_probe.conclude(rows)[0] == "raw"  # vLLM's default logprobs_mode is raw_logprobs


# --- the command and the report ------------------------------------------------------------------------------------

def test_check_rl_metrics_command() -> None:
    from orchestrator.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["check", "rl-metrics", "--prompts", "2", "--max-new-tokens", "4", "--top-k", "20",
                              "--format", "json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert (obj["verdict"], obj["engine_logprobs"]) == ("IDENTICAL", "raw")
    assert [s["setting"] for s in obj["settings"]] == ["temperature 1, top-k 20"]
    assert obj["pair"]["report_divergence_uses"]["k3"] == "token-mean"
    assert set(obj["pair"]["importance_ratio"]) == {"token_mean", "sequence", "sequence_geometric"}
    assert runner.invoke(app, ["check", "rl-metrics", "--top-p", "0"]).exit_code == 2
    assert runner.invoke(app, ["check", "rl-metrics", "--kernel", "no-such-kernel"]).exit_code == 2


def test_check_rl_metrics_exits_1_when_a_null_control_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli.main import app

    monkeypatch.setattr(m, "log_ratio", lambda p, q: torch.as_tensor(p) - torch.as_tensor(q))
    res = CliRunner().invoke(app, ["check", "rl-metrics", "--prompts", "1", "--max-new-tokens", "2",
                                   "--arm-kernel", "none", "--temperature", "0.7"])
    assert res.exit_code == 1, res.output
    assert "FAILED planted" in res.output and "verdict: INCORRECT (FAIL)" in res.output


@pytest.mark.usefixtures("ledgered_writes")
def test_report_divergence_says_what_the_logprobs_are(tmp_path: Path) -> None:
    from reports import divergence as dv
    from reports import divergence_tables as dt
    from storage.catalog import open_catalog
    from storage.store import ResultStore

    store = ResultStore(tmp_path)
    for arm, engine in (("a", "cpu"), ("c", "cpu"), ("v", "vllm")):
        store.write("arm_runs", "s", f"g-{arm}", [{
            "unit_id": f"g-{arm}", "experiment": "e", "arm": arm, "restart": 0, "model": "tiny-qwen3", "engine": engine,
            "configured_kernel": "int8-cutlass-order", "scales": "real", "env_json": "{}", "host": "h", "pid": 1,
            "observed_kernels": [], "kernel_calls_json": "{}", "evidence_ok": True, "weights_sha256": "w"}])
    for arm in ("c", "v"):
        store.write("teacher_forced", "s", f"tf-{arm}", [{
            "unit_id": f"tf-{arm}", "experiment": "e", "ref_arm": "a", "ref_restart": 0, "arm": arm, "prompt_index": p,
            "position": 0, "ref_token": 3, "ref_argmax": 3, "ref_margin": 1.0, "arm_argmax": 3, "arm_margin": 1.0,
            "flip": False, "ref_token_prob_ref": 0.5, "ref_token_prob_arm": 0.5, "k3_ref_arm": 0.0,
            "kl_ref_arm": 0.0 if arm == "c" else None} for p in range(3)])
    with open_catalog(tmp_path) as cat:
        rep = {"distribution": dv.distribution(cat, "s", resamples=50)}
    by = {p["arm"]: p["logprobs"] for p in rep["distribution"]}
    assert (by["c"]["ref_arm"]["engine"], by["c"]["arm"]["semantics"], by["v"]["arm"]["engine"]) == ("cpu", "raw", "vllm")
    lines = dt.distribution_lines(rep)
    assert any(line.startswith("a -> c: engine logprobs: raw on both arms (log_softmax in float64 of the CPU engine")
               for line in lines)
    assert any(line.startswith("a -> v: engine logprobs: raw on both arms") and "raw_logits" in line for line in lines)
    unknown = dv.logprob_semantics({"a": "cpu", "x": "sglang"}, "a", "x")
    assert unknown["line"] == "engine logprobs: not determined for x (engine 'sglang')"
