"""jaxring/engine/own_optimizer.py: the user's own optax optimizer, from the task or by the config's import path,
trains through the engine's step as the same optax chain does in a plain loop; conflicts are refused."""

import jax
import numpy as np
import optax
import pytest

from jaxring.engine.config import ConfigError
from jaxring.engine.devices import replicate, split_for_devices
from jaxring.engine.optim import learning_rate_schedule
from jaxring.engine.own_optimizer import optimizer_for
from jaxring.engine.registry import check_task_class
from jaxring.engine.step import StepParts, init_train_state, make_train_step
from jaxring.engine.sync import make_sync
from tests.jaxring.engine.toy_task import ToyTask, toy_config

STEPS, DEVICES = 4, 2
HERE = "tests.jaxring.engine.test_own_optimizer"


def not_a_transformation(schedule):
    return schedule


def frozen_w2(schedule):
    """What the config names by its import path: adam on w1, w2 frozen."""
    return optax.multi_transform({"train": optax.adam(schedule), "frozen": optax.set_to_zero()},
                                 {"w1": "train", "w2": "frozen"})


class LionTask(ToyTask):
    def optimizer(self, schedule):
        return optax.lion(schedule)


def config(**optim):
    return toy_config(optim={"momentum": 0.0, "clip_norm": None, "learning_rate": 0.01, **optim})


CASES = {  # (task, optim settings, the optax chain it must be, given the schedule)
    "lion-from-the-task": (LionTask, {}, optax.lion),
    "multi-transform-frozen-by-path-clipped": (
        ToyTask, {"name": f"{HERE}:frozen_w2", "clip_norm": 0.5, "schedule": "warmup_cosine", "warmup_steps": 2},
        lambda s: optax.chain(optax.clip_by_global_norm(0.5), frozen_w2(s))),
}


@pytest.mark.parametrize("case", CASES)
def test_the_own_optimizer_trains_as_optax_does_in_a_plain_loop(case):
    task_class, settings, reference = CASES[case]
    task, optim = task_class(), config(**settings).optim
    schedule = learning_rate_schedule(optim, 10, STEPS)
    optimizer = optimizer_for(optim, schedule, task)
    devices = jax.local_devices()[:DEVICES]
    initial = init_train_state(task, optimizer, seed=1)
    state = replicate(initial, devices)
    step = make_train_step(StepParts(task, optimizer), make_sync(1, "psum", 1 << 20), devices)
    batches = [{"x": task.x[i * 8 : i * 8 + 8], "y": task.y[i * 8 : i * 8 + 8]} for i in range(STEPS)]
    losses = []
    for batch in batches:
        state, metrics = step(state, split_for_devices(batch, DEVICES))
        losses.append(metrics["loss"][0])

    plain = reference(schedule)  # one device, the whole batch: the mean of the two devices' equal halves

    @jax.jit
    def plain_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: task.loss({**initial.model_state, "params": p}, batch, None)[0])(
            params)
        updates, opt_state = plain.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state, expected = initial.params, plain.init(initial.params), []
    for batch in batches:
        params, opt_state, loss = plain_step(params, opt_state, batch)
        expected.append(loss)
    np.testing.assert_allclose(np.asarray(losses), np.asarray(expected), rtol=1e-5)
    trained = jax.tree_util.tree_map(lambda leaf: np.asarray(leaf)[0], state.params)
    for name in ("w1", "w2"):
        np.testing.assert_allclose(trained[name], params[name], rtol=1e-5, atol=1e-6)
    assert not np.allclose(trained["w1"], initial.params["w1"])
    if case.startswith("multi-transform-frozen"):
        np.testing.assert_array_equal(trained["w2"], initial.params["w2"])


def refusal(task, **optim) -> str:
    with pytest.raises((ConfigError, TypeError)) as error:
        optimizer_for(config(**optim).optim, optax.constant_schedule(0.1), task)
    return str(error.value)


def test_conflicts_are_refused_clearly():
    assert refusal(LionTask(), momentum=0.9) == ("optim.momentum set, but the optimizer is LionTask.optimizer's own: "
                                                 "pass such settings to the optax transformation it builds, and leave "
                                                 "them out of the optim section")
    assert "optim.weight_decay set, but the optimizer is optim.name" in refusal(
        ToyTask(), name=f"{HERE}:frozen_w2", weight_decay=0.1)
    assert refusal(LionTask(), name=f"{HERE}:frozen_w2").startswith(
        f"both LionTask.optimizer and optim.name '{HERE}:frozen_w2' supply the optimizer")
    assert refusal(LionTask(), name="adamw") == ("optim.name 'adamw' is set, but LionTask.optimizer supplies the "
                                                 "optimizer: remove optim.name")
    assert refusal(ToyTask(), name=f"{HERE}:not_a_transformation").startswith(
        f"optim.name '{HERE}:not_a_transformation' returned a function; it must return an optax GradientTransformation")
    assert f"optim.name '{HERE}:lion': module '{HERE}'" in refusal(ToyTask(), name=f"{HERE}:lion")


def test_an_own_optimizer_is_refused_under_shard_optimizer():
    """train.shard_optimizer updates each device's block with optim.py's elementwise optimizers only."""
    for task, optim in ((LionTask(), {}), (ToyTask(), {"name": f"{HERE}:frozen_w2"})):
        with pytest.raises(ConfigError, match=r"^train.shard_optimizer applies the update to each device's block .* "
                                              r"set train.shard_optimizer false for it$"):
            optimizer_for(config(**optim).optim, optax.constant_schedule(0.1), task, sharded=True)


def test_a_task_optimizer_with_other_arguments_is_refused_with_the_task():
    class Wrong(ToyTask):
        def optimizer(self):
            return optax.sgd(0.1)

    with pytest.raises(ConfigError, match=r"optimizer\(self\) cannot be called as optimizer\(self, schedule\)"):
        check_task_class(Wrong)
