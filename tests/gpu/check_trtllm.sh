#!/usr/bin/env bash
# GPU check of trident's TensorRT-LLM path (< 8 minutes): build a tiny engine through
# `trident engines build`, publish it to a real S3 (SeaweedFS), fetch it on a clean cache,
# render with `trident repo`, serve it with Triton's tensorrtllm backend, stream an answer.
#
# Run on a GPU machine with TensorRT-LLM v0.16 and Triton's TRT-LLM backend, e.g. inside
# nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3 with this repository and its
# requirements installed (`pip install --no-deps -r requirements.lock` minus vllm/torch):
#   TRIDENT_TRTLLM_EXAMPLES=/path/to/TensorRT-LLM/examples tests/gpu/check_trtllm.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "check_trtllm: $*" >&2; exit 2; }
command -v nvidia-smi >/dev/null || fail "no nvidia-smi: this check needs a GPU"
command -v "${TRIDENT_TRTLLM_BUILD:-trtllm-build}" >/dev/null \
  || fail "no trtllm-build on PATH (install TensorRT-LLM or set TRIDENT_TRTLLM_BUILD)"
command -v tritonserver >/dev/null || fail "no tritonserver on PATH (use a -trtllm- Triton image)"
[ -d /opt/tritonserver/backends/tensorrtllm ] || fail "Triton has no tensorrtllm backend"
[ -n "${TRIDENT_TRTLLM_EXAMPLES:-}${TRIDENT_TRTLLM_CONVERT:-}" ] \
  || fail "set TRIDENT_TRTLLM_EXAMPLES to TensorRT-LLM's examples/ (for llama/convert_checkpoint.py)"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export HF_HUB_OFFLINE=1
exec timeout 480 "$PYTHON" tests/gpu/check_trtllm.py
