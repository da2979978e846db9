"""The GPU protocol on a CPU machine: planned with its resources, refused at launch, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.conftest import REPO

runner = CliRunner()
SPEC = REPO / "sweeps" / "int8-cutlass-vs-triton-qwen3.toml"


def test_gpu_sweep_plans_on_cpu_with_gpu_resources() -> None:
    res = runner.invoke(app, ["sweep", "plan", str(SPEC), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"generate", "teacher_forced", "replay", "kdepth"}
    assert all("gpu=1" in r["resources"] for r in rows)
    gen = [r for r in rows if r["kind"] == "generate"]
    assert len(gen) == 2 * 2 * 3 and all("fresh-process" in r["resources"] for r in gen)


def test_gpu_sweep_launch_refuses_without_gpu(tmp_path: Path) -> None:
    results = tmp_path / "results"
    res = runner.invoke(app, ["sweep", "launch", str(SPEC), "--results", str(results), "--no-progress"])
    assert res.exit_code == 2
    assert "request a GPU" in res.output and "no GPU" in res.output
    assert not results.exists()


def test_vllm_arm_validation(tmp_path: Path) -> None:
    bad = SPEC.read_text().replace('kernel = "triton-int8"', 'kernel = "int8-triton-order"', 1)
    (tmp_path / "prereg").mkdir()
    (tmp_path / "prereg" / "int8-cutlass-vs-triton-qwen3.toml").write_text(
        (REPO / "sweeps" / "prereg" / "int8-cutlass-vs-triton-qwen3.toml").read_text())
    (tmp_path / "s.toml").write_text(bad)
    res = runner.invoke(app, ["sweep", "validate", str(tmp_path / "s.toml")])
    assert res.exit_code == 2 and "is not a vLLM kernel family" in res.output
