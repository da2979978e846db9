"""Spec validation: every bad input names the file and the field path, and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.errors import SpecError
from orchestrator.spec import load_spec, parse_spec
from tasks.kinds.fields import ArithmeticRange, GeometricRange
from tasks.kinds.kdepth import INT8_MAX_K
from tests.conftest import REPO, tiny_spec_text

runner = CliRunner()


def problems(text: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "bad.toml")
    return str(info.value)


def test_demo_spec_is_valid() -> None:
    spec = load_spec(REPO / "sweeps" / "kdepth-demo.toml")
    assert spec.sweep.name == "kdepth-demo"
    int8 = spec.experiments["int8"]
    assert int8.k.values() == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert int8.seed_values() == list(range(16))
    assert [i.name for i in spec.experiments["fp8"].impls()] == [
        "fp8-torch-scaled-mm", "fp8-sequential", "fp8-pairwise", "fp8-blocked-128"]


def test_ranges_are_inclusive_generators() -> None:
    assert GeometricRange(start=256, stop=16384, factor=2).values()[-1] == 16384
    assert GeometricRange(start=3, stop=20, factor=3).values() == [3, 9]
    assert ArithmeticRange(start=0, stop=6, step=3).values() == [0, 3, 6]


def test_unknown_key_names_the_field() -> None:
    msg = problems(tiny_spec_text().replace('dtype = "int8"', 'dtype = "int8"\nbatch = 3'))
    assert "bad.toml" in msg and "experiments.int8.batch: unknown key" in msg


def test_unknown_top_level_key() -> None:
    msg = problems('colour = "red"\n' + tiny_spec_text())
    assert "- colour: unknown key" in msg


def test_wrong_type_names_the_field() -> None:
    msg = problems(tiny_spec_text().replace("m = 16", 'm = "16"'))
    assert "experiments.int8.m" in msg


def test_wrong_type_inside_a_range() -> None:
    msg = problems(tiny_spec_text().replace("stop = 128", "stop = 1.5"))
    assert "experiments.int8.k" in msg and "stop" in msg


def test_bad_literal_lists_allowed_values() -> None:
    msg = problems(tiny_spec_text().replace('"pow2"]', '"pow3"]'))
    assert "experiments.int8.scale_modes.1" in msg and "'real'" in msg and "'pow2'" in msg


def test_unknown_kernel_suggests_names() -> None:
    msg = problems(tiny_spec_text(impls='["int8-cutlas-order"]'))
    assert "experiments.int8.implementations[0]" in msg
    assert "int8-cutlass-order" in msg  # did you mean


def test_kernel_of_the_wrong_operand_dtype() -> None:
    msg = problems(tiny_spec_text(impls='["fp8-sequential"]'))
    assert "experiments.int8.implementations[0]" in msg and "fp8" in msg


def test_int8_k_above_the_int32_bound() -> None:
    msg = problems(tiny_spec_text().replace("stop = 128", f"stop = {2 * INT8_MAX_K}"))
    assert "experiments.int8.k" in msg and str(INT8_MAX_K) in msg


def test_int8_k_at_the_bound_is_fine() -> None:
    parse_spec(tiny_spec_text().replace("k = { start = 32, stop = 128, factor = 2 }", f"k = [{INT8_MAX_K}]"))


def test_unknown_kind_lists_kinds() -> None:
    msg = problems(tiny_spec_text().replace('kind = "kdepth"', 'kind = "kdepht"'))
    assert "experiments.int8.kind" in msg and "kdepth" in msg


def test_missing_required_field() -> None:
    msg = problems(tiny_spec_text().replace('question = "Do the INT8 epilogue orders agree on tiny shapes?"', ""))
    assert "question: required field is missing" in msg


def test_invalid_toml_and_duplicate_keys() -> None:
    assert "not valid TOML" in problems("name = [")
    assert "not valid TOML" in problems('name = "again"\n' + tiny_spec_text())


def test_bad_sweep_name() -> None:
    assert "name:" in problems(tiny_spec_text(name="../escape"))


def test_duplicate_labels_refused() -> None:
    msg = problems(tiny_spec_text(impls='["int8-cutlass-order", "int8-cutlass-order"]'))
    assert "duplicate implementation names" in msg


def test_missing_file() -> None:
    with pytest.raises(SpecError, match="file not found"):
        load_spec("/nonexistent/spec.toml")


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t.replace('dtype = "int8"', 'dtype = "int8"\nbogus = 1'),
        lambda t: t.replace("m = 16", 'm = "16"'),
        lambda t: t.replace('"int8-triton-order"', '"int8-no-such-kernel"'),
        lambda t: t.replace("stop = 128", "stop = 300000"),
    ],
    ids=["unknown-key", "wrong-type", "unknown-kernel", "k-overflow"],
)
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path: Path, mutate) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(mutate(tiny_spec_text()))
    results = tmp_path / "results"
    for cmd in (["sweep", "validate", str(spec)], ["sweep", "plan", str(spec)],
                ["sweep", "launch", str(spec), "--results", str(results)]):
        res = runner.invoke(app, cmd)
        assert res.exit_code == 2, res.output
        assert "bad.toml" in res.output
    assert not results.exists()


def test_cli_missing_spec_exits_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["sweep", "launch", str(tmp_path / "nope.toml"), "--results", str(tmp_path / "r")])
    assert res.exit_code == 2 and "file not found" in res.output
    assert not (tmp_path / "r").exists()


def test_user_kernel_from_the_current_directory(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "my_kernels_cwd.py").write_text(
        "import torch\nfrom tasks.kernels import Kernel\n\n"
        "class Mine(Kernel):\n    operand_dtype = 'int8'\n    description = 'user kernel'\n\n"
        "    def compute(self, ops):\n        return (torch._int_mm(ops.a, ops.b).float() * ops.scale_a * ops.scale_b).to(ops.out_dtype)\n"
    )
    spec = tmp_path / "mine.toml"
    spec.write_text(tiny_spec_text(impls='["int8-cutlass-order", "my_kernels_cwd:Mine"]'))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    res = runner.invoke(app, ["sweep", "validate", str(spec)])
    assert res.exit_code == 0, res.output


def test_an_arm_name_shared_by_two_generate_experiments_is_refused() -> None:
    """Runs are keyed by (sweep, arm): two experiments' arms of one name would be pooled silently."""
    exp = """
[experiments.{name}]
kind = "generate"
prompts = {{ count = 1, length = 4, seed = 0 }}
max_new_tokens = 2

[experiments.{name}.arms.{arm}]
kernel = "int8-cutlass-order"
"""
    text = 'name = "s"\nquestion = "q"\n' + exp.format(name="a", arm="cutlass") + exp.format(name="b", arm="cutlass")
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    msg = str(err.value)
    assert "experiments.b.arms.cutlass" in msg and "also an arm of experiments.a" in msg and "pooled" in msg
    ok = 'name = "s"\nquestion = "q"\n' + exp.format(name="a", arm="cutlass") + exp.format(name="b", arm="cutlass-b")
    assert set(parse_spec(ok).experiments) == {"a", "b"}
