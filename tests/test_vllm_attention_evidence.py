"""Attention arms on the vLLM engine (issue #37): selected with ``LLM(attention_backend=...)`` -- vLLM 0.32
reads no ``VLLM_ATTENTION_BACKEND`` -- and the backend that ran is observed in vLLM's log and must be the
configured one. The log lines are vLLM 0.32's own formats (platforms/cuda.py; `make vllm-contract` checks
they are still there): ``Using %s backend.`` with the selected ``AttentionBackendEnum`` member,
``Using %s attention backend out of potential backends: %s.`` with its own choice."""

from __future__ import annotations

from typing import Any

import pytest

from tasks.models.vllm_selection import (
    attention_problems,
    check_evidence,
    forcing,
    parse_attention_log,
)

SELECTED = "INFO 12-05 01:02:03 [cuda.py:446] Using AttentionBackendEnum.FLASHINFER backend."
CHOSEN = ("INFO 12-05 01:02:03 [cuda.py:507] Using FLASH_ATTN attention backend out of potential backends: "
          "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].")


def test_both_of_vllms_attention_lines_are_parsed_colours_and_repeats_aside() -> None:
    assert parse_attention_log(SELECTED) == ["FLASHINFER"]
    assert parse_attention_log(f"\x1b[32m{CHOSEN}\x1b[0m\n{CHOSEN}") == ["FLASH_ATTN"]
    # kernel-selection lines are not attention lines
    assert parse_attention_log("Selected CutlassInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8") == []


@pytest.mark.parametrize(("configured", "observed", "require", "problem"), [
    ("FLASHINFER", ["FLASHINFER"], True, None),
    ("FLASHINFER", ["FLASH_ATTN"], True, "attention backend FLASHINFER was configured, but vLLM logged using FLASH_ATTN"),
    ("FLASHINFER", [], True, "vLLM logged no 'Using ... backend' line"),
    ("FLASHINFER", [], False, None),  # a second engine in the process: vLLM logs once per process
    (None, ["FLASH_ATTN"], True, None),  # vLLM's own choice: recorded, not judged
])
def test_a_configured_backend_must_be_the_one_that_ran(configured: str | None, observed: list[str], require: bool,
                                                        problem: str | None) -> None:
    got = attention_problems(configured, observed, require)
    assert (got == []) if problem is None else (len(got) == 1 and problem in got[0]), got


def test_the_evidence_of_an_arm_that_silently_ran_the_default_backend_fails() -> None:
    """The defect: FLASHINFER asked for through an environment variable vLLM 0.32 ignores; FLASH_ATTN ran."""
    forced = forcing("cutlass-int8", "0.32.0")
    layers = {"model.layers.0.mlp.down_proj": "CutlassInt8ScaledMMLinearKernel"}
    ev = check_evidence(forced, log_pairs=[("CutlassInt8ScaledMMLinearKernel", "CompressedTensorsW8A8Int8")],
                        layers=layers, attention="FLASHINFER", attention_log=parse_attention_log(CHOSEN))
    assert not ev["ok"] and ev["attention"] == {"configured": "FLASHINFER", "observed": ["FLASH_ATTN"]}
    assert any("FLASHINFER was configured, but vLLM logged using FLASH_ATTN" in p for p in ev["problems"])
    ok = check_evidence(forced, log_pairs=[("CutlassInt8ScaledMMLinearKernel", "CompressedTensorsW8A8Int8")],
                        layers=layers, attention="FLASHINFER", attention_log=parse_attention_log(SELECTED))
    assert ok["ok"], ok["problems"]


def test_an_attention_arm_builds_its_engine_with_the_engine_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks.models.vllm_engine as ve
    from tasks.models.arms import build_vllm_engine

    built: dict[str, Any] = {}

    class Recorder:  # the engine's constructor needs CUDA: record what the arm hands it
        def __init__(self, model: str, **kwargs: Any) -> None:
            built.update(kwargs, model=model)

    monkeypatch.setattr(ve, "VllmEngine", Recorder)
    params = {"arm": {"name": "fi", "kernel": "cutlass-int8", "env": {}, "attention": {"name": "vllm-flashinfer"}},
              "prompts": {"synthetic": {"length": 8}}, "max_new_tokens": 4, "model": "/ckpt", "model_seed": 0}
    build_vllm_engine(params)
    assert built["attention_backend"] == "FLASHINFER"
    assert "VLLM_ATTENTION_BACKEND" not in built["env"]
