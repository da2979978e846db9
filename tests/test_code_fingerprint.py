"""A unit's id covers the code of a user's kernel (issue #36): an edited kernel is not served its old results.

Fast: the fingerprint of a ``module:attr`` kernel (its module, the helpers of its package) changes with its
code and only then; built-ins have none (their ids are pinned: tests/test_pinned_ids.py); the kernel whose
code changed is named; a relaunch sets the old code's units aside and reruns them, and one killed midway is
finished by the next. Slow: the whole story through the CLI -- launch, relaunch (nothing to run), edit the
kernel's arithmetic, relaunch: the kernel and its fingerprints named, its units rerun (where it had been
"0 to run" with the old results), the units it does not touch kept, and the report changes.
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
    # only: a rerun in place only when nothing else about the plan changed
    assert code_changes([_unit(new), _unit(other)], done, only=True) == []
    assert code_changes([_unit(new)], done, only=True) == [change]


def test_a_code_rerun_killed_midway_is_finished_by_the_next_launch(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The old code's unit is set aside (ledger file first, then its result files, then the spec record) under
    a journal; a launch killed between two moves leaves the journal, and the next launch finishes the same
    moves: the unit the edit did not touch is kept, nothing is deleted, the tree verifies clean."""
    from datetime import UTC, datetime

    from orchestrator import runner
    from orchestrator.plan import Plan
    from storage import verify
    from storage.store import ResultStore

    impl = {"name": "mine", "kernel": "p.m:K", "params": {}, "version": "1", "code": "aaaa"}
    old = _unit({"k": 64, "implementations": [impl]})
    kept = _unit({"k": 64, "implementations": [{"name": "exact", "kernel": "exact", "params": {}, "version": "1"}]})
    new = _unit({"k": 64, "implementations": [{**impl, "code": "bbbb"}]})
    store = ResultStore(tmp_path / "results")
    now = datetime.now(UTC)
    for u in (old, kept):
        row = {"unit_id": u.id, "kind": "kdepth", "experiment": "e", "description": "", "status": "ok",
               "params_json": canonical_json(u.params), "attempts": 1, "host": "h", "pid": 1, "node_id": "n",
               "started_at": now, "finished_at": now, "duration_s": 0.1, "error": None, "tables": ["kdepth"],
               "rows": 1, "spec_sha256": "x", "swapcheck_version": "0", "torch_version": "2.13.0"}
        store.commit_unit("s", u.id, {"kdepth": [{"unit_id": u.id, "k": 64}]},
                          lambda files, row=row: {**row, "files": [f.as_dict() for f in files]})
    store.write("sweeps", "s", "spec", [{"spec_sha256": "x", "question": "q", "spec_path": "s.toml", "spec_toml": "",
                                        "n_units": 2, "unit_ids": [old.id, kept.id], "created_at": now}])
    plan = Plan("s", "x", [new, kept])
    rerun = runner.check_sweep_identity(store, plan)
    assert rerun is not None and not rerun.resume and rerun.retired == [old.id]
    assert [c.kernel for c in rerun.changes] == ["p.m:K"]

    real_move = store.move

    def killed(rel: str, dest: str) -> None:  # the driver dies once the ledger file has moved
        real_move(rel, dest)
        raise SystemExit("SIGKILL")

    monkeypatch.setattr(store, "move", killed)
    with pytest.raises(SystemExit):
        runner.retire_changed_code(store, "s", rerun)
    monkeypatch.setattr(store, "move", real_move)
    assert store.done_units("s") == {kept.id}  # the old unit is not "ok" with its files half gone
    assert store.size(f"table=kdepth/sweep=s/{old.id}.parquet") is not None  # its result file: not yet moved
    again = runner.check_sweep_identity(store, plan)
    assert again is not None and again.resume
    aside, changes, n = runner.retire_changed_code(store, "s", again)
    assert (n, [c.kernel for c in changes]) == (1, ["p.m:K"])
    assert runner.check_sweep_identity(store, plan) is None  # the journal is gone, no record: this plan's
    for rel in (f"table=units/sweep=s/{old.id}.parquet", f"table=kdepth/sweep=s/{old.id}.parquet",
                "table=sweeps/sweep=s/spec.parquet"):
        assert store.size(rel) is None and store.size(f"{aside}/{rel}") is not None
    assert store.size(f"table=kdepth/sweep=s/{kept.id}.parquet") is not None and store.done_units("s") == {kept.id}
    store.write("sweeps", "s", "spec", [{"spec_sha256": "x", "question": "q", "spec_path": "s.toml", "spec_toml": "",
                                        "n_units": 2, "unit_ids": [new.id, kept.id], "created_at": now}])
    assert not [p for p in verify.verify(store, "s") if p.damage]  # as the launch leaves it: this plan recorded


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

        [experiments.other]
        kind = "kdepth"
        dtype = "int8"
        implementations = ["int8-triton-order", "int8-cutlass-order"]
        m = 32
        n = 32
        k = [256]
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
    key = results / "_state" / "verified-files.key"  # the launch wrote the secret that signs readers' caches
    assert key.is_file() and key.stat().st_mode & 0o777 == 0o600
    again = swapcheck("sweep", "launch", str(spec), "--results", str(results), "--no-progress")
    assert again.returncode == 0 and "code changed" not in again.stderr + again.stdout
    (tmp_path / "fp_pkg_c" / "helpers.py").write_text("FACTOR = 1.01\n")  # 1 % wrong
    def verdict() -> str:
        done = swapcheck("report", "certificate", "--results", str(results), "--sweep", "mine",
                         "--pair", "fp_pkg_c.kernels:Scaled,int8-cutlass-order", "--format", "json")
        assert done.returncode == 0, done.stderr
        return str(json.loads(done.stdout)[0]["verdict"])

    before = verdict()
    kept = {r["unit_id"]: r["finished_at"] for r in json.loads(swapcheck(
        "query", "SELECT unit_id, finished_at::VARCHAR AS finished_at FROM units WHERE experiment = 'other'",
        "--results", str(results), "--format", "json").stdout)}
    assert len(kept) == 2
    (tmp_path / "fp_pkg_c" / "helpers.py").write_text("FACTOR = 1.01\n")  # 1 % wrong
    edited = swapcheck("sweep", "launch", str(spec), "--results", str(results), "--no-progress")
    out = " ".join((edited.stdout + edited.stderr).split())  # a console may wrap the long line
    # Not "0 to run" with the old results (the defect): the kernel and its fingerprints named, its units rerun.
    assert edited.returncode == 0, out[-3000:]
    assert "the code of kernel fp_pkg_c.kernels:Scaled changed since this sweep ran it" in out
    assert "4 unit(s) are new work: rerun" in out and "set aside under _quarantine/" in out
    assert "6 units, 2 already done, 4 to run" in out, out
    assert differing() > 0  # the edited kernel differs from int8-cutlass-order now
    assert verdict() != before, before  # the certificate is the new code's
    after = {r["unit_id"]: r["finished_at"] for r in json.loads(swapcheck(
        "query", "SELECT unit_id, finished_at::VARCHAR AS finished_at FROM units WHERE experiment = 'other'",
        "--results", str(results), "--format", "json").stdout)}
    assert after == kept  # the units the edit does not touch: kept, not recomputed
    n_units = swapcheck("query", "SELECT count(*) AS n FROM units", "--results", str(results), "--format", "json")
    assert json.loads(n_units.stdout) == [{"n": 6}]  # the old code's units are no longer counted
    verified = swapcheck("sweep", "verify", "--results", str(results))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    quiet = swapcheck("sweep", "launch", str(spec), "--results", str(results), "--no-progress")
    assert quiet.returncode == 0 and "code changed" not in quiet.stderr + quiet.stdout
    assert "6 already done, 0 to run" in " ".join((quiet.stdout + quiet.stderr).split())


QUANT_AND_ATTENTION = '''
import torch
from tasks.quantizers.per_token import Int8PerToken
from {pkg}.helpers import FACTOR


class MyQuant(Int8PerToken):
    """vllm-int8 (FACTOR unused by the numerics here: an edit of the package is what matters)."""


def my_attention(q, k, v, attn_mask=None, scale=None, causal=False):
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)
    return out * FACTOR, None
'''


def test_a_users_quantizer_and_attention_kernel_put_their_code_into_the_unit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #36: quantizers and attention kernels of a user's package are fingerprinted like kernels
    (an edit reruns their units); the built-ins keep their pinned payloads."""
    from tasks.attention import registry as areg
    from tasks.attention.fields import attention_payload
    from tasks.attention.registry import AttentionKernel
    from tasks.kinds.fields import QuantizerRef, quantizer_payload
    from tasks.quantizers import registry as qreg

    d = _package(tmp_path, "fp_pkg_q")
    (d / "extras.py").write_text(textwrap.dedent(QUANT_AND_ATTENTION.format(pkg="fp_pkg_q")))
    monkeypatch.syspath_prepend(str(tmp_path))
    qreg.register_quantizer("fp-user-quant", "fp_pkg_q.extras:MyQuant")
    import fp_pkg_q.extras as extras

    areg.register_attention(AttentionKernel(name="fp-user-attn", device="cpu", compute=extras.my_attention,
                                            description="user", logsumexp="none"))
    try:
        q1 = quantizer_payload(QuantizerRef(quantizer="fp-user-quant"))
        a1 = attention_payload("fp-user-attn")
        assert q1["code"] and q1["kernel"] == "fp-user-quant" and a1["code"] and a1["kernel"] == "fp-user-attn"
        (d / "helpers.py").write_text("FACTOR = 1.01\n")  # an edit of the package
        q2 = quantizer_payload(QuantizerRef(quantizer="fp-user-quant"))
        a2 = attention_payload("fp-user-attn")
        assert q2["code"] != q1["code"] and a2["code"] != a1["code"]
        # built-ins: no code, the payload as pinned
        assert "code" not in quantizer_payload(QuantizerRef(quantizer="vllm-int8"))
        assert "code" not in attention_payload("sdpa-math")
    finally:
        qreg._unregister("fp-user-quant")
        areg._unregister("fp-user-attn")


USER_KIND = '''
from typing import Any, Literal

from tasks.kinds import Kind
from tasks.kinds.fields import Strict
from {pkg}.helpers import FACTOR


class Exp(Strict):
    kind: Literal["{name}"]
    xs: list[int]


def _run(params: dict[str, Any], ctx: Any = None) -> dict[str, list[dict[str, Any]]]:
    return {{}}


def _expand(experiment: str, exp: Exp) -> list[Any]:
    return [KIND.unit(experiment, {{"x": x}}) for x in exp.xs]


KIND = Kind(name="{name}", version="1", spec=Exp, tables=(), describe=lambda p: "x", run=_run, expand=_expand)
'''


def test_a_users_kind_puts_its_code_into_the_unit_id_and_an_edit_is_a_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #36: a kind from a user's package (or a plugin) is fingerprinted too: an edit of its package
    changes its units' ids, and the planner names it as a code change (rerun in place), not another spec."""
    from orchestrator.plan import kind_code_changes
    from tasks import kinds
    from tasks.kinds import base

    d = _package(tmp_path, "fp_pkg_k")
    (d / "kind.py").write_text(textwrap.dedent(USER_KIND.format(pkg="fp_pkg_k", name="fpkind")))
    monkeypatch.syspath_prepend(str(tmp_path))
    kinds.register_kind("fp_pkg_k.kind:KIND", name="fpkind")
    try:
        first = kinds.kind_code("fpkind")
        assert first is not None and kinds.kind_version("fpkind") == f"1+code.{first}"
        assert kinds.kind_code("kdepth") is None and kinds.kind_version("kdepth") == kinds.get_kind("kdepth").version
        old = kinds.unit_id("fpkind", {"x": 1})
        assert kinds.get_kind("fpkind").unit("e", {"x": 1}).id == old  # what a spec plans
        recorded = {old: {"kind": "fpkind", "params_json": canonical_json({"x": 1})}}
        (d / "helpers.py").write_text("FACTOR = 1.01\n")  # an edit of the package
        base._KIND_CODES.clear()  # a new process
        second = kinds.kind_code("fpkind")
        new = kinds.unit_id("fpkind", {"x": 1})
        assert second not in (None, first) and new != old
        (change,) = kind_code_changes([Unit(new, "fpkind", "e", {"x": 1}, Resources())], recorded)
        assert change.line().startswith(f"the code of kind fpkind changed since this sweep ran it (fingerprint earlier -> {second})")
        assert kind_code_changes([Unit(new, "fpkind", "e", {"x": 2}, Resources())], recorded) == []  # new work
    finally:
        kinds.unregister_kind("fpkind")
        base._KIND_CODES.clear()
