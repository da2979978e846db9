"""The plan cache (orchestrator.plan_cache, issue #39): a relaunch reuses a spec's plan only when the
spec, swapcheck's code and every input the expansion read are unchanged.

* every shipped spec and every kind's example: the reused plan equals the expanded one (ids, profiles,
  merged duplicates) and its units walk to the same ids;
* what must make a plan new: an edited user's kernel (issue #36), an edited prompt file, an edited
  model config, another code digest, a process that registered a kernel as an object, a damaged
  cache file, ``SWAPCHECK_PLAN_CACHE=off``;
* a forged plan can only stop a launch: its units walk to other ids (``PlanChanged``);
* no expansion reads a file except through an expansion input (tasks.inputs): every shipped spec
  and kind example expanded in a fresh process under an audit hook.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from orchestrator import plan_cache
from orchestrator.plan import Plan, PlanChanged, make_plan
from orchestrator.spec import LoadedSpec, SweepSpec, load_spec
from tasks import inputs
from tasks.kinds import get_kind, kind_names
from tests.test_code_fingerprint import _package

REPO = Path(__file__).resolve().parent.parent
SPECS = sorted((REPO / "sweeps").glob("*.toml"))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A plan cache of the test's own, in a process that counts as hermetic (other tests of this
    process registered planted kernels; these tests name only built-ins and their own packages)."""
    d = tmp_path / "plans"
    monkeypatch.setenv(plan_cache.ENV, str(d))
    monkeypatch.setattr(inputs, "_RUNTIME", [])
    return d


def _same(a: Plan, b: Plan) -> None:
    assert a.ids == b.ids
    assert list(a.which) == list(b.which)
    assert a.profiles == b.profiles
    assert a._skip == b._skip
    assert (a.sweep, a.spec_sha256) == (b.sweep, b.spec_sha256)


def _example_specs() -> list[tuple[str, LoadedSpec]]:
    out = []
    for name in kind_names():
        kind = get_kind(name)
        if kind.spec is None or kind.example is None:
            continue
        exp = kind.resolve(kind.spec.model_validate(dict(kind.example)), lambda p: (REPO / "sweeps" / p).resolve())
        sweep = SweepSpec(question="q", name=f"example-{name}", experiments={"e": dict(kind.example)})
        out.append((name, LoadedSpec(path=f"<{name}.example>", text="", sha256="0" * 64, sweep=sweep,
                                     experiments={"e": exp})))
    return out


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_a_shipped_specs_plan_is_reused_as_it_was_expanded(path: Path, cache: Path) -> None:
    spec = load_spec(path)
    first = make_plan(spec)
    assert first.source == "expanded"
    again = make_plan(spec)
    assert again.source == "cache"
    _same(again, first)
    assert [u.id for u in again.iter_units()] == first.ids  # its units, walked from the spec, are the planned ones


def test_a_reused_plans_pending_units_are_the_ones_not_done(cache: Path) -> None:
    """A plan from the cache knows its ids sorted: a ledger holding exactly them is one comparison
    (nothing pending); any other done set, of the same size or not, is matched id by id."""
    import pyarrow as pa

    from orchestrator.runner import Pending

    spec = load_spec(REPO / "sweeps" / "kdepth-demo.toml")
    make_plan(spec)
    plan = make_plan(spec)
    assert plan.source == "cache" and plan.sorted_ids is not None
    everything = plan.sorted_ids
    assert len(Pending(plan, everything)) == 0
    assert len(Pending(plan, set(plan.ids))) == 0
    missing = everything.slice(1)
    pending = Pending(plan, missing)
    assert len(pending) == 1 and [u.id for u in pending.units()] == [everything[0].as_py()]
    foreign = pa.concat_arrays([missing, pa.array(["f" * 20])])  # as many ids, one of them no unit of the plan
    assert len(Pending(plan, foreign)) == 1
    assert len(Pending(plan, pa.array([], pa.string()))) == len(plan)


def test_every_kinds_example_plan_is_reused_as_it_was_expanded(cache: Path) -> None:
    examples = _example_specs()
    assert examples  # the kinds with an example of their own (the others are in the shipped specs)
    for name, spec in examples:
        first, again = make_plan(spec), make_plan(spec)
        assert (first.source, again.source) == ("expanded", "cache"), name
        _same(again, first)


SPEC = '''
name = "{name}"
question = "does an edited kernel make a new plan?"

[experiments.k]
kind = "kdepth"
dtype = "int8"
implementations = ["int8-cutlass-order", "{kernel}"]
reference = "exact"
scale_modes = ["real"]
m = 4
n = 4
k = {{ start = 16, stop = 32, factor = 2 }}
seeds = 2
out_dtype = "bf16"
'''


def test_an_edited_users_kernel_makes_a_new_plan(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _package(tmp_path, "pc_pkg_a")  # the user's kernel of the fingerprint tests (issue #36)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec_path = tmp_path / "s.toml"
    spec_path.write_text(SPEC.format(name="edited", kernel="pc_pkg_a.kernels:Scaled"))
    spec = load_spec(spec_path)
    first = make_plan(spec)
    assert make_plan(spec).source == "cache"
    (d / "helpers.py").write_text("FACTOR = 1.01\n")  # a helper of the kernel: its code changed
    edited = make_plan(spec)
    assert edited.source == "expanded"
    assert len(edited.ids) == len(first.ids) and set(edited.ids).isdisjoint(first.ids)  # each unit runs the kernel
    assert make_plan(spec).source == "cache"
    (d / "helpers.py").write_text("FACTOR = 1.0\n")
    back = make_plan(spec)
    assert back.source == "expanded" and back.ids == first.ids


PLUGIN_KIND = '''
from typing import Literal

from tasks.kinds import Kind
from tasks.kinds.fields import Strict


class Grid(Strict):
    kind: Literal["{name}"]
    units: int


def _run(params, ctx=None):
    return {{}}


KIND = Kind(name="{name}", version="1", spec=Grid, tables=(), describe=lambda p: f"unit {{p['i']}}", run=_run,
            expand=lambda experiment, exp: (KIND.unit(experiment, {{"i": i * {step}}}) for i in range(exp.units)))
'''


FRESH_PLAN = """
import sys
sys.path.insert(0, {where!r})
from orchestrator.plan import make_plan
from orchestrator.spec import load_spec
from tasks.kinds import register_kind
register_kind("pc_plugin.kind:KIND", name="pc-grid")
plan = make_plan(load_spec({spec!r}))
print(plan.source, " ".join(plan.ids))
"""


def test_a_plugins_kind_registered_by_reference_is_reused_until_its_code_changes(tmp_path: Path, cache: Path) -> None:
    """A kind registered as ``"module:attr"`` (a plugin, the benchmarks' kind) keeps a process
    hermetic; its code is an expansion input (``kind_code``): each fresh process reuses the plan
    until the kind's code is edited, then expands it anew (a running process keeps the code it
    imported, and the ids it gives)."""
    pkg = tmp_path / "pc_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kind.py").write_text(PLUGIN_KIND.format(name="pc-grid", step=1))
    spec = tmp_path / "s.toml"
    spec.write_text('name = "plugin"\nquestion = "q"\n[experiments.g]\nkind = "pc-grid"\nunits = 50\n')

    def fresh() -> tuple[str, list[str]]:
        out = subprocess.run([sys.executable, "-c", FRESH_PLAN.format(where=str(tmp_path), spec=str(spec))],
                             capture_output=True, text=True, timeout=120, env={**os.environ, plan_cache.ENV: str(cache)})
        assert out.returncode == 0, out.stderr[-2000:]
        source, *ids = out.stdout.split()
        return source, ids

    first = fresh()
    assert first[0] == "expanded" and len(first[1]) == 50
    assert fresh() == ("cache", first[1])
    (pkg / "kind.py").write_text(PLUGIN_KIND.format(name="pc-grid", step=2))  # the kind's code edited
    source, ids = fresh()
    assert source == "expanded" and set(ids).isdisjoint(first[1])
    assert fresh() == ("cache", ids)


def test_an_edited_prompt_file_or_model_config_makes_a_new_plan(tmp_path: Path, cache: Path) -> None:
    shutil.copy(REPO / "sweeps" / "prompts" / "answer-demo.jsonl", tmp_path / "p.jsonl")
    model = tmp_path / "model"
    model.mkdir()
    config = json.loads((REPO / "tasks" / "models" / "shipped" / "answer-qwen3" / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config))
    (tmp_path / "s.toml").write_text(textwrap.dedent('''
        name = "prompts"
        question = "does an edited input make a new plan?"

        [experiments.r]
        kind = "replay"
        model = "model"
        engine = "vllm"
        capture_kernel = "cutlass-int8"
        pairs = [["vllm-cutlass", "vllm-triton"]]
        prompts = { file = "p.jsonl" }
    '''))
    spec = load_spec(tmp_path / "s.toml")
    first = make_plan(spec)
    assert make_plan(spec).source == "cache"
    lines = (tmp_path / "p.jsonl").read_text().splitlines()
    (tmp_path / "p.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # one prompt fewer
    fewer = make_plan(spec)
    assert fewer.source == "expanded" and fewer.ids != first.ids
    assert make_plan(spec).source == "cache"
    (model / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    other_model = make_plan(spec)
    assert other_model.source == "expanded" and other_model.ids != fewer.ids


def test_other_code_or_environment_is_another_key(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec(REPO / "sweeps" / "kdepth-demo.toml")
    key = plan_cache.plan_key(spec)
    assert plan_cache.plan_key(spec) == key
    monkeypatch.setenv("SWAPCHECK_INT8_ACCUMULATOR", "exact")
    assert plan_cache.plan_key(spec) != key
    monkeypatch.delenv("SWAPCHECK_INT8_ACCUMULATOR")
    assert plan_cache.plan_key(spec) == key
    digest = plan_cache.code_digest()
    from tasks import fingerprint

    real = fingerprint._digest

    def one_file_edited(f: Path) -> bytes | None:
        d = real(f)
        return hashlib.sha256(b"edited").digest() if f.name == "kdepth.py" and f.parent.name == "kinds" else d

    monkeypatch.setattr(fingerprint, "_digest", one_file_edited)
    assert plan_cache.code_digest() != digest
    assert plan_cache.plan_key(spec) != key


def test_a_process_that_registered_an_object_expands_every_time(cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tasks.kernels.int8 import Int8CutlassOrder
    from tasks.kernels.registry import _unregister, register_kernel

    spec = load_spec(REPO / "sweeps" / "kdepth-demo.toml")
    assert make_plan(spec).source == "expanded" and make_plan(spec).source == "cache"

    class Planted(Int8CutlassOrder):
        name = ""

    register_kernel("pc-planted", Planted)
    try:
        assert inputs.not_hermetic() == f"kernel 'pc-planted' registered as an object by {__name__}"
        with caplog.at_level(logging.INFO, logger="orchestrator.plan_cache"):
            assert make_plan(spec).source == "expanded"
    finally:
        _unregister("pc-planted")
    assert inputs.not_hermetic() is not None  # for the rest of the process
    files = list(cache.glob("*.plan"))
    assert len(files) == 1


def test_a_lazily_registered_kind_stays_hermetic(cache: Path) -> None:
    from tasks.kinds import register_kind, unregister_kind

    register_kind("tasks.kinds.kdepth:KIND", name="pc-lazy")
    try:
        assert inputs.not_hermetic() is None
    finally:
        inputs._RUNTIME.clear()
        unregister_kind("pc-lazy")
    assert inputs.not_hermetic() is not None  # an unregistration is a change no name describes
    inputs._RUNTIME.clear()


def test_a_damaged_or_switched_off_cache_expands(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec(REPO / "sweeps" / "demo.toml")
    first = make_plan(spec)
    (path,) = cache.glob("*.plan")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # one bit of the body
    path.write_bytes(bytes(data))
    again = make_plan(spec)
    assert again.source == "expanded" and again.ids == first.ids
    assert make_plan(spec).source == "cache"  # written anew
    path.write_bytes(b"not a plan")
    assert make_plan(spec).source == "expanded"
    monkeypatch.setenv(plan_cache.ENV, "off")
    shutil.rmtree(cache)
    assert make_plan(spec).source == "expanded" and make_plan(spec).source == "expanded"
    assert not cache.exists()


def test_a_forged_plan_stops_the_launch_it_would_mislead(cache: Path) -> None:
    spec = load_spec(REPO / "sweeps" / "demo.toml")
    first = make_plan(spec)
    (path,) = cache.glob("*.plan")
    head, _, body = path.read_bytes().partition(b"\n")
    header = json.loads(head)
    body = b"f" * 20 + body[20:]  # the first unit's id replaced, the file's own hash made to match
    header["body_sha256"] = hashlib.sha256(body).hexdigest()
    path.write_bytes(json.dumps(header).encode() + b"\n" + body)
    forged = make_plan(spec)
    assert forged.source == "cache" and forged.ids[0] == "f" * 20 and forged.ids[1:] == first.ids[1:]
    with pytest.raises(PlanChanged):
        list(forged.iter_units())


def test_the_cache_keeps_the_newest_plans(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_cache, "KEEP", 3)
    for p in SPECS[:5]:
        make_plan(load_spec(p))
    assert len(list(cache.glob("*.plan"))) == 3


AUDIT = r'''
import json, os, site, sys
sys.path[:0] = [{tests!r}, {repo!r}]
import test_plan_cache as t
from orchestrator.plan import Plan
from orchestrator.spec import load_spec
from tasks import inputs
from tasks.kinds import get_kind

# Installed code and the standard library: reads there are imports. Anything else counts, code
# files (an import) apart.
code_roots = tuple(os.path.realpath(p) + os.sep for p in {{sys.prefix, sys.base_prefix, *site.getsitepackages()}})
CODE = (".py", ".pyc", ".so", ".pth", ".pyi", ".typed")
seen = []
busy = []


def outside(path):
    rec = inputs._ACTIVE.get()
    if rec is None or rec._depth or busy:
        return  # nothing records, the read is an expansion input's own, or the audit's own
    busy.append(1)
    try:
        p = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return
    finally:
        busy.pop()
    if p.endswith(CODE) or "__pycache__" in p or ".dist-info" in p or ".egg-info" in p or p.startswith(code_roots):
        return
    seen.append(p)


def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        outside(args[0])


for name in ("stat", "lstat"):
    def wrapped(path, *a, _real=getattr(os, name), **k):
        if isinstance(path, (str, bytes, os.PathLike)):
            outside(path)
        return _real(path, *a, **k)
    setattr(os, name, wrapped)
sys.addaudithook(hook)


def expansion(spec):
    return lambda: (u for n, e in spec.experiments.items() for u in get_kind(e.kind).expand(n, e))


report = {{}}
for name, spec in [(p.name, load_spec(p)) for p in t.SPECS] + t._example_specs():
    del seen[:]
    with inputs.recording() as rec:
        Plan(spec.sweep.name, spec.sha256, expand=expansion(spec))
    report[name] = {{"outside": sorted(set(seen)), "inputs": len(rec.entries())}}

# The audit's own control: an expansion that reads a file directly (not through an input) is caught.
planted = os.path.realpath("planted.txt")
with open(planted, "w") as fh:
    fh.write("3")
del seen[:]
with inputs.recording() as rec:
    from tasks.kinds import Kind
    kind = Kind(name="planted", version="1", spec=None, tables=(), describe=str, run=lambda p, c: {{}})
    Plan("planted", "0", expand=lambda: [kind.unit("e", {{"n": open(planted).read()}})])
report["<planted>"] = {{"outside": sorted(set(seen)), "inputs": len(rec.entries()), "file": planted}}
print(json.dumps(report))
'''


def test_no_expansion_reads_a_file_except_through_an_expansion_input(tmp_path: Path) -> None:
    """Expanding every shipped spec and kind example in a fresh process, with an audit hook on every
    open, directory listing and stat: outside an expansion input, only code is read (a read of a
    spec's file, a prompt, a model, anything under sweeps/, would make a reused plan blind to it)."""
    script = AUDIT.format(tests=str(REPO / "tests"), repo=str(REPO))
    env = {**os.environ, plan_cache.ENV: "off"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    planted = report.pop("<planted>")
    assert planted["outside"] == [planted["file"]]  # the control: a direct read is seen
    assert len(report) == len(SPECS) + len(_example_specs())
    offenders = {name: r["outside"] for name, r in report.items() if r["outside"]}
    assert offenders == {}
    # the audit sees what it should: specs with prompt files or models read them through an input
    assert report["answer-demo.toml"]["inputs"] >= 2
