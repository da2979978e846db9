"""The ``localize`` kind end to end (slow): units through the worker's own code path (an in-process launch,
no Ray), the Parquet rows, ``report localize`` (JSON equal to the rows; its per-pair figures recomputed
with plain DuckDB over the Parquet files) and the culprit artifact under the results root.

The pair is ``int8-cutlass-order`` vs ``_localize_planted:OneLinearOff`` (equal except on
``layers.1.mlp.down_proj``), so every diverging prompt's culprit set is exactly that linear.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.conftest import launch_in_process

pytestmark = pytest.mark.slow
runner = CliRunner()
TARGET = "layers.1.mlp.down_proj"

SPEC = textwrap.dedent("""
    question = "Which linear makes the planted kernel's generations part?"
    name = "loc"

    [experiments.planted]
    kind = "localize"
    prompts = { count = 3, length = 8, seed = 3 }
    max_new_tokens = 6

    [experiments.planted.arms.ref]
    kernel = "int8-cutlass-order"

    [experiments.planted.arms.planted]
    kernel = "_localize_planted:OneLinearOff"

    [experiments.same]
    kind = "localize"
    prompts = { count = 1, length = 8, seed = 3 }
    max_new_tokens = 4

    [experiments.same.arms.a]
    kernel = "int8-cutlass-order"

    [experiments.same.arms.b]
    kernel = "int8-cutlass-order"
    """)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("localize-e2e") / "results"
    summary = launch_in_process(root, SPEC)
    assert summary.n_ok == summary.n_units, summary.failures
    return root


def _rows(root: Path) -> list[dict[str, Any]]:
    files = sorted((root / "table=localize").rglob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def test_rows_are_written_and_the_report_shows_them(results: Path) -> None:
    rows = _rows(results)
    assert len(rows) == 4
    planted = [r for r in rows if r["experiment"] == "planted"]
    assert all(r["first_divergence"] is not None and r["culprit"] == [TARGET] for r in planted)
    assert all(r["verified_culprit_diverges"] and r["verified_none_identical"] and r["verified_one_minimal"]
               and r["artifact_reproduces"] for r in planted)
    (same,) = [r for r in rows if r["experiment"] == "same"]
    assert same["first_divergence"] is None and same["culprit"] is None

    res = runner.invoke(app, ["report", "localize", "--results", str(results), "--format", "json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    cols = ("experiment", "prompt_index", "first_divergence", "culprit", "artifact", "verified_one_minimal")
    assert sorted(tuple(map(str, (r[c] for c in cols))) for r in shown) == \
        sorted(tuple(map(str, (r[c] for c in cols))) for r in rows)
    table = runner.invoke(app, ["report", "localize", "--results", str(results)])
    assert table.exit_code == 0, table.output
    assert TARGET in table.output and "3/3" in table.output and "0/1" in table.output


def test_the_per_pair_figures_are_plain_duckdb_over_the_parquet(results: Path) -> None:
    import duckdb

    from storage.catalog import open_catalog

    glob = str(results / "table=localize" / "**" / "*.parquet")
    want = duckdb.connect().execute(f"""
        SELECT count(*) AS prompts, count(first_divergence) AS diverged, min(first_divergence) AS lo,
               max(first_divergence) AS hi, count(*) FILTER (WHERE verified_one_minimal) AS one_minimal
        FROM read_parquet('{glob}', hive_partitioning = true) WHERE experiment = 'planted'""").fetchone()
    from reports.localize import pairs

    with open_catalog(results) as cat:
        (got,) = [r for r in pairs(cat, "loc") if r["experiment"] == "planted"]
    assert (got["prompts"], got["diverged"], got["first_divergence_min"], got["first_divergence_max"],
            got["one_minimal"]) == want


def test_the_artifact_lies_under_the_results_root_and_replays(results: Path) -> None:
    from tasks.models.culprit import replay_culprit

    planted = [r for r in _rows(results) if r["experiment"] == "planted"]
    for r in planted:
        assert replay_culprit(results / r["artifact"]).reproduced


def test_a_linear_that_differs_only_downstream_of_another_gets_the_mixed_pass_operands() -> None:
    """The e2e demo's prompt 13 (cutlass vs triton, measured: parts at token 80, culprit set
    {layers.0.self_attn.o_proj, layers.0.mlp.up_proj}): on the all-A operands the two kernels agree on
    up_proj, so its artifact entry comes from the pass with the culprit set on triton-order, where they
    differ; o_proj's stays from the all-A pass."""
    from tasks.kinds.localize import culprit_calls
    from tasks.models import build_model
    from tasks.models.culprit import culprit_bytes, outputs_differ
    from tasks.prompts import prompts_from_payload

    ka, kb = {"kernel": "int8-cutlass-order", "params": {}}, {"kernel": "int8-triton-order", "params": {}}
    model = build_model("tiny-qwen3", kernel=ka)
    prompt = prompts_from_payload({"synthetic": {"count": 128, "length": 16, "seed": 0}}, 1024)[13]
    toks = [int(t) for t in model.generate([prompt], 80, top_k=2).tokens[0]]
    prefix = prompt + toks[:80]
    culprit = ["layers.0.self_attn.o_proj", "layers.0.mlp.up_proj"]
    with model.capture() as cap:
        model.forward_tokens([prefix])
    up_all_a = next(c for c in cap.layers if c.name == culprit[1])
    assert not outputs_differ(up_all_a, ka, kb)
    calls = culprit_calls(model, cap, culprit, prefix, ka, kb)
    assert [(c.name, c.operands_from) for c in calls] == [(culprit[0], "all-A"), (culprit[1], "culprit-on-B")]
    assert all(outputs_differ(c, ka, kb) for c in calls)
    _, meta = culprit_bytes(calls, {"name": "a", "version": "1", **ka}, {"name": "b", "version": "1", **kb}, {})
    assert [x["operands_from"] for x in meta["linears"]] == ["all-A", "culprit-on-B"]
    assert all(x["differing"] > 0 for x in meta["linears"])
