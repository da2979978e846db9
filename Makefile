# Quick start: `make demo` runs the main sweep on an embedded Ray instance; `make test` runs the tests.
# Both create .venv and install swapcheck into it from requirements/cpu.lock (every transitive
# dependency pinned with its hashes, made by `make lock`); a stamp file makes a second run instant.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.swapcheck-installed
RESULTS ?= results
LOCK   := requirements/cpu.lock
GPU_LOCK := requirements/gpu.lock
# The Docker image's lock: the vLLM release image runs CPython 3.12 (vLLM 0.32 needs setuptools < 81
# there), so its dependencies are resolved for that Python (infra/docker/Dockerfile checks it).
DOCKER_LOCK := requirements/docker.lock
# The optional Triton extra (the triton-scaled-mm kernel): requirements/cpu.lock plus triton, resolved
# with cpu.lock as constraints so every other pin stays the CPU lock's (`make triton` installs it).
TRITON_LOCK := requirements/triton.lock
# Where the CPU build of torch 2.13.0 comes from: this machine keeps its wheel in /opt/wheels; elsewhere
# PyTorch's CPU index serves the same file (the lock checks its hash either way).
TORCH_CPU_WHEELS ?= /opt/wheels
TORCH_CPU_FROM ?= $(if $(wildcard $(TORCH_CPU_WHEELS)/torch-2.13.0+cpu-*.whl),--find-links $(TORCH_CPU_WHEELS),--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
UV     := $(BIN)/uv
# One resolution for every machine the project runs on: CPython 3.11 on Linux x86_64.
LOCK_FLAGS := --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes \
              --custom-compile-command "make lock" --quiet

.PHONY: demo kdepth-demo test test-slow test-gpu test-latest vllm-contract lint install lock lock-upgrade triton gpu-kit-wheels gpu-kit-cpu clean docs bench bench-quick fault-report

# The venv gets uv at the lock's version and hashes (with pip, the one installer a new venv has), then
# everything else from the lock with uv, which prints its progress, compiled to bytecode at install
# (where PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile torch, transformers and
# ray from source: 2x the start-up of each worker and subprocess); swapcheck itself goes in editable,
# built with the lock's setuptools. The last line checks the venv against the lock.
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing swapcheck into $(VENV) from $(LOCK)"
	@awk '/^uv==/{p=1;print;next} p&&/^ /{print;next} {p=0}' $(LOCK) > $(VENV)/uv-from-lock.txt
	@$(BIN)/python -m pip install --isolated --disable-pip-version-check --no-input --no-deps --require-hashes \
	    -r $(VENV)/uv-from-lock.txt
	@echo "uv installs the locked packages ('Installed N packages'), then compiles them to bytecode, silent until"
	@echo "'Bytecode compiled N files': under a minute on a quiet machine, a few minutes on a slow or busy one"
	$(UV) pip install --python $(BIN)/python --require-hashes --compile-bytecode $(TORCH_CPU_FROM) -r $(LOCK)
	$(UV) pip install --python $(BIN)/python --no-deps --no-build-isolation -e .
	@$(BIN)/python tools/check_lock.py $(LOCK)
	@$(BIN)/python -c "import torch, ray, duckdb, swapcheck_common, orchestrator, tasks, storage, reports"
	@touch $(STAMP)

install: $(STAMP)

# The main job: every experiment on the embedded default (sweeps/demo.toml), then the conformance
# matrix, the certificate of the headline pair, the pre-registered predictions and an HTML report.
demo: $(STAMP)
	$(BIN)/swapcheck sweep launch sweeps/demo.toml --results $(RESULTS)
	$(BIN)/swapcheck report conformance --results $(RESULTS) --sweep demo
	$(BIN)/swapcheck report certificate --results $(RESULTS) --sweep demo --pair int8-cutlass-order,int8-triton-order
	$(BIN)/swapcheck report predictions --results $(RESULTS) --sweep demo
	$(BIN)/swapcheck report all --results $(RESULTS) --sweep demo --format html --out $(RESULTS)/demo-report.html

# The K-depth experiment alone, with its full table.
kdepth-demo: $(STAMP)
	$(BIN)/swapcheck sweep launch sweeps/kdepth-demo.toml --results $(RESULTS)
	$(BIN)/swapcheck report kdepth --results $(RESULTS) --sweep kdepth-demo

# The default run skips tests marked `slow` (under 6 minutes on 2 cores); CI runs both sets. Both run
# on TEST_WORKERS pytest-xdist workers, a test module per worker at a time (its module fixtures once).
# Neither installs anything outside .venv: without Debian's chromium the HTML report's headless-browser
# test skips and says how to install it (.ci/run installs it on CI machines).
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=20

test: $(STAMP)
	@$(BIN)/python -m compileall -q swapcheck swapcheck_common orchestrator tasks storage reports benchmarks
	$(PYTEST) -m "not slow and not gpu"

test-slow: $(STAMP)
	@$(BIN)/python -m compileall -q swapcheck swapcheck_common orchestrator tasks storage reports benchmarks
	$(PYTEST) -m "slow and not gpu"

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu

# The GPU lease kit (docs/gpu.md, infra/gpu-kit/run.sh): `gpu-kit-wheels` puts the wheels a borrowed
# GPU machine lacks (pydantic, DuckDB: cpu.lock's versions and hashes, CPython 3.12) in .kit-wheels/ and
# checks that the tree plus them stays under 64 MiB; `gpu-kit-cpu` runs the kit here, every device call
# on its CPU counterpart (Triton's kernel under its interpreter once `make triton` installed it), into
# KIT_OUT, which must be new or empty.
KIT_OUT ?= $(RESULTS)/gpu-kit-cpu
gpu-kit-wheels: $(STAMP)
	$(BIN)/python tools/gpu_kit_wheels.py

gpu-kit-cpu: $(STAMP)
	bash infra/gpu-kit/run.sh --cpu $(KIT_OUT)

# The fault suite (tests/faults, slow cases included) tallied: cases, clean, rows lost, duplicated,
# silent wrong answers (the table of docs/reliability.md).
fault-report: $(STAMP)
	$(BIN)/python tools/fault_report.py --workers $(TEST_WORKERS)

# Every stage benchmark against its named baseline, measured in the same run (docs/performance.md);
# writes benchmarks/results.json. Run it on a quiet machine: the figures are ratios, not seconds.
# Bytecode compiled first, as an installed package has it (with PYTHONDONTWRITEBYTECODE set, every CLI
# run of the reads stage would otherwise compile swapcheck's modules again: 0.14 s of a 1 s command).
bench: $(STAMP)
	@$(BIN)/python -m compileall -q swapcheck swapcheck_common orchestrator tasks storage reports benchmarks
	$(BIN)/python benchmarks/run_all.py

bench-quick: $(STAMP)
	@$(BIN)/python -m compileall -q swapcheck swapcheck_common orchestrator tasks storage reports benchmarks
	$(BIN)/python benchmarks/run_all.py --quick --out benchmarks/results-quick.json

# ruff, mypy --strict (pyproject.toml) and the import contracts of docs/architecture.md.
lint: $(STAMP)
	$(BIN)/ruff check swapcheck swapcheck_common orchestrator tasks storage reports tests benchmarks tools
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(RESULTS) .pytest_cache .ruff_cache .mypy_cache .hypothesis

docs: $(STAMP)
	$(BIN)/typer orchestrator.cli.main utils docs --name swapcheck --title "swapcheck CLI reference" --output docs/cli.md

# Re-resolve both locks from pyproject.toml, keeping every pin that still satisfies it (`lock-upgrade`
# takes the newest allowed versions). Commit the result; never edit a lock by hand.
lock: $(STAMP)
	$(UV) pip compile pyproject.toml --extra dev -c requirements/cpu-constraints.txt \
	    --find-links $(TORCH_CPU_WHEELS) $(LOCK_FLAGS) $(UPGRADE) -o $(LOCK)
	$(UV) pip compile pyproject.toml --extra vllm --extra dev -c requirements/gpu-constraints.txt \
	    $(LOCK_FLAGS) $(UPGRADE) -o $(GPU_LOCK)
	$(UV) pip compile pyproject.toml --extra vllm -c requirements/gpu-constraints.txt \
	    $(subst 3.11,3.12,$(LOCK_FLAGS)) $(UPGRADE) -o $(DOCKER_LOCK)
	$(UV) pip compile pyproject.toml --extra dev --extra triton -c $(LOCK) \
	    --find-links $(TORCH_CPU_WHEELS) $(LOCK_FLAGS) $(UPGRADE) -o $(TRITON_LOCK)
	@{ echo '# Every exact pin of requirements/cpu.lock, without hashes, written by `make lock` (never by hand):'; \
	   echo '# `pip install -c constraints.txt ...` puts swapcheck'"'"'s tested versions into an environment of your own.'; \
	   sed -n 's/^\([A-Za-z0-9_.+-]*==[^ ]*\).*/\1/p' $(LOCK); } > constraints.txt

lock-upgrade:
	$(MAKE) lock UPGRADE=--upgrade

# Triton 3.6.0 into .venv (the optional `triton` extra, from requirements/triton.lock with hashes): the
# triton-scaled-mm kernel then compiles on a GPU and runs under Triton's interpreter on a CPU (its slow
# tests, tests/test_triton_kernel.py). The venv is then triton.lock's, no longer exactly cpu.lock's.
triton: $(STAMP)
	$(UV) pip install --python $(BIN)/python --require-hashes --compile-bytecode $(TORCH_CPU_FROM) -r $(TRITON_LOCK)
	@$(BIN)/python tools/check_lock.py $(TRITON_LOCK)

# The contract with vLLM (issue #37): every vLLM symbol, argument, variable, class, backend and log
# format swapcheck relies on, checked in the source of each wheel the `vllm` extra allows (fetched
# without dependencies, no GPU; cached in ~/.cache/swapcheck/vllm-wheels) and reported for the newer
# releases; exit 1 names the call site that breaks. Run with the nightly (docs/development.md).
vllm-contract: $(STAMP)
	$(BIN)/python tools/vllm_contract.py --newer

# The nightly check against upstream (not CI's gate): resolve the newest versions pyproject.toml allows
# into a separate venv, run the default suite there and report which pins moved and what broke.
test-latest: $(STAMP)
	$(BIN)/python tools/test_latest.py --torch-wheels $(TORCH_CPU_WHEELS)
