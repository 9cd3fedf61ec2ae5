"""The persistent layer's CUDA source itself (persistent_rnn.cu and its kernels), compiled for the host
against kernel_host_shim.h, against the model's scan; and the shim's own checks: broken kernels fail
or give wrong numbers, its wmma and roundings match their definitions.

Each launch runs a block per OS thread and the block's 512 threads as fibers switched at barriers in
an order drawn from the seed (jaxring/rnn/csrc/kernel_host_grid.cc), so a race inside a block shows
as results that change with the seed: every case runs under two seeds and must give the same bits.
"""

import dataclasses
import functools
import os
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from jaxring.rnn.layer import saved_width, weight_gradients
from jaxring.rnn.plan import DeviceBudget, plan_layer
from tests.jaxring.rnn.test_host_mirror import GATES, RELU_CLIP, float64_scan, mirror, random_layer, plan_over_blocks
from tests.testing_modules import BUILD_WITH_THEM

# Where CMakeLists.txt looks for the CUDA headers the module is built with (types only, no runtime).
CUDA_HEADER = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include" / "cuda_runtime_api.h"
try:
    from jaxring.rnn import _jaxring_rnn_host_test as host
except ImportError:
    if CUDA_HEADER.exists():
        raise ImportError(f"{CUDA_HEADER} is here but jaxring.rnn._jaxring_rnn_host_test is not built: "
                          f"{BUILD_WITH_THEM}") from None
    pytest.skip(f"the host build of the RNN kernels needs the CUDA headers ({CUDA_HEADER}) at build time",
                allow_module_level=True)

STORAGE = {np.dtype(np.float32): "float32", np.dtype(ml_dtypes.bfloat16): "bfloat16"}
SCHEDULE_SEEDS = (0, 1)


def device_array(a, dtype):
    """`a` in `dtype`, C-contiguous, bfloat16 as its uint16 bits (what the module copies)."""
    a = np.ascontiguousarray(np.asarray(a, dtype))
    return a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a


def run_kernels(cell, dtype, plan, kernels, biases, projected, mask, d_outputs, seed):
    """LaunchForward then LaunchBackward on the host with `plan`'s split: outputs, states, d_kernels,
    d_biases (summed by layer.weight_gradients, as on the GPU), d_projected."""
    directions, batch, frames, width = projected.shape
    hidden = width // GATES[cell]
    storage = STORAGE[np.dtype(dtype)]
    shape = (directions, batch, frames, hidden, GATES[cell], plan.unit_groups, plan.batch_rows, plan.forward_chunk,
             plan.backward_chunk)
    outputs = np.empty((directions, batch, frames, hidden), dtype)
    states = np.empty((directions, frames + 1, batch, hidden), dtype)
    saved = np.empty((directions, frames, batch, saved_width(cell, hidden)), np.float32)
    host.forward(storage, shape, RELU_CLIP, device_array(kernels, dtype), device_array(biases, dtype),
                 device_array(projected, dtype), np.ascontiguousarray(mask), device_array(outputs, dtype),
                 device_array(states, dtype), saved, seed)
    d_recurrent = np.empty((directions, frames, batch, width), dtype)
    d_projected = np.empty((directions, batch, frames, width), dtype)
    host.backward(storage, shape, RELU_CLIP, device_array(kernels, dtype), np.ascontiguousarray(mask),
                  device_array(states, dtype), saved, device_array(d_outputs, dtype), device_array(d_recurrent, dtype),
                  device_array(d_projected, dtype), seed)
    d_kernels, d_biases = weight_gradients(states, d_recurrent, np.float32)
    return [np.asarray(a, np.float64) for a in (outputs, states, d_kernels, d_biases, d_projected)]


def states_of(outputs, mask):
    """[D, T + 1, B, H] states from outputs: each frame's output where real, else the state held."""
    directions, batch, frames, hidden = outputs.shape
    states = np.zeros((directions, frames + 1, batch, hidden))
    for t in range(frames):
        states[:, t + 1] = np.where(mask[:, :, t, None], outputs[:, :, t], states[:, t])
    return states


@functools.lru_cache(maxsize=None)
def case(cell, directions, batch, frames, hidden):
    """A random layer (ragged lengths, padded frames) and its outputs' cotangent."""
    rng = np.random.default_rng(hidden * 1000 + batch)
    layer = random_layer(rng, cell, directions, batch, frames, hidden)
    return layer, rng.normal(size=(directions, batch, frames, hidden))


def in_mirror(dtype, cell, blocks, layer, d_outputs):
    """host_mirror's outputs, states and gradients in `dtype` (float64: the scan's, to 1e-10)."""
    outputs, *grads = mirror(cell, dtype, blocks, *layer, d_outputs, seed=0)
    return [outputs, states_of(outputs, layer[3]), *grads]


def relative_errors(got, want):
    return [np.abs(g - w).max() / np.abs(w).max() for g, w in zip(got, want)]


NAMES = ["outputs", "states", "d_kernels", "d_biases", "d_projected"]
# Of the largest value. The kernels' float32 products run in TF32 (docs/PERSISTENT_RNN.md, "Dtypes"),
# whose 10-bit mantissa rounds each operand by up to 2^-11 = 4.9e-4: measured 4e-5 to 4.8e-4 here,
# against 5e-8 to 3e-7 for the float32 mirror; a misplaced row or column is off by far more.
FLOAT32_TOLERANCE = 1e-3
# bfloat16 rounds where the mirror rounds: measured equal to its error to two digits (3e-3 to 2e-1;
# a plain RNN's gradients move most, rounding flips pre-activations across the clip's kinks).
BFLOAT16_MIRROR_FACTOR = 1.25
SHAPES = [  # cell, directions, batch, frames, hidden, blocks per direction
    ("gru", 2, 3, 9, 13, 4),
    ("gru", 1, 1, 5, 7, 1),
    ("gru", 2, 20, 6, 33, 3),
    ("rnn", 2, 5, 11, 9, 2),
    ("rnn", 1, 17, 4, 7, 7),  # as many blocks as units: one each
    ("rnn", 2, 2, 7, 33, 5),
    ("gru", 2, 40, 4, 13, 8),  # 3 runs of utterances x 2 runs of units a direction
    ("rnn", 1, 33, 3, 10, 6),  # 3 runs of utterances x 2 runs of units
]


def check_against(want, cell, blocks, layer, d_outputs, runs, dtype):
    """Float32 to TF32's rounding of `want`, bfloat16 as far off as the bfloat16 mirror."""
    assert all(np.abs(w).max() > 0.1 for w in want)  # nothing compared is trivially zero
    if dtype == np.float32:
        bounds = [FLOAT32_TOLERANCE] * len(NAMES)
    else:
        bounds = [BFLOAT16_MIRROR_FACTOR * e
                  for e in relative_errors(in_mirror(dtype, cell, blocks, layer, d_outputs), want)]
    for name, error, bound in zip(NAMES, relative_errors(runs, want), bounds):
        assert error <= bound, (name, error, bound)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("cell, directions, batch, frames, hidden, blocks", SHAPES)
def test_kernels_match_the_float64_mirror(cell, directions, batch, frames, hidden, blocks, dtype):
    """Outputs, states and gradients of the host-compiled kernels, the same bits under two schedules,
    against the float64 mirror (tests/jaxring/rnn/test_host_mirror.py proves it the scan's)."""
    layer, d_outputs = case(cell, directions, batch, frames, hidden)
    plan = plan_over_blocks(cell, dtype, blocks, layer[0], layer[2])
    runs = [run_kernels(cell, dtype, plan, *layer, d_outputs, seed) for seed in SCHEDULE_SEEDS]
    for name, first, second in zip(NAMES, *runs):
        np.testing.assert_array_equal(first, second, err_msg=f"{name} changes with the schedule: a race")
    check_against(in_mirror(np.float64, cell, blocks, layer, d_outputs), cell, blocks, layer, d_outputs, runs[0],
                  dtype)


def test_kernels_match_the_float64_scan():
    """Against jaxring/rnn/scan.py's scan itself, one shape (JAX compiles the scan for seconds;
    the other shapes and the plain RNN go through the mirror, which the scan's tests pin)."""
    cell, directions, batch, frames, hidden, blocks = SHAPES[0]
    layer, d_outputs = case(cell, directions, batch, frames, hidden)
    outputs, *grads = float64_scan(cell, *layer, d_outputs)
    want = [outputs, states_of(outputs, layer[3]), *grads]
    for dtype in [np.float32, ml_dtypes.bfloat16]:
        plan = plan_over_blocks(cell, dtype, blocks, layer[0], layer[2])
        check_against(want, cell, blocks, layer, d_outputs, run_kernels(cell, dtype, plan, *layer, d_outputs, 0),
                      dtype)


def test_the_plan_never_gives_a_block_no_units_and_the_module_refuses_one():
    plan = plan_layer(5, 3, 4, 2, 4, DeviceBudget("many SMs", sms=100, shared_bytes_per_block=1 << 30))
    assert plan.blocks_per_direction == 5 and all(len(plan.units(j)) == 1 for j in range(5))
    layer, d_outputs = case("gru", 1, 1, 5, 7)
    eight_groups = dataclasses.replace(plan_over_blocks("gru", np.float32, 7, layer[0], layer[2]), starts=tuple(range(9)))
    with pytest.raises(ValueError, match=r"unit_groups 8 must be 1 to hidden \(7\)"):
        run_kernels("gru", np.float32, eight_groups, *layer, d_outputs, seed=0)


def test_a_missing_block_barrier_gives_wrong_values_under_some_schedules():
    """Threads read their neighbour's shared-memory slot: with __syncthreads always right, without
    it the neighbour may not have written yet (shared memory starts as NaN, as stale memory)."""
    want = (np.arange(64) + 1) % 64 + 1
    wrong = 0
    for seed in range(8):
        code, message, correct = host.barrier_check("rotate", broken=False, seed=seed)
        assert code == 0 and not message
        np.testing.assert_array_equal(correct, want)
        code, _, racy = host.barrier_check("rotate", broken=True, seed=seed)
        assert code == 0
        wrong += not np.array_equal(racy, want)
    assert wrong >= 6


CUDA_ERROR_LAUNCH_TIMEOUT = 702  # cudaErrorLaunchTimeout: what a hang is reported as
CUDA_ERROR_MISALIGNED_ADDRESS = 716


@pytest.mark.parametrize("name, message", [
    ("exit_before_barrier", r"block 0: the block would hang: threads 0-4 wait at __syncthreads, 5 exited, 6-63"),
    # Which of block 1's finishing and another's arriving is seen first depends on the OS's timing.
    ("skip_grid_sync", r"(block 1 finished while blocks [02, ]* wait|blocks 1 finished without reaching it)"),
    ("mixed_barriers", r"threads 0-31 wait at grid.sync, 32-63 wait at __syncthreads"),
])
def test_barriers_a_gpu_would_hang_at_fail_the_launch(name, message):
    for seed in range(3):
        code, text, _ = host.barrier_check(name, broken=False, seed=seed)
        assert (code, text) == (0, "")
        code, text, _ = host.barrier_check(name, broken=True, seed=seed)
        assert code == CUDA_ERROR_LAUNCH_TIMEOUT
        assert re.search(message, text), text


def test_a_block_late_at_the_grid_barrier_past_the_deadline_fails_the_launch():
    """Block 1 sleeps 0.3 s before grid.sync: a hang for a 0.1 s deadline, not for the default one."""
    code, text, _ = host.barrier_check("slow_block", broken=True, seed=0, barrier_seconds=0.1)
    assert code == CUDA_ERROR_LAUNCH_TIMEOUT
    assert re.search(r"waited 0.1 s at grid.sync for blocks 1, which never arrived", text), text
    code, text, values = host.barrier_check("slow_block", broken=True, seed=0)
    assert (code, text) == (0, "") and np.all(np.array(values) == 1)


@pytest.mark.parametrize("offset, ldm, lanes, code, message", [
    (0, 16, "all", 0, ""),
    (16, 32, "all", 0, ""),  # 32 bytes in: aligned
    (2, 16, "all", CUDA_ERROR_MISALIGNED_ADDRESS, "not 256-bit (32-byte) aligned"),
    (0, 12, "all", CUDA_ERROR_MISALIGNED_ADDRESS, "ldm 12 is not a multiple of 8 elements"),
    (0, 16, "half_return", CUDA_ERROR_LAUNCH_TIMEOUT,
     "warp 0 would hang: threads 0-15 wait at a warp barrier, 16-31 exited"),
    (0, 16, "own_pointer", CUDA_ERROR_LAUNCH_TIMEOUT,
     "warp 0: lane 1 calls wmma::load_matrix_sync(0x"),
])
def test_wmma_loads_fault_where_the_gpu_would(offset, ldm, lanes, code, message):
    got_code, text, tile = host.load_tile(offset, ldm, lanes)
    assert got_code == code and message in text, text
    if code == 0:  # the kernel fills element i with i % 7 and reads 16 rows of `ldm`
        index = offset + np.arange(16)[:, None] * ldm + np.arange(16)[None, :]
        np.testing.assert_array_equal(np.reshape(tile, (16, 16)), index % 7)


def round_to_tf32(x):
    """Nearest value with a 10-bit mantissa, ties away from zero, in float64 arithmetic."""
    x = np.asarray(x, np.float64)
    step = 2.0 ** (np.floor(np.log2(np.abs(np.where(x == 0, 1, x)))) - 10)
    return np.sign(x) * np.floor(np.abs(x) / step + 0.5) * step


def test_roundings_match_their_definitions():
    rng = np.random.default_rng(0)
    one_ulp_bf16, one_ulp_tf32 = 2.0**-7, 2.0**-10
    ties = np.array([1 + one_ulp_bf16 / 2, 1 + 3 * one_ulp_bf16 / 2, -(1 + one_ulp_bf16 / 2)], np.float32)
    x = np.concatenate([rng.normal(size=2000) * 10.0 ** rng.integers(-30, 30, size=2000), ties,
                        [0.0, -0.0, np.inf, -np.inf, 1e-40, 3.4e38]]).astype(np.float32)
    want = x.astype(ml_dtypes.bfloat16)  # ml_dtypes rounds to nearest, ties to even, as cvt.rn.bf16.f32
    bits = np.array(host.round_to_bfloat16(x), np.uint16)
    np.testing.assert_array_equal(bits, want.view(np.uint16))
    np.testing.assert_array_equal(np.array(host.bfloat16_to_float(bits), np.float32), want.astype(np.float32))
    nan_bits = np.array(host.round_to_bfloat16(np.array([np.nan], np.float32)), np.uint16)
    assert np.isnan(host.bfloat16_to_float(nan_bits)[0])

    tf32_ties = np.array([1 + one_ulp_tf32 / 2, -(1 + one_ulp_tf32 / 2), 1 + 3 * one_ulp_tf32 / 2], np.float32)
    finite = np.concatenate([rng.normal(size=2000) * 10.0 ** rng.integers(-30, 30, size=2000), tf32_ties])
    finite = finite.astype(np.float32)
    got = np.array(host.round_to_tf32(finite), np.float32)
    np.testing.assert_array_equal(got, round_to_tf32(finite).astype(np.float32))
    np.testing.assert_array_equal(got[-3:], [1 + one_ulp_tf32, -(1 + one_ulp_tf32), 1 + 2 * one_ulp_tf32])


@pytest.mark.parametrize("precision", ["bfloat16", "tf32"])
@pytest.mark.parametrize("layout_a", ["row", "col"])
@pytest.mark.parametrize("layout_b", ["row", "col"])
@pytest.mark.parametrize("layout_c", ["row", "col"])
def test_wmma_multiplies_tiles_as_rounded_float32_products(precision, layout_a, layout_b, layout_c):
    k = 16 if precision == "bfloat16" else 8
    rng = np.random.default_rng(k)
    a, b, c = (rng.normal(size=shape).astype(np.float32) for shape in [(16, k), (k, 16), (16, 16)])
    store = {"row": lambda m: np.ascontiguousarray(m), "col": lambda m: np.ascontiguousarray(m.T)}
    d = np.array(host.multiply_tiles(precision, layout_a, layout_b, layout_c, store[layout_a](a),
                                     store[layout_b](b), store[layout_c](c)), np.float64).reshape(16, 16)
    d = d if layout_c == "row" else d.T
    if precision == "bfloat16":
        a_in, b_in = (m.astype(ml_dtypes.bfloat16).astype(np.float64) for m in (a, b))
    else:
        a_in, b_in = round_to_tf32(a), round_to_tf32(b)
    want = a_in @ b_in + c
    # Float32 accumulation of exact products: k + 1 roundings at most, each of the running sum.
    bound = (k + 1) * np.finfo(np.float32).eps * (np.abs(a_in) @ np.abs(b_in) + np.abs(c))
    assert np.all(np.abs(d - want) <= bound)
    unrounded = a.astype(np.float64) @ b + c  # the rounding of the inputs is visible, so it was applied
    assert np.abs(d - unrounded).max() > 10 * bound.max()
