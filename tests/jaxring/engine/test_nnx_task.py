"""jaxring/engine/nnx_task.py: an nnx.Module's state through the engine's step and checkpoints, with no glue in
the task: BatchNorm's statistics averaged, counters and RNG keys kept with their dtypes, a dropout stream per
device."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxring.engine.checkpoint import Checkpoints
from jaxring.engine.devices import replicate, split_for_devices, unreplicate
from jaxring.engine.nnx_task import STATE, NNXTask
from jaxring.engine.step import StepParts, TrainState, init_train_state, make_train_step
from jaxring.engine.sync import make_sync

FEATURES, WIDTH = 5, 7


class Count(nnx.Variable):
    """An int32 counter of the model's own: state that is not a statistic."""


class Mask(nnx.Variable):
    """The last dropout mask drawn, as int32: each device's own, kept (never averaged)."""


class Net(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(FEATURES, WIDTH, rngs=rngs)
        self.norm = nnx.BatchNorm(WIDTH, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.calls = Count(jnp.zeros((), jnp.int32))
        self.mask = Mask(jnp.zeros((WIDTH,), jnp.int32))

    def __call__(self, x):
        self.calls[...] += 1
        self.mask[...] = (self.dropout(jnp.ones((WIDTH,))) > 0).astype(jnp.int32)
        return self.dropout(self.norm(self.linear(x))) * self.mask[...]


class NetTask(NNXTask):
    def create_model(self, rngs):
        return Net(rngs)

    def model_loss(self, model, batch):
        return jnp.mean((model(batch["x"]).sum(-1) - batch["y"]) ** 2)

    def model_predict(self, model, batch):
        return model(batch["x"])


TASK, OPTIMIZER = NetTask(), optax.adam(1e-2)
DEVICES = jax.local_devices()[:2]
STEP = make_train_step(StepParts(TASK, OPTIMIZER), make_sync(1, "psum", 1 << 20), DEVICES)


def initial_state():
    return init_train_state(TASK, OPTIMIZER, seed=3)


def run(steps, after_each=lambda state: None):
    """The replicated state after `steps` queued steps on two devices, on batches that change per step."""
    state = replicate(initial_state(), DEVICES)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        batch = {"x": rng.normal(size=(6 * len(DEVICES), FEATURES)).astype(np.float32),
                 "y": rng.normal(size=6 * len(DEVICES)).astype(np.float32)}
        state, _ = STEP(state, split_for_devices(batch, len(DEVICES)))
        after_each(state)
    return state


@pytest.fixture(scope="module")
def fifty_steps():
    return run(50)


def test_counters_and_keys_survive_50_queued_steps_and_a_checkpoint(tmp_path, fifty_steps):
    initial, state = initial_state(), fifty_steps
    model_state = jax.tree_util.tree_map(np.asarray, state.model_state[STATE])
    assert model_state["calls"].dtype == np.int32 and (model_state["calls"] == 50).all()
    rngs = model_state["dropout"]["rngs"]
    assert rngs["count"].dtype == np.uint32 and (rngs["count"] == 100).all()  # two draws a step
    for device_key in rngs["key"]:  # the stream's key, as key data: the same as at init on every device
        np.testing.assert_array_equal(device_key, initial.model_state[STATE]["dropout"]["rngs"]["key"])
    for statistic in ("mean", "var"):  # averaged: every device holds the same BatchNorm statistics
        np.testing.assert_array_equal(model_state["norm"][statistic][0], model_state["norm"][statistic][1])
    assert not np.allclose(model_state["norm"]["mean"][0], 0)

    checkpoints = Checkpoints(tmp_path)
    checkpoints.save(50, unreplicate(state), {})
    restored, _ = checkpoints.restore(initial)
    for want, got in zip(jax.tree_util.tree_leaves(unreplicate(state)), jax.tree_util.tree_leaves(restored)):
        assert np.asarray(got).dtype == np.asarray(want).dtype
        np.testing.assert_array_equal(got, want)


def test_each_device_draws_its_own_dropout_masks_from_the_seed():
    masks = []
    run(2, lambda state: masks.append(np.asarray(state.model_state[STATE]["mask"])))
    masks.append(np.asarray(run(1).model_state[STATE]["mask"]))
    assert masks[0].dtype == np.int32 and 0 < masks[0].sum() < masks[0].size  # a dropout mask, not all kept
    assert not np.array_equal(masks[0][0], masks[0][1])  # device 0's against device 1's
    assert not np.array_equal(masks[0], masks[1])  # a new mask each step
    np.testing.assert_array_equal(masks[0], masks[2])  # from the seed: the same run draws the same masks


def test_predict_runs_in_evaluation_mode_on_a_checkpoint_read_without_a_template(tmp_path, fifty_steps):
    """As scripts/evaluate.py reads a checkpoint: with no template, as nested dicts."""
    state = unreplicate(fifty_steps)
    Checkpoints(tmp_path).save(50, state, {})
    read = Checkpoints(tmp_path).read(50).state
    variables = {"params": read["params"], **read["model_state"]}
    x = np.random.default_rng(1).normal(size=(4, FEATURES)).astype(np.float32)
    predict = jax.jit(TASK.predict)  # as the engine calls it: traced (pmap)
    first, again = predict(variables, {"x": x}), predict(variables, {"x": x})
    np.testing.assert_array_equal(first, again)  # no dropout in evaluation mode
    model_state = state.model_state[STATE]
    norm = (x @ state.params["linear"]["kernel"] + state.params["linear"]["bias"] - model_state["norm"]["mean"])
    expected = norm / np.sqrt(model_state["norm"]["var"] + 1e-5) * state.params["norm"]["scale"]
    expected = expected + state.params["norm"]["bias"]  # evaluation mode: the running statistics, no dropout
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-6)


def test_a_task_without_the_model_methods_is_refused_when_defined():
    with pytest.raises(TypeError, match="has no model_loss, model_predict: an NNXTask writes create_model"):
        class Half(NNXTask):  # noqa: F841
            def create_model(self, rngs):
                return Net(rngs)


def test_a_loss_of_its_own_may_merge_nnx_state_without_copying():
    """A task of one's own (no NNXTask) holding nnx.State in its model state, in a loop of one's own (no
    checkpoints): nnx.merge(copy=False) in the loss mutates BatchStat in the trace where the loss runs."""
    graphdef, params, rest = nnx.split(nnx.Sequential(nnx.Linear(FEATURES, 3, rngs=nnx.Rngs(0)),
                                                      nnx.BatchNorm(3, rngs=nnx.Rngs(1))), nnx.Param, ...)

    class Merging:
        def loss(self, variables, batch, rng):
            model = nnx.merge(graphdef, variables["params"], variables["rest"], copy=False)
            return jnp.mean(model(batch["x"]) ** 2), {"rest": nnx.state(model, nnx.Not(nnx.Param))}

    optimizer = optax.sgd(0.1)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                       model_state={"rest": rest}, rng=jax.random.key_data(jax.random.key(0)))
    x = np.random.default_rng(2).normal(size=(2, 4, FEATURES)).astype(np.float32)
    step = make_train_step(StepParts(Merging(), optimizer), make_sync(1, "psum", 1 << 20), DEVICES)
    _, metrics = step(replicate(state, DEVICES), {"x": x})
    expected = []
    for half in x:  # each device's batch, normalised by its own statistics (training mode)
        hidden = half @ np.asarray(params["layers"][0]["kernel"][...]) + np.asarray(params["layers"][0]["bias"][...])
        expected.append(np.mean(((hidden - hidden.mean(0)) / np.sqrt(hidden.var(0) + 1e-5)) ** 2))
    np.testing.assert_allclose(np.asarray(metrics["loss"]), [np.mean(expected)] * 2, rtol=1e-5)
