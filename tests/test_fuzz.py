"""``check fuzz`` and ``check replay`` (issue 16, item 3): the fuzzer finds what fixed shapes miss.

The planted kernels of ``_fuzz_planted`` are wrong only at one kind of edge (N % 16 != 0, M > 64,
K beyond a split point).  The fixed-shape checks of ``sweeps/demo.toml`` (and the harness's default
shapes) pass every one of them; the fuzzer catches each within a short budget, shrinks the failure
and saves an artifact that replays byte for byte.  Correct CPU kernels fuzz clean.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from _fuzz_planted import PLANTED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from orchestrator.cli.check_fuzz import parse_budget
from orchestrator.cli.main import app
from orchestrator.errors import UsageError
from tasks.checks import DEFAULT_SHAPES, load_subject, run_bounds, run_exact_match
from tasks.checks.artifact import ArtifactError, load_artifact, replay, save_artifact, tensor_bytes
from tasks.checks.fuzz import (
    INT8_NO_OVERFLOW_K,
    MAX_M,
    MAX_WORK,
    FuzzSettings,
    draw_operands,
    fuzz,
    plan_trial,
    run_check,
)
from tasks.verdicts import Verdict

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
#: The budget the tests give the fuzzer (the CLI's default is 60 s); each planted defect is found
#: well within it (the trial that finds it is fixed by the seed; the budget only caps the time).
BUDGET_S = 20.0

#: What each planted defect needs of the shrunk shape (M, K, N) that still fails.
CONDITION = {
    "n_tail_pair_store": lambda m, k, n: n % 16 >= 2,
    "large_m_ftz": lambda m, k, n: m > 64,
    "split_k_tail": lambda m, k, n: k > 1024 and k % 1024 >= 2,
}


def _demo_shapes() -> list[tuple[int, int, int]]:
    spec = tomllib.loads((REPO / "sweeps" / "demo.toml").read_text())
    shapes = {tuple(s) for name in ("exact-match", "bounds") for s in spec["experiments"][name]["shapes"]}
    return sorted(shapes | set(DEFAULT_SHAPES))


def test_plans_are_deterministic_and_reach_the_edges() -> None:
    plans = [plan_trial(7, i, "int8") for i in range(600)]
    assert plans == [plan_trial(7, i, "int8") for i in range(600)]
    assert [plan_trial(8, i, "int8") for i in range(20)] != plans[:20]
    normal = [p for p in plans if p.recipe != "int32-edge"]
    assert all(p.m * p.k * p.n <= MAX_WORK and 1 <= p.m <= MAX_M for p in normal)
    assert any(p.m == 1 for p in plans) and any(p.m > 128 for p in plans)
    assert any(p.n % 16 not in (0,) for p in plans) and any(p.n % 16 == 0 for p in plans)
    edges = {16 * j + d for j in range(1, 300) for d in (-1, 1)}
    assert sum(p.k in edges for p in plans) > 100  # K at tile boundaries +- 1, often
    assert {p.recipe for p in plans} == {"randn", "outliers-k", "mixed-rows", "ties", "subnormal", "int32-edge"}
    assert {p.scales for p in plans} == {"pow2", "nonpow2", "unit", "tiny"}
    assert all(INT8_NO_OVERFLOW_K - 2048 <= p.k <= INT8_NO_OVERFLOW_K for p in plans if p.recipe == "int32-edge")
    plain = {plan_trial(7, i, None).recipe for i in range(300)}
    assert "int32-edge" not in plain and {plan_trial(7, i, None).scales for i in range(50)} == {"none"}


def test_a_trial_draws_the_same_operands_for_the_same_seed_and_index() -> None:
    s = load_subject("int8-cutlass-order")
    plan = plan_trial(3, 5, "int8")
    one = run_check(s, "bounds", plan, 3, FuzzSettings())
    two = run_check(s, "bounds", plan, 3, FuzzSettings())
    assert one.scale_b is not None and two.scale_b is not None
    assert torch.equal(one.a, two.a) and torch.equal(one.b, two.b) and torch.equal(one.scale_b, two.scale_b)
    assert tensor_bytes(one.judged.output) == tensor_bytes(two.judged.output)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), index=st.integers(0, 10**6), operands=st.sampled_from(["int8", "fp8_e4m3"]))
def test_scaled_operands_times_scales_are_exact_in_fp32(seed: int, index: int, operands: str) -> None:
    """The bounds check runs its algorithm on ``a * scale_a`` and ``b * scale_b`` in fp32: every scale
    kind (non-powers of two included) must keep those products exact, or the bound is not exact."""
    s = load_subject("int8-cutlass-order" if operands == "int8" else "fp8-sequential")
    plan = plan_trial(seed, index, operands)
    a, b, sa, sb, info = draw_operands(s, "bounds", plan, seed, torch.bfloat16)
    assert sa is not None and sb is not None and info["scales"] == plan.scales
    assert a.dtype == s.operand_dtype(torch.bfloat16) and tuple(a.shape) == (plan.m, plan.k)
    for x, scale in ((a.double(), sa.double().reshape(-1, 1)), (b.double(), sb.double().reshape(1, -1))):
        exact = x * scale  # float64: exact (at most 8 + 24 significant bits)
        assert torch.equal((x.float() * scale.float()).double(), exact)
    if plan.scales == "nonpow2":
        assert not bool((torch.frexp(torch.cat([sa.reshape(-1), sb]))[0].abs() == 0.5).any())


def _exact(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor | None, sb: torch.Tensor | None) -> torch.Tensor:
    x, y = a.double(), b.double()
    if sa is not None and sb is not None:
        x, y = x * sa.double().reshape(-1, 1), y * sb.double().reshape(1, -1)
    return x @ y


def _first_plan(operands: str | None, recipe: str):  # type: ignore[no-untyped-def]
    return next(p for p in (plan_trial(0, i, operands) for i in range(2000)) if p.recipe == recipe)


@pytest.mark.parametrize("kernel", ["_planted_kernels:correct", "int8-cutlass-order", "fp8-sequential"])
def test_the_recipes_do_what_they_say(kernel: str) -> None:
    s = load_subject(kernel)
    tiny = torch.finfo(torch.bfloat16).tiny
    sub = _first_plan(s.operands, "subnormal")
    a, b, sa, sb, _ = draw_operands(s, "bounds", sub, 0, torch.bfloat16)
    c = _exact(a, b, sa, sb).abs()
    assert float(((c > 0) & (c < tiny)).double().mean()) > 0.5  # most outputs are subnormal in bf16
    ties = _first_plan(s.operands, "ties")
    a, b, sa, sb, _ = draw_operands(s, "bounds", ties.at(8, 300, 8), 0, torch.bfloat16)
    c = _exact(a, b, None, None)
    assert bool((c == c.round()).all())  # integer sums: in bf16 beyond 256 every odd integer is a tie
    assert bool(((c.abs() > 256) & (c.abs() < 512) & (c % 2 == 1)).any())
    if s.operands == "int8":
        edge = _first_plan("int8", "int32-edge")
        a, b, _, _, _ = draw_operands(s, "bounds", edge, 0, torch.bfloat16)
        row0 = (a.long() @ b.long())[0]
        assert bool((row0 == edge.k * 127 * 127).all()) and int(row0.max()) < 2**31  # at the edge, not over


@pytest.mark.parametrize("attr", PLANTED)
def test_fixed_shape_checks_miss_the_planted_edge_defects(attr: str) -> None:
    s = load_subject(f"_fuzz_planted:{attr}")
    shapes = _demo_shapes()
    assert run_exact_match(s, shapes, torch.bfloat16, trials=10).passed
    assert run_bounds(s, shapes, "any", torch.bfloat16, trials=10).passed


@pytest.mark.parametrize("attr", PLANTED)
def test_fuzz_catches_each_planted_defect_and_its_artifact_replays_byte_for_byte(attr: str, tmp_path: Path) -> None:
    s = load_subject(f"_fuzz_planted:{attr}")
    settings = FuzzSettings()
    result = fuzz(s, BUDGET_S, 0, settings, save=lambda f: str(save_artifact(tmp_path, f, s, {}, 0, settings)))
    assert not result.passed and result.stopped == "failures", result.text()
    (fail,) = result.failures
    r = fail.shrunk.judged.result
    assert r.verdict is Verdict.INCORRECT and r.first is not None
    assert CONDITION[attr](r.m, r.k, r.n), r.shape  # the shrunk shape is still inside the defect's region
    o = fail.original.plan
    assert (r.m, r.k, r.n) != (o.m, o.k, o.n) and r.m * r.k * r.n < o.m * o.k * o.n  # it did shrink
    # the artifact: self-contained, and the kernel's output again, byte for byte
    assert fail.artifact is not None
    art = load_artifact(fail.artifact)
    assert art.meta["kernel"]["ref"] == f"_fuzz_planted:{attr}" and art.meta["verdict"] == "INCORRECT"
    assert art.meta["shape"] == {"m": r.m, "k": r.k, "n": r.n} and art.meta["trial"] == o.index
    assert art.meta["row"]["first_row"] == r.first.row and art.meta["row"]["first_col"] == r.first.col
    fresh = s.run(art.tensors["a"], art.tensors["b"], torch.bfloat16)
    assert tensor_bytes(fresh) == tensor_bytes(art.tensors["actual"]) == tensor_bytes(fail.shrunk.judged.output)
    rep = replay(fail.artifact)
    assert rep.reproduced and rep.same_output and rep.same_expected and rep.verdict == "INCORRECT"
    assert json.loads(Path(fail.artifact).with_suffix(".json").read_text())["verdict"] == "INCORRECT"


@pytest.mark.parametrize("kernel", ["int8-cutlass-order", pytest.param("fp8-sequential", marks=pytest.mark.slow),
                                    pytest.param("_planted_kernels:correct", marks=pytest.mark.slow)])
def test_correct_kernels_fuzz_clean(kernel: str) -> None:
    s = load_subject(kernel)
    result = fuzz(s, 4.0, 0)
    assert result.passed and not result.failures and len(result.trials) >= 3, result.text()


@pytest.mark.parametrize(("attr", "verdict"), [("raises", "ERROR"), ("wrong_shape", "INCORRECT")])
def test_a_kernel_that_raises_or_returns_a_wrong_shape_is_saved_and_replays(attr: str, verdict: str, tmp_path: Path) -> None:
    s = load_subject(f"_planted_kernels:{attr}")
    st = FuzzSettings()
    result = fuzz(s, 20.0, 0, st, save=lambda f: str(save_artifact(tmp_path, f, s, {}, 0, st)))
    (fail,) = result.failures
    r = fail.shrunk.judged.result
    assert r.verdict.value == verdict and (r.m, r.k, r.n) == (1, 1, 1)  # fails everywhere: shrinks to 1x1x1
    assert (r.error is not None) == (attr == "raises") and (r.info.get("problem") is not None) == (attr == "wrong_shape")
    assert fail.artifact is not None
    art = load_artifact(fail.artifact)
    assert ("actual" in art.tensors) == (attr == "wrong_shape")
    rep = replay(fail.artifact)
    assert rep.reproduced and rep.verdict == verdict


def test_shapes_a_kernel_does_not_take_are_skipped_not_failed() -> None:
    s = load_subject("_fuzz_planted:AlignedK16")
    result = fuzz(s, 30.0, 0, max_trials=8)
    assert result.passed and len(result.trials) == 8 and result.skipped > 0, result.text()
    assert all(t.plan.k % 16 == 0 for t in result.trials)
    assert result.skip_reason is not None and "K must be a multiple of 16" in result.skip_reason
    assert f"skipped: {result.skipped} trial(s)" in result.text()


def test_fuzzing_is_deterministic_given_the_seed() -> None:
    s = load_subject("int8-cutlass-order")
    one, two = fuzz(s, 60.0, 11, max_trials=4), fuzz(s, 60.0, 11, max_trials=4)
    assert len(one.trials) == len(two.trials) == 4 and one.stopped == "max_trials"
    assert [(t.plan, t.exact_match, t.bounds) for t in one.trials] == [(t.plan, t.exact_match, t.bounds) for t in two.trials]


# -- the CLI -----------------------------------------------------------------------------------------


def test_parse_budget() -> None:
    assert [parse_budget(x) for x in ("60s", "2m", "90", "1.5m", "1h")] == [60, 120, 90, 90, 3600]
    for bad in ("0", "abc", "-5s", "10 parsecs"):
        with pytest.raises(UsageError):
            parse_budget(bad)


def test_cli_fuzz_finds_saves_and_replay_reproduces(tmp_path: Path) -> None:
    out = tmp_path / "fails"
    res = runner.invoke(app, ["check", "fuzz", "--kernel", "_fuzz_planted:n_tail_pair_store", "--budget", "20s",
                              "--seed", "0", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 1, res.output
    assert "failures: 1" in res.output and "shrunk to" in res.output and "verdict: INCORRECT (FAIL)" in res.output
    (path,) = sorted(out.glob("*.safetensors"))
    assert str(path) in res.output
    rep = runner.invoke(app, ["check", "replay", str(path)])
    assert rep.exit_code == 0, rep.output
    assert "reproduced: the recorded failure happens again, byte for byte" in rep.output
    js = runner.invoke(app, ["check", "replay", str(path), "--format", "json"])
    assert js.exit_code == 0 and json.loads(js.stdout)["reproduced"] is True

    # the same artifact, pointed at a fixed kernel: the failure no longer reproduces (exit 1)
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = json.loads(f.metadata()["swapcheck"]), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    meta["kernel"]["ref"] = "_planted_kernels:correct"
    fixed = tmp_path / "fixed.safetensors"
    save_file(tensors, str(fixed), metadata={"swapcheck": json.dumps(meta)})
    rep = runner.invoke(app, ["check", "replay", str(fixed)])
    assert rep.exit_code == 1, rep.output
    assert "NOT reproduced: the kernel now passes this case (fixed?)" in rep.output

    # a bad file names itself and the field (exit 2)
    del meta["check"]["name"]
    broken = tmp_path / "broken.safetensors"
    save_file(tensors, str(broken), metadata={"swapcheck": json.dumps(meta)})
    rep = runner.invoke(app, ["check", "replay", str(broken)])
    assert rep.exit_code == 2 and "broken.safetensors: check.name: missing" in rep.output
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    rep = runner.invoke(app, ["check", "replay", str(junk)])
    assert rep.exit_code == 2 and "junk.safetensors: not a safetensors file" in rep.output
    with pytest.raises(ArtifactError, match="no such file"):
        load_artifact(tmp_path / "missing.safetensors")


def test_cli_fuzz_of_a_correct_kernel_exits_0_and_bad_input_exits_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["check", "fuzz", "--kernel", "int8-cutlass-order", "--budget", "30s", "--max-trials", "3",
                              "--out", str(tmp_path), "--format", "json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj["trials"] == 3 and obj["failures"] == [] and obj["passed"] and obj["stopped"] == "max_trials"
    assert not list(tmp_path.iterdir())
    for args, needle in ((["--budget", "0s"], "--budget"), (["--budget", "soon"], "--budget"),
                         (["--kernel", "no-such-kernel"], "--kernel"), (["--algorithm", "nope"], "unknown algorithm")):  # fmt: skip
        cmd = ["check", "fuzz", "--kernel", "int8-cutlass-order", "--out", str(tmp_path), *args]
        res = runner.invoke(app, cmd)
        assert res.exit_code == 2 and needle in res.output, (args, res.output)


# -- the sweep kind --------------------------------------------------------------------------------

FUZZ_SPEC = """
question = "Does the fuzz kind run through the runner and save replayable failures?"
name = "fuzz-sweep"

[experiments.hunt]
kind = "fuzz"
kernels = ["int8-cutlass-order", "tests._fuzz_planted:n_tail_pair_store"]
budget_s = 60
max_trials = 12
"""


def test_fuzz_kind_runs_through_the_runner(ray_local: object, tmp_path: Path) -> None:
    from storage.catalog import read_only_query

    spec = tmp_path / "fuzz.toml"
    spec.write_text(FUZZ_SPEC)
    results = tmp_path / "results"
    res = runner.invoke(app, ["sweep", "launch", str(spec), "--results", str(results), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "2 ok, 0 failed" in res.output
    rows = read_only_query(results, "SELECT kernel, trial, verdict, failed_check, shrunk_n, artifact FROM fuzz "
                                    "ORDER BY kernel, trial").to_pylist()  # fmt: skip
    clean = [r for r in rows if r["kernel"] == "int8-cutlass-order"]
    assert len(clean) == 12 and all(Verdict(r["verdict"]).passed and r["artifact"] is None for r in clean)
    planted = [r for r in rows if r["kernel"] != "int8-cutlass-order"]
    failed = [r for r in planted if r["failed_check"]]
    assert len(failed) == 1 and failed[0]["verdict"] == "INCORRECT" and failed[0]["shrunk_n"] % 16 >= 2
    artifact = results / failed[0]["artifact"]
    assert artifact.is_file()
    assert replay(artifact).reproduced
    res = runner.invoke(app, ["report", "conformance", "--results", str(results)])
    assert res.exit_code in (0, 1), res.output
    assert "fuzz" in res.output
    # report fuzz: one line per hunt recomputed from the trial rows, and the saved failure with the
    # replay command that reproduces it
    res = runner.invoke(app, ["report", "fuzz", "--results", str(results), "--format", "json"])
    assert res.exit_code == 0, res.output
    listed = json.loads(res.output)
    assert [(f["kernel"], f["trial"], f["check"]) for f in listed] == \
        [(r["kernel"], r["trial"], r["failed_check"]) for r in failed]
    assert listed[0]["replay"] == f"swapcheck check replay {results}/{failed[0]['artifact']}"
    from reports import fuzz as fr
    from storage.catalog import open_catalog

    with open_catalog(results) as cat:
        hunts = {h["kernel"]: h for h in fr.summary(cat, None)}
    for kernel, group in (("int8-cutlass-order", clean), (planted[0]["kernel"], planted)):
        h = hunts[kernel]
        assert h["trials"] == len(group)
        assert h["failures"] == sum(r["artifact"] is not None for r in group)
    res = runner.invoke(app, ["report", "fuzz", "--results", str(results)])
    assert res.exit_code == 0 and "saved failures" in res.output and "swapcheck check replay" in res.output
