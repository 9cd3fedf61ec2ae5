"""ZeRO-1/2-style data parallelism with jaxring alone: the classifier of examples/classifier, its adamw state
split over the devices by jaxring.ShardedUpdate, trained next to the same model with the state replicated.

    python examples/sharded_training.py                     # every local device, under jax.pmap

Each step of the sharded model reduce-scatters the gradients through jaxring's ring,
updates this device's block of the weights with this device's block of adam's two
moments, and all-gathers the weights (jaxring/collectives/sharded_update.py). The
replicated model averages the gradients with jaxring.allreduce and runs the whole update
on every device. Prints one JSON line: the first and last loss, the dev error rate, the
largest difference between the two models' weights, whether every device holds the same
sharded weights, and the optimizer state's bytes per device in each.
XLA_FLAGS=--xla_force_host_platform_device_count=8 gives a CPU 8 devices.
"""

from __future__ import annotations

import argparse
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxring
from classifier.data import make_clusters
from classifier.model import MLP

AXIS = "batch"
CLASSES, FEATURES = 4, 16
network = MLP(hidden=(64,), classes=CLASSES)
optimizer = optax.adamw(3e-3, weight_decay=1e-4)
sharded = jaxring.ShardedUpdate(optimizer, AXIS, clip_norm=1.0)  # clipping: the norm over every device's block
clipped = optax.chain(optax.clip_by_global_norm(1.0), optimizer)  # the replicated model's same update


def loss_fn(params, x, y):
    logits = network.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@functools.partial(jax.pmap, axis_name=AXIS)
def sharded_step(params, opt_state, x, y):
    """opt_state: this device's blocks. The gradients go to `update` unaveraged: it reduce-scatters them."""
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params, opt_state, _, _ = sharded.update(grads, opt_state, params)
    return params, opt_state, jaxring.allreduce(loss, AXIS, op="mean")


@functools.partial(jax.pmap, axis_name=AXIS)
def replicated_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = clipped.update(jaxring.allreduce(grads, AXIS, op="mean"), opt_state, params)
    return optax.apply_updates(params, updates), opt_state, jaxring.allreduce(loss, AXIS, op="mean")


def state_bytes(opt_state) -> int:
    """Bytes of one device's optimizer state (pmap's leading axis is the devices)."""
    return sum(leaf[0].nbytes for leaf in jax.tree.leaves(opt_state))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-per-device", type=int, default=16)
    args = parser.parse_args(argv)
    n = jax.local_device_count()
    data = make_clusters(4096, FEATURES, CLASSES, spread=0.3, seed=0)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, FEATURES)))["params"]
    replicate = lambda tree: jax.tree.map(lambda a: np.stack([a] * n), tree)  # noqa: E731
    ours = replicate(params)
    ours_state = jax.pmap(sharded.init, axis_name=AXIS)(ours)  # each device: optimizer.init of its blocks
    theirs, theirs_state = replicate(params), replicate(clipped.init(params))
    rng, losses = np.random.default_rng(0), []
    for _ in range(args.steps):
        rows = rng.choice(len(data["train"]["y"]), n * args.batch_per_device, replace=False)
        x = data["train"]["x"][rows].reshape(n, -1, FEATURES)
        y = data["train"]["y"][rows].reshape(n, -1)
        ours, ours_state, loss = sharded_step(ours, ours_state, x, y)
        theirs, theirs_state, _ = replicated_step(theirs, theirs_state, x, y)
        losses.append(loss[0])  # on the device: the loop queues steps without waiting
    losses = [float(v) for v in jax.device_get(losses)]
    first = jax.tree.map(lambda a: np.asarray(a[0]), ours)
    predicted = np.argmax(network.apply({"params": first}, data["dev"]["x"]), axis=-1)
    result = {"devices": n, "first_loss": losses[0], "last_loss": losses[-1],
              "dev_error_rate": float(np.mean(predicted != data["dev"]["y"])),
              "max_difference_from_replicated": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                                    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs))),
              "same_bits_on_every_device": all(bool((np.asarray(a) == np.asarray(a)[:1]).all())
                                               for a in jax.tree.leaves(ours)),
              "optimizer_state_bytes_per_device": {"sharded": state_bytes(ours_state),
                                                   "replicated": state_bytes(theirs_state)}}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
