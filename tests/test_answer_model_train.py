"""answer-qwen3's slow checks (docs/models.md "A model with answers"): retraining with the
MANIFEST's command on the recorded CPU kind and thread count reproduces the shipped sha256; on any
CPU the shipped weights reach the recorded held-out accuracy through the W8A8 engine. (A generate
unit's ``correct`` recomputed with plain DuckDB: tests/test_answer_model.py, in the default set.)"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.models.checkpoint import check_manifest, shipped_model_dir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import train_answer_model as tam  # noqa: E402

MANIFEST = json.loads((ROOT / "tasks" / "models" / "shipped" / "answer-qwen3" / "MANIFEST.json").read_text())


@pytest.mark.slow
def test_retraining_reproduces_the_shipped_hash(tmp_path: Path) -> None:
    recorded = MANIFEST["cpu"]
    here = tam.cpu_identity(recorded["threads"])
    keys = ("model_name", "vendor_id", "cpu_family", "cpu_model", "isa_flags", "torch_cpu_capability")
    differ = {k: (recorded.get(k), here.get(k)) for k in keys if recorded.get(k) != here.get(k)}
    if differ:
        pytest.skip(f"CPU identity differs from the recorded one (recorded, here): {differ}; "
                    "bit-identical retraining is claimed only on the recorded CPU kind")
    import torch
    import transformers

    if (torch.__version__, transformers.__version__) != (MANIFEST["torch"], MANIFEST["transformers"]):
        pytest.skip(f"torch/transformers {torch.__version__}/{transformers.__version__} differ from the "
                    f"recorded {MANIFEST['torch']}/{MANIFEST['transformers']}")
    argv = shlex.split(MANIFEST["command"])[2:]  # after "python tools/train_answer_model.py"
    for flag in ("--out", "--demo-prompts"):  # write into tmp_path, not over the shipped files
        if flag in argv:
            argv[argv.index(flag) + 1] = str(tmp_path / flag.strip("-"))
    # --no-eval: the same weights without the held-out evaluation (the next test checks the shipped
    # weights' accuracy against the manifest; evaluating here again would double this test's time)
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "train_answer_model.py"), *argv, "--log-every", "0",
                          "--no-eval"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads((tmp_path / "out" / "MANIFEST.json").read_text())
    assert got["model_safetensors_sha256"] == MANIFEST["model_safetensors_sha256"]
    assert got["held_out"] == "not evaluated (--no-eval)"
    assert (tmp_path / "demo-prompts").read_text() == (ROOT / "sweeps" / "prompts" / "answer-demo.jsonl").read_text()


@pytest.mark.slow
def test_shipped_weights_reach_the_recorded_held_out_accuracy() -> None:
    root = shipped_model_dir("answer-qwen3")
    assert check_manifest(root) == MANIFEST
    test_pairs, train_pairs = tam.split_pairs(MANIFEST["seed"])
    assert len(set(test_pairs.tolist()) & set(train_pairs[:200_000].tolist())) == 0
    for kernel in ("int8-cutlass-order", "int8-triton-order"):
        rec = MANIFEST["held_out"][f"w8a8 {kernel}"]
        assert tam.engine_accuracy(root, test_pairs, kernel) == rec["correct"]
        lo, hi = tam.clopper_pearson(rec["correct"], rec["n"])
        assert rec["ci95"] == [lo, hi] and lo <= rec["accuracy"] <= hi
        assert rec["accuracy"] >= 0.99
