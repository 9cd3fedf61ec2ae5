"""Data-parallel SGD with jaxring's all-reduce alone (no engine): the classifier of examples/classifier.

    python examples/library_training.py pmap                # every local device, under jax.pmap
    python examples/library_training.py shard_map           # a Mesh of every device, under jax.shard_map
    mpirun -np 2 python examples/library_training.py shard_map --distributed   # every device of every process

Each step averages the gradients with `jaxring.allreduce(grads, "batch",
op="mean")` where `jax.lax.pmean(grads, "batch")` would be, and also computes
lax's mean to report how far apart the two are (the test suite checks it,
tests/examples/). Prints one JSON line: the first and last training loss, the
dev error rate, and the largest difference between the ring's and lax's mean.
XLA_FLAGS=--xla_force_host_platform_device_count=8 gives a CPU 8 devices.

It writes its own step rather than taking the engine's (jaxring/engine/step.py,
`make_train_step`, a pmapped step over an engine Task) because it shows the
all-reduce as the drop-in for lax.pmean in a loop that uses nothing of the
engine, under shard_map as well as pmap.
"""

from __future__ import annotations

import argparse
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxring
from classifier.data import make_clusters
from classifier.model import MLP

AXIS = "batch"
CLASSES, FEATURES = 4, 16
network = MLP(hidden=(64,), classes=CLASSES)
optimizer = optax.adam(3e-3)


def loss_fn(params, x, y):
    logits = network.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def mean_gradients(params, x, y):
    """(mean loss, mean gradients, their largest gap from lax's) over every device of AXIS; inside pmap or shard_map."""
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    mean = jaxring.allreduce(grads, AXIS, op="mean")  # the drop-in for jax.lax.pmean(grads, AXIS)
    reference = jax.lax.pmean(grads, AXIS)  # lax's, for the report only
    gaps = [jnp.max(jnp.abs(a - b)) for a, b in zip(jax.tree.leaves(mean), jax.tree.leaves(reference))]
    return jaxring.allreduce(loss, AXIS, op="mean"), mean, jnp.max(jnp.stack(gaps))


def update(params, opt_state, grads):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def train_with_pmap(data, steps: int, batch_per_device: int, params):
    """Local devices under pmap: parameters and optimizer state replicated, one row of batches per device."""
    n = jax.local_device_count()
    @functools.partial(jax.pmap, axis_name=AXIS)
    def step(params, opt_state, x, y):
        loss, grads, gap = mean_gradients(params, x, y)
        return *update(params, opt_state, grads), loss, gap


    replicate = lambda tree: jax.tree.map(lambda a: np.stack([a] * n), tree)  # noqa: E731
    params, opt_state = replicate(params), replicate(optimizer.init(params))
    losses, gaps = [], []
    for x, y in batches(data["train"], steps, n * batch_per_device, seed=0):
        params, opt_state, loss, gap = step(params, opt_state, x.reshape(n, -1, FEATURES), y.reshape(n, -1))
        losses.append(loss[0])  # still on the device: the loop queues steps without waiting (on_host)
        gaps.append(gap.max())
    return jax.tree.map(lambda a: a[0], params), *on_host(losses, gaps)


def train_with_shard_map(data, steps: int, batch_per_device: int, params):
    """A mesh of every device (of every process, under jax.distributed), batches sharded over it."""
    mesh = jax.make_mesh((jax.device_count(),), (AXIS,))
    rows = NamedSharding(mesh, P(AXIS))

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P(), P(AXIS), P(AXIS)), out_specs=P())
    def step(params, opt_state, x, y):
        # params are the same on every device (invariant over AXIS). Without this pcast, the gradient of
        # this device's loss with respect to them would already be summed over the devices by JAX's
        # transpose, and averaging it again would give N times the mean gradient, with lax as with jaxring.
        loss, grads, gap = mean_gradients(jax.lax.pcast(params, AXIS, to="varying"), x, y)
        return *update(params, opt_state, grads), loss, gap  # grads, and so the update, are invariant again

    opt_state = optimizer.init(params)
    local = jax.local_device_count() * batch_per_device  # this process's rows of each global batch
    losses, gaps = [], []
    for x, y in batches(data["train"], steps, jax.device_count() * batch_per_device, seed=0):
        mine = slice(jax.process_index() * local, (jax.process_index() + 1) * local)
        x, y = (jax.make_array_from_process_local_data(rows, a[mine]) for a in (x, y))
        params, opt_state, loss, gap = step(params, opt_state, x, y)
        losses.append(loss)
        gaps.append(gap)
    return params, *on_host(losses, gaps)


def on_host(*per_step):
    """Each list of per-step device values as Python floats, fetched once the loop is done: float(loss)
    inside the loop would wait for that step to finish, and no later step could be queued meanwhile
    (log every few hundred steps, not every step)."""
    return [[float(value) for value in jax.device_get(values)] for values in per_step]


def batches(split, steps: int, global_batch: int, seed: int):
    """`steps` global batches of `split`, reshuffled every epoch; the same in every process."""
    rng = np.random.default_rng(seed)
    order = np.array([], np.int64)
    for _ in range(steps):
        if len(order) < global_batch:
            order = rng.permutation(len(split["y"]))
        rows, order = order[:global_batch], order[global_batch:]
        yield split["x"][rows], split["y"][rows]


def error_rate(params, split) -> float:
    predicted = np.argmax(network.apply({"params": params}, split["x"]), axis=-1)
    return float(np.mean(predicted != split["y"]))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["pmap", "shard_map"])
    parser.add_argument("--distributed", action="store_true",
                        help="shard_map over every device of every process of an mpirun job (jax.distributed)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-per-device", type=int, default=16)
    args = parser.parse_args(argv)
    if args.distributed:
        if args.mode != "shard_map":
            parser.error("--distributed goes with shard_map: pmap maps the devices of one process")
        jaxring.initialize_jax_distributed()  # JAX's runtime, numbered as MPI numbers the processes
    data = make_clusters(4096, FEATURES, CLASSES, spread=0.3, seed=0)  # the same data in every process
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, FEATURES)))["params"]  # the same everywhere
    train = train_with_pmap if args.mode == "pmap" else train_with_shard_map
    params, losses, gaps = train(data, args.steps, args.batch_per_device, params)
    result = {"mode": args.mode, "processes": jax.process_count(), "devices": jax.device_count(),
              "first_loss": losses[0], "last_loss": losses[-1], "dev_error_rate": error_rate(params, data["dev"]),
              "ring_vs_lax_max_difference": max(gaps)}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
