#!/usr/bin/env bash
# GPU smoke test (benchmarks/gpu_smoke.py): one NVIDIA GPU, no network, under 8 minutes.
# Usage: infra/gpu-smoke.sh [--out FILE] [--budget-s SECONDS] ...   (see --help)
set -euo pipefail
cd "$(dirname "$0")/.."
# Offline: never reach for a model hub or send usage statistics.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
exec "$PY" benchmarks/gpu_smoke.py "$@"
