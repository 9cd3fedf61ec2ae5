"""The host mirror of the persistent kernel (tests/jaxring/rnn/host_mirror.py) against the reference scan
(jaxring/rnn/scan.py) computed in float64."""

import jax
import ml_dtypes
import numpy as np
import pytest

from jaxring.rnn import layer
from jaxring.rnn.plan import DeviceBudget, plan_layer
from jaxring.rnn.scan import scan_recurrence
from tests.jaxring.rnn import host_mirror

GATES = {"gru": 3, "rnn": 1}
RELU_CLIP = 1.5  # low, so random pre-activations land on both sides of the clip


def random_layer(rng, cell, directions, batch, frames, hidden):
    width = GATES[cell] * hidden
    kernels = rng.normal(size=(directions, hidden, width)) / np.sqrt(hidden)
    biases = 0.3 * rng.normal(size=(directions, width))
    projected = rng.normal(size=(directions, batch, frames, width))
    lengths = rng.integers(1, frames + 1, size=batch)
    lengths[0] = frames
    forward_mask = np.arange(frames)[None, :] < lengths[:, None]
    # The backward direction reads its frames reversed, so its padding comes first.
    mask = np.stack([forward_mask, forward_mask[:, ::-1]][:directions])
    return kernels, biases, projected, mask


def float64_scan(cell, kernels, biases, projected, mask, d_outputs):
    """Outputs and gradients (kernels, biases, projected) of the model's scan in float64."""
    with jax.enable_x64(True):
        outputs, vjp = jax.vjp(lambda k, b, x: scan_recurrence(cell, RELU_CLIP, 1, k, b, x, mask),
                               kernels, biases, projected)
        return [np.asarray(a) for a in (outputs, *vjp(d_outputs))]


def plan_over_blocks(cell, dtype, blocks, kernels, projected):
    """plan.py's split of the layer over `blocks` blocks a direction, shared memory unbounded."""
    return plan_layer(kernels.shape[1], GATES[cell], projected.shape[1], len(kernels), np.dtype(dtype).itemsize,
                      DeviceBudget("test", sms=blocks * len(kernels), shared_bytes_per_block=1 << 30))


def mirror(cell, dtype, blocks, kernels, biases, projected, mask, d_outputs, seed):
    plan = plan_over_blocks(cell, dtype, blocks, kernels, projected)
    rng = np.random.default_rng(seed)
    kernels, biases, projected = (a.astype(dtype) for a in (kernels, biases, projected))
    outputs, states, saved = host_mirror.forward(cell, RELU_CLIP, plan, kernels, biases, projected, mask, rng)
    d_recurrent, d_projected = host_mirror.backward(cell, RELU_CLIP, plan, kernels, mask, states, saved,
                                                    d_outputs.astype(dtype), rng)
    # The kernel and bias gradients as layer.py takes them from the mirror's (or the kernel's) outputs.
    with jax.enable_x64(dtype == np.float64):
        accumulator = np.float64 if dtype == np.float64 else np.float32
        d_kernels, d_biases = layer.weight_gradients(states, d_recurrent, accumulator)
    return [np.asarray(a, np.float64) for a in (outputs, d_kernels, d_biases, d_projected)]


SHAPES = [  # cell, directions, batch, frames, hidden, blocks per direction
    ("gru", 2, 3, 9, 13, 4),
    ("gru", 1, 1, 2, 5, 5),
    ("gru", 2, 256, 3, 7, 3),
    ("rnn", 2, 5, 11, 9, 2),
    ("rnn", 1, 256, 4, 3, 3),
    ("gru", 2, 40, 4, 13, 8),  # 3 runs of utterances x 2 runs of units a direction
    ("rnn", 2, 33, 3, 10, 6),
]


def test_shapes_split_the_batch_and_the_units_alone_and_together():
    plans = [plan_layer(hidden, GATES[cell], batch, directions, 8,
                        DeviceBudget("test", sms=blocks * directions, shared_bytes_per_block=1 << 30))
             for cell, directions, batch, _, hidden, blocks in SHAPES]
    splits = {(plan.batch_groups > 1, plan.unit_groups > 1) for plan in plans}
    assert splits == {(False, True), (True, False), (True, True)}


@pytest.mark.parametrize("cell, directions, batch, frames, hidden, blocks", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_float64_mirror_equals_the_float64_scan(cell, directions, batch, frames, hidden, blocks, seed):
    rng = np.random.default_rng(seed)
    layer = random_layer(rng, cell, directions, batch, frames, hidden)
    d_outputs = rng.normal(size=(directions, batch, frames, hidden))
    want = float64_scan(cell, *layer, d_outputs)
    got = mirror(cell, np.float64, blocks, *layer, d_outputs, seed)
    for name, g, w in zip(["outputs", "d_kernels", "d_biases", "d_projected"], got, want):
        assert np.abs(w).max() > 0.1, name  # nothing compared is trivially zero
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=name)


def scan_in(dtype, cell, kernels, biases, projected, mask, d_outputs):
    """The model's scan as it runs today in `dtype`: outputs and gradients, as float64."""
    cast = [jax.numpy.asarray(a, dtype) for a in (kernels, biases, projected, d_outputs)]
    outputs, vjp = jax.vjp(lambda k, b, x: scan_recurrence(cell, RELU_CLIP, 1, k, b, x, mask), *cast[:3])
    return [np.asarray(a, np.float64) for a in (outputs, *vjp(cast[3]))]


@pytest.mark.parametrize("dtype, floor", [(np.float32, 1e-6), (ml_dtypes.bfloat16, 1e-2)])
@pytest.mark.parametrize("cell", ["gru", "rnn"])
def test_float32_and_bfloat16_err_no_more_than_the_scan_in_the_same_dtype(dtype, floor, cell):
    """Against float64, the mirror (float32 accumulation and gates) is at most as far off as the scan.

    Measured: float32 both 1-2e-7; bfloat16 the mirror 2e-3 to 1e-1, the scan 7e-3 to 2e-1 (a plain
    RNN's gradients move most: rounding flips pre-activations across the clip's kinks).
    """
    rng = np.random.default_rng(3)
    layer = random_layer(rng, cell, 2, 6, 10, 11)
    d_outputs = rng.normal(size=(2, 6, 10, 11))
    want = float64_scan(cell, *layer, d_outputs)
    got = mirror(cell, dtype, 4, *layer, d_outputs, seed=3)
    scan = scan_in(dtype, cell, *layer, d_outputs)
    for name, g, s, w in zip(["outputs", "d_kernels", "d_biases", "d_projected"], got, scan, want):
        error, scan_error = (np.abs(a - w).max() / np.abs(w).max() for a in (g, s))
        assert error <= max(floor, scan_error), (name, error, scan_error)


def test_blocks_really_interleave_between_barriers():
    """A read of another block's write with no barrier between gives different results by order."""
    seen = []

    def writer(cell):
        cell[0] = 1
        yield None

    def reader(cell):
        seen.append(cell[0])
        yield None

    for seed in range(20):
        cell = [0]
        host_mirror.run_blocks([writer(cell), reader(cell)], np.random.default_rng(seed))
    assert set(seen) == {0, 1}


def test_blocks_passing_different_numbers_of_barriers_are_a_hang():
    def block(barriers):
        for _ in range(barriers):
            yield host_mirror.BARRIER

    with pytest.raises(RuntimeError, match="would hang"):
        host_mirror.run_blocks([block(2), block(1)], np.random.default_rng(0))
