"""Bad input through the real CLI: exit code 2, a message naming the field or file, nothing written.

Every case runs ``sweep validate``, ``sweep plan`` and ``sweep launch --results <tmp>`` (launch must
refuse before Ray starts) or ``check exact-match --kernel ...``, and compares a hash of every path
and byte under ``tmp_path`` (the current directory is inside it) before and after.  Specs are data:
a ``module:attr`` that is not a declared kernel is refused before anything is called, so
``subprocess:Popen`` with ``touch pwned`` creates no file and ``os:abort`` (run in a subprocess,
so a regression cannot kill pytest) does not abort.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.conftest import REPO

runner = CliRunner()

HEAD = 'question = "q?"\nname = "bad-inputs"\n'
KDEPTH = HEAD + """
[experiments.int8]
kind = "kdepth"
dtype = "int8"
implementations = ["int8-cutlass-order", "int8-triton-order"]
m = 16
n = 24
k = 64
seeds = 1
"""
CHECK = HEAD + """
[experiments.em]
kind = "exact_match"
kernels = ["int8-cutlass-order"]
shapes = [[8, 64, 8]]
trials = 2
"""
REPLAY = HEAD + """
[experiments.rp]
kind = "replay"
pairs = [["int8-cutlass-order", "int8-triton-order"]]
prompts = { file = "prompts.jsonl" }
"""
GENERATE = HEAD + """
[experiments.gen]
kind = "generate"
restarts = 1
[experiments.gen.arms.a]
kernel = "int8-cutlass-order"
"""


def kd(extra: str = "", **replace: str) -> str:
    """The kdepth spec with lines replaced (``m="m = 1e12"``) and lines added to the experiment."""
    text = KDEPTH
    for key, line in replace.items():
        text = "\n".join(line if ln.split("=")[0].strip() == key else ln for ln in text.splitlines()) + "\n"
    return text + extra + "\n"


def impl(entry: str) -> str:
    return kd(implementations=f'implementations = ["int8-cutlass-order", {entry}]')


DEEP_ARRAY = HEAD + "[experiments.x]\nkind = \"kdepth\"\nv = " + "[" * 50_000 + "]" * 50_000 + "\n"
DEEP_TABLE = HEAD + "[experiments.x]\nkind = \"kdepth\"\nv = " + "{ a = " * 3000 + "1" + " }" * 3000 + "\n"
DEEP_DOTTED = HEAD + "[experiments.x]\nkind = \"kdepth\"\n" + ".".join(["a"] * 200) + " = 1\n"

#: (id, spec text, what the message must name)
SPEC_CASES: list[tuple[str, str | bytes, str]] = [
    # specs are data: nothing but declared kernels is ever called
    ("popen-touch", impl('{ kernel = "subprocess:Popen", params = { args = "touch pwned", shell = true } }'),
     "experiments.int8.implementations[1]"),
    ("sys-exit", impl('"sys:exit"'), "experiments.int8.implementations[1]"),
    ("os-system", impl('{ kernel = "os:system", params = { command = "touch pwned" } }'), "implementations[1]"),
    ("builtins-eval", impl('"builtins:eval"'), "implementations[1]"),
    ("torch-matmul", impl('"torch:matmul"'), "implementations[1]"),
    ("numpy-matmul", impl('"numpy:matmul"'), "implementations[1]"),
    ("unmarked-function", impl('"_user_kernels:unmarked_matmul"'), "implementations[1]"),
    ("unmarked-factory", impl('"_user_kernels:unmarked_factory"'), "implementations[1]"),
    ("non-kernel-class", impl('"_user_kernels:NotAKernelClass"'), "implementations[1]"),
    ("attribute-through-module", impl('"_user_kernels:os.system"'), "implementations[1]"),
    ("reference-popen", kd('reference = "subprocess:Popen"'), "experiments.int8.reference"),
    ("check-kernel-os", CHECK.replace('kernels = ["int8-cutlass-order"]', 'kernels = ["os:getcwd"]'),
     "experiments.em.kernels[0]"),
    ("generate-arm-popen", GENERATE.replace('kernel = "int8-cutlass-order"', 'kernel = "subprocess:Popen"'),
     "experiments.gen.arms.a.kernel"),
    # absurd resources and shapes
    ("num-cpus-inf", kd("resources = { num_cpus = inf }"), "experiments.int8.resources.num_cpus"),
    ("num-cpus-nan", kd("resources = { num_cpus = nan }"), "experiments.int8.resources.num_cpus"),
    ("num-cpus-huge", kd("resources = { num_cpus = 1e9 }"), "experiments.int8.resources.num_cpus"),
    ("num-gpus-negative", kd("resources = { num_gpus = -1 }"), "experiments.int8.resources.num_gpus"),
    ("memory-gb-zero", kd("resources = { memory_gb = 0 }"), "experiments.int8.resources.memory_gb"),
    ("memory-gb-inf", kd("resources = { memory_gb = inf }"), "experiments.int8.resources.memory_gb"),
    ("m-float-1e12", kd(m="m = 1e12"), "experiments.int8.m"),
    ("m-int-10e12", kd(m="m = 1000000000000"), "experiments.int8.m"),
    ("k-range-huge", kd(k="k = { start = 1, stop = 1000000000000, step = 1 }"), "experiments.int8.k"),
    ("seeds-huge", kd(seeds="seeds = 1000000000000"), "experiments.int8.seeds"),
    ("shape-memory", kd(m="m = 65536", n="n = 65536", k="k = 65536"), "experiments.int8.m/n/k"),
    ("memory-gb-too-small", kd("resources = { memory_gb = 0.01 }", m="m = 4096", n="n = 4096", k="k = 4096"),
     "experiments.int8.m/n/k"),
    ("check-shape-too-big", CHECK.replace("[[8, 64, 8]]", "[[2000000, 1, 1]]"), "experiments.em.shapes"),
    ("check-shape-memory", CHECK.replace("[[8, 64, 8]]", "[[100000, 100000, 100000]]"), "experiments.em.shapes[0]"),
    ("check-seed-huge", CHECK + "seed = 1000000000000000000000000000000\n", "experiments.em.seed"),
    ("k-int8-overflow", kd(k="k = 200000"), "experiments.int8.k"),
    # parser crashes
    ("deep-arrays", DEEP_ARRAY, "nested"),
    ("deep-inline-tables", DEEP_TABLE, "nested"),
    ("deep-dotted-keys", DEEP_DOTTED, "nested deeper"),
    ("invalid-toml", HEAD + "[experiments.x\n", "not valid TOML"),
    ("duplicate-keys", KDEPTH + "m = 32\n", "not valid TOML"),
    ("not-utf8", HEAD.encode() + b"description = \"\xff\xfe\"\n", "cannot read"),
    # schema
    ("unknown-top-key", "bogus = 1\n" + KDEPTH, "bogus: unknown key"),
    ("unknown-experiment-key", kd("bogus = 1"), "experiments.int8.bogus: unknown key"),
    ("wrong-type-m", kd(m='m = "16"'), "experiments.int8.m"),
    ("wrong-type-num-cpus", kd('resources = { num_cpus = "1" }'), "experiments.int8.resources.num_cpus"),
    ("bad-literal-dtype", kd(dtype='dtype = "int4"'), "experiments.int8.dtype"),
    ("unknown-kernel", impl('"int8-no-such-kernel"'), "experiments.int8.implementations[1]"),
    ("unknown-kind", HEAD + '[experiments.x]\nkind = "nope"\n', "experiments.x.kind"),
    ("duplicate-labels", impl('{ kernel = "int8-triton-order", label = "int8-cutlass-order" }'),
     "experiments.int8.implementations"),
    ("bad-sweep-name", KDEPTH.replace('name = "bad-inputs"', 'name = "a/b"'), "name:"),
    ("max-retries-range", "max_retries = 11\n" + KDEPTH, "max_retries"),
    ("duplicate-scale-modes", kd('scale_modes = ["real", "real"]'), "experiments.int8.scale_modes"),
    ("empty-implementations", kd(implementations="implementations = []"), "experiments.int8.implementations"),
    ("params-datetime", impl('{ kernel = "int8-triton-order", label = "t", params = { bias_mode = 1979-05-27 } }'),
     "experiments.int8.implementations"),
    ("params-inf", impl('{ kernel = "_user_kernels:FloatReference", params = { offset = inf } }'),
     "experiments.int8.implementations"),
    ("trials-zero", CHECK.replace("trials = 2", "trials = 0"), "experiments.em.trials"),
    ("missing-prompts-file", REPLAY, "experiments.rp.prompts.file"),
    ("bad-prompts-file", REPLAY.replace("prompts.jsonl", "bad.jsonl"), "experiments.rp.prompts.file"),
    ("missing-preregistration", 'preregistration = ["nope.toml"]\n' + KDEPTH, "preregistration[0]"),
]


def tree_hash(root: Path) -> str:
    """SHA-256 over every path (files, folders, links) and every file's bytes under ``root``."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path with a current directory inside it, a bad prompts file, and user kernels on."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (tmp_path / "bad.jsonl").write_text("not json\n")
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("SWAPCHECK_USER_KERNELS", raising=False)
    return tmp_path


def refused(work: Path, invoke: Callable[[], tuple[int, str]], names: str) -> str:
    before = tree_hash(work)
    code, output = invoke()
    assert code == 2, output
    assert names in output, output
    assert tree_hash(work) == before, "a refused input changed files"
    assert not (work / "cwd" / "pwned").exists() and not Path("pwned").exists()
    return output


@pytest.mark.parametrize("text,names", [(t, n) for _, t, n in SPEC_CASES], ids=[c[0] for c in SPEC_CASES])
def test_bad_spec_is_refused_by_validate_plan_and_launch(work: Path, text: str | bytes, names: str) -> None:
    spec = work / "spec.toml"
    spec.write_bytes(text if isinstance(text, bytes) else text.encode())
    results = work / "results"
    for cmd in (["sweep", "validate", str(spec)], ["sweep", "plan", str(spec)],
                ["sweep", "launch", str(spec), "--results", str(results), "--no-progress"]):
        def invoke(cmd: list[str] = cmd) -> tuple[int, str]:
            res = runner.invoke(app, cmd)
            return res.exit_code, res.output

        out = refused(work, invoke, names)
        assert "spec.toml" in out  # the file is named
        assert "nothing was written" in out
    assert not results.exists()


def test_user_kernels_off_refuses_module_attr(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = work / "spec.toml"
    spec.write_text(impl('"_user_kernels:FloatReference"'))
    monkeypatch.setenv("SWAPCHECK_USER_KERNELS", "0")
    for cmd in (["sweep", "validate", str(spec)], ["sweep", "plan", str(spec)]):
        out = refused(work, lambda cmd=cmd: _cli(cmd), "experiments.int8.implementations[1]")
        assert "user kernels are turned off" in out


def _cli(cmd: list[str]) -> tuple[int, str]:
    res = runner.invoke(app, cmd)
    return res.exit_code, res.output


CHECK_CASES = [
    ("popen", ["--kernel", "subprocess:Popen", "--param", "args=touch pwned", "--param", "shell=true"]),
    ("sys-exit", ["--kernel", "sys:exit"]),
    ("torch-matmul", ["--kernel", "torch:matmul"]),
    ("unmarked", ["--kernel", "_user_kernels:unmarked_matmul"]),
    ("non-kernel-class", ["--kernel", "_user_kernels:NotAKernelClass"]),
    ("unimportable", ["--kernel", "no_such_module_zz:f"]),
    ("no-user-kernels", ["--kernel", "_user_kernels:marked_matmul", "--no-user-kernels"]),
]


@pytest.mark.parametrize("args", [a for _, a in CHECK_CASES], ids=[c[0] for c in CHECK_CASES])
def test_check_refuses_non_kernels(work: Path, args: list[str]) -> None:
    refused(work, lambda: _cli(["check", "exact-match", *args, "--shape", "4x8x4", "--trials", "1"]), "--kernel")


def test_check_no_user_kernels_leaves_the_switch_as_it_was(work: Path) -> None:
    _cli(["check", "exact-match", "--kernel", "_user_kernels:marked_matmul", "--no-user-kernels"])
    assert "SWAPCHECK_USER_KERNELS" not in os.environ
    code, out = _cli(["check", "exact-match", "--kernel", "_user_kernels:marked_matmul", "--shape", "4x8x4", "--trials", "1"])
    assert code == 0, out


def _swapcheck(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("swapcheck")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "orchestrator.cli.main"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.run([*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # slow set: the default run stays under 6 minutes on 2 cores (CI runs both)
def test_os_abort_is_refused_in_a_separate_process(work: Path) -> None:
    """``os:abort`` would kill the process that calls it: run the CLI in a child process."""
    spec = work / "spec.toml"
    spec.write_text(impl('"os:abort"'))
    cases = [(["sweep", "validate", str(spec)], "experiments.int8.implementations[1]"),
             (["check", "exact-match", "--kernel", "os:abort"], "--kernel")]
    for args, names in cases:
        def invoke(args: list[str] = args) -> tuple[int, str]:
            proc = _swapcheck(args, work / "cwd")
            return proc.returncode, proc.stdout + proc.stderr

        out = refused(work, invoke, names)
        assert "standard library" in out
