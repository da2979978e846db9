"""A unit's id covers the code of a user's kernel (issue #36): an edited kernel is not served its old results.

Fast: the fingerprint of a ``module:attr`` kernel (its module, the helpers of its package) changes with its
code and only then; built-ins have none (their ids are pinned: tests/test_pinned_ids.py); the kernel whose
code changed is named. Slow: the whole story through the CLI -- launch, relaunch (nothing to run), edit the
kernel's arithmetic, relaunch: refused (exit 2) naming the kernel and its fingerprints, where it had been
"0 to run" with the old results; under a new sweep name the new code runs and the report changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.plan import code_changes
from tasks.kinds import Unit, unit_id
from tasks.kinds.base import canonical_json
from tasks.kinds.fields import Implementation, Resources, impl_payload

KERNEL = '''
from tasks.kernels.int8 import Int8CutlassOrder
from {pkg}.helpers import FACTOR


class Scaled(Int8CutlassOrder):
    """int8-cutlass-order times FACTOR (1.0: the same bits)."""

    name = ""

    def compute(self, ops):
        return (super().compute(ops).float() * FACTOR).to(ops.out_dtype)
'''


def _package(root: Path, pkg: str, factor: str = "1.0") -> Path:
    d = root / pkg
    d.mkdir(parents=True, exist_ok=True)
    (d / "__init__.py").write_text("")
    (d / "kernels.py").write_text(textwrap.dedent(KERNEL.format(pkg=pkg)))
    (d / "helpers.py").write_text(f"FACTOR = {factor}\n")
    return d


def test_the_fingerprint_follows_the_code_of_the_kernel_and_its_helpers(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.kernels.registry import kernel_code

    d = _package(tmp_path, "fp_pkg_a")
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = "fp_pkg_a.kernels:Scaled"
    first = kernel_code(ref)
    assert first is not None and len(first) == 16 and kernel_code(ref) == first
    (d / "helpers.py").write_text("FACTOR = 1.01\n")  # a helper the kernel imports: its code changed
    second = kernel_code(ref)
    assert second not in (None, first)
    (d / "helpers.py").write_text("FACTOR = 1.0\n")
    assert kernel_code(ref) == first  # the same code, the same fingerprint
    (d / "notes.txt").write_text("not code")
    assert kernel_code(ref) == first
    # the same package checked out elsewhere (another node): the same fingerprint
    other = tmp_path / "elsewhere"
    _package(other, "fp_pkg_a")
    assert kernel_code(ref) == first
    for builtin in ("int8-cutlass-order", "exact", "fp8-blocked-128", "int8-onednn"):
        assert kernel_code(builtin) is None


def test_only_a_users_kernel_puts_its_code_into_the_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(tmp_path, "fp_pkg_b")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "code" not in impl_payload(Implementation(kernel="int8-cutlass-order"))
    user = impl_payload(Implementation(kernel="fp_pkg_b.kernels:Scaled"))
    assert user["code"] and user["version"] == "1"


def _unit(params: dict) -> Unit:
    return Unit(unit_id("kdepth", params), "kdepth", "e", params, Resources())


def test_the_kernel_whose_code_changed_is_named() -> None:
    old = {"k": 64, "implementations": [{"name": "mine", "kernel": "p.m:K", "params": {}, "version": "1", "code": "aaaa"},
                                        {"name": "int8-cutlass-order", "kernel": "int8-cutlass-order", "params": {},
                                         "version": "1"}]}
    new = json.loads(json.dumps(old))
    new["implementations"][0]["code"] = "bbbb"
    other = {**new, "k": 128}  # new work, not changed code
    done = {"u1": {"kind": "kdepth", "params_json": canonical_json(old)}}
    (change,) = code_changes([_unit(new), _unit(other)], done)
    assert (change.kernel, change.before, change.now, change.units) == ("p.m:K", ("aaaa",), ("bbbb",), 1)
    assert change.line().startswith("the code of kernel p.m:K changed since this sweep ran it (fingerprint aaaa -> bbbb)")
    assert code_changes([_unit(old)], done) == [] and code_changes([_unit(new)], {}) == []
    # only: a refusal names the code only when nothing else about the plan changed
    assert code_changes([_unit(new), _unit(other)], done, only=True) == []
    assert code_changes([_unit(new)], done, only=True) == [change]


@pytest.mark.slow  # three launches, each starting its own Ray instance (the fast tests above cover the parts)
def test_an_edited_kernel_reruns_its_units_and_the_report_changes(tmp_path: Path) -> None:
    from tests.conftest import REPO

    _package(tmp_path, "fp_pkg_c")
    spec = tmp_path / "mine.toml"
    spec.write_text(textwrap.dedent('''
        question = "Is my kernel the CUTLASS order?"
        name = "mine"

        [experiments.k]
        kind = "kdepth"
        dtype = "int8"
        implementations = ["fp_pkg_c.kernels:Scaled", "int8-cutlass-order"]
        m = 32
        n = 32
        k = [256, 1024]
        seeds = 2
    '''))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    results = tmp_path / "results"

    def swapcheck(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(Path(sys.executable).parent / "swapcheck"), *args], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=600)

    def differing() -> int:
        done = swapcheck("query", "SELECT sum(differing)::BIGINT AS d FROM kdepth WHERE comparison = 'pair'",
                         "--results", str(results), "--format", "json")
        assert done.returncode == 0, done.stderr
        return int(json.loads(done.stdout)[0]["d"])

    first = swapcheck("sweep", "launch", str(spec), "--results", str(results), "--no-progress")
    assert first.returncode == 0, first.stderr[-3000:]
    assert differing() == 0  # FACTOR = 1.0: the same bits as int8-cutlass-order
    again = swapcheck("sweep", "launch", str(spec), "--results", str(results), "--no-progress")
    assert again.returncode == 0 and "code changed" not in again.stderr + again.stdout
    (tmp_path / "fp_pkg_c" / "helpers.py").write_text("FACTOR = 1.01\n")  # 1 % wrong
    edited = swapcheck("sweep", "launch", str(spec), "--results", str(results), "--no-progress")
    out = " ".join((edited.stdout + edited.stderr).split())  # a console may wrap the long line
    # Not "0 to run" with the old results (the defect): refused, the kernel and its fingerprints named,
    # what to do said, nothing written.
    assert edited.returncode == 2, out[-3000:]
    assert "the code of kernel fp_pkg_c.kernels:Scaled changed since this sweep ran it" in out
    assert "4 unit(s) are new work" in out and "new `name`" in out and differing() == 0
    spec.write_text(spec.read_text().replace('name = "mine"', 'name = "mine-edited"'))
    rerun = swapcheck("sweep", "launch", str(spec), "--results", str(results), "--no-progress")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert differing() > 0  # the new sweep's rows: the edited kernel differs from int8-cutlass-order
