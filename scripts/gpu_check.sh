#!/usr/bin/env bash
# Everything that needs a GPU, in one command, on a machine with only its
# image (python3 with jax + CUDA plugin, flax, optax, nvcc, cmake, ninja,
# scikit-build-core, nanobind; no network):
#
#   scripts/gpu_check.sh                       # every stage
#   GPU_CHECK_STAGES="build harness" scripts/gpu_check.sh   # some of them
#
# Stages: build (in place, with -Xptxas=-v register report), import (jaxring
# without the training-only packages), protocol (the CPU protocol tests, if
# pytest is there), harness (scripts/check_cuda_ring.py: k = 2..8 virtual
# ranks, both engines), sanitizer (compute-sanitizer memcheck and synccheck
# on a small case), jax (scripts/check_jax_gpu.py under each engine, and a bad
# JAXRING_CUDA_ENGINE), bench (scripts/bench_cuda_ring.py). Results go to
# $OUT, else ./gpu-results; the exit status is non-zero if any stage failed.
# HARNESS_LARGEST caps the harness's sizes (elements; default 64M).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-results}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-python3}"
STAGES="${GPU_CHECK_STAGES:-build import protocol harness sanitizer jax bench}"
# The harness runs k ranks' kernels at once from k streams, which needs k
# hardware queues; CUDA reads this when it starts (docs/CUDA_RING.md).
export CUDA_DEVICE_MAX_CONNECTIONS=32
failed=()

stage() {  # stage NAME COMMAND...: runs it, logs to $OUT/NAME.log, records a failure
  local name=$1
  shift
  echo "=== $name: $*" | tee -a "$OUT/summary.txt"
  local start=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 5 "$OUT/$name.log"
  echo "=== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || failed+=("$name")
}

wants() { [[ " $STAGES " == *" $1 "* ]]; }

: >"$OUT/summary.txt"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
"$PYTHON" -c "import jax; print(jax.__version__, jax.devices())" >"$OUT/jax-devices.txt" 2>&1 || true

if wants build; then
  stage build "$PYTHON" -m pip install -v --no-build-isolation --no-deps -e .
  grep -E "Compiling entry|registers|spill" "$OUT/build.log" >"$OUT/ptxas.txt" || true
fi

if wants import; then
  # The image lacks the training-only packages; jaxring must import without them.
  stage import "$PYTHON" -c "
import importlib.util, jaxring
absent = [m for m in ('jiwer', 'soundfile', 'soxr', 'espeakng_loader', 'tensorboardX', 'mpi4jax')
          if importlib.util.find_spec(m) is None]
print('import jaxring: ok; absent here:', absent)
print('platforms:', jaxring.collectives._ffi.register())"
fi

if wants protocol; then
  if "$PYTHON" -c "import pytest" 2>/dev/null; then
    stage protocol "$PYTHON" -m pytest -q -p no:cacheprovider tests/jaxring/test_ring_protocol.py tests/jaxring/test_schedule.py
  else
    echo "=== protocol: skipped (no pytest in this image)" | tee -a "$OUT/summary.txt"
  fi
fi

if wants harness; then
  stage harness "$PYTHON" scripts/check_cuda_ring.py --out "$OUT/harness.jsonl" --largest "${HARNESS_LARGEST:-67108864}"
fi

if wants sanitizer; then
  # Small cases: the sanitizer slows kernels by orders of magnitude.
  for tool in memcheck synccheck; do
    stage "sanitizer-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 \
      "$PYTHON" scripts/check_cuda_ring.py --out "$OUT/sanitizer-$tool.jsonl" --ranks 2,3 --largest 1000 --timeout 120
  done
fi

if wants jax; then
  for engine in host device; do
    stage "jax-$engine" env JAXRING_CUDA_ENGINE=$engine JAXRING_LOG=debug "$PYTHON" scripts/check_jax_gpu.py
  done
  # A misspelt engine is an error that says what to write instead.
  stage jax-bad-engine bash -c "! JAXRING_CUDA_ENGINE=devcie '$PYTHON' scripts/check_jax_gpu.py >'$OUT/jax-bad-engine.out' 2>&1 \
    && grep -q \"JAXRING_CUDA_ENGINE is 'devcie'; use 'host'\" '$OUT/jax-bad-engine.out'"
fi

if wants bench; then
  stage bench "$PYTHON" scripts/bench_cuda_ring.py --json-dir "$OUT" --markdown "$OUT/bench.md"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}" | tee -a "$OUT/summary.txt"
  exit 1
fi
echo "all stages passed: $STAGES" | tee -a "$OUT/summary.txt"
