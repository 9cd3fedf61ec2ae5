"""The training step as a function: (state, batch) -> (state, metrics), pmapped over a process's devices.

`make_train_step` builds it once from a task, an optimizer, the precision and
accumulation settings (`StepParts`) and a sync (jaxring/engine/sync.py); it
holds no Trainer and no MPI of its own, so a loop of one's own can call it
(optim.py's make_optimizer, devices.py's replicate and split_for_devices):

    state = replicate(init_train_state(task, optimizer, seed=0), devices)
    step = make_train_step(StepParts(task, optimizer), make_sync(1, "ring", bucket_bytes), devices)
    for batch in batches:
        state, metrics = step(state, split_for_devices(batch, len(devices)))

The Trainer (jaxring/engine/trainer.py) builds it with the run's settings;
tests/jaxring/engine/test_step.py checks the two are the same step, bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxring.engine import precision, sharded_step
from jaxring.engine.initial_state import checked_optimizer_state, checked_variables
from jaxring.engine.model_state import mean_of_step
from jaxring.engine.registry import checked_loss
from jaxring.engine.sync import Sync
from jaxring.engine.task import AXIS, Task


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any  # float32 master weights; the model may compute in bfloat16
    opt_state: Any
    model_state: Any  # non-param collections; model_state.py: which leaves the step averages over replicas
    rng: jax.Array
    loss_scale: Any = None  # precision.LossScale under train.compute_dtype float16, else None (no leaves)


def init_train_state(task: Task, optimizer: optax.GradientTransformation, seed: int,
                     compute_dtype: str = "float32") -> TrainState:
    """The state before step 1, as host arrays: the task's initial variables from `seed`."""
    init_rng, step_rng = jax.random.split(jax.random.PRNGKey(seed))
    variables = checked_variables(task, jax.jit(task.init)(init_rng))
    params = variables["params"]
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=checked_optimizer_state(optimizer.init(params)),
        model_state={k: v for k, v in variables.items() if k != "params"},
        rng=step_rng,
        loss_scale=precision.LossScale.initial() if compute_dtype == "float16" else None,
    )
    return jax.tree_util.tree_map(np.asarray, state)


def variables_of(state: TrainState) -> dict:
    return {"params": state.params, **state.model_state}


@dataclasses.dataclass(frozen=True)
class StepParts:
    """The two halves of a synchronous step, on either side of the sync's mean over every replica.

    `compute_dtype`: train.compute_dtype; `accumulate_steps`: train.accumulate_steps; `first_replica`:
    the global index of this process's first device (rank x local devices), from which each replica
    folds its own random draws, so that none repeats across the replicas of every process.
    `shard_optimizer`: train.shard_optimizer (sharded_step.py), whose `optimizer` leaves the
    clipping by optim.clip_norm (`clip_norm`) to the sharded update (optim.make_sharded_optimizer).
    """

    task: Task
    optimizer: optax.GradientTransformation
    compute_dtype: str = "float32"
    accumulate_steps: int = 1
    first_replica: int = 0
    shard_optimizer: bool = False
    clip_norm: float | None = None
    decay_mask: Callable | None = None  # under shard_optimizer: adamw's (optim.decay_mask_of)

    def local(self, state: TrainState, batch: dict):
        """What the sync averages over every replica: (gradients, new model state (its floating-point leaves:
        model_state.py), loss) of one device's
        batch; with accumulate_steps k, the mean over its k micro-batches, taken in turn (a scan: the
        memory of one), each seeing the model state the one before left."""
        replica = jax.lax.axis_index(AXIS) + self.first_replica
        rng = jax.random.fold_in(jax.random.fold_in(state.rng, state.step), replica)
        micro_batches = self.accumulate_steps
        scale = None if state.loss_scale is None else state.loss_scale.scale
        if micro_batches == 1:
            return self._gradients(state.params, state.model_state, batch, rng, scale)

        def accumulate(carry, index_and_batch):
            grad_sum, model_state, loss_sum = carry
            index, micro_batch = index_and_batch
            grads, model_state, loss = self._gradients(state.params, model_state, micro_batch,
                                                       jax.random.fold_in(rng, index), scale)
            return (jax.tree_util.tree_map(jnp.add, grad_sum, grads), model_state, loss_sum + loss), None

        split = jax.tree_util.tree_map(lambda x: x.reshape((micro_batches, -1) + x.shape[1:]), batch)
        start = (jax.tree_util.tree_map(jnp.zeros_like, state.params), state.model_state, jnp.zeros((), jnp.float32))
        (grad_sum, model_state, loss_sum), _ = jax.lax.scan(accumulate, start, (jnp.arange(micro_batches), split))
        return jax.tree_util.tree_map(lambda g: g / micro_batches, grad_sum), model_state, loss_sum / micro_batches

    def _gradients(self, params, model_state, batch: dict, rng, scale):
        """(float32 gradients, new model state, loss) of the task's loss on `batch`, computed in
        compute_dtype; `scale` (float16's loss scale, else None) multiplies the loss before the
        backward pass and divides the gradients after."""
        dtype = precision.COMPUTE_DTYPES[self.compute_dtype]
        computed_batch = precision.cast_floats(batch, dtype) if dtype != jnp.float32 else batch

        def loss_fn(params):
            computed = precision.cast_floats(params, dtype) if dtype != jnp.float32 else params
            # Rebuilt in this trace: NNX mutates a Variable (merge(copy=False)) only in the trace that made it.
            rebuilt = jax.tree_util.tree_map(lambda leaf: leaf, model_state)
            loss, new_state = checked_loss(self.task, self.task.loss({"params": computed, **rebuilt},
                                                                     computed_batch, rng))
            loss = loss.astype(jnp.float32)
            return (loss if scale is None else loss * scale), (loss, new_state)

        (_, (loss, new_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        if scale is not None:
            grads = jax.tree_util.tree_map(lambda g: g / scale, grads)
        return grads, precision.like(new_state, model_state), loss

    def finish(self, state: TrainState, averaged):
        """The optimizer update from the averaged (gradients, model state, loss), and the step's metrics.

        Under loss scaling, a step whose gradients overflowed (the same on every replica: they are the
        all-reduced ones) leaves the weights and optimizer as they were and halves the scale."""
        grads, model_state, loss = averaged
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        loss_scale = state.loss_scale
        if loss_scale is not None:
            finite = precision.all_finite(grads)
            keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
            params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
            loss_scale = loss_scale.after(finite)
        state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, model_state=model_state,
                              loss_scale=loss_scale)
        return state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}


TrainStep = Callable[[TrainState, dict], tuple[TrainState, dict]]


def make_train_step(parts: StepParts, sync: Sync, devices=None) -> TrainStep:
    """(state, batch) -> (state, {"loss", "grad_norm"}), pmapped: `state` replicated over `devices` (None:
    pmap's default, every device of the job under jax.distributed, so a process passes its own) and
    donated, each leaf of `batch` split over them ([devices, rows per device, ...], devices.split_for_devices).
    The step queues without waiting: nothing in it reads a value on the host. With parts.shard_optimizer,
    `state`'s opt_state is each device's blocks (sharded_step.on_devices) and the update sharded_step's.
    mpi4jax's sync splits the step into programs around its cross-process mean (jaxring/engine/sync_mpi4jax.py);
    they queue too."""
    if getattr(parts, "shard_optimizer", False):  # any object with local and finish is a step's parts
        return jax.pmap(lambda state, batch: sharded_step.finish(parts, sync, state, parts.local(state, batch)),
                        axis_name=AXIS, devices=devices, donate_argnums=0)
    whole = jax.pmap(lambda state, batch: parts.finish(state, mean_of_step(sync.mean, parts.local(state, batch))),
                     axis_name=AXIS, devices=devices, donate_argnums=0)
    return sync.train_step(whole, parts, devices)
