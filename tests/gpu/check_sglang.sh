#!/usr/bin/env bash
# GPU check of trident's SGLang backend (docs/sglang.md): serve a small chat model with
# the real SGLang through Triton and check streaming, abort and prefix-cache hits.
# Usage: tests/gpu/check_sglang.sh [--model PATH_OR_HF_ID] [--gpu TYPE] [--workdir DIR]
# Needs: one NVIDIA GPU, sglang (0.5.x) and trident installed in the same Python
# environment as the Triton stub (PYTHON below), tritonserver (nvidia-pytriton or NGC).
# Finishes in under 8 minutes or fails (timeout 480 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}

command -v nvidia-smi >/dev/null || { echo "FAIL: no nvidia-smi: this check needs a GPU"; exit 2; }
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
"$PYTHON" -c "import sglang; print('sglang', sglang.__version__)" \
  || { echo "FAIL: sglang is not importable by $PYTHON"; exit 2; }

exec timeout --signal=INT --kill-after=20 480 "$PYTHON" tests/gpu/check_sglang.py "$@"
