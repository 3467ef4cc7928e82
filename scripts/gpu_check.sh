#!/usr/bin/env bash
# nvgpu on a real GPU (see scripts/gpu_check.py and docs/nvgpu.md).
#
#   scripts/gpu_check.sh prepare [ARTIFACT_DIR]   here, with MLIR: compile the kernels (default build/gpu_artifacts)
#   scripts/gpu_check.sh OUT_DIR [ARTIFACT_DIR]    on the GPU machine: checks + benchmarks -> OUT_DIR/gpu_check.json
#
# The GPU machine needs python3 with numpy (torch for the zero-copy checks and the benchmarks), the NVIDIA
# driver, and this source tree; not MLIR. Carry ARTIFACT_DIR there (it is git-ignored under build/).
# If pytest is installed there, the gpu-marked tests that need no MLIR run first (tests/nvgpu/test_nvgpu_gpu.py,
# then the fused-attention ones of tests/nvgpu/test_nvgpu_attention.py).
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$HERE/.venv/bin/python" ]; then PY="$HERE/.venv/bin/python"; else PY="$(command -v python3 || command -v python)"; fi
fi
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = "prepare" ]; then
  exec "$PY" "$HERE/scripts/gpu_check.py" prepare "${2:-$HERE/build/gpu_artifacts}" ${SPEC:+--spec "$SPEC"}
fi
OUT="${1:?usage: scripts/gpu_check.sh OUT_DIR [ARTIFACT_DIR] | prepare [ARTIFACT_DIR]}"
ART="${2:-$HERE/build/gpu_artifacts}"
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
if [ ! -f "$ART/manifest.json" ] && "$PY" -c "import mlir" 2>/dev/null; then
  "$PY" "$HERE/scripts/gpu_check.py" prepare "$ART" || exit 2
fi
status=0
if "$PY" -c "import pytest" 2>/dev/null; then
  PBSDK_GPU_ARTIFACTS="$ART" timeout 180 "$PY" -m pytest -q -p no:cacheprovider -m gpu "$HERE/tests/nvgpu/test_nvgpu_gpu.py" \
    --junitxml="$OUT/pytest-gpu.xml" > "$OUT/pytest-gpu.txt" 2>&1 || status=1
  PBSDK_GPU_ARTIFACTS="$ART" timeout 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu "$HERE/tests/nvgpu/test_nvgpu_attention.py" \
    --junitxml="$OUT/pytest-gpu-attention.xml" > "$OUT/pytest-gpu-attention.txt" 2>&1 || status=1
fi
timeout 420 "$PY" "$HERE/scripts/gpu_check.py" run "$ART" "$OUT" || status=$?
exit $status
