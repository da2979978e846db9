"""The GPU lease kit (issue #38, infra/gpu-kit/run.sh, orchestrator/gpukit.py), tested without a GPU.

``run.sh --cpu`` runs the kit's own code with every device call replaced by its CPU counterpart; these tests
run it as a user would (the shell script, a fresh OUT), then read its output on the CPU side as docs/gpu.md
says (unpack, ``sweep verify``, ``report all``), and once more on a Python without Ray, DuckDB and vLLM (the
borrowed machine has none of them). The Triton kernel under Triton's interpreter: tests/test_triton_kernel.py.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

from orchestrator import gpukit

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "infra" / "gpu-kit" / "run.sh"
CLI = [str(Path(sys.executable).parent / "swapcheck")]
#: The kernels whose `device` param the CPU spec sets to "cpu" (their CPU counterparts).
DEVICE_KERNELS = {"cublas-int8", "cublas-matmul", "triton-scaled-mm", "torch-scaled-mm-cuda"}


def _kit(out: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(RUN), "--cpu", str(out), *args], capture_output=True, text=True, env=full,
                          timeout=timeout, cwd=REPO)


def _unpack(out: Path, dest: Path) -> Path:
    with tarfile.open(out / "results.tar.gz") as tar:
        tar.extractall(dest, filter="data")
    return dest


def _entries(spec: dict, exp: dict) -> list[tuple[str, dict, str]]:
    fields = gpukit._KERNEL_LISTS.get(exp["kind"], ())
    return [gpukit._impl(e) for f in fields for e in exp.get(f, []) if not isinstance(e, list)]


def _on_cpu() -> dict[str, str]:
    """Each SDPA backend's CUDA entry -> its CPU counterpart (attention kernels name their device)."""
    from tasks.attention.sdpa import SDPA_NAMES

    return {SDPA_NAMES[(b, "cuda")]: SDPA_NAMES[(b, "cpu")] for b, d in SDPA_NAMES if d == "cuda"}


def test_cpu_spec_mirrors_the_gpu_spec() -> None:
    """The --cpu mode runs the same experiments and labels, each device kernel on the CPU, nothing else."""
    gpu = tomllib.loads(gpukit.SPECS["gpu"].read_text())
    cpu = tomllib.loads(gpukit.SPECS["cpu"].read_text())
    assert list(gpu["experiments"]) == list(cpu["experiments"])
    on_cpu = _on_cpu()
    for name, exp in gpu["experiments"].items():
        g, c = _entries(gpu, exp), _entries(cpu, cpu["experiments"][name])
        if exp["kind"] == "attention_replay":  # pairs, and the tables keyed by their kernels, mapped
            cexp = cpu["experiments"][name]
            assert [[on_cpu[a], on_cpu[b]] for a, b in exp["pairs"]] == cexp["pairs"], name
            for field in ("algorithms", "ulps"):
                assert {on_cpu[k]: v for k, v in exp.get(field, {}).items()} == cexp.get(field, {}), (name, field)
            rest = {"pairs", "algorithms", "ulps"}
            assert {k: v for k, v in exp.items() if k not in rest} == {k: v for k, v in cexp.items() if k not in rest}
            continue
        if exp.get("attention_kernels"):  # attention kernels name their device (tasks/attention/sdpa.py)
            assert [on_cpu[e[0]] for e in g] == [e[0] for e in c], name
            continue
        assert [e[2] for e in g] == [e[2] for e in c], name
        for (gk, gp, label), (ck, cp, _) in zip(g, c, strict=True):
            assert gk == ck, label
            if gk in DEVICE_KERNELS:
                assert gp.get("device", "cuda") == "cuda" and cp.get("device") == "cpu", label
                assert {k: v for k, v in cp.items() if k != "device"} == gp, label
            else:
                assert "device" not in cp, label
    assert gpu["preregistration"] == cpu["preregistration"] == ["predictions.toml"]


def test_spec_text_round_trips_and_drops_what_cannot_run() -> None:
    text = gpukit.SPECS["gpu"].read_text()
    data, dropped = gpukit.runnable_spec(text)
    # No CUDA here: every device kernel of the GPU spec is dropped, with its reason; emulations stay.
    assert dropped and all("not available here" in d or "dropped" in d for d in dropped)
    assert any("cublas-int8-channelwise not available here" in d and "CUDA" in d for d in dropped), dropped
    kd = data["experiments"]["int8-kdepth"]["implementations"]
    assert kd == ["int8-torch-channelwise", "int8-cutlass-order", "int8-triton-order"]
    assert "exact-match" not in data["experiments"]  # every kernel of it needs the GPU
    out = gpukit.spec_text(data, "# header")
    assert tomllib.loads(out) == data


def test_headline_pairs_are_each_gpu_kernel_and_its_emulation() -> None:
    data = tomllib.loads(gpukit.SPECS["cpu"].read_text())
    pairs = gpukit.headline_pairs(data)
    assert ("cublas-int8-channelwise", "int8-torch-channelwise") in pairs
    assert ("cublas-int8-cutlass-order", "int8-cutlass-order") in pairs
    assert ("cublas-int8-triton-order", "int8-triton-order") in pairs
    assert ("sdpa-flash-cpu", "sdpa-math") in pairs  # the replay's attention pairs too
    assert len({frozenset(p) for p in pairs}) == len(pairs)


def test_a_replay_loses_each_pair_with_an_unavailable_kernel_and_its_keys() -> None:
    """attention_replay's pairs: every pair with a kernel not available here is dropped (one line each, naming
    the kernel and why), the algorithms of kernels no kept pair names go with them, and a replay left without
    pairs is dropped; on the GPU spec here (no CUDA) every pair goes."""
    cpu, dropped = gpukit.runnable_spec(gpukit.SPECS["cpu"].read_text())
    replay = cpu["experiments"]["sdpa-replay-bf16"]
    assert replay["pairs"] == [["sdpa-flash-cpu", "sdpa-math"]]
    assert replay["algorithms"] == {"sdpa-flash-cpu": "fused-general", "sdpa-math": "plain"}
    lines = [d for d in dropped if d.startswith("experiments.sdpa-replay-bf16.pairs: ")]
    assert len(lines) == 2, lines
    assert ("experiments.sdpa-replay-bf16.pairs: pair sdpa-flash-cpu~sdpa-efficient-cpu dropped, sdpa-efficient-cpu "
            "not available here: PyTorch has no CPU implementation") in "\n".join(lines)
    for name in ("sdpa-replay-fp32", "sdpa-replay-bf16-cudnn"):  # cuDNN and efficient have no CPU counterpart
        assert f"experiments.{name}: dropped, none of its pairs can run here" in dropped
        assert name not in cpu["experiments"]
    from orchestrator.spec import parse_spec

    # What remains is a valid spec: no key names a dropped kernel.
    parse_spec(gpukit.spec_text(cpu, "# kit"), str(gpukit.SPECS["cpu"]))
    gpu, gdropped = gpukit.runnable_spec(gpukit.SPECS["gpu"].read_text())
    if gpukit._unavailable("attention_replay", "pairs", "sdpa-flash-cuda") is not None:
        assert not any(n.startswith("sdpa-replay") for n in gpu["experiments"])
        assert sum(d.startswith("experiments.sdpa-replay-bf16.pairs: pair ") for d in gdropped) == 3
        assert sum(d.startswith("experiments.sdpa-replay-bf16-cudnn.pairs: pair ") for d in gdropped) == 3


def test_a_replay_is_dropped_where_transformers_is_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    real = gpukit._importable
    monkeypatch.setattr(gpukit, "_importable", lambda m: m != "transformers" and real(m))
    data, dropped = gpukit.runnable_spec(gpukit.SPECS["cpu"].read_text())
    assert "sdpa-replay-bf16" not in data["experiments"] and "sdpa-batch-invariance-bf16" in data["experiments"]
    assert ("experiments.sdpa-replay-bf16: dropped, its kind (attention_replay) needs transformers, which is not "
            "importable here") in dropped


def test_out_must_be_new_or_empty(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("mine")
    proc = _kit(tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "must be a new or empty folder" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]


def test_cpu_kit_end_to_end_read_by_the_cpu_side(tmp_path: Path) -> None:
    """run.sh --cpu OUT as a user runs it; then unpack, verify and report as docs/gpu.md says."""
    out = tmp_path / "out"
    proc = _kit(out, "--work", str(tmp_path / "work"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(gpukit.OUT_FILES) and len(files) <= gpukit.MAX_FILES
    assert all(p.stat().st_size <= gpukit.MAX_FILE_BYTES for p in out.iterdir())
    summary = (out / "summary.txt").read_text()
    assert "sweep verify: clean" in summary
    assert "0 failed" in summary, summary
    assert "cublas-int8-channelwise vs int8-torch-channelwise: IDENTICAL" in summary
    assert "CONFIRMED cublas-int8-channelwise-is-its-emulation" in summary
    assert "REFUTED" not in summary, summary
    assert "fused-differs-on-gpu" not in summary  # what only a GPU can show is not registered
    assert "batch invariance" in summary and "cublas-matmul-fp32 (fp32): bit-invariant" in summary
    assert "sdpa-flash-cpu" in summary and "dropped: sdpa-efficient-cpu (" in summary
    # The SDPA backends' replay (CPU counterparts: flash and math): the pair's certificate and verdict.
    assert re.search(r"^  sdpa-flash-cpu vs sdpa-math: (IDENTICAL|WITHIN_ALGORITHM_BOUND) ", summary, re.M), summary
    assert "pair sdpa-flash-cpu~sdpa-efficient-cpu dropped" in (out / "spec.toml").read_text()  # every place
    device = json.loads((out / "device.json").read_text())
    assert device["mode"] == "cpu" and device["torch"]
    assert (out / "kit.log").read_text().count("ok") >= 10  # every unit's line is in the log
    ran = tomllib.loads((out / "spec.toml").read_text())
    assert ran["name"] == "gpu-kit-cpu"

    results = _unpack(out, tmp_path / "unpacked")
    verify = subprocess.run([*CLI, "sweep", "verify", "--results", str(results)], capture_output=True, text=True)
    assert verify.returncode == 0 and "clean" in verify.stderr, verify.stdout + verify.stderr
    report = subprocess.run([*CLI, "report", "all", "--results", str(results), "--format", "markdown"],
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    for text in ("cublas-int8-channelwise", "int8-torch-channelwise", "IDENTICAL", "cublas-matmul-bf16",
                 "cublaslt-fp8-fast", "bit-invariant", "cublas-int8-channelwise-is-its-emulation",
                 "sdpa-flash-cpu within the bounds of fused-general", "sdpa-math within the bounds of plain"):
        assert text in report.stdout, text
    # The device's identity is in the provenance the CPU side reads.
    launches = subprocess.run([*CLI, "query", "--results", str(results), "--format", "json",
                               "select provenance_json from launches"], capture_output=True, text=True)
    prov = json.loads(json.loads(launches.stdout)[0]["provenance_json"])
    assert "libraries" in prov["identity"] and prov["identity"]["gpu"] == "no CUDA device"


def test_kit_runs_on_a_python_without_ray_duckdb_or_vllm(tmp_path: Path) -> None:
    """The borrowed machine has no Ray, DuckDB or vLLM: the kit runs, says the summary has no verdict
    table, and the tree it packs verifies on the CPU side. A budget that ends before the last unit
    ends the run with status budget; the same --work again runs the rest, nothing twice."""
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class _Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('ray', 'duckdb', 'vllm'):\n"
        "            raise ImportError(f'{name} is not installed on this machine')\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Block())\n")
    env = {"PYTHONPATH": str(block)}
    work = tmp_path / "work"
    first = _kit(tmp_path / "out1", "--work", str(work), "--budget-s", "0.0001", env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    s1 = (tmp_path / "out1" / "summary.txt").read_text()
    assert "DuckDB is not importable here" in s1
    assert "budget reached" in s1, s1
    second = _kit(tmp_path / "out2", "--work", str(work), env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    s2 = (tmp_path / "out2" / "summary.txt").read_text()
    assert "(finished)" in s2 and "0 failed" in s2 and "sweep verify: clean" in s2, s2
    results = _unpack(tmp_path / "out2", tmp_path / "unpacked")
    dup = subprocess.run([*CLI, "query", "--results", str(results), "--format", "json",
                          "select count(*) as n, count(distinct unit_id) as d from units"], capture_output=True, text=True)
    row = json.loads(dup.stdout)[0]
    assert row["n"] == row["d"] > 0
    statuses = subprocess.run([*CLI, "query", "--results", str(results), "--format", "json",
                               "select status from launches order by started_at"], capture_output=True, text=True)
    assert [r["status"] for r in json.loads(statuses.stdout)] == ["budget", "finished"]


#: Every torch API the kit's own modules call, each present in torch 2.11 (the borrowed machine's) and in
#: 2.13 (this project's pin): a new one must be added here after checking it exists in 2.11.
KIT_TORCH_APIS = {
    # public, in torch 2.11's documentation
    "torch.__version__", "torch.version.cuda", "torch.empty", "torch.from_numpy", "torch.matmul", "torch.addcmul",
    "torch.maximum", "torch.minimum", "torch.nn.functional.scaled_dot_product_attention",
    "torch.backends.cuda.matmul", "torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.is_available",
    "torch.backends.mkldnn", "torch.backends.cpu.get_cpu_capability",
    "torch.cuda.device_count", "torch.cuda.get_device_capability", "torch.cuda.get_device_name",
    "torch.cuda.get_device_properties", "torch.cuda.is_available",
    "torch.bool", "torch.finfo", "torch.ones", "torch.tensor", "torch.where", "torch.zeros",
    # private, present since torch 2.0 (torch._int_mm) and read only through getattr with a fallback (torch._C)
    "torch._int_mm", "torch._C",
}
KIT_MODULES = ["orchestrator/gpukit.py", "tasks/kernels/cublas.py", "tasks/kernels/triton_mm.py",
               "tasks/kernels/_triton_jit.py", "tasks/attention/sdpa.py", "tasks/kinds/attention_replay.py"]


def _torch_apis(path: Path) -> set[str]:
    """``torch.a.b.c`` attribute chains a module uses (longest chain per expression)."""
    found: set[str] = set()

    def chain(node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id == "torch" and parts:
            return ".".join(["torch", *reversed(parts)])
        return None

    tree = ast.parse(path.read_text())
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            c = chain(node)
            if c:
                found.add(c)
                sub = node.value
                while isinstance(sub, ast.Attribute):
                    inner.add(id(sub))
                    sub = sub.value
    return found


@pytest.mark.parametrize("module", KIT_MODULES)
def test_kit_code_uses_only_torch_apis_of_torch_2_11(module: str) -> None:
    path = REPO / module
    if not path.exists():
        pytest.skip(f"{module} is not in this checkout")
    used = {a for a in _torch_apis(path) if not a.startswith(("torch.float", "torch.bfloat16", "torch.int", "torch.Tensor",
                                                                  "torch.dtype", "torch.Size", "torch.device"))}
    import torch

    for api in used:  # each exists in the torch installed here
        obj: object = torch
        for part in api.split(".")[1:]:
            assert hasattr(obj, part), f"{module}: {api} does not exist in torch {torch.__version__}"
            obj = getattr(obj, part)
    unknown = used - KIT_TORCH_APIS
    assert not unknown, (f"{module} uses torch APIs not yet checked against torch 2.11: {sorted(unknown)}; check "
                         "each exists in torch 2.11 and add it to KIT_TORCH_APIS")


def test_kit_wheels_are_the_locks_pins_with_their_hashes() -> None:
    """make gpu-kit-wheels downloads exactly cpu.lock's versions of what the borrowed machine lacks, checked
    against the lock's hashes (pip download --require-hashes): the requirements it hands pip."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gpu_kit_wheels as kw
    finally:
        sys.path.remove(str(REPO / "tools"))
    req = kw.lock_entries(kw.LOCK, kw.PACKAGES)
    pins = {line.split("==")[0].lower(): line.split("==")[1].split()[0] for line in req.splitlines()
            if "==" in line and not line.startswith(" ")}
    assert set(pins) == set(kw.PACKAGES)
    lock = kw.LOCK.read_text()
    for name, version in pins.items():
        assert f"{name}=={version}" in lock
    assert req.count("--hash=sha256:") >= len(kw.PACKAGES)
    assert not req.rstrip().endswith("\\")
    with pytest.raises(SystemExit, match="no pin for"):
        kw.lock_entries(kw.LOCK, ("no-such-package",))
    tree, wheels = kw.travelling_bytes()
    assert 0 < tree < kw.BUDGET_BYTES


def test_a_bad_spec_is_refused_with_exit_2_naming_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nquestion = "q"\n[experiments.a]\nkind = "kdepth"\ndtype = "int9"\n'
                   'implementations = ["exact"]\nk = [8]\n')
    proc = _kit(tmp_path / "out", "--spec", str(bad), "--work", str(tmp_path / "work"), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: {bad}: invalid sweep spec; nothing was written." in proc.stderr
    assert "experiments.a.dtype" in proc.stderr and "int9" in proc.stderr
    assert not (tmp_path / "work" / "results").exists()
