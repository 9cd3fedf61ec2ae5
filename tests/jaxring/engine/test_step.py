"""The train step as a function (jaxring/engine/step.py): built from a task and settings alone, with no
Trainer, no MPI and no run directory, it is the Trainer's step, bit for bit."""

from types import SimpleNamespace

import jax
import numpy as np
import pytest

from jaxring.engine import trainer as trainer_lib
from jaxring.engine.devices import replicate, split_for_devices
from jaxring.engine.optim import learning_rate_schedule, make_optimizer
from jaxring.engine.step import StepParts, init_train_state, make_train_step
from jaxring.engine.sync import make_sync
from jaxring.engine.task import Shard
from tests.jaxring.engine.toy_task import ToyTask, toy_config, world_of

STEPS = 20
DEVICES = 3  # 9 rows a process batch, 3 a device: sizes that are not powers of two


class DropoutTask(ToyTask):
    """ToyTask whose inputs are dropped at random from the step's rng: the replicas' draws reach the weights."""

    def loss(self, variables, batch, rng):
        keep = jax.random.bernoulli(rng, 0.8, batch["x"].shape)
        return super().loss(variables, {**batch, "x": batch["x"] * keep / 0.8}, rng)


def pure_run(task, config, devices):
    """The losses and final state of STEPS steps of make_train_step's step, from the config's settings alone."""
    train = config.train
    batches = task.train_batches(train.batch_size, Shard(0, 1), train.seed)
    schedule = learning_rate_schedule(config.optim, batches.steps_per_epoch, STEPS)
    optimizer = make_optimizer(config.optim, schedule)
    parts = StepParts(task, optimizer, train.compute_dtype, train.accumulate_steps)
    step = make_train_step(parts, make_sync(1, train.allreduce, train.bucket_bytes), devices)
    state = replicate(init_train_state(task, optimizer, train.seed, train.compute_dtype), devices)
    losses = []
    for _, batch in zip(range(STEPS), batches):
        state, metrics = step(state, split_for_devices(batch, len(devices)))
        losses.append(metrics["loss"])  # not read: the steps queue
    return np.asarray(losses), state


def trainer_run(task, config, devices, workdir):
    """The same with the Trainer's own step."""
    trainer = trainer_lib.Trainer(task, config, workdir, world_of(len(devices)))
    state = replicate(trainer.init_state(), trainer.devices)
    losses = []
    for _, batch in zip(range(STEPS), trainer.batches):
        state, metrics = trainer.train_step(state, batch)
        losses.append(metrics["loss"])
    return np.asarray(losses), state


@pytest.mark.parametrize("settings", [{}, {"compute_dtype": "float16", "accumulate_steps": 3},
                                      {"compute_dtype": "bfloat16", "allreduce": "psum"}],
                         ids=["float32", "float16-accumulated", "bfloat16-psum"])
def test_the_pure_step_is_the_trainers_bit_for_bit(tmp_path, settings):
    config = toy_config(train={"batch_size": 9, "max_steps": STEPS, "bucket_bytes": 64, **settings})
    devices = jax.local_devices()[:DEVICES]
    pure_losses, pure = pure_run(DropoutTask(), config, devices)
    losses, state = trainer_run(DropoutTask(), config, devices, tmp_path)
    assert int(np.asarray(pure.step)[0]) == STEPS and len(set(pure_losses[:, 0].tolist())) == STEPS
    np.testing.assert_array_equal(pure_losses, losses)
    for a, b in zip(jax.tree_util.tree_leaves(pure), jax.tree_util.tree_leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_step_donates_the_state_and_leaves_the_batch():
    """make_train_step's contract: the old state's buffers are reused for the new one (memory), the batch is the
    caller's; the step is finish(state, mean of local(state, batch)), local's (gradients, model state, loss)."""
    devices = jax.local_devices()[:2]
    state, batch = replicate({"w": np.arange(3.0, dtype=np.float32)}, devices), replicate(np.ones(3, np.float32), devices)
    parts = SimpleNamespace(local=lambda s, b: ({"g": s["w"] * b}, {}, b.sum()),
                            finish=lambda s, mean: {"w": s["w"] - mean[0]["g"]})
    new = make_train_step(parts, make_sync(1, "psum", bucket_bytes=64), devices)(state, batch)
    np.testing.assert_allclose(np.asarray(new["w"]), np.zeros((2, 3)))  # w - mean(w * 1)
    assert state["w"].is_deleted() and not batch.is_deleted()
