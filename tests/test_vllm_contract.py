"""The contract with vLLM, against vLLM's own wheels (issue #37; tools/vllm_contract.py).

Slow: each fetches the vLLM 0.32.0 wheel (no dependencies; cached between runs under
$SWAPCHECK_VLLM_WHEELS or ~/.cache/swapcheck/vllm-wheels) from the package index.

* every term of the contract holds in 0.32.0;
* a copy of 0.32.0's source with one argument renamed breaks the contract, naming swapcheck's call site;
* vLLM 0.32's own logging configuration, imported from the wheel: a handler attached to the ``vllm``
  logger before ``LLM()`` configures logging is removed (the defect: no kernel-selection line was ever
  collected); attached after ``configure_vllm_logging()`` (what the engine now does first), it stays
  through ``LLM()``'s own call and receives vLLM's INFO lines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import vllm_contract  # noqa: E402

pytestmark = pytest.mark.slow


def test_every_term_holds_in_the_pinned_wheel(capsys: pytest.CaptureFixture[str]) -> None:
    assert vllm_contract.main(["--versions", "0.32.0"]) == 0
    out = capsys.readouterr().out
    assert "vLLM 0.32.0 (allowed):" in out and "BREAK" not in out
    assert "attention_backend" in out and "AttentionBackendEnum members FLASH_ATTN" in out


def test_an_argument_renamed_in_a_copy_of_the_wheel_names_the_call_site(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "vllm-src"
    shutil.copytree(vllm_contract.fetch("0.32.0"), copy)
    args = copy / "vllm" / "engine" / "arg_utils.py"
    text = args.read_text()
    assert "    attention_backend: " in text
    args.write_text(text.replace("    attention_backend: ", "    attn_backend: ", 1))
    assert vllm_contract.main(["--source", str(copy)]) == 1
    captured = capsys.readouterr()
    broken = [line for line in captured.out.splitlines() if "BREAK" in line]
    assert len(broken) == 1 and "tasks/models/vllm_engine.py:VllmEngine.__init__" in broken[0], captured.out
    assert "EngineArgs has no field attention_backend" in captured.out
    assert "1 term(s) of the contract break" in captured.err


def test_vllm_032s_own_logging_config_drops_an_early_handler_and_keeps_one_attached_after() -> None:
    script = textwrap.dedent('''
        import logging
        import vllm.logger as vl
        from vllm.config.logging import LoggingConfig
        from tasks.models.vllm_engine import configure_vllm_logging

        class Lines(logging.Handler):
            def __init__(self):
                super().__init__(logging.INFO)
                self.lines = []
            def emit(self, record):
                self.lines.append(record.getMessage())

        vllm_logger = logging.getLogger("vllm")
        early = Lines()
        vllm_logger.addHandler(early)                  # what VllmEngine did before issue #37
        vl.configure_logging_if_needed(LoggingConfig())  # LLM.__init__'s first call in the process
        print("early kept:", early in vllm_logger.handlers)
        vl._last_configured_logging_config = None       # a fresh process again
        print("applied:", configure_vllm_logging())     # what VllmEngine does now, first
        late = Lines()
        vllm_logger.addHandler(late)
        vllm_logger.setLevel(logging.INFO)
        vl.configure_logging_if_needed(LoggingConfig())  # LLM.__init__ again: the same config, no dictConfig
        print("late kept:", late in vllm_logger.handlers)
        vl.init_logger("vllm.model_executor.kernels").info("Selected %s for %s", "CutlassInt8ScaledMMLinearKernel",
                                                           "CompressedTensorsW8A8Int8")
        print("collected:", late.lines)
    ''')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([vllm_contract.import_path("0.32.0"), str(REPO)]),
           "VLLM_LOGGING_LEVEL": "INFO"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "early kept: False" in out, out  # the defect, reproduced by vLLM's own code
    assert "applied: True" in out and "late kept: True" in out, out
    assert "collected: ['Selected CutlassInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8']" in out, out
