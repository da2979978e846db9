"""The user-code rule (issue #24, item 4): which modules a ``module:attr`` kernel name may import.

A ``__main__`` module (any component of the dotted path) is a program's entry point: importing
``llvmlite.tests.__main__`` ran llvmlite's test suite, ``typer.__main__`` / ``certifi.__main__`` /
``pyparsing.__main__`` / ``flask.__main__`` ran their CLIs on swapcheck's own arguments.  Installed
third-party packages are imported only when their distribution declares the ``swapcheck.kernels``
entry-point group.  Every refusal is a KernelError (exit 2) naming the module and the rule, decided
before anything is imported: each case checks ``sys.modules`` in a fresh interpreter and runs the
real CLI (``sweep validate``, ``check replay``) in a subprocess, so a regression cannot run a test
suite or a CLI inside pytest.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tasks.kernels.registry as reg
from tasks.kernels import KernelError, get_kernel
from tests.conftest import REPO

#: (kernel name, the distribution's top-level package that must be installed)
MAIN_CASES = [
    ("llvmlite.tests.__main__:x", "llvmlite"),
    ("typer.__main__:x", "typer"),
    ("certifi.__main__:x", "certifi"),
    ("pyparsing.__main__:x", "pyparsing"),
    ("flask.__main__:x", "flask"),
]
#: What a __main__ program that did run would print (a test suite, a CLI's usage or its output).
RAN_MARKS = ("Ran ", "Usage:", "usage:", "cacert.pem", "Traceback", "OK (", "FAILED (")


def _installed(top: str) -> bool:
    return importlib.util.find_spec(top) is not None


def _cases() -> list:
    return [
        pytest.param(name, marks=pytest.mark.skipif(not _installed(top), reason=f"{top} not installed"), id=top)
        for name, top in MAIN_CASES
    ]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    env.pop("SWAPCHECK_USER_KERNELS", None)
    return env


def _swapcheck(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("swapcheck")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "orchestrator.cli.main"]
    return subprocess.run([*cmd, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120)


# -- get_kernel, in a fresh interpreter: refused, and nothing imported --------------------------------

PROBE = textwrap.dedent("""
    import json, sys
    from tasks.kernels import KernelError, get_kernel
    out = {}
    for name in sys.argv[1:]:
        module = name.partition(":")[0]
        top = module.split(".")[0]
        before = {m for m in sys.modules if m.split(".")[0] == top}
        loaded = module in sys.modules  # only '__main__' itself, the running program
        try:
            get_kernel(name)
            msg = None
        except KernelError as exc:
            msg = str(exc)
        after = {m for m in sys.modules if m.split(".")[0] == top}
        out[name] = {"error": msg, "new_modules": sorted(after - before), "target_loaded": module in sys.modules and not loaded}
    print("PROBE" + json.dumps(out))
""")


def test_get_kernel_refuses_main_modules_without_importing_them(tmp_path: Path) -> None:
    names = [n for n, top in MAIN_CASES if _installed(top)] + ["__main__:x", "flask.cli:x", "typer.main:x"]
    proc = subprocess.run([sys.executable, "-c", PROBE, *names], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE"))
    found = json.loads(line[len("PROBE"):])
    for name in names:
        r = found[name]
        module = name.partition(":")[0]
        if name == "flask.cli:x" and not _installed("flask"):
            continue
        assert r["error"] is not None, f"{name} was not refused"
        assert "user-code rule" in r["error"] and repr(module) in r["error"], r["error"]
        assert "it was not imported and nothing was called" in r["error"]
        assert r["new_modules"] == [] and r["target_loaded"] is False, (name, r)
        rule = "the __main__ rule" if "__main__" in module.split(".") else "the installed-package rule"
        assert rule in r["error"], r["error"]
    for mark in RAN_MARKS:
        assert mark not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", [n for n, _ in MAIN_CASES] + ["__main__:x", "pkg.sub.__main__.deeper:x", "unittest.__main__:x"])
def test_main_rule_is_decided_from_the_name_alone(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The __main__ rule needs no lookup at all: it holds even where nothing could be found."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda *a, **k: pytest.fail("find_spec was called"))
    with pytest.raises(KernelError, match=r"the __main__ rule"):
        get_kernel(name)


def test_own_main_module_is_refused_and_does_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a user's own package: ``mypkg.__main__`` is a program, never a kernel module."""
    pkg = tmp_path / "uc_own_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    marker = tmp_path / "ran"
    (pkg / "__main__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KernelError, match=r"'uc_own_pkg\.__main__' is a __main__ module"):
        get_kernel("uc_own_pkg.__main__:x")
    assert not marker.exists()
    assert "uc_own_pkg" not in sys.modules and "uc_own_pkg.__main__" not in sys.modules


def test_own_modules_are_still_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = tmp_path / "uc_own_kernels.py"
    mod.write_text("from tasks.kernels import kernel_function\n\n"
                   "@kernel_function\ndef mm(a, b):\n    return a @ b\n")  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        k = get_kernel("uc_own_kernels:mm")
        assert k.name == "uc_own_kernels:mm"
        assert reg._user_code_refusal("uc_own_kernels") is None
        assert reg._user_code_refusal("tasks.kernels.int8") is None  # swapcheck's own
    finally:
        sys.modules.pop("uc_own_kernels", None)


@pytest.mark.skipif(not _installed("flask"), reason="flask not installed")
def test_installed_packages_need_the_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed distribution is importable from a kernel name only once it declares the
    ``swapcheck.kernels`` group (its __main__ never)."""
    assert "the installed-package rule" in (reg._user_code_refusal("flask.cli") or "")
    monkeypatch.setattr(reg, "_kernel_distributions", lambda: {"swapcheck", "flask"})
    assert reg._user_code_refusal("flask.cli") is None
    assert "the __main__ rule" in (reg._user_code_refusal("flask.__main__") or "")


# -- the CLI, in a subprocess: exit 2, the rule named, nothing ran ------------------------------------

SPEC = """question = "q?"
name = "user-code-rule"

[experiments.int8]
kind = "kdepth"
dtype = "int8"
implementations = ["int8-cutlass-order", "{kernel}"]
m = 16
n = 24
k = 64
seeds = 1
"""


def _artifact(path: Path, kernel: str) -> Path:
    """A minimal, valid fuzz-failure artifact whose recorded kernel is ``kernel``."""
    import torch
    from safetensors.torch import save_file

    from tasks.checks.artifact import FORMAT, FORMAT_VERSION

    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "kernel": {"ref": kernel, "params": {}},
            "check": {"name": "exact_match", "dtype": "fp32", "info": {}},
            "shape": {"m": 2, "k": 3, "n": 2}, "seed": 0, "trial": 0, "verdict": "INCORRECT"}  # fmt: skip
    tensors = {"a": torch.zeros(2, 3), "b": torch.zeros(3, 2)}
    save_file(tensors, str(path), metadata={"swapcheck": json.dumps(meta)})
    return path


def _refused_by_cli(proc: subprocess.CompletedProcess[str], module: str, where: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "the __main__ rule" in out and repr(module) in out and where in out, out
    assert "it was not imported" in out, out
    for mark in RAN_MARKS:
        assert mark not in out, out


@pytest.mark.slow  # two CLI subprocesses per installed package; get_kernel's refusal runs in the default set
@pytest.mark.parametrize("name", _cases())
def test_sweep_validate_and_check_replay_refuse_main_modules(name: str, tmp_path: Path) -> None:
    module = name.partition(":")[0]
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(kernel=name))
    _refused_by_cli(_swapcheck(["sweep", "validate", str(spec)], tmp_path), module,
                    "experiments.int8.implementations[1]")  # fmt: skip
    art = _artifact(tmp_path / "a.safetensors", name)
    _refused_by_cli(_swapcheck(["check", "replay", str(art)], tmp_path), module, "kernel.ref")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "spec.toml"]  # nothing written
