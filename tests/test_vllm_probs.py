"""probs_diff and k3 on vLLM arms (issue #27): the reference side recorded by the reference arm's own
generate unit, the arm's side from its scoring pass, and the reports over rows without the KL.

vLLM does not run here: the pure functions are checked against the CPU's
:func:`tasks.kinds.teacher_forced.distribution_arrays` on the same logits, bit for bit; the whole
path (generate unit -> Parquet -> teacher_forced unit) runs against the fake ``vllm`` package of
tests/test_vllm_engine_fake.py (wired like vLLM 0.32: ``compute_logits``, ``Logprob`` dicts,
``prompt_logprobs``); the report reads a Parquet tree written with the project's writers through
real DuckDB. ``test_gpu_vllm_probs_end_to_end`` runs the real thing on a GPU.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections import namedtuple
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from orchestrator.worker import UnitFiles, unit_table
from reports import divergence as dv
from reports import divergence_tables as dt
from storage.catalog import open_catalog
from storage.schemas import TABLES
from storage.store import ResultStore
from tasks.kinds import generate
from tasks.kinds import teacher_forced as tf
from tasks.models.predictions import ScoreResult
from tasks.models.vllm_rows import (
    TEACHER_FORCED_LOGPROB,
    VllmEngineError,
    assemble_logits,
    generated_logprobs,
    generation_from_outputs,
    target_logprobs,
    token_logprobs,
)
from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed

Logprob = namedtuple("Logprob", "logprob rank decoded_token")
Completion = namedtuple("Completion", "token_ids logprobs")
RequestOutput = namedtuple("RequestOutput", "prompt_token_ids outputs prompt_logprobs")


def bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float64)).view(np.uint64)


def _logits(rows: int, vocab: int = 97, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=g) * 4).to(torch.float32)


# --- the pure functions ---------------------------------------------------------------------------------------------

def test_logprobs_and_k3_equal_the_cpu_distribution_arrays_bit_for_bit() -> None:
    """p_ref, p_arm and k3 from two separately computed log-probabilities (the vLLM path: each arm in
    its own process) are the bits distribution_arrays computes from both logits at once (the CPU path)."""
    ref, arm = _logits(40, seed=1), _logits(40, seed=1)
    arm[::3] += _logits(40, seed=2)[::3] * 1e-3  # some positions differ, others are identical
    tokens = torch.argmax(ref, dim=-1).numpy()
    tokens[5] = 3  # a non-argmax reference token too
    want = tf.distribution_arrays(ref, arm, tokens)
    got = tf.k3_from_logprobs(token_logprobs(ref, tokens), token_logprobs(arm, tokens))
    for c in ("ref_token_prob_ref", "ref_token_prob_arm", "k3_ref_arm"):
        assert np.array_equal(bits(got[c]), bits(want[c])), c
    same = np.arange(40) % 3 != 0
    assert (got["k3_ref_arm"][same] == 0).all() and (got["k3_ref_arm"][~same] > 0).all()  # k3 >= 0, 0 iff equal
    # bfloat16 logits (what vLLM's compute_logits may return) are widened the same way
    # (through k3_from_logprobs' torch exp, as the vLLM path does: numpy's exp differs from torch's by an
    # ulp on some inputs on AVX2, where torch's vectorised exp is another code path)
    got16 = tf.k3_from_logprobs(*[token_logprobs(ref.to(torch.bfloat16), tokens)] * 2)["ref_token_prob_ref"]
    want16 = tf.distribution_arrays(ref.to(torch.bfloat16), ref.to(torch.bfloat16), tokens)["ref_token_prob_ref"]
    assert np.array_equal(bits(got16), bits(want16))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_logprobs(ref, np.full(40, 97))


def test_generate_path_assembles_each_generated_tokens_logprob_from_request_output_and_captured_logits() -> None:
    """What the reference arm's generate unit records: its RequestOutput (decoding) and the captured
    teacher-forced logits of prompt + generated tokens (compute_logits: the prompt rows and the sampled
    row, in either order) give, per generated position, log softmax(logits[len(prompt) - 1 + p])[token p]."""
    prompts = [[5, 6, 7], [8, 9]]
    full = [_logits(len(p) + 4, seed=10 + i) for i, p in enumerate(prompts)]
    generated = [[int(torch.argmax(lg[len(p) - 1 + t])) for t in range(4)] for p, lg in zip(prompts, full, strict=True)]

    def entry(row: torch.Tensor, tok: int) -> dict[int, Logprob]:
        vals, ids = torch.topk(row, 3)
        d = {int(i): Logprob(float(v), r + 1, None) for r, (v, i) in enumerate(zip(vals, ids, strict=True))}
        d.setdefault(tok, Logprob(float(row[tok]), 0, None))
        return d

    outs = [RequestOutput(p, [Completion(g, [entry(lg[len(p) - 1 + t], g[t]) for t in range(len(g))])], None)
            for p, g, lg in zip(prompts, generated, full, strict=True)]
    gen = generation_from_outputs(prompts, outs, top_k=2)
    assert gen.info["argmax_mismatches"] == 0
    per_sequence = []
    for p, g, lg in zip(prompts, gen.tokens, full, strict=True):
        seq = p + g
        n = len(seq)
        # teacher-forced replay of the sequence: vLLM computes the n - 1 prompt rows and the sampled row
        last = lg[-1:].clone()
        captured = [last, lg[:-1].clone()]
        assembled = assemble_logits(captured, n, int(torch.argmax(last[0])))
        assert torch.equal(assembled, lg)
        per_sequence.append(target_logprobs(assembled, seq))
    got = generated_logprobs(gen.prompts, gen.tokens, per_sequence)
    for p, g, lg, lp in zip(prompts, generated, full, got, strict=True):
        f = len(p) - 1
        want = tf.distribution_arrays(lg[f: f + len(g)], lg[f: f + len(g)], g)["ref_token_prob_ref"]
        assert np.array_equal(bits(np.exp(lp)), bits(want)) and len(lp) == 4
    assert math.isnan(per_sequence[0][-1])  # the last position predicts nothing
    seq0 = prompts[0] + gen.tokens[0]
    from_prompt_end = target_logprobs(full[0], seq0, start=len(prompts[0]) - 1)  # what the units ask for
    assert np.isnan(from_prompt_end[: len(prompts[0]) - 1]).all()
    assert np.array_equal(bits(from_prompt_end[len(prompts[0]) - 1: -1]), bits(per_sequence[0][len(prompts[0]) - 1: -1]))
    with pytest.raises(VllmEngineError, match="scored positions"):
        generated_logprobs(prompts, [g[:-1] for g in gen.tokens], per_sequence)


def _scores(sequences: list[list[int]], logits: list[torch.Tensor]) -> ScoreResult:
    from tasks.models.vllm_rows import score_from_logits

    return score_from_logits(sequences, logits, 2)


def test_vllm_table_joins_the_reference_decoding_with_the_arms_scores() -> None:
    """The teacher_forced rows of a vLLM unit: the reference's token and margin and recorded
    log-probability per (prompt, position), the arm's argmax, margin and log-probability at the score
    position predicting it; KL NULL; a position without a recorded log-probability NULL in all four."""
    prompts = [[1, 2, 3], [4, 5]]
    generated = [[7, 8, 9], [10, 11, 12]]
    sequences = [p + g for p, g in zip(prompts, generated, strict=True)]
    ref_logits = [_logits(len(s), seed=20 + i) for i, s in enumerate(sequences)]
    arm_logits = [lg + 0.01 * _logits(len(s), seed=30 + i) for i, (s, lg) in enumerate(zip(sequences, ref_logits, strict=True))]
    firsts = [len(p) - 1 for p in prompts]
    ref_lp = generated_logprobs(prompts, generated, [target_logprobs(lg, s) for s, lg in zip(sequences, ref_logits, strict=True)])
    decoded: tf.Decoding = {(i, p): (t, 0.5 + p, float(ref_lp[i][p])) for i, g in enumerate(generated) for p, t in enumerate(g)}
    decoded[(1, 2)] = (12, 2.5, None)  # not recorded there
    scores = _scores(sequences, arm_logits)
    arm_lp = [target_logprobs(lg, s) for s, lg in zip(sequences, arm_logits, strict=True)]
    table = tf.vllm_table("ref", "arm", generated, decoded, scores, arm_lp, firsts)
    declared = unit_table("teacher_forced", table, "u" * 20, "e")
    assert declared.schema.equals(TABLES["teacher_forced"]) and declared.num_rows == 6
    rows = table.to_pylist()
    assert [(r["prompt_index"], r["position"], r["ref_token"]) for r in rows] == \
        [(i, p, t) for i, g in enumerate(generated) for p, t in enumerate(g)]
    assert all(r["kl_ref_arm"] is None for r in rows)
    last = rows[-1]
    assert (last["ref_token_prob_ref"], last["ref_token_prob_arm"], last["k3_ref_arm"]) == (None, None, None)
    assert last["arm_argmax"] == int(scores.argmax[1][firsts[1] + 2]) and last["ref_margin"] == 2.5
    for r in rows[:-1]:
        i, p = r["prompt_index"], r["position"]
        f = firsts[i]
        want = tf.distribution_arrays(ref_logits[i][f + p: f + p + 1], arm_logits[i][f + p: f + p + 1], [generated[i][p]])
        for c in ("ref_token_prob_ref", "ref_token_prob_arm", "k3_ref_arm"):
            assert bits([r[c]])[0] == bits(want[c])[0], (i, p, c)
        assert r["arm_argmax"] == int(scores.argmax[i][f + p]) and r["arm_margin"] == float(scores.margins[i][f + p])
        assert r["flip"] == (r["ref_argmax"] != r["arm_argmax"]) and r["ref_argmax"] == generated[i][p]
    bad = dict(decoded)
    bad[(0, 1)] = (99, 0.0, 0.0)
    with pytest.raises(RuntimeError, match="other tokens"):
        tf.vllm_table("ref", "arm", generated, bad, scores, arm_lp, firsts)


def test_reference_decoding_reads_the_column_and_old_files_without_it(tmp_path: Path) -> None:
    """Real Parquet through the worker's unit context: a generations file with the column gives its
    values (NULL as None); one written before the column existed reads with every log-probability None."""
    store = ResultStore(tmp_path / "results")
    rows = [{"unit_id": "new", "experiment": "e", "arm": "a", "restart": 0, "prompt_index": 0, "position": p,
             "token": 10 + p, "margin": 1.0, "topk_ids": [10 + p], "topk_logits": [1.0],
             TEACHER_FORCED_LOGPROB: None if p == 2 else -0.25 * p} for p in range(3)]
    store.write("generations", "s", "new", rows)
    old_schema = pa.schema([f for f in TABLES["generations"] if f.name != TEACHER_FORCED_LOGPROB])
    old = pa.Table.from_pylist([{k: v for k, v in r.items() if k != TEACHER_FORCED_LOGPROB} | {"unit_id": "old"}
                                for r in rows], schema=old_schema)
    path = store.partition("generations", "s") / "old.parquet"
    pq.write_table(old, path)
    ctx = UnitFiles(store, "s", "tf")
    decoded, present = tf.reference_decoding(ctx, "new")
    assert present and decoded == {(0, 0): (10, 1.0, 0.0), (0, 1): (11, 1.0, -0.25), (0, 2): (12, 1.0, None)}
    decoded, present = tf.reference_decoding(ctx, "old")
    assert not present and decoded == {(0, p): (10 + p, 1.0, None) for p in range(3)}


# --- the whole path against the fake vLLM ---------------------------------------------------------------------------

@pytest.fixture
def gpu_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))


def _arm(name: str, kernel: str) -> dict[str, Any]:
    return {"name": name, "kernel": kernel, "params": {}, "version": "vllm", "scales": "real", "engine": "vllm", "env": {}}


def test_vllm_generate_then_teacher_forced_fill_probs_and_k3_and_leave_kl_null(
        monkeypatch: pytest.MonkeyPatch, gpu_torch: None, tmp_path: Path) -> None:
    """The reference arm's generate unit (restart 0) records each generated token's teacher-forced
    log-probability; the other arm's teacher_forced unit, in another engine, reads it from the Parquet
    and fills p_ref, p_arm and k3 -- the bits distribution_arrays gives on the two engines' logits --
    and leaves the KL NULL. Restart 1 records nothing."""
    import tasks.models.arms as arms
    import tasks.models.vllm_engine as ve
    from tests.test_vllm_engine_fake import _fake_vllm

    built: list[Any] = []
    original = arms.build_vllm_engine

    def build(params: dict[str, Any]) -> Any:
        monkeypatch.setattr(ve, "_PROCESS_ENGINES", [])  # each unit is its own process on a real runner
        built.append(original(params))
        if params["arm"]["name"] == "triton":  # the fake's two INT8 kernels agree on these shapes: make the arms differ
            g = torch.Generator().manual_seed(5)
            built[-1].module.lm += 0.05 * torch.randn(built[-1].module.lm.shape, generator=g)
        return built[-1]

    _fake_vllm(monkeypatch)
    monkeypatch.setattr(arms, "build_vllm_engine", build)
    prompts = [[1, 2, 3], [4, 5, 6, 7], [9, 10]]
    common = {"model": "/models/fake", "model_seed": 0, "prompts": {"tokens": prompts}, "max_new_tokens": 5,
              "top_k": 3}
    ref_arm, other = _arm("cutlass", "cutlass"), _arm("triton", "triton")
    store = ResultStore(tmp_path / "results")
    for restart in (0, 1):
        out = generate.run({**common, "arm": ref_arm, "restart": restart})
        for name in ("generations", "sequences", "arm_runs"):
            store.write(name, "s", f"ref-{restart}", unit_table(name, out[name], f"ref-{restart}", "e"))
        run = json.loads(out["arm_runs"][0]["kernel_calls_json"])["evidence"]
        if restart == 0:
            assert run["teacher_forced_replay"] == {"positions": 15, "argmax_differs_from_decoded": 0,
                                                    "column": f"generations.{TEACHER_FORCED_LOGPROB}"}
        else:
            assert "teacher_forced_replay" not in run
    ref_engine = built[0]
    got = store.read_unit("generations", "s", "ref-1", ["teacher_forced_token_logprob"])
    assert all(r[TEACHER_FORCED_LOGPROB] is None for r in got)

    params = {**common, "reference": {**ref_arm, "unit_id": "ref-0"}, "arm": other}
    table = tf.run(params, UnitFiles(store, "s", "tf"))["teacher_forced"]
    assert isinstance(table, pa.Table)
    arm_engine = built[-1]
    assert type(arm_engine.module.model.layers[0].mlp.down_proj.scheme.kernel).__name__.startswith("Triton")
    tokens = {r["prompt_index"]: list(r["tokens"]) for r in store.read_unit("sequences", "s", "ref-0")}
    cols = table.to_pydict()
    assert cols["kl_ref_arm"] == [None] * 15 and table.column("ref_token_prob_ref").null_count == 0
    at = 0
    for i, p in enumerate(prompts):
        g, seq = tokens[i], p + tokens[i]
        f = len(p) - 1
        with torch.no_grad():
            lr = ref_engine.module.compute_logits(ref_engine.module.hidden(seq))[f: f + len(g)]
            la = arm_engine.module.compute_logits(arm_engine.module.hidden(seq))[f: f + len(g)]
        want = tf.distribution_arrays(lr, la, g)
        for c in ("ref_token_prob_ref", "ref_token_prob_arm", "k3_ref_arm"):
            assert np.array_equal(bits(cols[c][at: at + len(g)]), bits(want[c])), (i, c)
        at += len(g)
    k3 = np.array(cols["k3_ref_arm"])
    assert (k3 >= 0).all() and (k3 > 0).any()  # the fake's peaked logits: k3 tiny, 0 where p = 1 in both


# --- the report over rows with probabilities and no KL --------------------------------------------------------------

def _write_report_tree(root: Path) -> None:
    """Sweep s: pair a -> v (vLLM-like: probabilities and k3, KL NULL) over 3 sequences of 4 positions,
    pair a -> c (CPU-like: all four) over the same positions."""
    store = ResultStore(root)
    for arm, with_kl in (("v", False), ("c", True)):
        rows = []
        for p in range(3):
            for i in range(4):
                lr, la = -0.1 * (i + 1), -0.1 * (i + 1) - 0.02 * (p + 1)
                log_r = la - lr
                rows.append({"unit_id": f"tf-{arm}", "experiment": "e", "ref_arm": "a", "ref_restart": 0, "arm": arm,
                             "prompt_index": p, "position": i, "ref_token": 10 * p + i, "ref_argmax": 10 * p + i,
                             "ref_margin": 1.0, "arm_argmax": 10 * p + i + (1 if i == 3 else 0), "arm_margin": 1.0,
                             "flip": i == 3, "ref_token_prob_ref": math.exp(lr), "ref_token_prob_arm": math.exp(la),
                             "k3_ref_arm": math.expm1(log_r) - log_r,
                             "kl_ref_arm": 0.001 * (p + 1) if with_kl else None})
        store.write("teacher_forced", "s", f"tf-{arm}", rows)


def test_report_shows_probs_diff_and_k3_without_kl_and_says_why(tmp_path: Path) -> None:
    root = tmp_path / "results"
    _write_report_tree(root)
    with open_catalog(root) as cat:
        dist = {p["arm"]: p for p in dv.distribution(cat, "s", resamples=200)}
        by_k3 = {p["arm"]: p for p in dv.distribution(cat, "s", gate_metric="k3", resamples=200)}
    files = sorted(str(f) for f in ResultStore(root).partition("teacher_forced", "s").glob("*.parquet"))
    ((pd_mean, pd_max, k3_mean, n),) = duckdb.connect().execute(f"""
        SELECT avg(abs(ref_token_prob_ref - ref_token_prob_arm)), max(abs(ref_token_prob_ref - ref_token_prob_arm)),
               avg(k3_ref_arm), count(*)
        FROM read_parquet({files!r}) WHERE arm = 'v' AND kl_ref_arm IS NULL""").fetchall()
    v, c = dist["v"], dist["c"]
    assert (v["positions"], v["measured_positions"], v["kl_positions"], n) == (12, 12, 0, 12)
    assert v["probs_diff"]["mean_per_position"] == pytest.approx(pd_mean) and v["probs_diff"]["max"] == pytest.approx(pd_max)
    assert v["k3"]["mean_per_position"] == pytest.approx(k3_mean) and v["k3"]["positions"] == 12
    lo, hi = v["k3"]["per_position"]["interval"]
    assert lo <= k3_mean <= hi
    assert "kl" not in v and v["kl_not_measured"].startswith("not measured (vLLM")
    assert v["gate"]["passed"] is None and v["gate"]["bound"] is None and "not evaluated" in v["gate"]["note"]
    assert v["gate"]["figure"] == "mismatch KL per position"
    # the CPU-like pair of the same sweep: the same probabilities, and its KL over its own positions
    assert c["probs_diff"]["mean_per_position"] == pytest.approx(pd_mean) and c["kl_positions"] == 12
    assert c["kl"]["mean_per_position"] == pytest.approx(0.002) and c["gate"]["passed"] is True
    # a gate on k3 reads k3, over the positions that measure it, and says so
    g = by_k3["v"]["gate"]
    assert (g["metric"], g["figure"], g["positions"]) == ("k3", "k3 KL per position", 12)
    assert g["mean"] == pytest.approx(k3_mean) and g["passed"] is (g["bound"] < 0.015)
    rep = {"distribution": list(dist.values())}
    rows = {r["pair"]: r for r in dt.distribution_rows(rep)}
    assert rows["a -> v"]["mismatch KL / position [95%]"] == "not measured (vLLM)"
    assert rows["a -> v"]["gate"].startswith("not evaluated: the mismatch KL per position is not measured on vLLM")
    assert rows["a -> c"]["gate"].startswith("PASS: mismatch KL per position") and "(12 positions)" in rows["a -> c"]["gate"]
    assert any(line.startswith("a -> v: mismatch KL not measured (vLLM") for line in dt.distribution_lines(rep))
    figures = dv.pair_figures({"first_divergence": [], "total_agreement": {"pairs": [], "answers": {"recorded": False}},
                               "distribution": list(dist.values()), "flip_buckets": []}, "a", "v")
    teacher = figures["teacher_forced"]
    assert len(teacher) == 1 and teacher[0]["kl_mean"] is None and teacher[0]["kl_note"].startswith("not measured")
    assert teacher[0]["k3_mean"] == pytest.approx(k3_mean)
    # ... and the certificate's evidence cells render it: probs_diff and k3, no KL number, no gate passed
    from reports.certificate import divergence_cells

    cells = divergence_cells([{"arm_a": "a", "arm_b": "v", "divergence": figures}])
    assert cells["probs_diff / k3 / KL per position [95%]"].startswith(f"a->v probs_diff {pd_mean:.3g}")
    assert "KL not measured (vLLM" in cells["probs_diff / k3 / KL per position [95%]"]
    assert cells["KL gate (|mean| + 2 SE)"] == "a->v not evaluated (kl not measured)"


# --- on a GPU ---------------------------------------------------------------------------------------------------------

GPU_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, ".")
    from orchestrator.worker import UnitFiles, unit_table
    from storage.store import ResultStore
    from tasks.kinds import generate, teacher_forced
    step, root, common, ref, arm = sys.argv[1], sys.argv[2], *map(json.loads, sys.argv[3:6])
    store = ResultStore(root)
    if step == "generate":
        out = generate.run({**common, "arm": ref, "restart": 0})
        for t in ("generations", "sequences", "arm_runs"):
            store.write(t, "s", "ref", unit_table(t, out[t], "ref", "e").to_pylist())
    else:
        table = teacher_forced.run({**common, "reference": {**ref, "unit_id": "ref"}, "arm": arm}, UnitFiles(store, "s", "tf"))
        store.write("teacher_forced", "s", "tf-" + arm["name"], unit_table("teacher_forced", table["teacher_forced"], "tf", "e"))
""")


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_vllm_probs_end_to_end(tmp_path: Path) -> None:
    """On a GPU with vLLM: the reference arm (CUTLASS) generates and records its log-probabilities in one
    process; the Triton arm and a second CUTLASS arm score its sequences each in its own process. Both
    fill p_ref, p_arm and k3 (KL NULL); the CUTLASS arm, the same computation in another process, gives
    k3 = 0 and p_arm = p_ref exactly at every position."""
    from tasks.devices import cuda_reason, vllm_reason

    missing = "; ".join(r for r in (cuda_reason(), vllm_reason()) if r)
    if missing:
        pytest.skip(f"needs CUDA and vLLM 0.29-0.32: {missing}")
    from tasks.models import build_model, save_compressed

    ckpt = tmp_path / "tiny-qwen3-w8a8"
    save_compressed(build_model("tiny-qwen3"), ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(cfg, indent=2))
    common = {"model": str(ckpt), "model_seed": 0, "prompts": {"tokens": [[11, 12, 13, 14], [21, 22, 23]]},
              "max_new_tokens": 12, "top_k": 5}
    ref = _arm("cutlass", "cutlass")
    root = tmp_path / "results"
    for step, arm in (("generate", ref), ("tf", _arm("triton", "triton")), ("tf", _arm("cutlass-again", "cutlass"))):
        res = subprocess.run([sys.executable, "-c", GPU_SCRIPT, step, str(root), json.dumps(common), json.dumps(ref),
                              json.dumps(arm)], cwd=REPO, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-4000:]
    store = ResultStore(root)
    gens = store.read_unit("generations", "s", "ref")
    assert len(gens) == 24 and all(r[TEACHER_FORCED_LOGPROB] is not None and r[TEACHER_FORCED_LOGPROB] <= 0 for r in gens)
    tri = store.read_unit("teacher_forced", "s", "tf-triton")
    same = store.read_unit("teacher_forced", "s", "tf-cutlass-again")
    for rows in (tri, same):
        assert len(rows) == 24 and all(r["kl_ref_arm"] is None for r in rows)
        assert all(0 < r["ref_token_prob_ref"] <= 1 and 0 < r["ref_token_prob_arm"] <= 1 and r["k3_ref_arm"] >= 0
                   for r in rows)
    assert all(r["k3_ref_arm"] == 0 and r["ref_token_prob_ref"] == r["ref_token_prob_arm"] for r in same)
