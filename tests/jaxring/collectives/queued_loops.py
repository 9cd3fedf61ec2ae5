"""Training-shaped loops of jaxring collectives queued without a block, as JAX users write them.

Each step's parameters are the previous step's output (chained, donated), or
each step reads the same input (unchained: nothing orders the steps but the
queue, as in the issue's first loop); its values change per step, and nothing
blocks until the end; every step's all-reduced value and the final parameters
are then checked against a float64 numpy replay. Shared by test_queued_steps.py (host devices, one
process) and mpi_workers/ (processes=True under mpirun, jax.distributed).

Run as a script, it runs every single-process scenario on N host devices:
python -m tests.jaxring.collectives.queued_loops N STEPS REPEATS
"""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

import jaxring

AXIS = "q"
SIZE = 301  # odd, several elements per device
LR = 0.05
TIMEOUT_S = 20  # a stall fails the step within seconds, never hangs


def rows(process, n_local, salt=0):
    """Process `process`'s inputs, one row per local device: random, never all zeros."""
    return np.random.default_rng([2026, process, n_local, salt]).standard_normal((n_local, SIZE)).astype(np.float32) + 0.5


def scale(k):
    """Step k's multiplier: the values change from step to step."""
    return np.float32(1 + (k % 5) * 0.25)


def replay(every_row, steps, w0):
    """float64 numpy: each step's mean of sin(x * w) * scale over every device, and the final w."""
    x = np.asarray(every_row, np.float64)
    w = np.asarray(w0, np.float64)
    means = []
    for k in range(steps):
        mean = (np.sin(x * w) * scale(k)).mean(0)
        means.append(mean)
        w = w - LR * mean
    return means, w


def _body(w, x, k, processes, with_lax):
    g = jnp.sin(x * w) * k
    mean = jaxring.allreduce(g, AXIS, op="mean", processes=processes, timeout=TIMEOUT_S)
    loss = jax.lax.pmean(jnp.sum(g), AXIS) if with_lax else jnp.sum(g, keepdims=True)
    return w - LR * mean, mean, loss


def pmapped(devices, processes=False, with_lax=False):
    """(w per device, x per device, k per device) -> (w, mean, loss), w donated."""
    return jax.pmap(functools.partial(_body, processes=processes, with_lax=with_lax), AXIS, devices=devices,
                    donate_argnums=0)


def shard_mapped(devices, with_lax=False):
    """The same step over a Mesh: w and k replicated, x one row per device."""
    mesh = Mesh(np.array(devices), (AXIS,))
    body = functools.partial(_body, processes=False, with_lax=with_lax)
    step = jax.shard_map(lambda w, x, k: body(w, x[0], k), mesh=mesh, in_specs=(P(), P(AXIS), P()),
                         out_specs=(P(), P(), P(AXIS) if not with_lax else P()))
    return jax.jit(step, donate_argnums=0)


def queue(step, w, x, steps, k_of):
    """Queues `steps` steps with no block between them; returns the final w and every step's mean."""
    means = []
    for k in range(steps):
        w, mean, _ = step(w, x, k_of(k))
        means.append(mean)
    jax.block_until_ready((w, means))
    return w, means


def check(name, means, w, expected_means, expected_w, rows_of_mean=lambda m: np.asarray(m)):
    for k, (got, expected) in enumerate(zip(means, expected_means)):
        got = rows_of_mean(got)
        np.testing.assert_allclose(got, np.broadcast_to(expected, got.shape), rtol=2e-4, atol=2e-4,
                                   err_msg=f"{name}: step {k}")
    np.testing.assert_allclose(rows_of_mean(w), np.broadcast_to(expected_w, rows_of_mean(w).shape), rtol=2e-4,
                               atol=2e-4, err_msg=f"{name}: final parameters")


def run_single_process(n, steps):
    """Every single-process scenario on the first n host devices; raises on the first wrong value."""
    devices = jax.devices()[:n]
    x = rows(0, n)
    w0 = np.cos(np.arange(SIZE, dtype=np.float32))
    expected_means, expected_w = replay(x, steps, w0)
    per_device_k = lambda k: np.full((n,), scale(k))
    for with_lax in (False, True):
        w, means = queue(pmapped(devices, with_lax=with_lax), np.stack([w0] * n), x, steps, per_device_k)
        check(f"pmap over {n}, lax beside: {with_lax}", means, w, expected_means, expected_w)
        w, means = queue(shard_mapped(devices, with_lax), jnp.asarray(w0), x, steps, scale)
        check(f"shard_map over {n}, lax beside: {with_lax}", means, w, expected_means, expected_w)
    # Unchained: every step all-reduces the same input times its own k; only the queue orders them.
    summed = jax.pmap(lambda v, k: jaxring.allreduce(jnp.sin(v) * k, AXIS, timeout=TIMEOUT_S), AXIS, devices=devices)
    sums = [summed(x, per_device_k(k)) for k in range(steps)]
    jax.block_until_ready(sums)
    total = np.sin(x.astype(np.float64)).sum(0)
    for k, got in enumerate(sums):
        np.testing.assert_allclose(np.asarray(got), np.broadcast_to(total * scale(k), got.shape), rtol=1e-4,
                                   atol=1e-4, err_msg=f"unchained over {n}, step {k}")
    # Two jaxring programs queued in turn: the chained step and a reduce_scatter + all_gather of other values.
    other = rows(0, n, salt=1)
    gathered = jax.pmap(lambda v, k: jaxring.all_gather(jaxring.reduce_scatter(v * k, AXIS, tiled=True,
                                                                                 timeout=TIMEOUT_S),
                                                        AXIS, tiled=True, timeout=TIMEOUT_S), AXIS, devices=devices)
    blocks = np.concatenate([other, np.ones((n, (-SIZE) % n), np.float32)], axis=1)  # a multiple of n
    step = pmapped(devices)
    w, means, sums = np.stack([w0] * n), [], []
    for k in range(steps):
        w, mean, _ = step(w, x, per_device_k(k))
        means.append(mean)
        sums.append(gathered(blocks, per_device_k(k)))
    jax.block_until_ready((w, means, sums))
    check(f"interleaved with a second program over {n}", means, w, expected_means, expected_w)
    total = blocks.astype(np.float64).sum(0)
    for k, got in enumerate(sums):
        np.testing.assert_allclose(np.asarray(got), np.broadcast_to(total * scale(k), got.shape), rtol=1e-5,
                                   atol=1e-4, err_msg=f"second program, step {k}")


if __name__ == "__main__":
    n, steps, repeats = map(int, sys.argv[1:4])
    for repeat in range(repeats):
        run_single_process(n, steps)
        print(f"queued {steps} steps on {n} devices: run {repeat + 1} right", flush=True)
