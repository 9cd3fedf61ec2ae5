"""Deep Speech 2 trained under pmap over this process's host devices, batch norm's statistics
across the replicas, with each `rnn_impl` (scan, persistent, the host mirror in place of the
persistent layer's kernels: tests/jaxring/rnn/mirrored_layer.py): STEPS steps queued as a training
loop queues them (no block between), each on its own batch; prints each one's losses and last
gradients as JSON.

Run as its own process (tests/models/deepspeech2/test_rnn_impl.py) so it gets exactly the devices
XLA_FLAGS gives it, as a user's `--host-devices` run does.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np

import jaxring  # noqa: F401  (sizes XLA's CPU thread pool for the host devices, as scripts/train.py does)
from models.deepspeech2.model import DeepSpeech2, ModelConfig, init_variables
from tests.jaxring.rnn.mirrored_layer import stand_in_for_the_kernels


STEPS = 3


def train(rnn_impl: str) -> dict:
    devices = jax.local_device_count()
    config = ModelConfig(conv_layers=1, conv_channels=(3,), rnn_layers=1, rnn_hidden=7, rnn_impl=rnn_impl)
    variables = init_variables(config, jax.random.key(1))
    rng = np.random.default_rng(3)
    per_device = 2
    lengths = jnp.asarray(rng.integers(5, 19, size=(devices, per_device)), jnp.int32)
    features = jnp.asarray(rng.normal(size=(devices, per_device, 19, 161)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=(devices, per_device, 10, 29)), jnp.float32)

    def loss(params, features, lengths, weights):
        model = DeepSpeech2(config, axis_name="replicas")
        (logits, _), _ = model.apply({**variables, "params": params}, features, lengths, train=True,
                                     mutable=("batch_stats",))
        return jnp.sum(logits * weights)

    def step(params, features, lengths, weights):
        value, grads = jax.value_and_grad(loss)(params, features, lengths, weights)
        return jax.lax.psum((value, grads), "replicas")

    def update(params, features, lengths, weights):
        value, grads = step(params, features, lengths, weights)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), value, grads

    train = jax.pmap(update, axis_name="replicas")
    params = jax.tree.map(lambda p: jnp.broadcast_to(p, (devices, *p.shape)), variables["params"])
    losses = []
    for k in range(STEPS):
        params, value, grads = train(params, features * (1 + 0.1 * k), lengths, weights)
        losses.append(value)
    leaves = {jax.tree_util.keystr(path): np.asarray(leaf[0]).tolist()
              for path, leaf in jax.tree_util.tree_leaves_with_path(grads)}
    return {"devices": devices, "losses": [float(v[0]) for v in losses], "grads": leaves}


if __name__ == "__main__":
    stand_in_for_the_kernels()
    print(json.dumps({rnn_impl: train(rnn_impl) for rnn_impl in ("scan", "persistent")}))
