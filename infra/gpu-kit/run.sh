#!/usr/bin/env bash
# The GPU lease kit (docs/gpu.md): the field's core claims measured on one borrowed NVIDIA GPU with only
# torch and Triton, written as a swapcheck results tree that the CPU side reports.
#
#   infra/gpu-kit/run.sh OUT                 # on the GPU machine: <= 8 minutes on one H200
#   infra/gpu-kit/run.sh --cpu OUT           # anywhere: CPU counterparts, Triton under its interpreter
#   infra/gpu-kit/run.sh OUT --budget-s 300  # no unit starts after 300 s
#
# OUT gets at most 8 files: results.tar.gz, summary.txt, kit.log, device.json, spec.toml.
# It runs on the machine's own Python (PYTHON, else this checkout's .venv, else python3) with the tree on
# PYTHONPATH: nothing is installed but the wheels `make gpu-kit-wheels` put in .kit-wheels/ (pydantic,
# DuckDB), and those only when that Python lacks them, into a folder under $TMPDIR.
set -euo pipefail
kit=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$kit/../.." && pwd)
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c "import pydantic, duckdb" 2>/dev/null; then
    if compgen -G "$repo/.kit-wheels/*.whl" >/dev/null; then
        site="${TMPDIR:-/tmp}/swapcheck-kit-site"
        if "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
            --no-cache-dir --upgrade --target "$site" "$repo"/.kit-wheels/*.whl; then
            export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        else
            echo "run.sh: the wheels in .kit-wheels/ (made for CPython 3.12) do not install on $PYTHON: going on without them" >&2
        fi
    fi
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$PYTHON" -m orchestrator.gpukit "$@"
