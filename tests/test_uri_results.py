"""--results as a pyarrow filesystem URI: the same sweep, ledger, resume and DuckDB reports.

``file://`` URIs go through the URI code path end to end (pyarrow filesystem writes, DuckDB reading
the URI); ``s3://`` and ``gs://`` use the same code with pyarrow's S3/GCS filesystems and DuckDB's
httpfs extension, which need the network this machine does not have.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.store import ResultStore, is_uri, open_store
from tests.conftest import REPO, tiny_spec_text

runner = CliRunner()


def test_uri_store_roundtrip(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/r"
    store = open_store(uri)
    assert isinstance(store, ResultStore) and is_uri(uri)
    assert not store.exists()
    assert store.mark_attempt("s", "u", "node") == 1 and store.attempts("s", "u") == 1
    assert store.attempt_markers("s")[0]["node_id"] == "node"
    assert store.write_text("nightly/x/report.md", "# hi").endswith("nightly/x/report.md")
    assert (tmp_path / "r" / "nightly" / "x" / "report.md").read_text() == "# hi"
    assert store.exists()


def test_sweep_launch_resume_and_reports_on_a_uri(ray_local, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(tiny_spec_text(name="uri"))
    uri = f"file://{tmp_path}/results"
    first = runner.invoke(app, ["sweep", "launch", str(spec), "--results", uri, "--no-progress"])
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, ["sweep", "launch", str(spec), "--results", uri, "--no-progress"])
    assert again.exit_code == 0 and "12 skipped" in again.output
    rep = runner.invoke(app, ["report", "kdepth", "--results", uri, "--format", "json"])
    assert rep.exit_code == 0, rep.output
    assert {r["impl_b"] for r in json.loads(rep.stdout)} == {"int8-triton-order", "exact"}
    q = runner.invoke(app, ["query", "SELECT count(*) AS n FROM kdepth", "--results", uri, "--format", "json"])
    assert json.loads(q.stdout) == [{"n": 36}]
    # Local-path readers see the very same files.
    local = runner.invoke(app, ["query", "SELECT count(*) AS n FROM units", "--results", str(tmp_path / "results"), "--format", "json"])
    assert json.loads(local.stdout) == [{"n": 12}]


def test_replay_artifacts_on_a_uri(ray_local, tmp_path: Path) -> None:
    spec = (REPO / "sweeps" / "replay-demo.toml").read_text().replace(
        'preregistration = ["prereg/replay-demo.toml"]\n', "").replace("count = 8, length = 24", "count = 2, length = 8")
    (tmp_path / "r.toml").write_text(spec)
    uri = f"file://{tmp_path}/results"
    res = runner.invoke(app, ["sweep", "launch", str(tmp_path / "r.toml"), "--results", uri, "--no-progress"])
    assert res.exit_code == 0, res.output
    files = list((tmp_path / "results" / "_artifacts").rglob("capture.safetensors"))
    assert len(files) == 1
