"""jaxring/engine/model_state.py: the step averages a model state's floating-point leaves over the replicas, and
each replica keeps its integer and key leaves (a linen-style task: collections as plain dicts)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxring.engine.checkpoint import Checkpoints
from jaxring.engine.devices import replicate, split_for_devices, unreplicate
from jaxring.engine.step import StepParts, init_train_state, make_train_step
from jaxring.engine.sync import make_sync
from jaxring.engine.task import AXIS
from tests.jaxring.engine.toy_task import ToyTask

STEPS, DEVICES = 50, 3


class CountingTask(ToyTask):
    """ToyTask with a step counter, an RNG stream's key (as key data) it advances, and the replica it ran on."""

    def init(self, rng):
        return {**super().init(rng), "counts": {"steps": jnp.zeros((), jnp.int32), "replica": jnp.zeros((), jnp.int32)},
                "rng": {"key": jax.random.key_data(jax.random.key(7))}}

    def loss(self, variables, batch, rng):
        loss, state = super().loss(variables, batch, rng)
        key = jax.random.split(jax.random.wrap_key_data(variables["rng"]["key"]))[0]
        counts = {"steps": variables["counts"]["steps"] + 1, "replica": jax.lax.axis_index(AXIS)}
        return loss, {**state, "counts": counts, "rng": {"key": jax.random.key_data(key)}}


def test_counters_and_keys_are_kept_through_50_queued_steps_and_a_checkpoint(tmp_path):
    task, optimizer, devices = CountingTask(rows=STEPS * 9), optax.sgd(0.05), jax.local_devices()[:DEVICES]
    initial = init_train_state(task, optimizer, seed=0)
    state = replicate(initial, devices)
    step = make_train_step(StepParts(task, optimizer), make_sync(1, "psum", 1 << 20), devices)
    expected_mean = np.zeros(task.x.shape[1])
    for index in range(STEPS):  # queued: nothing read until the end
        x = task.x[index * 9 : (index + 1) * 9]
        state, _ = step(state, split_for_devices({"x": x, "y": task.y[: len(x)]}, DEVICES))
        expected_mean = 0.9 * expected_mean + 0.1 * x.astype(np.float64).mean(0)  # the mean of the replicas' means
    counts = jax.tree_util.tree_map(np.asarray, state.model_state["counts"])
    assert counts["steps"].dtype == np.int32 and counts["steps"].tolist() == [STEPS] * DEVICES
    assert counts["replica"].tolist() == list(range(DEVICES))  # each replica's own, never averaged
    key = jax.random.key(7)
    for _ in range(STEPS):
        key = jax.random.split(key)[0]
    keys = np.asarray(state.model_state["rng"]["key"])
    assert keys.dtype == np.uint32
    for replica_key in keys:
        np.testing.assert_array_equal(replica_key, jax.random.key_data(key))
    np.testing.assert_allclose(np.asarray(state.model_state["stats"]["mean"]), [expected_mean] * DEVICES, rtol=1e-5)

    checkpoints = Checkpoints(tmp_path)
    checkpoints.save(STEPS, unreplicate(state), {})
    restored, _ = checkpoints.restore(initial)
    for want, got in zip(jax.tree_util.tree_leaves(unreplicate(state)), jax.tree_util.tree_leaves(restored)):
        assert np.asarray(got).dtype == np.asarray(want).dtype
        np.testing.assert_array_equal(got, want)
