"""The kernel's full identity (orchestrator/provenance.py, issue #26): what it records, its hash, the
certificate line that names it and the nightly's identity-change flag. Runs torch, DuckDB and Parquet
here; the GPU part's logic (the autotune cache hash) is tested on files, its device path in
``test_identity_gpu_part`` (marked gpu)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator import provenance
from orchestrator.nightly import identity_change, identity_markdown, launch_identities
from reports import certificate as cf
from storage.catalog import open_catalog
from storage.store import ResultStore

pytestmark = pytest.mark.usefixtures("ledgered_writes")

CPUINFO = """processor\t: 0
model name\t: Test CPU
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_int8 amx_tile foo
processor\t: 1
flags\t\t: fpu
"""
CUDA_CONFIG = """PyTorch built with:
  - Intel(R) oneAPI Math Kernel Library Version 2023.1-Product Build 20230303 for Intel(R) 64
  - Intel(R) MKL-DNN v3.5.3 (Git Hash 66f0cb9eb66affd2da3bf5f8d897376f04aae6af)
  - OpenMP 201511 (a.k.a. OpenMP 4.5)
  - CPU capability usage: AVX2
  - CUDA Runtime 12.4
  - CuDNN 90.1  (built against CUDA 12.4)
  - Build settings: BLAS_INFO=mkl, LAPACK_INFO=mkl, USE_CUDA=ON,
"""


@pytest.fixture(scope="module")
def full() -> dict[str, Any]:
    return provenance.collect()


def test_cpu_flags_and_model_from_cpuinfo_text() -> None:
    assert provenance.cpu_flags(CPUINFO) == ["amx_bf16", "amx_int8", "amx_tile", "avx", "avx2", "avx512_bf16",
                                             "avx512f", "fma"]
    assert provenance.cpu_flags("Features\t: fp asimd sve\n") == ["asimd", "sve"]
    assert provenance.cpu_flags("") == []
    assert provenance.cpu_model(CPUINFO) == "Test CPU"


def test_torch_config_parsed() -> None:
    cfg = provenance.parse_torch_config(CUDA_CONFIG)
    assert cfg == {"onednn": "3.5.3", "mkl": "2023.1", "blas": "mkl", "lapack": "mkl", "openmp": "201511",
                   "cpu_capability_build": "AVX2", "cuda_build": "12.4", "cudnn_build": "90.1"}
    here = provenance.parse_torch_config(torch.__config__.show())
    assert here["blas"] is not None and (here["onednn"] is not None) == torch.backends.mkldnn.is_available()


def test_full_identity_records_what_selects_the_kernel(full: dict[str, Any]) -> None:
    ident = full["identity"]
    assert "torch_error" not in full
    assert ident["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert ident["cpu"]["isa_flags"] == provenance.cpu_flags()
    assert ident["libraries"]["torch"] == torch.__version__
    assert ident["threads"]["intra_op"] == torch.get_num_threads()
    assert ident["matmul"]["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert ident["matmul"]["allow_tf32"] == torch.backends.cuda.matmul.allow_tf32
    assert ident["cpu"]["isa_level"] == provenance.isa_level(torch_capability=torch.backends.cpu.get_cpu_capability())
    # The CPU kernels whose path depends on the CPU report it (issue #35); the rest are listed as not exposing one.
    paths = ident["layout_path"]
    assert paths["int8-cutlass-order"].startswith("int8 accumulator ") and paths["int8-onednn"].startswith("oneDNN ")
    assert "fp8-sequential" in full["layout_path_not_exposed"] and "int8-onednn" not in full["layout_path_not_exposed"]
    assert full["identity_sha256"] == provenance.identity_hash(ident) and len(full["identity_sha256"]) == 16
    json.dumps(full)  # a launch row stores it as JSON


def test_a_precision_setting_changes_the_identity(full: dict[str, Any]) -> None:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if before != "medium" else "high")
    try:
        other = provenance.collect()
    finally:
        torch.set_float32_matmul_precision(before)
    assert other["identity_sha256"] != full["identity_sha256"]
    assert provenance.collect()["identity_sha256"] == full["identity_sha256"]  # stable when nothing changed
    change = identity_change([{"launch_id": "p", **_ident(full)}], [{"launch_id": "t", **_ident(other)}])
    assert change["changed"] is True
    # torch ties allow_tf32 to the precision setting ("highest" is the only one without TF32)
    assert {f["field"] for f in change["fields"]} <= {"matmul.float32_matmul_precision", "matmul.allow_tf32"}
    assert "matmul.float32_matmul_precision" in {f["field"] for f in change["fields"]}
    assert "**Changed**" in identity_markdown(change) and "matmul.float32_matmul_precision" in identity_markdown(change)


def _ident(p: dict[str, Any]) -> dict[str, Any]:
    return {"identity_sha256": p.get("identity_sha256"), "identity": p.get("identity")}


def test_without_torch_facts_nothing_imports_torch() -> None:
    code = ("import sys, json; from orchestrator import provenance as p; f = p.collect(torch_facts=False); "
            "print(json.dumps([('torch' in sys.modules), 'identity_sha256' in f, f['identity']['cpu']['isa_flags']]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    imported, hashed, flags = json.loads(out.stdout)
    assert (imported, hashed, flags) == (False, False, provenance.cpu_flags())


def test_autotune_cache_hash(tmp_path: Path) -> None:
    a, b = tmp_path / "triton", tmp_path / "inductor"
    assert provenance.autotune_cache_hash([a, b]) is None  # nothing tuned: no hash, never a made-up one
    (a / "k1").mkdir(parents=True)
    (a / "k1" / "best_config.json").write_text('{"BLOCK_M": 64, "num_warps": 4}')
    h1 = provenance.autotune_cache_hash([a, b])
    assert h1 is not None and provenance.autotune_cache_hash([a, b]) == h1
    (a / "k1" / "best_config.json").write_text('{"BLOCK_M": 128, "num_warps": 4}')  # a fresh tune chose otherwise
    assert provenance.autotune_cache_hash([a, b]) not in (None, h1)
    dirs = provenance.autotune_cache_dirs({"HOME": "/h", "TRITON_CACHE_DIR": "/t", "USER": "u"})
    assert dirs == [Path("/t"), Path("/tmp/torchinductor_u")]


def _launch(sweep: str, lid: str, prov: dict[str, Any]) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"launch_id": lid, "spec_sha256": "s" * 64, "started_at": now, "finished_at": now, "address": None,
            "embedded": True, "n_units": 1, "n_skipped": 0, "n_ok": 1, "n_failed": 0, "status": "finished",
            "provenance_json": json.dumps(prov)}


def _kd(k: int, differing: int) -> dict[str, Any]:
    return {"unit_id": f"kd-{k}", "experiment": "kdepth", "dtype": "int8", "out_dtype": "bf16", "m": 4, "n": 4,
            "k": k, "seed": 0, "scale_mode": "real", "bias": False, "comparison": "pair", "impl_a": "a", "impl_b": "b",
            "kernel_a": "a", "kernel_b": "b", "elements": 1000, "differing": differing,
            "frac_differing": differing / 1000, "max_spacing": 1, "max_spacing_significant": 1,
            "hist_0": 1000 - differing, "hist_1": differing, "hist_2": 0, "hist_gt2": 0, "nonfinite_mismatch": 0,
            "max_abs_error": 0.0}


def test_certificate_names_its_identity_and_old_rows_still_read(tmp_path: Path, full: dict[str, Any]) -> None:
    store = ResultStore(tmp_path)
    old = {k: v for k, v in full.items() if k not in ("identity", "identity_sha256")}  # a row before #26
    for sweep in ("new", "old"):
        store.write("kdepth", sweep, "kd", [_kd(k, d) for k, d in ((256, 2), (1024, 3))])
    for sweep in ("new", "old"):  # a sweep's launches are read where its spec record is
        store.write("sweeps", sweep, "spec", [{"spec_sha256": "s" * 64, "question": "q", "spec_path": "s.toml",
                                               "spec_toml": "", "n_units": 1, "unit_ids": ["kd"],
                                               "created_at": datetime.now(UTC)}])
    store.write("launches", "new", "l1", [_launch("new", "l1", full)])
    store.write("launches", "old", "l0", [_launch("old", "l0", old)])
    with open_catalog(tmp_path) as cat:
        certs = {c["sweep"]: c for c in cf.certificates(cat, None)}
        ids_new, ids_old = launch_identities(cat, "new"), launch_identities(cat, "old")
    new, was = certs["new"], certs["old"]
    assert new["identity_sha256"] == [full["identity_sha256"]]
    lines = cf.detail_lines(new)
    (line,) = [x for x in lines if x.startswith("kernel identity ")]
    assert full["identity_sha256"] in line and f"torch {torch.__version__}" in line and "layout path a not exposed, b not exposed" in line
    assert was["identity_sha256"] == [] and was["provenance"]["launches"][0]["identity"] is None
    assert any(x.startswith("kernel identity: not recorded") for x in cf.detail_lines(was))
    # The nightly: an old night without an identity is unknown, never a change.
    assert identity_change(ids_old, ids_new)["changed"] is None
    assert identity_change(ids_new, ids_new) == {"previous": full["identity_sha256"], "today": full["identity_sha256"],
                                                 "today_all": [full["identity_sha256"]], "changed": False, "fields": []}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_identity_gpu_part(full: dict[str, Any]) -> None:
    gpu = full["identity"]["gpu"]
    assert isinstance(gpu, dict) and gpu["devices"] and len(gpu["capability"]) == 2
    assert gpu["autotune_cache_sha256"] == (provenance.autotune_cache_hash(provenance.autotune_cache_dirs())
                                            or provenance.NOT_EXPOSED)
    lib = full["identity"]["libraries"]
    assert lib["cuda"] == torch.version.cuda and lib["cudnn"] == torch.backends.cudnn.version()


def test_identity_line_names_exposed_paths_and_pooled_identities() -> None:
    ident = {"cpu": {"torch_capability": "AVX2", "isa_flags": ["avx2", "fma"]}, "libraries": {"torch": "t"},
             "threads": {"intra_op": 4}, "matmul": {"float32_matmul_precision": "high", "allow_tf32": True},
             "layout_path": {"k1": "transposed-B: packed"}}
    prov = {"identity_sha256": ["aa", "bb"], "launches": [{"identity_sha256": "aa", "identity": ident},
                                                         {"identity_sha256": "bb", "identity": ident},
                                                         {"identity_sha256": None, "identity": None}]}
    line = cf.identity_line(prov, ("k1", "k2"))
    assert line.startswith("kernel identity aa, bb (2 identities across 2 launches: the evidence pools them)")
    assert "layout path k1 transposed-B: packed, k2 not exposed" in line and "allow_tf32 True" in line
    assert line.endswith("; 1 launch(es) without a recorded identity")
