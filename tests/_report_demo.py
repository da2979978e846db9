"""A small real results tree shaped like ``make demo``'s, for the tests of what reports look like.

One sweep named ``demo`` whose question is sweeps/demo.toml's own, with the demo's kinds cut down:
K-depth of the three INT8 epilogue orders and two FP8 accumulation orders, cold-restart generation
with the demo's four arms (``cutlass``, ``triton``, ``cutlass-pow2``, ``triton-pow2``: the names
issue #40 saw cut to ``cutlass-…`` / ``triton-p…``) and teacher-forced pairs, and a localization of
two prompts that part. Every unit runs through the worker's own code path in this process
(:func:`tests.conftest.launch_in_process`); the tree is built once per test process and shared.

Cost: about 20 s on a loaded 2-core machine after the tiny model's first build.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO, launch_in_process

SWEEP = "demo"
#: The pair sweeps/demo.toml's question is about ("vLLM's CUTLASS and Triton kernels").
HEADLINE = ("int8-cutlass-order", "int8-triton-order")
ARMS = ("cutlass", "triton", "cutlass-pow2", "triton-pow2")

SPEC = '''
question = """{question}"""
name = "demo"

[experiments.kdepth-int8]
kind = "kdepth"
dtype = "int8"
implementations = ["int8-cutlass-order", "int8-triton-order", "int8-torch-channelwise"]
scale_modes = ["real", "pow2"]
m = 64
n = 64
k = {{ start = 256, stop = 1024, factor = 2 }}
seeds = 2

[experiments.kdepth-fp8]
kind = "kdepth"
dtype = "fp8_e4m3"
implementations = ["fp8-sequential", "fp8-pairwise"]
m = 64
n = 64
k = {{ start = 1024, stop = 4096, factor = 4 }}
seeds = 1

[experiments.e2e]
kind = "generate"
model = "tiny-qwen3"
restarts = 1
prompts = {{ count = 4, length = 8, seed = 0 }}
max_new_tokens = 12

[experiments.e2e.arms.cutlass]
kernel = "int8-cutlass-order"

[experiments.e2e.arms.triton]
kernel = "int8-triton-order"

[experiments.e2e.arms.cutlass-pow2]
kernel = "int8-cutlass-order"
scales = "pow2"

[experiments.e2e.arms.triton-pow2]
kernel = "int8-triton-order"
scales = "pow2"

[[experiments.e2e.teacher_forced]]
reference = "cutlass"
arms = ["triton"]

[[experiments.e2e.teacher_forced]]
reference = "cutlass-pow2"
arms = ["triton-pow2"]

[experiments.localize]
kind = "localize"
model = "tiny-qwen3"
prompts = {{ count = 128, length = 16, seed = 0 }}
prompt_indices = [78, 26]
max_new_tokens = 16
scales = "real"

[experiments.localize.arms.cutlass]
kernel = "int8-cutlass-order"

[experiments.localize.arms.triton]
kernel = "int8-triton-order"
'''

_built: dict[str, Path] = {}


def demo_question() -> str:
    return str(tomllib.loads((REPO / "sweeps" / "demo.toml").read_text(encoding="utf-8"))["question"])


def demo_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results tree (built on the first call of this process)."""
    if "root" not in _built:
        root = tmp_path_factory.mktemp("report-demo") / "results"
        summary = launch_in_process(root, SPEC.format(question=demo_question()), restarts_here=True)
        assert summary.n_ok == summary.n_units, summary.failures
        _built["root"] = root
    return _built["root"]
