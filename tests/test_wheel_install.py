"""swapcheck installed from a wheel, used outside the checkout (issue #37: a wheel built from the
repository had no ``models/``, so ``answer-qwen3`` existed only in a checkout).

Slow: builds the wheel (no build isolation: the lock's setuptools), checks that it carries the shipped
model and the package data, installs it with ``--no-deps`` into a fresh virtual environment whose
dependencies come from this environment's site-packages (a ``.pth`` line after the new environment's
own: swapcheck itself is the wheel's, never this checkout), and runs the answer demo there, in a
directory outside the checkout: the launch, then the certificate.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_the_wheel_carries_the_shipped_model_and_runs_the_answer_demo_outside_the_checkout(tmp_path: Path) -> None:
    # Built from a copy of the tree's files (tracked, and new ones not ignored): a checkout's own build/
    # may hold files the tree no longer has, which setuptools would pack.
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(dist), str(src)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("swapcheck-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("config.json", "model.safetensors", "MANIFEST.json"):
        assert f"tasks/models/shipped/answer-qwen3/{f}" in names
    assert "tasks/fingerprint.py" in names and "tasks/kernels/fingerprint.py" not in names
    assert any(n.startswith("storage/queries/") for n in names) and any(n.startswith("reports/templates/") for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    ours = sysconfig.get_paths()["purelib"]
    (purelib / "zz_swapcheck_deps.pth").write_text(ours + "\n")  # after the venv's own site-packages
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                                "--no-deps", "-q", str(wheel)], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]

    work = tmp_path / "elsewhere"
    (work / "prompts").mkdir(parents=True)
    shutil.copy(REPO / "sweeps" / "answer-demo.toml", work / "answer-demo.toml")
    shutil.copy(REPO / "sweeps" / "prompts" / "answer-demo.jsonl", work / "prompts" / "answer-demo.jsonl")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    swapcheck = str(venv / "bin" / "swapcheck")
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import tasks.models.checkpoint as c; print(c.MODELS_DIR)"],
                           capture_output=True, text=True, cwd=work, env=env, check=True).stdout.strip()
    assert where.startswith(str(venv)) and not where.startswith(str(REPO)), where  # the wheel's, not the checkout's
    launched = subprocess.run([swapcheck, "sweep", "launch", "answer-demo.toml", "--results", "results", "--no-progress"],
                              capture_output=True, text=True, cwd=work, env=env, timeout=1200)
    assert launched.returncode == 0, launched.stderr[-3000:]
    report = subprocess.run([swapcheck, "report", "certificate", "--results", "results"], capture_output=True,
                            text=True, cwd=work, env=env, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "int8-cutlass-order vs int8-triton-order" in report.stdout, report.stdout[-2000:]
