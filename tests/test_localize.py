"""The ``localize`` kind (issue 27): first divergence, first differing linear, ddmin culprit sets
with their verification, and the culprit replay artifact (tasks.models.localize, tasks.models.culprit).

The planted case: ``_localize_planted:OneLinearOff`` equals ``int8-cutlass-order`` except on
``layers.1.mlp.down_proj``, so a localize run of the two can only part because of that linear, and
the search must name exactly it. The end-to-end run through the worker, the Parquet rows, ``report
localize`` and ``check replay`` is in tests/test_localize_e2e.py (slow).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tasks.models.localize import ddmin, first_divergence

TARGET = "layers.1.mlp.down_proj"
runner = CliRunner()


# -- delta debugging and first divergence (no model) -------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1,
                                                                                max_size=3))))
def test_ddmin_finds_exactly_the_set_a_superset_predicate_needs(case: tuple[int, set[int]]) -> None:
    n, needed = case
    calls: list[tuple[int, ...]] = []

    def test(subset: tuple[int, ...]) -> bool:
        calls.append(subset)
        return needed <= set(subset)

    found, tests = ddmin(list(range(n)), test)
    assert set(found) == needed
    assert tests == len(set(calls)) == len(calls)  # each distinct subset tested once
    assert found == sorted(found)  # the items' order is kept


def test_ddmin_result_is_one_minimal_for_a_non_monotone_predicate() -> None:
    # holds for {3, 5} and for {7} alone but not for {3, 5, 7} minus one of {3, 5} unless 7 stays
    def test(s: tuple[int, ...]) -> bool:
        x = set(s)
        return {3, 5} <= x or (7 in x and 1 not in x)

    found, _ = ddmin(list(range(10)), test)
    assert test(tuple(found))
    assert all(not test(tuple(y for y in found if y != x)) for x in found)


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([4], [5, 6]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) is None


# -- the planted case: only one linear can differ ------------------------------------------------------

def _params(**extra: Any) -> dict[str, Any]:
    from tasks.kinds.localize import LocalizeExperiment, expand

    exp = LocalizeExperiment.model_validate({
        "kind": "localize", "prompts": {"count": 2, "length": 8, "seed": 3}, "max_new_tokens": 6,
        "arms": {"ref": {"kernel": "int8-cutlass-order"}, "planted": {"kernel": "_localize_planted:OneLinearOff"}},
        **extra})
    (unit, *_) = expand("planted", exp)
    return unit.params


class _Artifacts:
    """A UnitContext that keeps artifacts in a directory (what the worker does under the results root)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sweep, self.unit_id = "t", "u"

    def put_artifact(self, name: str, data: bytes) -> str:
        (self.root / name).write_bytes(data)
        return name

    def read_unit(self, table: str, unit_id: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
        return []


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    from tasks.kinds.localize import run

    root = tmp_path_factory.mktemp("localize")
    (row,) = run(_params(), _Artifacts(root))["localize"]
    return row, root


def test_bisection_names_exactly_the_planted_linear(planted: tuple[dict[str, Any], Path]) -> None:
    row, _ = planted
    assert row["error"] is None
    assert row["first_divergence"] is not None and 0 <= row["first_divergence"] < 6
    assert row["culprit"] == [TARGET] and row["culprit_size"] == 1
    assert row["first_diff_linear"] == TARGET and row["first_diff_layer"] == 1
    assert row["first_diff_linear_order"] == 13  # 7 linears per layer: layer 1's down_proj is the 14th
    assert row["linears_hashed"] == 28 and row["tf_reproduces"] is True
    assert row["token_a"] != row["token_b"]
    # 28 linears, one culprit: ddmin halves its way down (each distinct set generated once)
    assert row["bisection_generations"] == row["bisection_tests"] and 2 <= row["bisection_generations"] <= 16


def test_the_verification_flags_are_earned(planted: tuple[dict[str, Any], Path]) -> None:
    row, _ = planted
    assert row["verified_culprit_diverges"] is True and row["culprit_divergence"] == row["first_divergence"]
    assert row["verified_none_identical"] is True and row["verified_one_minimal"] is True
    assert row["verification_generations"] == 3  # S, none (full length), S minus its one element


def test_the_culprit_artifact_replays_byte_for_byte(planted: tuple[dict[str, Any], Path], tmp_path: Path) -> None:
    import hashlib

    from tasks.models.culprit import FORMAT, is_culprit_artifact, load_culprit, replay_culprit

    row, root = planted
    path = root / row["artifact"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == row["artifact_sha256"] and row["artifact_reproduces"]
    meta, tensors = load_culprit(path)
    assert meta["format"] == FORMAT and meta["culprit"] == [TARGET] and is_culprit_artifact(path)
    (lin,) = meta["linears"]
    prefix = len(meta["prompt"]) + row["first_divergence"]
    assert (lin["m"], lin["n"], lin["k"]) == (prefix, 128, 384) and len(meta["prefix"]) == prefix
    assert lin["operands_from"] == "all-A"
    # every output of the planted linear is off by 0.5: all differ, the first is [0, 0]
    assert lin["differing"] == prefix * 128 and lin["first_difference"]["row"] == 0
    assert lin["first_difference"]["b"] == pytest.approx(lin["first_difference"]["a"] + 0.5, rel=2**-7, abs=2**-8)
    res = replay_culprit(path)
    assert res.reproduced and res.linears[0].same_a and res.linears[0].same_b
    assert "reproduced: both kernels' outputs again, byte for byte" in res.text()
    # a changed recorded output is no longer reproduced
    from safetensors.torch import save_file

    tensors[f"{TARGET}/out_b"] = tensors[f"{TARGET}/out_a"].clone()
    bad = tmp_path / "tampered.safetensors"
    save_file(tensors, str(bad), metadata={"swapcheck": json.dumps(meta)})
    again = replay_culprit(bad)
    assert not again.reproduced and again.linears[0].same_a and not again.linears[0].same_b


def test_a_damaged_artifact_is_refused_naming_the_field(planted: tuple[dict[str, Any], Path], tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from tasks.models.culprit import CulpritArtifactError, load_culprit

    row, root = planted
    meta, tensors = load_culprit(root / row["artifact"])
    del tensors[f"{TARGET}/x_q"]
    bad = tmp_path / "missing.safetensors"
    save_file(tensors, str(bad), metadata={"swapcheck": json.dumps(meta)})
    with pytest.raises(CulpritArtifactError, match=r"tensors\.layers\.1\.mlp\.down_proj/x_q: missing"):
        load_culprit(bad)
    other = tmp_path / "other.safetensors"
    save_file(tensors, str(other), metadata={"swapcheck": json.dumps({**meta, "format_version": 9})})
    with pytest.raises(CulpritArtifactError, match="format_version"):
        load_culprit(other)
    with pytest.raises(CulpritArtifactError, match="no such file"):
        load_culprit(tmp_path / "nope.safetensors")


def test_identical_kernels_never_diverge() -> None:
    from tasks.kinds.localize import run

    params = _params(arms={"a": {"kernel": "int8-cutlass-order"}, "b": {"kernel": "int8-cutlass-order"}})
    (row,) = run(params, None)["localize"]
    assert row["first_divergence"] is None and row["culprit"] is None and row["artifact"] is None
    assert row["generated"] == 6 and row["error"] is None


# -- bad spec input: exit 2 naming the field ---------------------------------------------------------------

BAD = {
    "pairs = [[\"cutlass\", \"nope\"]]": "pairs[0]: unknown arm 'nope'",
    "prompt_indices = [0, 9]": "prompt_indices: [9] out of range",
    "max_new_tokens = 0": "max_new_tokens",
    "scales = \"weird\"": "scales",
}


@pytest.mark.parametrize(("line", "message"), list(BAD.items()))
def test_bad_spec_input_exits_2_naming_the_field(tmp_path: Path, line: str, message: str) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(textwrap.dedent(f"""
        question = "bad input?"
        name = "bad"

        [experiments.loc]
        kind = "localize"
        prompts = {{ count = 2, length = 4, seed = 0 }}
        {line}

        [experiments.loc.arms.cutlass]
        kernel = "int8-cutlass-order"

        [experiments.loc.arms.triton]
        kernel = "int8-triton-order"
        """))
    res = runner.invoke(app, ["sweep", "plan", str(spec)])
    assert res.exit_code == 2, res.output
    assert message in res.output and "loc" in res.output


def test_an_unknown_kernel_exits_2_naming_the_arm(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(textwrap.dedent("""
        question = "bad kernel?"
        name = "bad"

        [experiments.loc]
        kind = "localize"

        [experiments.loc.arms.a]
        kernel = "int8-cutlass-order"

        [experiments.loc.arms.b]
        kernel = "int8-no-such-kernel"
        """))
    res = runner.invoke(app, ["sweep", "plan", str(spec)])
    assert res.exit_code == 2 and "arms.b.kernel" in res.output, res.output


def test_kernel_evidence_refuses_a_generation_that_ran_another_kernel() -> None:
    from tasks.models import build_model
    from tasks.models.localize import Swapper

    model = build_model("tiny-qwen3")
    sw = Swapper(model, [5, 6, 7], "int8-cutlass-order", "int8-triton-order", [], horizon=2, budget=4)
    assert len(sw.generate(["layers.3.mlp.up_proj"])) == 2  # the swap it claims: evidence agrees
    model.set_kernel("int8-triton-order", ["layers.0.self_attn.k_proj"])  # behind the swapper's back
    model.reset_kernel_calls()
    model.forward_tokens([[5, 6, 7]])
    with pytest.raises(RuntimeError, match=r"layers\.0\.self_attn\.k_proj ran .*int8-triton-order"):
        sw._check_calls(set())


def test_check_replay_dispatches_a_culprit_artifact(planted: tuple[dict[str, Any], Path], tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from tasks.models.culprit import load_culprit

    row, root = planted
    path = root / row["artifact"]
    res = runner.invoke(app, ["check", "replay", str(path)])
    assert res.exit_code == 0, res.output
    assert "reproduced: both kernels' outputs again, byte for byte" in res.output and TARGET in res.output
    js = runner.invoke(app, ["check", "replay", str(path), "--format", "json"])
    obj = json.loads(js.stdout)
    assert js.exit_code == 0 and obj["reproduced"] is True and obj["format"] == "swapcheck.localize-culprit"
    assert [x["name"] for x in obj["linears"]] == [TARGET] and obj["linears"][0]["same_b"] is True
    meta, tensors = load_culprit(path)
    tensors[f"{TARGET}/out_a"] = tensors[f"{TARGET}/out_b"].clone()
    changed = tmp_path / "changed.safetensors"
    save_file(tensors, str(changed), metadata={"swapcheck": json.dumps(meta)})
    again = runner.invoke(app, ["check", "replay", str(changed)])
    assert again.exit_code == 1 and "NOT reproduced byte for byte" in again.output
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    bad = runner.invoke(app, ["check", "replay", str(junk)])
    assert bad.exit_code == 2 and "junk.safetensors" in bad.output
