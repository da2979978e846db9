"""A vLLM arm's prompts stay inside the model's vocabulary (issue #37): vLLM does not check prompt ids
when it skips the tokenizer, and answer-qwen3 has 16 tokens, where synthetic ids went up to 999."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.models.arms import SYNTHETIC_ID_BOUND, checkpoint_vocab_size, vllm_prompts


def _params(model: str, prompts: dict) -> dict:
    return {"model": model, "prompts": prompts}


def test_synthetic_ids_stay_below_a_small_vocabulary_and_are_unchanged_for_a_large_one(tmp_path: Path) -> None:
    synthetic = {"synthetic": {"count": 8, "length": 32, "seed": 3}}
    small, large = tmp_path / "small", tmp_path / "large"
    for d, vocab in ((small, 16), (large, 151_936)):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    assert checkpoint_vocab_size(str(small)) == 16 and checkpoint_vocab_size("some/hub-name") is None
    tiny = vllm_prompts(_params(str(small), synthetic))
    assert max(max(p) for p in tiny) < 16
    # a real vocabulary: the same prompts as before the change (ids below 1000), so earlier sweeps compare
    assert vllm_prompts(_params(str(large), synthetic)) == vllm_prompts(_params("some/hub-name", synthetic))
    assert max(max(p) for p in vllm_prompts(_params(str(large), synthetic))) < SYNTHETIC_ID_BOUND


def test_the_shipped_model_is_read_from_its_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPCHECK_MODEL_CACHE", str(tmp_path / "cache"))
    prompts = vllm_prompts(_params("answer-qwen3", {"synthetic": {"count": 4, "length": 8, "seed": 0}}))
    assert max(max(p) for p in prompts) < 16


def test_given_ids_are_checked_against_the_real_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 151_936}))
    assert vllm_prompts(_params(str(tmp_path), {"tokens": [[5, 120_000]]})) == [[5, 120_000]]
    with pytest.raises(ValueError, match="outside the model's vocabulary of 151936"):
        vllm_prompts(_params(str(tmp_path), {"tokens": [[151_936]]}))
