"""A relaunch that finds every unit done still says when finished units' files are damaged (#24, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, tiny_spec_text

pytestmark = pytest.mark.slow  # three launches in subprocesses (~25 s)


def _launch(spec: Path, results: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "sweep", "launch", str(spec), "--results",
                           str(results), "--num-cpus", "1"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})


def test_relaunch_over_a_truncated_file_hints_verify_and_repair(tmp_path: Path) -> None:
    from storage.store import open_store
    from storage.verify import quick_check

    spec = tmp_path / "tiny.toml"
    spec.write_text(tiny_spec_text(name="hint", seeds=1))
    results = tmp_path / "results"
    first = _launch(spec, results)
    assert first.returncode == 0, first.stderr
    again = _launch(spec, results)
    assert again.returncode == 0 and "warning:" not in again.stderr  # all done, nothing damaged: no hint
    victim = sorted((results / "table=kdepth" / "sweep=hint").glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:-10])
    assert quick_check(open_store(results), "hint") == [victim.stem]
    hinted = _launch(spec, results)
    assert hinted.returncode == 0 and "skipped (done before)" in hinted.stderr
    assert "warning: 1 finished unit of hint has files missing" in " ".join(hinted.stderr.split())
    assert "sweep verify" in hinted.stderr and "--repair" in hinted.stderr
