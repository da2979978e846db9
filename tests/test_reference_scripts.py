"""docs/reference/'s figures come from scripts in the repository, and the quick ones still print them.

Each script under docs/reference/scripts/ is run with this venv's Python from its own folder, as the
reference pages say, and its output must equal the ``*.out`` saved beside it, byte for byte (these
scripts are seeded and print no timings). The slower scripts (t4, t5*, t6b, t6c, epilogue_sim: from
30 s to several minutes on 2 cores) are left to a person rerunning a figure; their saved outputs are
what the pages quote.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPTS = REPO / "docs" / "reference" / "scripts"
QUICK = ["numerics/t1_bf16_basics.py", "numerics/t2_error_model.py", "numerics/t3_int8_bounds.py",
         "numerics/t6a_binary_p.py", "vllm/azp_sim.py"]


def test_every_script_has_its_saved_output_or_needs_triton() -> None:
    for script in sorted(SCRIPTS.rglob("*.py")):
        if script.name == "common.py" or script.name.startswith("triton_"):
            continue  # helpers; the Triton interpreter scripts need `make triton` and print a few lines
        # t5_fp8_accum.py takes its inputs on the command line: one saved output per run the page quotes
        stems = ["t5_fp8_randn", "t5_fp8_outlier"] if script.name == "t5_fp8_accum.py" else [script.stem]
        outs = [out for stem in stems if (out := script.with_name(f"{stem}.out")).is_file()]
        assert outs, f"{script.relative_to(REPO)} has no saved output beside it"


@pytest.mark.slow
@pytest.mark.parametrize("script", QUICK)
def test_quick_script_reproduces_its_saved_output(script: str) -> None:
    path = SCRIPTS / script
    run = subprocess.run([sys.executable, path.name], cwd=path.parent, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == path.with_suffix(".out").read_text(), f"{script} no longer prints its saved figures"
