"""A results tree whose spec gave two generate experiments an arm of one name (launched before
validation refused it): every report over generations warns that their runs are pooled."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.store import ResultStore
from tests.test_divergence import write_fixture

pytestmark = pytest.mark.usefixtures("ledgered_writes")

SPEC = """name = "s1"
question = "q"

[experiments.e2e]
kind = "generate"
prompts = { count = 4, length = 4, seed = 0 }
[experiments.e2e.arms.a]
kernel = "int8-cutlass-order"
[experiments.e2e.arms.b]
kernel = "int8-triton-order"

[experiments.other]
kind = "generate"
prompts = { count = 4, length = 4, seed = 1 }
[experiments.other.arms.a]
kernel = "int8-cutlass-order"
"""


def _record(root: Path, spec: str) -> None:
    ResultStore(root).write("sweeps", "s1", "spec", [{
        "spec_sha256": "s" * 64, "question": "q", "spec_path": "s.toml", "spec_toml": spec, "n_units": 4,
        "unit_ids": [], "created_at": datetime.now(UTC)}])


@pytest.mark.parametrize("shared", [True, False])
def test_a_shared_generate_arm_name_is_a_warning_on_every_report_over_the_sweep(tmp_path: Path, shared: bool) -> None:
    root = tmp_path / "results"
    write_fixture(root)
    _record(root, SPEC if shared else SPEC.replace("experiments.other.arms.a", "experiments.other.arms.a-other"))
    res = CliRunner().invoke(app, ["report", "agreement", "--results", str(root), "--format", "json"])
    assert res.exit_code == 0, res.output
    said = "sweep s1: arm 'a' is an arm of experiments e2e, other" in " ".join(res.stderr.split())
    assert said is shared
