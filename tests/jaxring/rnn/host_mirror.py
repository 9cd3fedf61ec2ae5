"""The persistent recurrent kernel's work split and grid barrier, run on the host in numpy: the tests' oracle.
test_host_mirror.py proves it equal to the scan, test_kernels_on_host.py holds the kernels to it, and
mirrored_layer.py runs it in the layer in place of the kernels.

Each thread block is a generator that runs its units' share of every time step
and yields at the kernel's grid barriers (BARRIER) and between its phases
(None); `run_blocks` resumes ready blocks in a random order and releases a
barrier only when every block waits at it. So a block that reads what another
has not yet written, or overwrites what another still reads, gives wrong
numbers under some orders, as a missing barrier or buffer would on the GPU.

Storage is in the compute dtype (inputs, weights, the saved states, outputs);
every product accumulates and every gate is computed in float32, or in float64
when the compute dtype is float64 (for exact comparisons against a float64 scan).
Arrays are laid out as jaxring/rnn/scan.py's `scan_recurrence` takes them:
[D, B, T, ...], each direction's frames in the order it reads them.
"""

from __future__ import annotations

import numpy as np

from jaxring.rnn.layer import saved_width
from jaxring.rnn.plan import Plan

BARRIER = "barrier"


def run_blocks(blocks: list, rng: np.random.Generator) -> None:
    """Runs generator `blocks` to completion, interleaved at random, each BARRIER a grid-wide barrier."""
    running = list(range(len(blocks)))
    waiting: set[int] = set()
    while running:
        ready = [b for b in running if b not in waiting]
        if not ready:
            if len(waiting) < len(blocks):  # a finished block never arrives
                raise RuntimeError(
                    f"blocks {sorted(waiting)} wait at a barrier that blocks "
                    f"{sorted(set(range(len(blocks))) - waiting)} finished without reaching: the kernel "
                    "would hang (blocks pass different numbers of barriers)"
                )
            waiting.clear()  # every block waits: the barrier opens
            continue
        block = ready[rng.integers(len(ready))]
        try:
            if next(blocks[block]) == BARRIER:
                waiting.add(block)
        except StopIteration:
            running.remove(block)


def _accumulator(dtype) -> type:
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def forward(cell: str, relu_clip: float, plan: Plan, kernels, biases, projected, mask, rng):
    """Returns (outputs [D, B, T, H], states [D, T + 1, B, H], saved [D, T, B, saved_width])."""
    directions, batch, frames, _ = projected.shape
    hidden, dtype = plan.hidden, projected.dtype
    acc = _accumulator(dtype)
    outputs = np.zeros((directions, batch, frames, hidden), dtype)
    # states[d, t] is the state before frame t: the kernel writes each frame's state to its own
    # slot, so blocks read step t's slot while others write step t + 1's without a second barrier.
    states = np.zeros((directions, frames + 1, batch, hidden), dtype)
    saved = np.zeros((directions, frames, batch, saved_width(cell, hidden)), acc)

    def block_program(d, j):
        units, columns, rows = np.array(plan.units(j)), np.array(plan.columns(j)), np.array(plan.rows(j))
        weights = kernels[d][:, columns].astype(acc)  # held on chip for the whole sequence
        bias = biases[d][columns].astype(acc)
        for t in range(frames):
            h_prev = states[d, t][rows].astype(acc)  # its utterances' rows of every block's units
            recurrent = h_prev @ weights + bias
            x = projected[d, rows, t][:, columns].astype(acc)
            if cell == "gru":
                x_r, x_z, x_n = np.split(x, 3, axis=-1)
                h_r, h_z, h_n = np.split(recurrent, 3, axis=-1)
                reset, update = _sigmoid(x_r + h_r), _sigmoid(x_z + h_z)
                candidate = np.tanh(x_n + reset * h_n)
                h_new = (1 - update) * candidate + update * h_prev[:, units]
                saved[d, t][np.ix_(rows, columns)] = np.concatenate([reset, update, candidate], axis=-1)
                saved[d, t][np.ix_(rows, 3 * hidden + units)] = h_n
            else:
                pre = x + recurrent
                h_new = np.clip(pre, 0, relu_clip)
                saved[d, t][np.ix_(rows, units)] = pre
            real = mask[d, rows, t, None]
            states[d, t + 1][np.ix_(rows, units)] = np.where(real, h_new, h_prev[:, units])
            outputs[d, rows[:, None], t, units] = np.where(real, h_new, 0)
            yield BARRIER

    run_blocks([block_program(d, j) for d in range(directions) for j in range(plan.blocks_per_direction)], rng)
    return outputs, states, saved


def backward(cell: str, relu_clip: float, plan: Plan, kernels, mask, states, saved, d_outputs, rng):
    """(d_recurrent [D, T, B, gates * H], d_projected [D, B, T, gates * H]) of the outputs' cotangent
    `d_outputs` through `forward`'s recurrence, starting from zero states, both in the compute dtype.

    d_recurrent[d, t] is frame t's gradient of the recurrent input (states[d, t] @ kernels[d] + biases[d]):
    the kernel and bias gradients are its sums over frames (jaxring/rnn/layer.py's weight_gradients),
    taken off the sequential path as cuDNN does."""
    directions, frames, batch, hidden = states.shape[0], states.shape[1] - 1, states.shape[2], plan.hidden
    dtype = d_outputs.dtype
    acc = _accumulator(dtype)
    width = plan.gates * hidden
    d_projected = np.zeros((directions, batch, frames, width), dtype)
    # Each block publishes its columns of frame t's recurrent-input gradient to the frame's own
    # slot, then every block reads all of them for its units' rows. No slot is written twice, so
    # one barrier per frame suffices: a fast block writing frame t - 1's slot never touches the
    # frame t slot a slower one still reads.
    d_recurrent = np.zeros((directions, frames, batch, width), dtype)

    def block_program(d, j):
        units, columns, rows = np.array(plan.units(j)), np.array(plan.columns(j)), np.array(plan.rows(j))
        weight_rows = kernels[d][units, :].astype(acc)  # held on chip for the whole sequence
        d_h = np.zeros((len(rows), len(units)), acc)
        for t in reversed(range(frames)):
            real = mask[d, rows, t, None]
            d_h = d_h + np.where(real, d_outputs[d, rows, t][:, units].astype(acc), 0)
            h_prev = states[d, t][rows].astype(acc)
            saved_t = saved[d, t][rows]
            if cell == "gru":
                reset, update, candidate = np.split(saved_t[:, columns], 3, axis=-1)
                h_n = saved_t[:, 3 * hidden + units]
                d_candidate = d_h * (1 - update) * (1 - candidate**2)
                d_update = d_h * (h_prev[:, units] - candidate) * update * (1 - update)
                d_reset = d_candidate * h_n * reset * (1 - reset)
                d_input = np.concatenate([d_reset, d_update, d_candidate], axis=-1)
                d_rec = np.concatenate([d_reset, d_update, d_candidate * reset], axis=-1)
                d_direct = d_h * update
            else:
                pre = saved_t[:, units]
                d_input = d_rec = d_h * ((pre > 0) & (pre < relu_clip))
                d_direct = np.zeros_like(d_h)
            d_recurrent[d, t][np.ix_(rows, columns)] = np.where(real, d_rec, 0)
            d_projected[d, rows[:, None], t, columns] = np.where(real, d_input, 0)
            yield BARRIER
            # The product reads the stored (compute-dtype) gradient, as the kernel's tensor cores do:
            # its utterances' rows, every block's columns.
            d_h = np.where(real, d_direct, d_h) + d_recurrent[d, t][rows].astype(acc) @ weight_rows.T
            yield None  # another block may run its next frame's first phase in between

    run_blocks([block_program(d, j) for d in range(directions) for j in range(plan.blocks_per_direction)], rng)
    return d_recurrent, d_projected
