# Quick start: `make demo` runs the K-depth demo sweep on an embedded Ray instance; `make test` runs the tests.
# Both create .venv and install swapcheck into it (quietly; a stamp file makes a second run instant).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.swapcheck-installed
RESULTS ?= results
PIP_QUIET := --quiet --disable-pip-version-check --no-input

.PHONY: demo kdepth-demo test test-slow test-gpu lint install clean docs bench bench-quick

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing swapcheck into $(VENV) (CPU torch pinned by constraints.txt)..."
	@$(BIN)/python -m pip install $(PIP_QUIET) -c constraints.txt -e '.[dev]' 2>&1 | grep -v "is ignored: it is neither" || true
	@$(BIN)/python -c "import torch, ray, duckdb, orchestrator, tasks, storage" 
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

# The default run skips tests marked `slow` (under 10 minutes on 2 cores); CI runs both sets.
test: $(STAMP)
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || true
	$(BIN)/python -m pytest -q -m "not slow and not gpu"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m "slow and not gpu"

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu

# Every stage benchmark against its named baseline, measured in the same run (docs/performance.md);
# writes benchmarks/results.json. Run it on a quiet machine: the figures are ratios, not seconds.
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

bench-quick: $(STAMP)
	$(BIN)/python benchmarks/run_all.py --quick --out benchmarks/results-quick.json

# ruff, mypy --strict (pyproject.toml) and the import contracts of docs/architecture.md.
lint: $(STAMP)
	$(BIN)/ruff check orchestrator tasks storage reports tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(RESULTS) .pytest_cache .ruff_cache .mypy_cache .hypothesis

docs: $(STAMP)
	$(BIN)/typer orchestrator.cli.main utils docs --name swapcheck --title "swapcheck CLI reference" --output docs/cli.md
