"""benchmarks/gpu_smoke.py without a GPU: every section runs with CPU stand-ins for the GPU kernels.

This tests the script (its sections, its table, its exit rule), not any GPU: the stand-ins are the
CPU emulations of the same epilogues, so every "GPU vs emulation" line must read 0 differing.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tasks.kernels import get_kernel
from tests.conftest import REPO

STANDIN = {
    "vllm-cutlass": ("int8-cutlass-order", {}),
    "vllm-cutlass-raw": ("int8-cutlass-order", {}),
    "vllm-triton": ("int8-triton-order", {"bias_mode": "fp32"}),
    "torch-scaled-mm-cuda": ("fp8-torch-scaled-mm", {}),
}


@pytest.fixture
def smoke(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_smoke_under_test", REPO / "benchmarks" / "gpu_smoke.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)

    def kernel(name, **params):
        if name not in STANDIN:
            return get_kernel(name, **params)
        target, base = STANDIN[name]
        k = get_kernel(target, **base)
        k.cpu_counterpart = lambda k_, n_: {"kernel": target, "params": base}
        return k

    def run(kernel, ops, out_dtype, device):
        return kernel(ops["a"], ops["b"], ops["scale_a"], ops["scale_b"], out_dtype, ops["bias"])

    monkeypatch.setattr(mod, "_kernel", kernel)
    monkeypatch.setattr(mod, "_run", run)
    return mod


AVAIL = dict.fromkeys(STANDIN, True)


def test_emulation_section(smoke):
    rep = smoke.Report()
    assert smoke.section_emulation(rep, AVAIL)
    lines = [line for line in rep.lines if " vs " in line and not line.startswith("==")]
    assert len(lines) == 12 and all(": 0/" in line for line in lines), lines


def test_kdepth_section_and_table(smoke):
    rep = smoke.Report()
    rows, ok = smoke.section_kdepth(rep, AVAIL, [32, 128], 8, 32, 1, smoke.Budget(300))
    assert ok and len(rows) == 2 * 3 * 2 * 2  # dtypes x pairs x scales x K
    assert smoke.table(rep, rows)
    assert rep.lines[-1].startswith("int8") or rep.lines[-1].startswith("fp8")
    pow2 = [r for r in rows if r["dtype"] == "int8" and r["scale"] == "pow2"]
    assert all(r["differing"] == 0 for r in pow2)
    bad = [{**rows[0], "dtype": "int8", "scale": "pow2", "differing": 1}]
    assert not smoke.table(smoke.Report(), bad)


def test_kdepth_degrades_without_vllm(smoke):
    rep = smoke.Report()
    rows, ok = smoke.section_kdepth(rep, {**AVAIL, "vllm-cutlass": False}, [32], 8, 32, 1, smoke.Budget(300))
    assert ok and {r["dtype"] for r in rows} == {"fp8_e4m3"}
    assert any(line.startswith("int8: skipped") for line in rep.lines)


def test_checks_section(smoke, monkeypatch):
    import tasks.checks as checks

    real = checks.load_subject

    def load(name, params=None, **kw):
        target, base = STANDIN[name]
        return real(target, base, **kw)

    monkeypatch.setattr(checks, "load_subject", load)
    rep = smoke.Report()
    assert smoke.section_checks(rep, AVAIL, 1, smoke.Budget(600))
    verdicts = [line for line in rep.lines if not line.startswith("==") and ("exact-match" in line or "bounds" in line)]
    assert len(verdicts) == 10 and not any("ERROR" in line for line in verdicts), rep.lines
