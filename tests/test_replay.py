"""Per-layer replay on the tiny W8A8 model: pow2 bit-identical, real within one spacing, scored predictions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.conftest import REPO

runner = CliRunner()

WRONG = """
sweep = "replay-demo"
amends = "{sha}"

[[predictions]]
id = "real-bit-identical"
statement = "A deliberately wrong prediction: under real scales every layer is bit-identical."
table = "replay"
where = "comparison = 'pair' AND scale_mode = 'real'"
every = "differing = 0"
label = "layer"
noun = "layers"
"""


@pytest.fixture(scope="module")
def replay_results(ray_local, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("replay")
    (d / "prereg").mkdir()
    original = (REPO / "sweeps" / "prereg" / "replay-demo.toml").read_text()
    (d / "prereg" / "replay-demo.toml").write_text(original)
    from orchestrator.prereg import sha256

    (d / "prereg" / "wrong.toml").write_text(WRONG.format(sha=sha256(original)))
    spec = (REPO / "sweeps" / "replay-demo.toml").read_text().replace(
        'preregistration = ["prereg/replay-demo.toml"]', 'preregistration = ["prereg/replay-demo.toml", "prereg/wrong.toml"]')
    (d / "replay.toml").write_text(spec)
    res = runner.invoke(app, ["sweep", "launch", str(d / "replay.toml"), "--results", str(d / "results"), "--no-progress"])
    assert res.exit_code == 0, res.output
    return d / "results"


def test_replay_report_per_layer(replay_results: Path) -> None:
    res = runner.invoke(app, ["report", "replay", "--results", str(replay_results), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    need = {"layer", "scale_mode", "elements", "differing", "max_spacing", "accumulators_equal"}
    assert rows and all(need <= set(r) for r in rows)
    pairs = [r for r in rows if r["comparison"] == "pair"]
    layers = {r["layer"] for r in pairs}
    assert len(layers) == 7 * 4  # seven W8A8 projections in each of tiny-qwen3's four decoder layers
    pow2 = [r for r in pairs if r["scale_mode"] == "pow2"]
    assert pow2 and all(r["differing"] == 0 for r in pow2)
    real = [r for r in pairs if r["scale_mode"] == "real"]
    assert all(r["max_spacing"] <= 1 for r in real)
    assert sum(r["differing"] for r in real) / sum(r["elements"] for r in real) < 1e-4
    assert all(r["accumulators_equal"] and r["accumulators_exact"] for r in pairs)
    capture = [r for r in rows if r["comparison"] == "capture"]
    assert len(capture) == 28 and all(r["differing"] == 0 for r in capture)


def test_predictions_scored_in_the_papers_form(replay_results: Path) -> None:
    res = runner.invoke(app, ["report", "predictions", "--results", str(replay_results), "--format", "json"])
    assert res.exit_code == 0, res.output
    by_id = {r["prediction"]: r for r in json.loads(res.stdout)}
    assert by_id["pow2-bit-identical"]["status"] == "confirmed"
    assert by_id["pow2-bit-identical"]["support"] == "28/28"  # 7 projections x 4 decoder layers
    assert by_id["capture-reproduces-model"]["support"] == "28/28"
    assert by_id["integer-alibi"]["status"] == "confirmed"
    wrong = by_id["real-bit-identical"]
    assert wrong["status"] == "refuted" and wrong["counterexample"].startswith("layers.")
    assert wrong["amended"] and not wrong["amended_after_results"]
    table = runner.invoke(app, ["report", "predictions", "--results", str(replay_results)], env={"COLUMNS": "200"})
    assert "CONFIRMED" in table.output and "28/28 layers" in table.output and "REFUTED" in table.output


def test_capture_file_and_manifest(replay_results: Path) -> None:
    from storage.catalog import read_only_query
    from tasks.models import load_capture

    rows = read_only_query(replay_results, "SELECT * FROM captures ORDER BY layer").to_pylist()
    assert len(rows) == 28 and all(r["kernel_calls"] >= 1 and r["capture_kernel"] == "int8-cutlass-order" for r in rows)
    assert {r["x_scale_layout"] for r in rows} == {"per-token"}
    layers = load_capture(replay_results / rows[0]["file"])
    assert len(layers) == 28 and all(layer.replay().equal(layer.output) for layer in layers)
